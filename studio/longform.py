"""Long inputs and multi-voice scripts through the studio's queue. The text is planned (engine/longform.py),
every voice of the script resolved from the library, and one long take (engine/longtake.py) generated on
the service's GPU worker, in turn with every other request. Its turns are counted in segments: between two
segments the take gives its slot back and waits for its next turn under the admission rule
(studio/admission.py), so a chapter does not hold a slot for an hour while other callers wait.

* `stream_long(service, request, voices=…)`: engine-style `Chunk`s, so the HTTP API's streaming code
  (`/v1/audio/speech`: raw, SSE, every format) sends a long take unchanged; no audio is kept.
* `generate_long(...)`, `regenerate_segment(...)`, `segment_rows(...)`: what a "Long form" view of the
  page needs: the take streams while its segment table fills in, then any row can be generated again
  (new seed or edited text) and the take re-assembled, without redoing the rest.

Wiring (studio/api.py, for the lead): add `voices: dict[str, str | None] | None = None` to `SpeechRequest`;
in `build_request`, check `len(req.input)` against `max_input_chars` (the `--max-input-chars` flag, default
`MAX_LONG_INPUT_CHARS`) instead of `MAX_TEXT_CHARS` when `wants_long_form(req.input, req.voices)`; in
`_Run._next`, call `stream_long(self.api.service, self.synth, voices=req.voices, max_chars=…)` instead of
`service.stream(self.synth)` for those requests. Everything after the first chunk stays as it is.
"""

from __future__ import annotations

import dataclasses
import secrets
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.config import SAMPLE_RATE
from engine.types import Chunk
from engine.longform import MAX_SEGMENT_SECONDS, plan
from engine.longtake import LongTake
from engine.tokenizer import estimate_seconds, lint_tags
from studio.service import RANDOM_SEED_BITS

# Default of the --max-input-chars flag: ~100k characters is a long chapter, ~110 minutes of speech.
# The take streams with keep_audio=False, so memory holds one segment's audio at a time, not the take.
MAX_LONG_INPUT_CHARS = 100_000


def wants_long_form(text: str, voices: Mapping[str, str | None] | None = None) -> bool:
    """Whether a request goes through the long-form path: a script (a `voices` map), or more speech than
    one segment holds (engine/longform.py MAX_SEGMENT_SECONDS; one prompt is cut at ~81 s in any case)."""
    return bool(voices) or estimate_seconds(text) > MAX_SEGMENT_SECONDS


@dataclass(frozen=True)
class _Prepared:
    segments: list
    default: Any  # the request's saved voice record (None: zero-shot or a one-off clip)
    records: dict  # the script's voice names → saved voice records


def _prepare(service, request, voices, max_chars: int, normalize: bool) -> _Prepared:
    """Validate `request`, plan its text, resolve its voices; fills `request.warnings` and `request.seed`.
    Runs on the caller's thread: a bad request fails here, before it takes a place in the queue."""
    text = request.text if isinstance(request.text, str) else ""
    if not text.strip():
        raise ValueError("Text is empty: type something to say.")
    if len(text) > max_chars:
        raise ValueError(f"Text is {len(text)} characters; the limit for one long take is {max_chars}. Split it.")
    if request.ref_audio is not None and voices:
        raise ValueError("A script takes its voices from the `voices` map; a one-off reference clip cannot be "
                         "combined with it.")
    dataclasses.replace(request, text="x").validate()  # the sampling options, checked by the one validator
    if service.engine.is_remote:
        raise ValueError("Long texts and scripts are generated in process; this studio drives a remote server.")
    default = service.resolve_voice(request.voice_id, request.caller)
    style = request.style
    if style is None and default is not None and getattr(default, "style", None):
        style = default.style
    segments = plan(text, style=service.resolve_style(style), normalize=normalize,
                    voices=dict(voices) if voices else None)
    records = {name: service.resolve_voice(name, request.caller)
               for name in {s.voice for s in segments if s.voice is not None}}
    request.warnings.clear()
    clone = default is not None or request.ref_audio is not None or bool(records)
    for segment in segments:
        request.warnings.extend(f"segment {segment.index + 1}: {w.tag}: {w.message}"
                                for w in lint_tags(segment.text, clone=clone))
    if request.seed is None:
        request.seed = secrets.randbits(RANDOM_SEED_BITS)
    request.seed = int(request.seed)
    return _Prepared(segments, default, records)


def _new_take(service, request, prepared: _Prepared, *, keep_audio: bool) -> LongTake:
    """The LongTake of a prepared request, its voices encoded (on the GPU worker: encoding is GPU work)."""
    engine = service.engine
    encode = service.encode_codes
    refs = {name: service.voices.voice_ref(record.id, encode=encode) for name, record in prepared.records.items()}
    voice = None
    if prepared.default is not None:
        voice = service.voices.voice_ref(prepared.default.id, encode=encode)
    elif request.ref_audio is not None:
        audio, sr = request.ref_audio
        voice = engine.encode_voice(np.asarray(audio, dtype=np.float32), int(sr), transcript=request.ref_text)
    return LongTake(engine, prepared.segments, voice=voice, voices=refs, seed=request.seed,
                    temperature=float(request.temperature), top_k=int(request.top_k), top_p=float(request.top_p),
                    max_frames=request.max_frames, repeat_guard=request.repeat_guard, cancel=request.cancel,
                    keep_audio=keep_audio)


def _queued(service, request, work) -> Iterator[Any]:
    """Run `work(job)` on the service's GPU worker in turn with every other request; yield what it puts out."""
    try:
        yield from service.queued(work, request.cancel, caller=request.caller)
    finally:
        if not request.finished.is_set():
            request.cancel.set()  # stopped, failed or abandoned by the consumer: free the worker


def _segments(job, take: LongTake) -> Iterator[Any]:
    """`take.stream()`, taking a new turn in the queue after every segment but the last (the stream is lazy:
    the next segment starts only when the next piece is asked for)."""
    for piece in take.stream():
        yield piece
        if piece.segment < piece.done < len(take.segments):
            job.turn()


def _flag_warning(request, take: LongTake) -> None:
    flagged = [t.index + 1 for t in take.takes if t is not None and t.flagged]
    if flagged:
        request.warnings.append(f"segments {', '.join(map(str, flagged))} were cut short (length cap or "
                                "repeated codes); listen to them and regenerate them if needed")


def stream_long(service, request, *, voices: Mapping[str, str | None] | None = None,
                max_chars: int = MAX_LONG_INPUT_CHARS, normalize: bool = True) -> Iterator[Chunk]:
    """Validate, plan, queue and stream one long take for `request` (a `studio.service.SynthesisRequest`).

    `voices` maps the script's speakers to saved voices (id or name; None: zero-shot), or is None for plain
    text spoken in `request.voice_id` (or zero-shot). Yields `Chunk`s; the last has `final=True` and the
    take's totals. Raises ValueError with a sentence for bad requests, before anything is queued."""
    prepared = _prepare(service, request, voices, max_chars, normalize)

    def work(job) -> None:
        take = _new_take(service, request, prepared, keep_audio=False)
        started, samples, frames = time.perf_counter(), 0, 0
        for piece in _segments(job, take):
            samples += len(piece.audio)
            done = take.takes[piece.segment]
            if piece.done > piece.segment and done is not None:
                frames += done.codes.shape[0]
            job.out.put(Chunk(audio=piece.audio, metrics=_metrics(take, frames, samples, started, None), final=False))
        reason = "cancelled" if request.cancel.is_set() else "eoc"
        _flag_warning(request, take)
        request.finished.set()
        job.out.put(Chunk(audio=np.zeros(0, np.float32), metrics=_metrics(take, frames, samples, started, reason),
                          final=True))

    yield from _queued(service, request, work)


def generate_long(service, request, *, voices: Mapping[str, str | None] | None = None,
                  max_chars: int = MAX_LONG_INPUT_CHARS, normalize: bool = True) -> Iterator[tuple[LongTake, Any]]:
    """As `stream_long`, for the studio page: yields `(take, TakeChunk)` as the take is generated, with
    every segment's audio kept, so that `regenerate_segment` and `take.assemble()` work afterwards."""
    prepared = _prepare(service, request, voices, max_chars, normalize)

    def work(job) -> None:
        take = _new_take(service, request, prepared, keep_audio=True)
        for piece in _segments(job, take):
            job.out.put((take, piece))
        _flag_warning(request, take)
        request.finished.set()

    yield from _queued(service, request, work)


def regenerate_segment(service, take: LongTake, index: int, *, seed: int | None = None,
                       text: str | None = None) -> np.ndarray:
    """Generate one segment again (a new seed, or edited text) on the GPU worker, in turn with other
    requests, and return the re-assembled take."""
    service.run_exclusive(take.regenerate, index, seed=seed, text=text)
    return take.assemble()


def segment_rows(take: LongTake) -> list[list]:
    """The segment table: #, speaker, text, seed, seconds, status (waiting / done / cut short)."""
    rows = []
    for i, segment in enumerate(take.segments):
        t = take.takes[i]
        status = "waiting" if t is None else f"cut short ({t.stop_reason})" if t.flagged else "done"
        rows.append([i + 1, segment.speaker or "", segment.text, take.seeds[i],
                     round(t.seconds, 2) if t is not None else round(segment.seconds, 1), status])
    return rows


def _metrics(take: LongTake, frames: int, samples: int, started: float, reason: str | None):
    """The take's numbers so far, in the engine's `Metrics` shape (the latest segment's prompt figures)."""
    elapsed = time.perf_counter() - started
    return dataclasses.replace(take.metrics, ttfa_ms=take.ttfa_ms, frames=frames, seed=take.base_seed,
                               rtf=elapsed / max(samples / SAMPLE_RATE, 1e-9), stop_reason=reason)


__all__ = ["stream_long", "generate_long", "regenerate_segment", "segment_rows", "wants_long_form",
           "MAX_LONG_INPUT_CHARS"]
