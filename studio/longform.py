"""Long inputs and multi-voice scripts through the studio's line. The text is planned (engine/longform.py),
every voice of the script resolved from the library, and one long take (engine/longtake.py) generated on
the service's GPU worker, in turn with every other request. Its turns are counted in segments: between two
segments the take gives its slot back and waits for its next turn under the admission rule
(studio/admission.py), so a chapter does not hold a slot for an hour while other callers wait.

* `start_long(service, request, voices=…)`: the take's `TakeHandle` (studio/take.py); its `stream()`
  yields engine-style `Chunk`s, so the HTTP API's streaming code (`/v1/audio/speech`: raw, SSE, every
  format) sends a long take unchanged; no audio is kept (`handle.take` is the `LongTake`, for its spans and
  captions). `stream_long(...)` is that stream.
* `start_long(..., pieces=True)`, `regenerate_segment(...)`, `segment_rows(...)`: what the page's "Long form"
  view needs: the take streams `(LongTake, TakeChunk)` while its segment table fills in, then any row can be
  generated again (new seed or edited text) and the take re-assembled, without redoing the rest.
* `listener=` (studio/listen.py): each segment is transcribed and scored by its word error rate, and one
  heard wrong is generated again with the next seed (engine/longtake.py); with ASR off the take's warnings
  say so and nothing is checked. The segment table shows each segment's WER.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.config import SAMPLE_RATE
from engine.longform import MAX_SEGMENT_SECONDS, has_pauses, plan
from engine.longtake import LongTake
from engine.ssml import read_text
from engine.tokenizer import estimate_seconds, lint_tags
from engine.types import Chunk
from studio.pronounce import Dictionary
from studio.service import StudioService, SynthesisRequest
from studio.take import TakeHandle

# Default of the --max-input-chars flag: ~100k characters is a long chapter, ~110 minutes of speech.
# The take streams with keep_audio=False, so memory holds one segment's audio at a time, not the take.
MAX_LONG_INPUT_CHARS = 100_000


def wants_long_form(text: str, voices: Mapping[str, str | None] | None = None) -> bool:
    """Whether a request goes through the long-form path: a script (a `voices` map), a pause marker (only
    the long form's joins make exact silence), or more speech than one segment holds (engine/longform.py
    MAX_SEGMENT_SECONDS; one prompt is cut at ~81 s in any case)."""
    return bool(voices) or has_pauses(text) or estimate_seconds(text) > MAX_SEGMENT_SECONDS


@dataclass(frozen=True)
class _Prepared:
    segments: list
    default: Any  # the request's saved voice record (None: zero-shot or a one-off clip)
    records: dict  # the script's voice names → saved voice records


def _prepare(service: StudioService, request: SynthesisRequest, voices, max_chars: int,
             normalize: bool) -> tuple[_Prepared, list[str]]:
    """Validate `request`, plan its text, resolve its voices; returns the plan and the warnings. Runs on the
    caller's thread: a bad request fails here, before it takes a place in the line."""
    text = request.text if isinstance(request.text, str) else ""
    if not text.strip():
        raise ValueError("Text is empty: type something to say.")
    if len(text) > max_chars:
        raise ValueError(f"Text is {len(text)} characters; the limit for one long take is {max_chars}. Split it.")
    if request.ref_audio is not None and voices:
        raise ValueError("A script takes its voices from the `voices` map; a one-off reference clip cannot be "
                         "combined with it.")
    default, style = _voice_and_style(service, request)
    read = read_text(text, request.ssml)
    notes: list[str] = []
    segments = plan(read.text, style=style, normalize=normalize, voices=dict(voices) if voices else None,
                    notes=notes)
    records = {name: service.resolve_voice(name, request.caller)
               for name in {s.voice for s in segments if s.voice is not None}}
    segments = respell_segments(service, segments, lambda s: records[s.voice] if s.voice is not None else default,
                                only=request.dictionary)
    clone = default is not None or request.ref_audio is not None or bool(records)
    warnings = [*read.warnings, *notes, *(f"segment {segment.index + 1}: {w.tag}: {w.message}"
                                  for segment in segments for w in lint_tags(segment.text, clone=clone))]
    return _Prepared(segments, default, records), warnings


def _voice_and_style(service: StudioService, request: SynthesisRequest):
    """The request checked but for its text, its saved voice record (or None) and its resolved style prefix."""
    dataclasses.replace(request, text="x").validate()  # everything but the text's length: one prompt's limit
    if service.engine.is_remote:
        raise ValueError("Long texts and scripts are generated in process; this studio drives a remote server.")
    default = service.resolve_voice(request.voice_id, request.caller)
    style = request.style
    if style is None and default is not None and default.style:
        style = default.style
    return default, service.resolve_style(style)


def respell_segments(service: StudioService, segments: list, voice_of=lambda segment: None, *,
                     project: Dictionary | None = None, only: Dictionary | None = None) -> list:
    """Planned (normalised) segments with the pronunciation dictionary (the owner's, then `project`'s; or `only`
    these rules) applied: the text the model reads. `voice_of(segment)` is the segment's saved voice record
    (None: zero-shot), or its name as the voices map wrote it, for the rules scoped to a voice."""
    def names(segment) -> tuple[str, ...]:
        voice = voice_of(segment)
        return (voice,) if isinstance(voice, str) else (voice.id, voice.name) if voice is not None else ()
    return [dataclasses.replace(s, text=service.respell(s.text, names(s), project=project, only=only))
            for s in segments]


def _new_take(service: StudioService, handle: TakeHandle, prepared: _Prepared, *, keep_audio: bool,
              more=None, listener=None) -> LongTake:
    """The LongTake of a prepared request, its voices encoded (on the GPU worker: encoding is GPU work), listening
    with `listener` (studio/listen.py) when it is on; when it is off its note joins the take's warnings."""
    engine, request = service.engine, handle.request
    encode = service.encode_codes
    refs = {name: service.voices.voice_ref(record.id, encode=encode) for name, record in prepared.records.items()}
    voice = None
    if prepared.default is not None:
        voice = service.voices.voice_ref(prepared.default.id, encode=encode)
    elif request.ref_audio is not None:
        audio, sr = request.ref_audio
        voice = engine.encode_voice(np.asarray(audio, dtype=np.float32), int(sr), transcript=request.ref_text)
    listening = {}
    if listener is not None:
        listening = listener.take_options()
        if listener.off_note is not None:
            handle.warnings.append(listener.off_note)
    return LongTake(engine, prepared.segments, voice=voice, voices=refs, **handle.params.as_dict(),
                    cancel=handle.cancel, keep_audio=keep_audio, more=more, **listening)


def _segments(job, take: LongTake) -> Iterator[Any]:
    """`take.stream()`, taking a new turn in the line after every segment but the last (the stream is lazy:
    the next segment starts only when the next piece is asked for)."""
    for piece in take.stream():
        yield piece
        if piece.segment < piece.done < len(take.segments):
            job.turn()


def _flag_warning(handle: TakeHandle, take: LongTake) -> None:
    flagged = [t.index + 1 for t in take.takes if t is not None and t.flagged]
    if flagged:
        handle.warnings.append(f"segments {', '.join(map(str, flagged))} were cut short (length cap or "
                               "repeated codes); listen to them and regenerate them if needed")
    misheard = [f"{t.index + 1} (WER {t.wer:.2f})" for t in take.takes if _misheard(take, t)]
    if misheard:
        handle.warnings.append(f"segments {', '.join(misheard)} still differ from their text after "
                               f"{take.check_retries} retries; listen to them and regenerate them if needed")


def _misheard(take: LongTake, t) -> bool:
    """A segment whose kept attempt still scores above the take's threshold."""
    return take.check is not None and t is not None and t.wer is not None and t.wer > take.check_above


def _chunks(service: StudioService, prepared: _Prepared, job, handle: TakeHandle, listener=None) -> None:
    """The take as `Chunk`s with running totals, no audio kept (the HTTP API's stream)."""
    take = _new_take(service, handle, prepared, keep_audio=False, listener=listener)
    started, samples, frames = time.perf_counter(), 0, 0
    for piece in _segments(job, take):
        samples += len(piece.audio)
        done = take.takes[piece.segment]
        if piece.done > piece.segment and done is not None:
            frames += done.codes.shape[0]
        job.out.put(Chunk(audio=piece.audio, metrics=_metrics(take, frames, samples, started, None), final=False))
    reason = "cancelled" if handle.cancel.is_set() else "eoc"
    _flag_warning(handle, take)
    handle.finish(take)  # its spans and texts stay for captions; its audio is not kept
    job.out.put(Chunk(audio=np.zeros(0, np.float32), metrics=_metrics(take, frames, samples, started, reason),
                      final=True))


def _pieces(service: StudioService, prepared: _Prepared, job, handle: TakeHandle, listener=None) -> None:
    """The take as `(LongTake, TakeChunk)`, every segment's audio kept (the page's long form)."""
    take = _new_take(service, handle, prepared, keep_audio=True, listener=listener)
    for piece in _segments(job, take):
        job.out.put((take, piece))
    _flag_warning(handle, take)
    handle.finish(take)


def start_long(service: StudioService, request: SynthesisRequest, *, voices: Mapping[str, str | None] | None = None,
               max_chars: int = MAX_LONG_INPUT_CHARS, normalize: bool = True, pieces: bool = False,
               listener=None) -> TakeHandle:
    """Validate and plan one long take for `request`; returns its handle (nothing queued until its `stream()`).

    `voices` maps the script's speakers to saved voices (id or name; None: zero-shot), or is None for plain
    text spoken in `request.voice_id` (or zero-shot). The stream yields `Chunk`s, the last with `final=True`
    and the take's totals; with `pieces=True`, `(LongTake, TakeChunk)` as the segments are made, every
    segment's audio kept so that `regenerate_segment` and `take.assemble()` work afterwards. `listener`
    (studio/listen.py) listens to every segment and retries those heard wrong (a listening take makes its
    first segment whole before it streams). Raises ValueError with a sentence for bad requests."""
    prepared, warnings = _prepare(service, request, voices, max_chars, normalize)
    work = _pieces if pieces else _chunks
    return service.handle(request, request.params.resolved(), warnings,
                          lambda job, handle: work(service, prepared, job, handle, listener))


def start_open_long(service: StudioService, request: SynthesisRequest, feed, listener=None) -> TakeHandle:
    """One open long take for text still being written: `feed` (studio/sentences.py `SentenceFeed`) hands it
    its segments as they complete. Every segment takes its turn in
    the line, and while the take waits for text it holds no slot. `request.text` is ignored; the rest is
    checked now (ValueError with a sentence). The take's style is the request's, resolved here for the feed:
    `feed.style` is set. Its stream yields `(LongTake, TakeChunk)`: the take's segments, seeds and TTFA grow
    as it goes. `listener` (studio/listen.py) listens to every sentence, each then made whole before it
    streams."""
    default, feed.style = _voice_and_style(service, dataclasses.replace(request, text="x"))
    prepared = _Prepared([], default, {})

    def work(job, handle: TakeHandle) -> None:
        def more():  # the next complete sentence, planned, with the pronunciation dictionary applied
            segment = job.turn(wait=lambda: feed.next_segment(handle.cancel))
            return None if segment is None else respell_segments(service, [segment], lambda s: default,
                                                                 only=request.dictionary)[0]

        take = _new_take(service, handle, prepared, keep_audio=False, more=more, listener=listener)
        for piece in take.stream():
            job.out.put((take, piece))
        handle.finish()

    return service.handle(request, request.params.resolved(), [], work)


def stream_long(service: StudioService, request: SynthesisRequest, **options) -> Iterator[Chunk]:
    """`start_long(service, request, **options).stream()`, validated when the first chunk is asked for."""
    yield from start_long(service, request, **options).stream()


def regenerate_segment(service, take: LongTake, index: int, *, seed: int | None = None,
                       text: str | None = None) -> np.ndarray:
    """Generate one segment again (a new seed, or edited text) on the GPU worker, in turn with other
    requests, and return the re-assembled take. Edited text goes through the pronunciation dictionary."""
    if text is not None and 0 <= index < len(take.segments):
        voice = take.segments[index].voice
        text = service.respell(text, (voice,) if voice else ())
    service.run_exclusive(take.regenerate, index, seed=seed, text=text)
    return take.assemble()


def segment_rows(take: LongTake) -> list[list]:
    """The segment table: #, speaker, text, seed, seconds, status (waiting / done / cut short / heard wrong,
    with the tries a listening take made), WER ("" when not listened to)."""
    rows = []
    for i, segment in enumerate(take.segments):
        t = take.takes[i]
        status = "waiting" if t is None else f"cut short ({t.stop_reason})" if t.flagged else \
            "heard wrong" if _misheard(take, t) else "done"
        if take.check is not None and t is not None and len(t.attempts) > 1:
            status += f" ({len(t.attempts)} tries)"
        rows.append([i + 1, segment.speaker or "", segment.text, take.seeds[i],
                     round(t.seconds, 2) if t is not None else round(segment.seconds, 1), status,
                     "" if t is None or t.wer is None else round(t.wer, 2)])
    return rows


def _metrics(take: LongTake, frames: int, samples: int, started: float, reason: str | None):
    """The take's numbers so far, in the engine's `Metrics` shape (the latest segment's prompt figures)."""
    elapsed = time.perf_counter() - started
    return dataclasses.replace(take.metrics, ttfa_ms=take.ttfa_ms, frames=frames, seed=take.base_seed,
                               rtf=elapsed / max(samples / SAMPLE_RATE, 1e-9), stop_reason=reason)


__all__ = [
    "MAX_LONG_INPUT_CHARS",
    "regenerate_segment",
    "respell_segments",
    "segment_rows",
    "start_long",
    "start_open_long",
    "stream_long",
    "wants_long_form",
]
