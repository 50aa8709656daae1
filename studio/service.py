"""The studio's service layer: one engine, one GPU queue, shared by the Gradio page and the HTTP API.

`StudioService` owns policy only: request validation, voice and style resolution, fair admission to the
engine's batch slots, cancellation, and a bounded history of takes. The engine does the work.

Slots: as many requests run at once as the engine decodes together (`engine.info.max_batch`, one thread
each while it runs); the engine's scheduler batches their steps (engine/scheduler.py). Which waiting request
gets a free slot is `studio/admission.py`'s rule: each request carries a `Caller`; the owner's go first, the
rest round robin across callers, and a visitor has at most `visitor_concurrency` running and `visitor_queue`
waiting. An engine that does not batch (a GPU backend loaded with max_batch 1 for its fused single-stream
path) reports max_batch 1 and the service runs one request at a time; a remote engine reports how many takes
it sends the server at once, and the server batches them.

    service = StudioService(engine, voices, presets)
    req = SynthesisRequest(text="Hello there.", voice_id="Narrator", style="Calm narrator", seed=7)
    for chunk in service.stream(req):          # engine Chunks; the last one has final=True
        play(chunk.audio)
    for item in service.stream(req, positions=True):   # also Queued(position) while the request waits
        ...
    req.warnings                               # tag-lint and resolution notes, filled before the first chunk
    req.take.recipe()                          # settings + seed + voice id that reproduce the take

Cancel with `req.cancel.set()` (from any thread): a waiting request leaves the queue at once, a running
one stops within a frame (the engine watches the same event; the takes beside it in the batch go on) and
its slot takes the next request. `req.caller` (default `OWNER`) decides its turn: `Caller.visitor(address)`
for a visitor of a public page.

HTTP API integration: app.py builds the Gradio `Blocks`, adds the documented endpoints that are also the MCP
tools (`studio.mcp.register(blocks, ...)`, before launch), launches, and then calls
`studio.api.register(blocks.app, service, api_key=...)`: the routes go on Gradio's own running FastAPI app
(`launch()` builds a new one each time), so the page, `/v1/audio/speech` and MCP share one port, one queue
and this one service. Use
`service.stream()` / `service.synthesize()` for generation, `service.run_exclusive(fn)` for any other GPU
work (e.g. encoding a voice), and `studio.formats.encode_audio()` for response bodies.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import queue
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from engine.config import FRAME_RATE, SAMPLE_RATE
from engine.tokenizer import CONTROL_TAGS, estimate_seconds, lint_tags
from engine.types import DEFAULT_REPEAT_GUARD, DEFAULT_TEMPERATURE, DEFAULT_TOP_K, DEFAULT_TOP_P, MAX_SEED
from studio.admission import OWNER, Admission, Caller, Refused
from studio.presets import apply_preset, check_style_prefix
from studio.voices import Consent

MAX_TEXT_CHARS = 4096  # the OpenAI speech API's `input` limit
MAX_FRAMES = 8192  # the backbone's context: no take can be longer than this many frames (~327 s)
MAX_TAKES = 4  # takes of one text made side by side (the page's "Takes")
RANDOM_SEED_BITS = 31  # drawn seeds stay below 2**31: exact in JSON numbers and in the browser


class ServiceBusy(TimeoutError):
    """The request waited longer than the queue timeout for a free slot on the GPU."""


class TooManyTakes(ServiceBusy):
    """A visitor already has as many takes waiting as one visitor may; the message says so."""


class ServiceClosed(RuntimeError):
    """The service was shut down."""


@dataclass
class SynthesisRequest:
    """One generation. `style` is a preset name or a raw tag prefix (SPEC D1); `voice_id` names a saved
    voice (id or name); `ref_audio=(samples, sample_rate)` + `ref_text` clone a voice for this request
    only. `seed=None` draws a random seed, recorded in the take so it can be reused."""

    text: str
    voice_id: str | None = None
    style: str | None = None
    temperature: float = DEFAULT_TEMPERATURE
    top_k: int = DEFAULT_TOP_K
    top_p: float = DEFAULT_TOP_P
    seed: int | None = None
    max_frames: int | None = None
    repeat_guard: int | None = DEFAULT_REPEAT_GUARD
    ref_audio: tuple[np.ndarray, int] | None = None
    ref_text: str | None = None
    cancel: threading.Event = field(default_factory=threading.Event)
    warnings: list[str] = field(default_factory=list)
    source: str = "api"  # "ui" or "api", recorded in the history
    caller: Caller = OWNER  # whose take: its turn in the queue, and which voices it may use
    take: Take | None = None  # set when the take is recorded
    finished: threading.Event = field(default_factory=threading.Event)

    def validate(self) -> None:
        """Raise ValueError with a sentence the user can act on."""
        if not isinstance(self.text, str) or not self.text.strip():
            raise ValueError("Text is empty: type something to say.")
        for what, value in (("Text", self.text), ("The style", self.style), ("The clip's transcript", self.ref_text)):
            _check_unicode(what, value)
        if len(self.text) > MAX_TEXT_CHARS:
            raise ValueError(f"Text is {len(self.text)} characters; the limit is {MAX_TEXT_CHARS}. Split it.")
        if not 0.0 <= float(self.temperature) <= 2.0:
            raise ValueError("Temperature must be between 0 (greedy) and 2.")
        if not 0.0 < float(self.top_p) <= 1.0:
            raise ValueError("top-p must be in (0, 1].")
        if int(self.top_k) < 0:
            raise ValueError("top-k must be 0 (off) or a positive number of candidates.")
        if self.seed is not None and not 0 <= int(self.seed) <= MAX_SEED:
            raise ValueError(f"Seed must be between 0 and {MAX_SEED}, or empty for a random one.")
        if self.max_frames is not None and not 1 <= int(self.max_frames) <= MAX_FRAMES:
            raise ValueError(f"Max length must be between 1 and {MAX_FRAMES} frames ({MAX_FRAMES // FRAME_RATE} s).")
        if self.voice_id is not None and self.ref_audio is not None:
            raise ValueError("Give either a saved voice or a reference clip, not both.")
        if self.ref_audio is not None:
            audio, sr = self.ref_audio
            if not isinstance(sr, int | np.integer) or sr <= 0 or np.asarray(audio).size == 0:
                raise ValueError("The reference clip is empty or has no sample rate; upload or record it again.")

    def settings(self) -> dict[str, Any]:
        return {"temperature": float(self.temperature), "top_k": int(self.top_k), "top_p": float(self.top_p),
                "max_frames": self.max_frames, "repeat_guard": self.repeat_guard}


@dataclass
class Take:
    """One finished (or stopped) generation, as the history keeps it."""

    id: int
    created: float
    text: str  # what the user typed
    prompt_text: str  # what the model saw: style prefix + text
    voice_id: str | None
    voice_name: str | None
    style: str | None
    settings: dict[str, Any]
    seed: int
    metrics: Any
    audio: np.ndarray
    sample_rate: int
    warnings: list[str]
    source: str

    @property
    def stop_reason(self) -> str:
        return getattr(self.metrics, "stop_reason", "") or ""

    @property
    def seconds(self) -> float:
        return len(self.audio) / self.sample_rate

    def recipe(self) -> dict[str, Any]:
        """Everything needed to reproduce this take (PRODUCT §7.7)."""
        return {"text": self.text, "voice_id": self.voice_id, "style": self.style, "seed": self.seed,
                **self.settings}


@dataclass(frozen=True)
class Queued:
    """Yielded by `stream(..., positions=True)` while a request waits for a slot, each time its place
    changes: 1 = next up (a slot is free: it starts at once), 2 = it cannot start at once (every slot busy,
    or the visitor's own takes fill its share) or one request is ahead of it; each further request that the
    admission rule starts before it adds one."""

    position: int


class _Job:
    """One unit of GPU work in the queue. `work(job)` runs on its own thread once admitted and puts results in
    `out`; work made of several parts (a long take's segments) calls `job.turn()` between them."""

    _ids = itertools.count(1)

    def __init__(self, work: Callable[[_Job], None], cancel: threading.Event, caller: Caller,
                 service: StudioService):
        self.id = next(self._ids)
        self.work = work
        self.cancel = cancel
        self.caller = caller
        self.started = False
        self.thread: threading.Thread | None = None
        self.out: queue.Queue = queue.Queue()
        self._service = service

    def turn(self) -> None:
        """Give the slot back and wait for the next turn under the admission rule, so a long take counts
        segment by segment. Returns at once when cancelled (the work then stops on its own)."""
        self._service._requeue(self)


_DONE = object()


class StudioService:
    """One engine, its batch slots behind fair admission (studio/admission.py), a bounded history behind them."""

    def __init__(self, engine, voices=None, presets=None, *, history_size: int = 50,
                 queue_timeout: float = 600.0, max_queue: int = 64, visitor_concurrency: int = 2,
                 visitor_queue: int = 4):
        self.engine = engine
        self.voices = voices
        self.presets = presets
        self.queue_timeout = queue_timeout
        self.max_queue = max_queue
        self.slots = max(1, engine.info.max_batch)
        self.admission = Admission(self.slots, visitor_running=visitor_concurrency, visitor_waiting=visitor_queue,
                                   max_waiting=max_queue)
        self._history: collections.deque[Take] = collections.deque(maxlen=history_size)
        self._history_lock = threading.Lock()  # workers append while page/API threads read
        self._take_ids = itertools.count(1)
        self._cond = threading.Condition()  # guards `admission` and every job's `started`
        self._last_batch = 0  # the most takes decoded together while the latest finished take ran
        self._closed = False

    # ---------------------------------------------------------------- queue

    @property
    def queue_depth(self) -> int:
        """Requests waiting or running."""
        with self._cond:
            return self.admission.waiting + self.admission.running

    def _dispatch(self) -> None:
        """Start every job the admission rule lets start now (call with `_cond` held)."""
        for job in self.admission.start():
            job.started = True
            if job.thread is None:
                job.thread = threading.Thread(target=self._run, args=(job,), name=f"higgs-take-{job.id}",
                                              daemon=True)
                job.thread.start()
        self._cond.notify_all()

    def _run(self, job: _Job) -> None:
        try:
            if not job.cancel.is_set():
                job.work(job)
        except BaseException as exc:  # handed to the caller's thread, never kills the service
            job.out.put(exc)
        finally:
            with self._cond:  # the slot is free before the consumer hears the end
                self.admission.done(job)
                self._dispatch()
            job.out.put(_DONE)

    def _submit(self, work: Callable[[_Job], None], cancel: threading.Event, caller: Caller) -> _Job:
        job = _Job(work, cancel, caller, self)
        with self._cond:
            if self._closed:
                raise ServiceClosed("The studio is shutting down.")
            try:
                self.admission.add(job)
            except Refused as exc:
                raise (TooManyTakes if exc.visitor else ServiceBusy)(str(exc)) from None
            self._dispatch()
        return job

    def _requeue(self, job: _Job) -> None:
        with self._cond:
            self.admission.done(job)
            job.started = False
            self.admission.add(job, again=True)
            self._dispatch()
            while not job.started:
                if job.cancel.is_set() or self._closed:
                    self.admission.remove(job)
                    self._cond.notify_all()
                    return
                self._cond.wait(0.1)

    def _wait_turn(self, job: _Job, timeout: float | None) -> Iterator[int]:
        """Yield `job`'s queue position each time it changes, until it is admitted (then `job.started` is True)
        or it is cancelled while waiting (it leaves the queue; `job.started` stays False)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        last = None
        while True:
            with self._cond:
                if job.started:
                    return
                if job.cancel.is_set() or (deadline is not None and time.monotonic() >= deadline):
                    self.admission.remove(job)
                    self._cond.notify_all()
                    if job.cancel.is_set():
                        return
                    raise ServiceBusy(f"Waited {timeout:.0f} s for a free slot on the GPU; try again.")
                position = self.admission.position(job)
                if position == last:
                    # Cancellation is an Event outside this condition, so wake up a few times a second to see it.
                    self._cond.wait(0.1)
                    continue
            last = position
            yield position  # outside the lock: the consumer may take its time

    def _results(self, job: _Job) -> Iterator[Any]:
        while True:
            item = job.out.get()
            if item is _DONE:
                return
            if isinstance(item, BaseException):
                raise item
            yield item

    def run_exclusive(self, fn: Callable[..., Any], *args, timeout: float | None = None, **kwargs) -> Any:
        """Run `fn(*args, **kwargs)` (e.g. encoding a voice) in a slot, in turn with generations: it holds one
        slot while it runs, and the engine's lock keeps its device work apart from the batch's steps."""
        job = self._submit(lambda j: j.out.put(("value", fn(*args, **kwargs))), threading.Event(), OWNER)
        for _ in self._wait_turn(job, self.queue_timeout if timeout is None else timeout):
            pass
        results = list(self._results(job))  # to the end: the slot is free when this returns
        if not results:
            raise RuntimeError("GPU work finished without a result")
        return results[0][1]

    def close(self) -> None:
        with self._cond:
            self._closed = True
            for job in self.admission.waiting_tickets():
                job.cancel.set()
            self._cond.notify_all()

    # ---------------------------------------------------------------- generation

    def resolve_style(self, style: str | None) -> str:
        """A preset name or a raw tag prefix → the checked tag prefix to put before the text (SPEC D1)."""
        style = (style or "").strip()
        if not style:
            return ""
        if style.startswith("<|"):
            return check_style_prefix(style)
        preset = self.presets.get(style) if self.presets is not None else None
        if preset is None:
            raise ValueError(f"Unknown style preset {style!r}; pick one from the list or write tags like "
                             "<|emotion:contemplation|>.")
        return preset.prefix

    def resolve_voice(self, voice_id: str | None, caller: Caller = OWNER):
        """A saved voice's id or name → its library record (None for zero-shot). A visitor finds only the
        voices shared with visitors, the presets and their own private voices."""
        if not voice_id:
            return None
        if self.voices is None:
            raise ValueError("No voice library is configured; use a reference clip instead.")
        # VoiceNotFound is a ValueError with a sentence for the user
        return self.voices.get(voice_id, visitor=not caller.owner)

    def encode_codes(self, wav24k: np.ndarray):
        """The voice library's encoder callback: prepared 24 kHz audio → codec codes [T, 8] as numpy. Call it
        on a generation worker (a take's, a long take's) or through `run_exclusive`: encoding is device work."""
        return self.engine.encode_codes(wav24k).numpy()

    def prepare(self, request: SynthesisRequest) -> tuple[str, Any, Any]:
        """Validate and resolve `request`: returns (prompt_text, voice_record, voice_ref_or_None).
        Fills `request.warnings` and `request.seed`. Runs on the caller's thread except for encoding."""
        request.validate()
        request.warnings.clear()
        voice = self.resolve_voice(request.voice_id, request.caller)
        style = request.style
        if style is None and voice is not None and getattr(voice, "style", None):
            style = voice.style
        prompt_text = apply_preset(request.text.strip(), self.resolve_style(style))
        clone = voice is not None or request.ref_audio is not None
        request.warnings.extend(f"{w.tag}: {w.message}" for w in lint_tags(prompt_text, clone=clone))
        sampling_note = self.engine.info.sampling_note
        if sampling_note:  # a remote server that sets sampling itself: say so rather than pretend
            request.warnings.append(sampling_note)
        if request.seed is None:
            request.seed = secrets.randbits(RANDOM_SEED_BITS)
        request.seed = int(request.seed)
        return prompt_text, voice, style

    def queued(self, work: Callable[[_Job], None], cancel: threading.Event, *, caller: Caller = OWNER,
               positions: bool = False) -> Iterator[Any]:
        """Run `work(job)` in a slot, in turn with every other request (`caller`'s turn under the admission
        rule), and yield what it puts in `job.out`; with `positions=True`, first a `Queued` each time the job's
        place in the queue changes. Nothing is yielded after a cancel while waiting (the job leaves the queue)."""
        job = self._submit(work, cancel, caller)
        for position in self._wait_turn(job, self.queue_timeout):
            if positions:
                yield Queued(position)
        if not job.started:  # cancelled while waiting
            return
        yield from self._results(job)

    def stream(self, request: SynthesisRequest, *, positions: bool = False) -> Iterator[Any]:
        """Validate, queue, generate: yields the engine's Chunks (the last has `final=True`), and with
        `positions=True` first a `Queued` each time the request's place in the queue changes. Raises
        ValueError for bad requests, ServiceBusy when the queue wait times out.

        The take is recorded on the worker side, so it lands in the history (and in `request.take`, with
        `request.finished` set) even when the consumer goes away; a stopped take ends with a final chunk
        whose `metrics.stop_reason` is "cancelled"."""
        prompt_text, voice, style = self.prepare(request)
        try:
            yield from self.queued(lambda job: self._generate(job, request, prompt_text, voice, style),
                                   request.cancel, caller=request.caller, positions=positions)
        finally:
            if not request.finished.is_set():
                request.cancel.set()  # stopped, failed or abandoned by the consumer: free the slot

    def _generate(self, job: _Job, request: SynthesisRequest, prompt_text: str, voice, style) -> None:
        engine = self.engine
        if voice is not None and engine.is_remote:
            ref = engine.encode_voice(voice.wav(), SAMPLE_RATE, transcript=voice.transcript or None)  # the clip travels
        elif voice is not None:
            ref = self.voices.voice_ref(voice.id, encode=self.encode_codes)  # codes cached in the library
        elif request.ref_audio is not None:
            audio, sr = request.ref_audio
            ref = engine.encode_voice(np.asarray(audio, dtype=np.float32), int(sr), transcript=request.ref_text)
        else:
            ref = None
        chunks = engine.generate_stream(
            prompt_text, voice=ref, temperature=float(request.temperature), top_k=int(request.top_k),
            top_p=float(request.top_p), seed=request.seed, max_frames=request.max_frames,
            repeat_guard=request.repeat_guard, cancel=request.cancel)
        pieces: list[np.ndarray] = []
        last = None
        try:
            # The engine watches `cancel` every frame and ends with a final "cancelled" chunk.
            for chunk in chunks:
                if len(chunk.audio):
                    pieces.append(np.asarray(chunk.audio, dtype=np.float32))
                last = chunk
                if chunk.final:
                    break
                job.out.put(chunk)
        finally:
            chunks.close()
        if last is None:
            return
        if not last.final:
            last = dataclasses.replace(last, audio=np.zeros(0, np.float32), final=True,
                                       metrics=_with_stop_reason(last.metrics, "cancelled"))
        request.take = self._record(request, prompt_text, voice, style, last.metrics, pieces)
        request.finished.set()
        job.out.put(last)

    def variants(self, request: SynthesisRequest, takes: int) -> list[SynthesisRequest]:
        """`takes - 1` more requests like `request`, with the seeds after its seed (drawn now if it has none),
        for takes compared side by side (PRODUCT §7.9). Streamed beside `request`, they run in free slots
        and the engine decodes them in one batch with it; each gives the take its seed gives alone."""
        if isinstance(takes, bool) or not isinstance(takes, int) or not 1 <= takes <= MAX_TAKES:
            raise ValueError(f"Takes must be a whole number from 1 to {MAX_TAKES}.")
        if request.seed is None:
            request.seed = secrets.randbits(RANDOM_SEED_BITS)
        return [dataclasses.replace(request, seed=(int(request.seed) + i) % (MAX_SEED + 1), cancel=threading.Event(),
                                    warnings=[], take=None, finished=threading.Event()) for i in range(1, takes)]

    def synthesize(self, request: SynthesisRequest) -> Take:
        """Generate to the end and return the recorded take."""
        for _ in self.stream(request):
            pass
        if request.take is None:
            raise RuntimeError("The generation was cancelled before it produced audio.")
        return request.take

    def _record(self, request, prompt_text, voice, style, metrics, pieces) -> Take:
        take = Take(
            id=next(self._take_ids), created=time.time(), text=request.text, prompt_text=prompt_text,
            voice_id=getattr(voice, "id", None), voice_name=getattr(voice, "name", None), style=style,
            settings=request.settings(), seed=request.seed, metrics=metrics,
            audio=np.concatenate(pieces) if pieces else np.zeros(0, np.float32), sample_rate=SAMPLE_RATE,
            warnings=list(request.warnings), source=request.source)
        with self._history_lock:
            self._history.append(take)
            self._last_batch = metrics.batch
        return take

    def take(self, take_id: int) -> Take | None:
        return next((t for t in self.history if t.id == int(take_id)), None)

    @property
    def history(self) -> list[Take]:
        """The latest takes, oldest first (a snapshot)."""
        with self._history_lock:
            return list(self._history)

    # ---------------------------------------------------------------- voices and presets

    def list_voices(self, caller: Caller = OWNER) -> list:
        """The voices `caller` may use: for a visitor, those shared with visitors and the presets."""
        return self.voices.list(visitor=not caller.owner) if self.voices is not None else []

    def save_voice(self, audio: np.ndarray, sample_rate: int, *, name: str, transcript: str | None = None,
                   description: str = "", style: str | None = None, seed: int | None = None,
                   consent: Consent | bool = False, asserted_by: str = "studio user"):
        """Prepare, encode (on the GPU worker, in turn) and save a voice. `consent` must be given: either a
        `Consent` record or True (the user ticked the box), else ValueError."""
        if self.voices is None:
            raise ValueError("No voice library is configured.")
        if consent is True:
            consent = Consent(asserted_by=asserted_by)
        if not isinstance(consent, Consent):
            raise ValueError("Confirm that you have the speaker's permission (tick the consent box) to save a voice.")
        # Encode now, in turn on the GPU worker, so the first take with this voice starts at full speed. A remote
        # engine has no codec here: its voices travel as clips.
        encode = None if self.engine.is_remote else \
            (lambda wav: self.run_exclusive(self.encode_codes, wav))
        return self.voices.add((int(sample_rate), np.asarray(audio, dtype=np.float32)), name=name,
                               transcript=transcript or None, description=description or "",
                               style=self.resolve_style(style), seed=seed, consent=consent, encode=encode)

    def list_styles(self) -> list[tuple[str, str]]:
        """(name, prefix) of every style preset, built-in first."""
        return [(p.name, p.prefix) for p in self.presets.list()] if self.presets is not None else []

    def save_style(self, name: str, style: str, *, description: str = ""):
        """Save the current style (a preset name or tag prefix) as a user preset; returns the preset."""
        if self.presets is None:
            raise ValueError("No preset store is configured.")
        return self.presets.add(name, self.resolve_style(style), description=description)

    # ---------------------------------------------------------------- status

    def estimate(self, text: str) -> dict[str, float]:
        """Duration estimate for text before generating (PRODUCT §7.11): seconds and frames."""
        seconds = estimate_seconds(text or "")
        return {"seconds": seconds, "frames": round(seconds * FRAME_RATE)}

    def status(self) -> dict[str, Any]:
        """Engine facts for the status panel and `/health`-style routes."""
        info = self.engine.info.as_dict()
        keys = ("checkpoint", "device", "precision", "backend", "kernel_arch", "kernel_loader", "demo")
        status = {k: info.get(k) for k in keys}
        status.update({k: v for k, v in info.items() if k not in status})
        status["demo"] = bool(status.get("demo"))
        status["queue_depth"] = self.queue_depth
        with self._history_lock:
            status["batch_size"] = self._last_batch
        status["max_batch"] = self.slots
        status["control_tags"] = len(CONTROL_TAGS)
        return status


def _check_unicode(what: str, value: str | None) -> None:
    """Refuse text that is not valid Unicode: a lone surrogate (JSON allows "\\ud800") breaks the tokenizer."""
    if value is None:
        return
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"{what} holds an invalid character at position {exc.start} (a lone UTF-16 surrogate). "
                         "Send valid Unicode text.") from None


def _with_stop_reason(metrics, reason: str):
    try:
        return dataclasses.replace(metrics, stop_reason=reason)
    except (TypeError, ValueError):
        return metrics
