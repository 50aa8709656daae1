"""`run(service, plan) -> TakeHandle`: a prepared take into the studio's one GPU line. Nothing is queued until
the handle's `stream()`; the work runs on the line's worker, in the caller's turn.

* one prompt: the engine's chunks, each under the true-peak ceiling (engine/peaks.py), recorded in the
  history as a `Take` when it ends;
* a long take (engine/longtake.py): its segments one by one, giving the slot back between two of them
  (studio/takes/admission.py), streamed as engine-style `Chunk`s with running totals; `record=True` keeps its
  audio and records it as one `Take` too (the page, MCP); `pieces=True` streams `(LongTake, TakeChunk)` and
  keeps every segment, so that the Long form tab can make one again (studio/takes/longform.py);
* an open long take (the WebSocket's): its sentences come from a feed as they are written.

`voice_ref` is the one place that builds a take's voice reference, and the one that knows about remote
engines (their voices travel as clips).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from typing import Any

import numpy as np

from engine.config import SAMPLE_RATE
from engine.longtake import LongTake
from engine.peaks import PeakLimiter
from engine.types import Chunk
from studio.takes.prepare import Plan
from studio.takes.take import TakeHandle

SINGLE_LISTEN_NOTE = "`listen` checks the segments of a long input; this input is one take, spoken as it is"


def run(service, plan: Plan, *, record: bool = False, pieces: bool = False, listener=None, feed=None) -> TakeHandle:
    """The plan's handle in `service`'s line. `listener` (studio/audio/listen.py): the long take's listener when
    the order asks `listen` (default: the service's). `feed` (studio/takes/sentences.py): an open plan's
    sentences."""
    order = plan.order
    warnings = list(plan.warnings)
    listener = (listener if listener is not None else service.listener) if order.listen else None
    if order.listen and not plan.long:
        warnings.append(SINGLE_LISTEN_NOTE)
    if listener is not None and listener.off_note is not None:
        warnings.append(listener.off_note)
        listener = None
    if plan.open:
        feed.style = plan.prefix
        work = lambda job, handle: _open(service, plan, job, handle, feed, listener)  # noqa: E731
    elif plan.long and pieces:
        work = lambda job, handle: _pieces(service, plan, job, handle, listener)  # noqa: E731
    elif plan.long:
        work = lambda job, handle: _chunks(service, plan, job, handle, listener, record)  # noqa: E731
    else:
        work = lambda job, handle: _single(service, plan, job, handle)  # noqa: E731
    return TakeHandle(service.line, order, plan.params, warnings, work, plan=plan)


def voice_ref(service, voice=None, clip: tuple[np.ndarray, int] | None = None, clip_text: str | None = None):
    """The engine's reference for a saved voice record (codes cached in the library, or its clip for a remote
    engine) or a one-off clip; None for the model's own voice. Runs on the line's worker: encoding is device
    work."""
    engine = service.engine
    if voice is not None and engine.is_remote:
        return engine.encode_voice(voice.wav(), SAMPLE_RATE, transcript=voice.transcript or None)
    if voice is not None:
        return service.voices.voice_ref(voice.id, encode=service.encode_codes)
    if clip is not None:
        audio, sr = clip
        return engine.encode_voice(np.asarray(audio, dtype=np.float32), int(sr), transcript=clip_text)
    return None


def _single(service, plan: Plan, job, handle: TakeHandle) -> None:
    order = plan.order
    ref = voice_ref(service, plan.voice, order.clip, order.clip_text)
    chunks = service.engine.generate_stream(plan.prompt, voice=ref, params=handle.params, cancel=handle.cancel)
    # Every take leaves under the true-peak ceiling: each chunk is limited before it is sent, the limiter holding
    # back only the ~10 ms its look-ahead needs, which the final chunk carries.
    limiter = PeakLimiter()
    pieces: list[np.ndarray] = []
    last = None
    try:
        for chunk in chunks:  # the engine watches `cancel` every frame and ends with a final "cancelled" chunk
            last = chunk
            if chunk.final:
                break
            chunk = dataclasses.replace(chunk, audio=limiter.feed(chunk.audio))
            pieces.append(chunk.audio)
            job.out.put(chunk)
    finally:
        chunks.close()
    if last is None:
        return
    tail = np.concatenate([limiter.feed(last.audio) if last.final else np.zeros(0, np.float32), limiter.flush()])
    pieces.append(tail)
    last = dataclasses.replace(last, audio=tail, final=True, metrics=last.metrics if last.final else
                               dataclasses.replace(last.metrics, stop_reason="cancelled"))
    handle.finish(service.record(handle, plan.prompt, last.metrics, pieces, plan.fired, limiter.gain_db))
    job.out.put(last)


def _long_take(service, plan: Plan, handle: TakeHandle, *, keep_audio: bool, more=None, listener=None) -> LongTake:
    """The plan's LongTake, its voices encoded, listening with `listener` when it is on."""
    order = plan.order
    refs = {name: voice_ref(service, record) for name, record in plan.records.items()}
    voice = voice_ref(service, plan.voice, order.clip, order.clip_text)
    listening = listener.take_options() if listener is not None else {}
    return LongTake(service.engine, list(plan.segments), voice=voice, voices=refs, **handle.params.as_dict(),
                    cancel=handle.cancel, keep_audio=keep_audio, more=more, **listening)


def _segments(job, take: LongTake) -> Iterator[Any]:
    """`take.stream()`, taking a new turn in the line after every segment but the last (the stream is lazy: the
    next segment starts only when the next piece is asked for)."""
    for piece in take.stream():
        yield piece
        if piece.segment < piece.done < len(take.segments):
            job.turn()


def _chunks(service, plan: Plan, job, handle: TakeHandle, listener, record: bool) -> None:
    """The long take as `Chunk`s with running totals. Its audio is kept only to `record` it as one take."""
    take = _long_take(service, plan, handle, keep_audio=False, listener=listener)
    started, samples, frames, kept = time.perf_counter(), 0, 0, []
    for piece in _segments(job, take):
        samples += len(piece.audio)
        done = take.takes[piece.segment]
        if piece.done > piece.segment and done is not None:
            frames += done.codes.shape[0]
        if record:
            kept.append(piece.audio)
        job.out.put(Chunk(audio=piece.audio, metrics=_metrics(take, frames, samples, started, None), final=False))
    reason = "cancelled" if handle.cancel.is_set() else "eoc"
    _flag_warning(handle, take)
    metrics = _metrics(take, frames, samples, started, reason)
    if record:
        prompt = "\n".join(s.text for s in plan.segments)
        handle.finish(service.record(handle, prompt, metrics, kept, plan.fired))
    else:
        handle.finish(take)  # its spans and texts stay for captions; its audio is not kept
    job.out.put(Chunk(audio=np.zeros(0, np.float32), metrics=metrics, final=True))


def _pieces(service, plan: Plan, job, handle: TakeHandle, listener) -> None:
    """The long take as `(LongTake, TakeChunk)`, every segment's audio kept (the Long form tab)."""
    take = _long_take(service, plan, handle, keep_audio=True, listener=listener)
    for piece in _segments(job, take):
        job.out.put((take, piece))
    _flag_warning(handle, take)
    handle.finish(take)


def _open(service, plan: Plan, job, handle: TakeHandle, feed, listener) -> None:
    """An open long take: every sentence the feed completes takes its turn in the line, respelled; while the
    take waits for text it holds no slot. Streams `(LongTake, TakeChunk)`."""
    order = plan.order

    def more():
        segment = job.turn(wait=lambda: feed.next_segment(handle.cancel))
        return None if segment is None else service.respell_segments([segment], lambda s: plan.voice,
                                                                     only=order.dictionary)[0]

    take = _long_take(service, plan, handle, keep_audio=False, more=more, listener=listener)
    for piece in take.stream():
        job.out.put((take, piece))
    handle.finish()


def _flag_warning(handle: TakeHandle, take: LongTake) -> None:
    flagged = [t.index + 1 for t in take.takes if t is not None and t.flagged]
    if flagged:
        handle.warnings.append(f"segments {', '.join(map(str, flagged))} were cut short (too long, or "
                               "repeating itself); listen to them and regenerate them if needed")
    misheard = [f"{t.index + 1} (WER {t.wer:.2f})" for t in take.takes if misheard_segment(take, t)]
    if misheard:
        handle.warnings.append(f"segments {', '.join(misheard)} still differ from their text after "
                               f"{take.check_retries} retries; listen to them and regenerate them if needed")


def misheard_segment(take: LongTake, t) -> bool:
    """A segment whose kept attempt still scores above the take's threshold."""
    return take.check is not None and t is not None and t.wer is not None and t.wer > take.check_above


def _metrics(take: LongTake, frames: int, samples: int, started: float, reason: str | None):
    """The take's numbers so far, in the engine's `Metrics` shape (the latest segment's prompt figures)."""
    elapsed = time.perf_counter() - started
    return dataclasses.replace(take.metrics, ttfa_ms=take.ttfa_ms, frames=frames, seed=take.base_seed,
                               rtf=elapsed / max(samples / SAMPLE_RATE, 1e-9), stop_reason=reason)


__all__ = ["misheard_segment", "run", "voice_ref"]
