"""One long take from a plan (engine/longform.py): every segment generated from the same anchor, streamed
as one continuous take, each segment replaceable on its own.

Anchoring (no drift): a segment's prompt is never built from the previous segment's output. With a voice
the anchor is its clone prompt; zero-shot, the first segment of a speaker is generated normally and its
frames (trimmed to whole frames around the speech) and text become the reference of every later segment
of that speaker, so the voice found there is kept. The anchor is a shared prompt prefix, so the engine's
prefix KV cache makes each later segment prefill only its own text (`SegmentTake.reused_tokens`).

Joins (engine/joins.py): each segment is trimmed to its speech, matched in loudness to the first, faded at
both ends and held under the true-peak ceiling (engine/peaks.py), and its planned pause follows as silence
streamed in blocks. The first segment streams as it is generated, through a limiter that holds back only
the ~10 ms its look-ahead needs (its TTFA is a short take's); later segments are generated whole, ahead of
playback, because trimming and loudness need all of a segment. A later segment cut short (length cap,
repeat guard) is generated once more with the next seed and flagged; the first is only flagged, since it
has already been heard.

Listening (`check`, engine/attempts.py): a take given `check(segment_text, audio) -> float | None` scores
every attempt of a segment and generates one heard wrong again; with a check the first segment is made
whole too, so the take's TTFA is then a whole segment's. A take without a check runs exactly as before.

The engine caches one prefix, so a script whose turns alternate between voices prefills each voice
block again at every change of speaker (still bit-identical to a cold prefill, only slower).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace

import numpy as np
import torch

from .attempts import CUT_SHORT, Attempt, again, best
from .config import SAMPLE_RATE
from .delay import default_max_frames
from .joins import (
    FADE,
    KEEP,
    SILENCE_BLOCK,
    WINDOW,
    anchor_frames,
    pause_samples,
    ramp,
    shape_segment,
    silence_blocks,
    speech_bounds,
    speech_rms,
)
from .longform import Segment
from .peaks import PeakLimiter, peak_ceiling
from .prompt import VoiceRef
from .tokenizer import strip_tags
from .types import DEFAULT_REPEAT_GUARD, DEFAULT_TEMPERATURE, DEFAULT_TOP_K, DEFAULT_TOP_P, new_seed


@dataclass(frozen=True)
class SegmentTake:
    """One generated segment: its prompt's numbers, the raw audio, and how it ended."""

    index: int
    text: str
    seed: int
    codes: torch.Tensor
    audio: np.ndarray  # raw engine output, before trimming, fades and gain
    stop_reason: str
    retried: bool  # the first seed was cut short, so this is a later seed's take
    prompt_tokens: int
    prefix_len: int
    reused_tokens: int  # prompt positions served by the prefix KV cache
    attempts: tuple[Attempt, ...] = ()  # every generation of the segment, in order, this one among them

    @property
    def wer(self) -> float | None:
        """The check's score of this take, its own attempt's (None: no check, or it could not tell)."""
        return next((a.wer for a in self.attempts if a.seed == self.seed), None)

    @property
    def flagged(self) -> bool:
        return self.retried or self.stop_reason in CUT_SHORT

    @property
    def seconds(self) -> float:
        return len(self.audio) / SAMPLE_RATE


@dataclass(frozen=True)
class TakeChunk:
    audio: np.ndarray  # float32 mono 24 kHz, the next samples of the assembled take
    segment: int  # the segment these samples belong to (pause samples: the segment before the pause)
    done: int  # segments finished so far (in a closed take, with the pause after them)
    total: int


# ------------------------------------------------------------------------------------------- the take
class LongTake:
    """Drives one `Engine` through a plan: anchors, per-segment seeds, streaming in order, regeneration of
    one segment and re-assembly. `voices` maps the plan's voice names to `VoiceRef`s; a segment that names
    none is spoken in `voice`, or with no `voice` zero-shot, anchored on its speaker's first segment.
    `seeds` (one per segment, e.g. from a recipe) reproduce a take exactly: they are used as they are,
    with no retry. `more` opens the take: `segments` may then be empty, and `more()` is called (on the
    streaming thread, so it may block) whenever the take needs its next segment; it returns it, or None
    when the text has ended. Segment i of an open take gets seed + i, as in a closed one. `check` listens to
    each segment (module docstring); with `seeds` nothing is retried, so it is not called."""

    def __init__(self, engine, segments: list[Segment], *, voice: VoiceRef | None = None,
                 voices: Mapping[str, VoiceRef] | None = None, seed: int | None = None, seeds: list[int] | None = None,
                 temperature: float = DEFAULT_TEMPERATURE, top_k: int = DEFAULT_TOP_K, top_p: float = DEFAULT_TOP_P,
                 max_frames: int | None = None, repeat_guard: int | None = DEFAULT_REPEAT_GUARD,
                 cancel: threading.Event | None = None, keep_audio: bool = True,
                 more: Callable[[], Segment | None] | None = None,
                 check: Callable[[str, np.ndarray], float | None] | None = None, check_above: float = 0.25,
                 check_retries: int = 2):
        if not segments and more is None:
            raise ValueError("the plan has no segments; give some text to speak")
        if seeds is not None and more is not None:
            raise ValueError("an open take draws its seeds from `seed`; give `seed`, not `seeds`")
        voices = dict(voices or {})
        self.voices = voices
        for segment in segments:
            self._check_voice(segment)
        if seeds is not None and len(seeds) != len(segments):
            raise ValueError(f"give one seed per segment: {len(seeds)} seeds for {len(segments)} segments")
        self.engine, self.voice, self.more = engine, voice, more
        self.options = dict(temperature=temperature, top_k=top_k, top_p=top_p, repeat_guard=repeat_guard)
        self.max_frames = max_frames
        # An HTTP stream of a 100k-character input is ~2 hours of audio (~1.3 GB as raw + shaped float32):
        # a server that only streams it drops each segment's samples once they are sent (codes are kept).
        self.keep_audio = keep_audio
        self.retry = seeds is None
        if check_retries < 0:
            raise ValueError(f"check_retries is how many times a segment may be generated again; got {check_retries}")
        self.check = check if self.retry else None
        self.check_above, self.check_retries = float(check_above), int(check_retries)
        if seeds is not None:
            self.base_seed = int(seeds[0])
        else:
            self.base_seed = new_seed() if seed is None else int(seed)
        self.cancel = cancel or threading.Event()
        # One entry per segment in each (`_add`); an open take's grow as its segments come.
        self.segments: list[Segment] = []
        self.seeds: list[int] = []
        self.takes: list[SegmentTake | None] = []
        self.prompts: list = []
        self.shaped: list[np.ndarray | None] = []
        self.lengths: list[int] = []  # samples of each shaped segment (kept when audio is not)
        self.peak_cuts: list[float] = []  # dB the ceiling's limiter took from each segment at most (0.0: none)
        for i, segment in enumerate(segments):
            self._add(segment, int(seeds[i]) if seeds is not None else _next_seed(self.base_seed, i))
        self.anchors: dict = {}  # speaker (None in plain text) → zero-shot anchor made from its first segment
        self.reference_rms: float | None = None  # the first segment's, kept through regenerations
        self.metrics = None  # the engine's Metrics of the latest chunk (prompt, reuse, stop reason)
        self.ttfa_ms: float | None = None
        self.wall_ms: float | None = None

    @classmethod
    def from_recipe(cls, engine, recipe: dict, *, voice: VoiceRef | None = None,
                    voices: Mapping[str, VoiceRef] | None = None, cancel: threading.Event | None = None) -> LongTake:
        """The take a `recipe()` describes, ready to `run()`: the same segments, options and seeds."""
        try:
            items = recipe["segments"]
            segments = [Segment(index=i, text=item["text"], source=item.get("source", item["text"]),
                                pause_after=float(item["pause_after"]), speaker=item.get("speaker"),
                                voice=item.get("voice")) for i, item in enumerate(items)]
            seeds = [int(item["seed"]) for item in items]
            options = dict(recipe["options"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"this is not a long-take recipe ({type(exc).__name__}: {exc}); "
                             "use the JSON that LongTake.recipe() wrote") from None
        return cls(engine, segments, voice=voice, voices=voices, seeds=seeds, cancel=cancel, **options)

    # ---------------------------------------------------------------- an open take's segments
    def _check_voice(self, segment: Segment) -> None:
        if segment.voice is not None and segment.voice not in self.voices:
            raise ValueError(f"no voice loaded for {segment.voice!r}; "
                             f"the take has {', '.join(map(repr, self.voices)) or 'none'}")

    def _has(self, index: int) -> bool:
        """Whether the take has segment `index`; an open take asks `more()` for it (which may wait for text).
        When the text has ended, the last segment's pause is dropped: nothing follows it."""
        if index < len(self.segments):
            return True
        if self.more is None or self.cancel.is_set():
            return False
        segment = self.more()
        if segment is None or self.cancel.is_set():
            if segment is None and self.segments:
                self.segments[-1] = replace(self.segments[-1], pause_after=0.0)
            return False
        self._check_voice(segment)
        self._add(replace(segment, index=index), _next_seed(self.base_seed, index))
        return True

    def _add(self, segment: Segment, seed: int) -> None:
        """One more segment for the take, with its seed; nothing of it is made yet."""
        self.segments.append(segment)
        self.seeds.append(seed)
        self.takes.append(None)
        self.prompts.append(None)
        self.shaped.append(None)
        self.lengths.append(0)
        self.peak_cuts.append(0.0)

    def _closing(self, index: int, audio: np.ndarray) -> Iterator[TakeChunk]:
        """Segment `index`'s last samples, then a closed take's pause after it in SILENCE_BLOCKs (an open
        take's comes before the next segment, once there is one); the segment's last chunk says it is done."""
        pause = pause_samples(self.segments[index].pause_after) if self.more is None else 0
        total = len(self.segments)
        yield TakeChunk(audio, index, index + int(pause == 0), total)
        for at, block in zip(range(0, pause, SILENCE_BLOCK), silence_blocks(pause)):
            yield TakeChunk(block, index, index + int(at + SILENCE_BLOCK >= pause), total)

    # ---------------------------------------------------------------- prompts
    def _prompt(self, segment: Segment, text: str):
        if segment.voice is not None:
            voice = self.voices[segment.voice]
        else:
            voice = self.voice or self.anchors.get(segment.speaker)
        return self.engine.build_prompt(text, voice=voice)

    def _make_anchor(self, segment: Segment, take: SegmentTake) -> None:
        """Zero-shot: the first segment of a speaker becomes the reference of its later segments."""
        key = segment.speaker
        if segment.voice is None and self.voice is None and key not in self.anchors:
            frames = take.codes[anchor_frames(take.audio, take.codes.shape[0])]
            if frames.shape[0]:
                self.anchors[key] = VoiceRef(codes=frames, transcript=strip_tags(take.text).strip())

    # ---------------------------------------------------------------- generation
    def _generate(self, index: int, text: str, seed: int, *, retry: bool, live: bool = False):
        """Generate segment `index`; yields raw audio chunks when `live`, and returns its SegmentTake: the
        only attempt, or with `retry` the one kept of those `again` asked for (`best`)."""
        segment = self.segments[index]
        prompt = self._prompt(segment, text)
        self.prompts[index] = prompt
        cap = self.max_frames or default_max_frames(text)
        takes: list[SegmentTake] = []
        attempts: list[Attempt] = []
        while True:
            chunks = []
            for chunk in self.engine.generate_stream(prompt=prompt, seed=seed, max_frames=cap, cancel=self.cancel,
                                                     **self.options):
                chunks.append(chunk.audio)
                self.metrics = chunk.metrics
                if live and len(chunk.audio):
                    yield chunk.audio
                last = chunk
            m = last.metrics
            audio = np.concatenate(chunks)
            heard = None
            if self.check is not None and retry and not live and not self.cancel.is_set():
                heard = self.check(text, audio)
            attempts.append(Attempt(seed, m.stop_reason, None if heard is None else float(heard)))
            takes.append(SegmentTake(index=index, text=text, seed=seed, codes=last.codes, audio=audio,
                                     stop_reason=m.stop_reason, retried=False, prompt_tokens=m.prompt_tokens,
                                     prefix_len=prompt.prefix_len, reused_tokens=m.reused_tokens))
            if live or not retry or self.cancel.is_set() or not again(attempts, above=self.check_above,
                                                                       retries=self.check_retries):
                break  # audio already heard cannot be taken back: a live segment is only flagged
            seed = _next_seed(seed)
        kept = best(attempts)
        return replace(takes[kept], retried=kept > 0 and attempts[0].stop_reason in CUT_SHORT,
                       attempts=tuple(attempts))

    def stream(self) -> Iterator[TakeChunk]:
        """Generate every segment in order and yield the take as it is assembled: the first segment as it
        is generated, each later one whole, followed by its pause. Stops at once when `cancel` is set.
        An open take yields each pause as soon as the segment after it is known, before that segment is made,
        so a listener's buffer holds the pause while the next segment is generated."""
        if not self._has(0):
            return
        started = time.perf_counter()
        emitted = 0  # samples of the first segment given to the limiter
        limiter, heard = PeakLimiter(), []  # and what it has let out of them
        first = self.segments[0]
        live = self.check is None  # listening needs the whole segment: with a check the first is made whole too
        gen = self._generate(0, first.text, self.seeds[0], retry=not live, live=live)
        raw = np.zeros(0, np.float32)
        while True:
            try:
                raw = np.concatenate([raw, next(gen)])
            except StopIteration as stop:
                take = stop.value
                break
            if self.cancel.is_set():
                gen.close()  # the engine's last, "cancelled" chunk is not part of the take
                return
            # Everything before the last loud window's end + KEEP − FADE is final: the trim and the
            # fade-out can only fall after it, and only the fade-in touches the start. Only whole windows
            # count, so a window judged now is judged the same way on the finished segment.
            complete = raw[:len(raw) // WINDOW * WINDOW]
            _, last = speech_bounds(complete) or (0, 0)
            limit = min(len(complete), last + KEEP) - FADE
            if limit > emitted:
                piece = raw[emitted:limit].copy()
                if emitted < FADE:
                    head = min(FADE, limit) - emitted
                    piece[:head] *= ramp(FADE)[emitted:emitted + head]
                emitted, piece = limit, limiter.feed(piece)
                if len(piece):
                    heard.append(piece)
                    if self.ttfa_ms is None:
                        self.ttfa_ms = 1e3 * (time.perf_counter() - started)
                    yield TakeChunk(piece, 0, 0, len(self.segments))
        if self.cancel.is_set():
            return
        self._finish(0, take, limiter, emitted, heard)
        tail = self.shaped[0][sum(map(len, heard)):]
        if self.ttfa_ms is None and len(tail):
            self.ttfa_ms = 1e3 * (time.perf_counter() - started)
        yield from self._closing(0, tail)
        self._sent(0)
        index = 1
        while self._has(index):
            segment = self.segments[index]
            if self.more is not None:
                for block in silence_blocks(pause_samples(self.segments[index - 1].pause_after)):
                    yield TakeChunk(block, index - 1, index, len(self.segments))
            take = yield from self._generate(index, segment.text, self.seeds[index], retry=self.retry)
            if self.cancel.is_set():
                return
            self._finish(index, take)
            yield from self._closing(index, self.shaped[index])
            self._sent(index)
            index += 1
        self.wall_ms = 1e3 * (time.perf_counter() - started)

    def _finish(self, index: int, take: SegmentTake, limiter: PeakLimiter | None = None, fed: int = 0,
                heard: list[np.ndarray] = ()) -> None:
        """Record a generated segment and shape it for the take, under the ceiling: through `limiter`, which
        already had the first `fed` samples of a streamed first segment and let `heard` out of them, or a
        fresh one. The first segment sets the loudness reference the first time; generated again, it is
        matched to that reference like the others."""
        self.takes[index] = take
        self.seeds[index] = take.seed
        self._make_anchor(self.segments[index], take)
        shaped = shape_segment(take.audio, trim_start=index > 0, reference_rms=self.reference_rms, ceiling=False)
        limiter = limiter or PeakLimiter()
        self.shaped[index] = np.concatenate([*heard, limiter.feed(shaped[fed:]), limiter.flush()])
        self.peak_cuts[index] = limiter.gain_db
        self.lengths[index] = len(self.shaped[index])
        if self.reference_rms is None:
            self.reference_rms = speech_rms(self.shaped[0]) or None

    def _sent(self, index: int) -> None:
        if not self.keep_audio:
            self.takes[index] = replace(self.takes[index], audio=np.zeros(0, np.float32))
            self.shaped[index] = None

    def run(self) -> np.ndarray:
        """Generate everything (draining `stream`) and return the assembled take."""
        for _ in self.stream():
            pass
        return self.assemble()

    # ---------------------------------------------------------------- editing
    def regenerate(self, index: int, *, seed: int | None = None, text: str | None = None) -> SegmentTake:
        """Generate segment `index` again (a new seed: `seed`, or the one after the last its take tried; or
        edited text) from the same anchor, listening as the take does; the other segments are untouched. A segment that made a zero-shot anchor keeps the old anchor, so the rest
        of the take keeps its voice; the new take is generated from it."""
        if not self.keep_audio:
            raise ValueError("this take was streamed without keeping its audio (keep_audio=False)")
        if not 0 <= index < len(self.segments) or self.takes[index] is None:
            raise ValueError(f"segment {index} has not been generated; the take has {len(self.segments)} segments")
        segment = self.segments[index]
        if text is not None:
            if not text.strip():
                raise ValueError("the edited segment is empty; type what it should say")
            segment = replace(segment, text=text, source=text)
            self.segments[index] = segment
        tried = self.takes[index].attempts  # the next seed after the last one tried, not a rejected attempt's
        seed = _next_seed(tried[-1].seed if tried else self.seeds[index]) if seed is None else int(seed)
        generator = self._generate(index, segment.text, seed, retry=self.retry)
        while True:
            try:
                next(generator)
            except StopIteration as stop:
                take = stop.value
                break
        self._finish(index, take)
        return take

    def assemble(self) -> np.ndarray:
        """The whole take: every segment as shaped for the take, with the planned pauses."""
        if not self.keep_audio:
            raise ValueError("this take was streamed without keeping its audio (keep_audio=False)")
        if any(s is None for s in self.shaped):
            raise ValueError("the take is not complete; generate every segment first")
        return np.concatenate([part for i, s in enumerate(self.segments)
                               for part in (self.shaped[i], *silence_blocks(pause_samples(s.pause_after)))])

    def spans(self) -> list[tuple[int, int]]:
        """[start, end) of each segment's samples in `assemble()` (also after streaming with
        keep_audio=False: the lengths are kept)."""
        out, at = [], 0
        for i, segment in enumerate(self.segments):
            out.append((at, at + self.lengths[i]))
            at += self.lengths[i] + pause_samples(segment.pause_after)
        return out

    def total_samples(self) -> int:
        """The assembled take's length in samples: every segment and every pause."""
        return sum(self.lengths) + sum(pause_samples(s.pause_after) for s in self.segments)

    def recipe(self) -> dict:
        """Everything needed to make this take again: the segments' texts, voices and seeds (the kept ones).
        A take that listened also records, per segment, the kept score and every attempt, and the policy
        (`listen`); `from_recipe` reads only the seeds, so the take is made again with no retry. `peak_ceiling`,
        when the true-peak ceiling acted on a segment: the ceiling and the deepest cut it made."""
        out = {"options": {**self.options, "max_frames": self.max_frames},
               "segments": [{"text": s.text, "source": s.source, "speaker": s.speaker, "voice": s.voice,
                             "pause_after": s.pause_after,
                             "seed": self.seeds[i], "stop_reason": t.stop_reason if t else None,
                             "flagged": bool(t and t.flagged),
                             **({"wer": None if t is None or t.wer is None else round(t.wer, 4),
                                 "attempts": [a.as_dict() for a in t.attempts] if t else []}
                                if self.check is not None else {})}
                            for i, (s, t) in enumerate(zip(self.segments, self.takes))]}
        out.update(peak_ceiling(min(self.peak_cuts, default=0.0)))
        if self.check is not None:
            out["listen"] = {"above": self.check_above, "retries": self.check_retries}
        return out


def _next_seed(seed: int, step: int = 1) -> int:
    """Segment i's seed is the take's seed + i, and a retry takes the next one; seeds stay 63-bit (SPEC D6)."""
    return (seed + step) % 2**63



__all__ = ["LongTake", "SegmentTake", "TakeChunk"]
