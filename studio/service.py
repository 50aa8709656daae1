"""The studio's service layer: one engine, one line for the GPU, shared by the Gradio page and the HTTP API.

`StudioService` owns policy only: request validation, voice and style resolution, fair admission to the
engine's batch (studio/gpu_queue.py over studio/admission.py), cancellation, and a bounded history of takes.
The engine does the work.

    service = StudioService(engine, voices, presets)
    request = SynthesisRequest(text="Hello there.", voice_id="Narrator", style="Calm narrator",
                               params=SamplingParams.of(seed=7))
    for chunk in service.stream(request):       # engine Chunks; the last one has final=True
        play(chunk.audio)

    handle = service.start(request)             # validated and resolved now; a TakeHandle
    handle.warnings                             # tag-lint and resolution notes
    handle.seed                                 # the seed it runs with (drawn when the request had none)
    for item in handle.stream(positions=True):  # also Queued(position) while it waits
        ...
    handle.take.recipe()                        # settings + seed + voice id that reproduce the take

Cancel with `handle.cancel.set()` (from any thread): a waiting take leaves the line at once, a running one stops
within a frame (the engine watches the same event; the takes beside it in the batch go on) and its slot takes the
next one. `request.caller` (default `OWNER`) decides its turn: `Caller.visitor(address)` for a visitor of a
public page.

HTTP API integration: app.py builds the Gradio `Blocks`, adds the documented endpoints that are also the MCP
tools (`studio.mcp.register(blocks, ...)`, before launch), launches, and then calls
`studio.api.register(blocks.app, service, api_key=...)`: the routes go on Gradio's own running FastAPI app
(`launch()` builds a new one each time), so the page, `/v1/audio/speech` and MCP share one port, one line and
this one service. Use `service.stream()` / `service.start()` / `service.synthesize()` for generation,
`service.run_exclusive(fn)` for any other GPU work (e.g. encoding a voice), and `studio.formats.encode_audio()`
for response bodies.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from engine.config import FRAME_RATE, SAMPLE_RATE
from engine.longform import has_pauses, model_pauses
from engine.normalize import looks_english
from engine.peaks import PeakLimiter
from engine.ssml import read_text
from engine.tokenizer import CONTROL_TAGS, estimate_seconds, lint_tags
from engine.types import SEED_LIMIT, Metrics, SamplingParams
from studio.admission import OWNER, Caller
from studio.aliases import Alias, VoiceAliases
from studio.gpu_queue import GpuQueue, Job, Queued, ServiceBusy, ServiceClosed, TooManyTakes
from studio.presets import apply_preset, check_style_prefix
from studio.pronounce import Dictionary, DictionaryStore, digest, merged
from studio.take import Take, TakeHandle
from studio.voices import Consent, VoiceNotFound

MAX_TEXT_CHARS = 4096  # the OpenAI speech API's `input` limit
MAX_TAKES = 4  # takes of one text made side by side (the page's "Takes")


@dataclass(frozen=True)
class SynthesisRequest:
    """One generation as asked. `style` is a preset name or a raw tag prefix (SPEC D1); `voice_id` names a saved
    voice (id or name); `ref_audio=(samples, sample_rate)` + `ref_text` clone a voice for this request only.
    `params.seed=None` draws a random seed when the take starts (`TakeHandle.seed`, recorded in the take)."""

    text: str
    voice_id: str | None = None
    style: str | None = None
    params: SamplingParams = field(default_factory=SamplingParams)
    ref_audio: tuple[np.ndarray, int] | None = None
    ref_text: str | None = None
    source: str = "api"  # "ui" or "api", recorded in the history
    ssml: bool | None = None  # the text is SSML: None decides by its `<speak>` root (engine/ssml.py)
    caller: Caller = OWNER  # whose take: its turn in the line, and which voices it may use
    # Pronunciation rules for this take instead of the studio's (studio/pronounce.py): a recipe's, which holds
    # the rules that fired when the take was made. None: the owner's dictionary as it stands.
    dictionary: Dictionary | None = None

    def validate(self) -> None:
        """Raise ValueError with a sentence the user can act on (the sampling settings were checked when
        `params` was built)."""
        if not isinstance(self.text, str) or not self.text.strip():
            raise ValueError("Text is empty: type something to say.")
        for what, value in (("Text", self.text), ("The style", self.style), ("The clip's transcript", self.ref_text)):
            _check_unicode(what, value)
        if len(self.text) > MAX_TEXT_CHARS:
            raise ValueError(f"Text is {len(self.text)} characters; the limit is {MAX_TEXT_CHARS}. Split it.")
        if self.voice_id is not None and self.ref_audio is not None:
            raise ValueError("Give either a saved voice or a reference clip, not both.")
        if self.ref_audio is not None:
            audio, sr = self.ref_audio
            if not isinstance(sr, int | np.integer) or sr <= 0 or np.asarray(audio).size == 0:
                raise ValueError("The reference clip is empty or has no sample rate; upload or record it again.")


def _settings_of(params: SamplingParams) -> dict[str, Any]:
    """A take's settings as the history, the recipe and the page's "Use settings" read them (the seed apart)."""
    return {k: v for k, v in params.as_dict().items() if k != "seed"}


class StudioService:
    """One engine, its batch behind the studio's one fair line, a bounded history behind them."""

    def __init__(self, engine, voices=None, presets=None, *, aliases: VoiceAliases | None = None,
                 history_size: int = 50, queue_timeout: float = 600.0, max_queue: int = 64,
                 visitor_concurrency: int = 2, visitor_queue: int = 4, dictionary: DictionaryStore | None = None):
        self.engine = engine
        self.voices = voices
        self.presets = presets
        self.dictionary = dictionary  # the owner's pronunciation dictionary (studio/pronounce.py), or None
        # OpenAI's voice names (what chat clients send) → voices and styles; the built-in table by default.
        self.aliases = aliases if aliases is not None else VoiceAliases.build(voices=voices, presets=presets)
        self.max_queue = max_queue
        self.line = GpuQueue(max(1, engine.info.max_batch), timeout=queue_timeout,
                             visitor_running=visitor_concurrency, visitor_waiting=visitor_queue, max_waiting=max_queue)
        self._history: collections.deque[Take] = collections.deque(maxlen=history_size)
        self._history_lock = threading.Lock()  # workers append while page/API threads read
        self._take_ids = itertools.count(1)
        self._last_batch = 0  # the most takes decoded together while the latest finished take ran
        self._merged: dict[tuple[str, str], Dictionary] = {}  # (owner's version, project's) → merged rules
        self._rules_lock = threading.Lock()

    # ---------------------------------------------------------------- the line

    @property
    def slots(self) -> int:
        return self.line.slots

    @property
    def queue_depth(self) -> int:
        """Requests waiting or running."""
        return self.line.depth

    def run_exclusive(self, fn: Callable[..., Any], *args, timeout: float | None = None, caller: Caller = OWNER,
                      **kwargs) -> Any:
        """Run `fn(*args, **kwargs)` (e.g. encoding a voice) in a slot, in `caller`'s turn with generations."""
        return self.line.run_exclusive(fn, *args, timeout=timeout, caller=caller, **kwargs)

    def transcriber_for(self, transcriber, caller: Caller = OWNER):
        """`transcriber` (studio/asr.py) with its calls made as device work in `caller`'s turn in the line:
        captions asked by the page or the API. None stays None."""
        return None if transcriber is None else transcriber.through(
            lambda fn, *args: self.run_exclusive(fn, *args, caller=caller))

    def close(self) -> None:
        self.line.close()

    def handle(self, request: SynthesisRequest, params: SamplingParams, warnings: list[str],
               work: Callable[[Job, TakeHandle], None]) -> TakeHandle:
        """A handle for `work` in this service's line (the long form builds its takes with it)."""
        return TakeHandle(self.line, request, params, warnings, work)

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

    def rules(self, project: Dictionary | None = None) -> Dictionary:
        """The owner's pronunciation dictionary as it stands (empty without a store), followed by `project`'s
        rules, which win over it. The merged dictionary is kept while neither changes (it compiles once)."""
        owner = self.dictionary.dictionary if self.dictionary is not None else Dictionary()
        if project is None or not project.rules:
            return owner
        key = (owner.version, project.version)
        with self._rules_lock:
            found = self._merged.get(key)
        if found is None:
            found = merged(owner, project)
            with self._rules_lock:
                if len(self._merged) >= 16:
                    self._merged.clear()
                self._merged[key] = found
        return found

    def respell(self, text: str, voice: tuple[str, ...] = (), language: str | None = None, *,
                project: Dictionary | None = None, only: Dictionary | None = None) -> str:
        """`text` (already normalised) as the model will read it: the pronunciation rules (the owner's, then
        `project`'s; or `only` these, a recipe's) in scope for `voice` (a voice's id and name) and `language`
        (None: "en" when the text reads as English) applied."""
        return self.pronounce(text, voice, language, project=project, only=only)[0]

    def pronounce(self, text: str, voice: tuple[str, ...] = (), language: str | None = None, *,
                  project: Dictionary | None = None, only: Dictionary | None = None) -> tuple[str, list]:
        """`respell`, with the rules that fired, in the order they apply: as a dictionary of their own they
        read `text` the same way."""
        rules = self.rules(project) if only is None else only
        if not rules.rules:
            return text, []
        language = language or ("en" if looks_english(text) else None)
        return rules.spoken(text, voice=voice, language=language)

    def pronunciation_key(self, text: str, voice: tuple[str, ...] = (), language: str | None = None, *,
                          project: Dictionary | None = None) -> str:
        """A hash of the rules that fire on `text` as `respell` applies them ("" when none do): what a project
        puts in a segment's cache key, so that changing a rule makes exactly the segments holding its word stale."""
        return digest(self.pronounce(text, voice, language, project=project)[1])

    def resolve_voice(self, voice_id: str | None, caller: Caller = OWNER):
        """A saved voice's id or name → its library record (None for zero-shot). A visitor finds only the
        voices shared with visitors, the presets and their own private voices."""
        if not voice_id:
            return None
        if self.voices is None:
            raise ValueError("No voice library is configured; use a reference clip instead.")
        # VoiceNotFound is a ValueError with a sentence for the user
        return self.voices.get(voice_id, visitor=not caller.owner)

    def resolve_alias(self, name: str | None, caller: Caller = OWNER) -> Alias | None:
        """The alias `name` stands for, or None: a configured alias wins over a saved voice of that name, which
        wins over the built-in table. Its voice is one `caller` may use (VoiceNotFound with a sentence if not)."""
        alias = self.aliases.get(name)
        if alias is None:
            return None
        if not alias.configured:
            try:
                self.resolve_voice(name, caller)
                return None  # a saved voice by that name: the owner meant it
            except (VoiceNotFound, ValueError):
                pass
        if alias.voice_id is not None:
            try:
                self.resolve_voice(alias.voice_id, caller)
            except VoiceNotFound:
                raise VoiceNotFound(f"The voice {alias.name!r} stands for is " + (
                    "not shared with visitors of this page." if not caller.owner else
                    f"gone ({alias.shown!r} was deleted); save it again or change --voice-alias.")) from None
        return alias

    def encode_codes(self, wav24k: np.ndarray):
        """The voice library's encoder callback: prepared 24 kHz audio → codec codes [T, 8] as numpy. Call it
        on a generation worker (a take's, a long take's) or through `run_exclusive`: encoding is device work."""
        return self.engine.encode_codes(wav24k).numpy()

    def start(self, request: SynthesisRequest) -> TakeHandle:
        """Validate and resolve `request` on the caller's thread (ValueError with a sentence for a bad one) and
        return its handle, with its warnings and its seed; nothing is queued until `handle.stream()`."""
        request.validate()
        voice_id, style = request.voice_id, request.style
        alias = self.resolve_alias(voice_id, request.caller)
        if alias is not None:
            voice_id = alias.voice_id
            style = style if style is not None else alias.style
        voice = self.resolve_voice(voice_id, request.caller)
        if style is None and voice is not None and voice.style:
            style = voice.style
        read = read_text(request.text, request.ssml)
        text, notes = read.text, list(read.warnings)
        if has_pauses(text):  # one prompt has no join to put exact silence at (the long form has)
            text = model_pauses(text)
            notes.append("pauses in a single take are the model's own pause tags, not exact silence; a long "
                         "take (the Long form tab, or the API) inserts them exactly")
        spoken, fired = self.pronounce(text.strip(), (voice.id, voice.name) if voice is not None else (),
                                       only=request.dictionary)
        prompt_text = apply_preset(spoken, self.resolve_style(style))
        clone = voice is not None or request.ref_audio is not None
        warnings = [*notes, *(f"{w.tag}: {w.message}" for w in lint_tags(prompt_text, clone=clone))]
        sampling_note = self.engine.info.sampling_note
        if sampling_note:  # a remote server that sets sampling itself: say so rather than pretend
            warnings.append(sampling_note)
        return self.handle(request, request.params.resolved(), warnings,
                           lambda job, handle: self._generate(job, handle, prompt_text, voice, style, fired))

    def stream(self, request: SynthesisRequest, *, positions: bool = False) -> Iterator[Any]:
        """Validate, queue, generate: yields the engine's Chunks (the last has `final=True`), and with
        `positions=True` first a `Queued` each time the request's place in the line changes. Raises
        ValueError for bad requests, ServiceBusy when the wait times out. A stopped take ends with a final
        chunk whose `metrics.stop_reason` is "cancelled". Use `start()` for the take's handle."""
        yield from self.start(request).stream(positions=positions)

    def _generate(self, job: Job, handle: TakeHandle, prompt_text: str, voice, style, fired=()) -> None:
        engine, request = self.engine, handle.request
        if voice is not None and engine.is_remote:
            ref = engine.encode_voice(voice.wav(), SAMPLE_RATE, transcript=voice.transcript or None)  # the clip travels
        elif voice is not None:
            ref = self.voices.voice_ref(voice.id, encode=self.encode_codes)  # codes cached in the library
        elif request.ref_audio is not None:
            audio, sr = request.ref_audio
            ref = engine.encode_voice(np.asarray(audio, dtype=np.float32), int(sr), transcript=request.ref_text)
        else:
            ref = None
        chunks = engine.generate_stream(prompt_text, voice=ref, params=handle.params, cancel=handle.cancel)
        # Every take leaves under the true-peak ceiling: each chunk is limited before it is sent, the
        # limiter holding back only the ~10 ms its look-ahead needs, which the final chunk carries.
        limiter = PeakLimiter()
        pieces: list[np.ndarray] = []
        last = None
        try:
            # The engine watches `cancel` every frame and ends with a final "cancelled" chunk.
            for chunk in chunks:
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
        handle.finish(self._record(handle, prompt_text, voice, style, last.metrics, pieces, fired, limiter.gain_db))
        job.out.put(last)

    def variants(self, handle: TakeHandle, takes: int) -> list[TakeHandle]:
        """`takes - 1` more takes like `handle`'s, with the seeds after its seed, for takes compared side by side
        (PRODUCT §7.9). Streamed beside it, they run in free slots and the engine decodes them in one batch with
        it; each gives the take its seed gives alone."""
        if isinstance(takes, bool) or not isinstance(takes, int) or not 1 <= takes <= MAX_TAKES:
            raise ValueError(f"Takes must be a whole number from 1 to {MAX_TAKES}.")
        seeds = [(handle.seed + i) % SEED_LIMIT for i in range(1, takes)]
        return [self.start(dataclasses.replace(handle.request, params=handle.params.with_seed(seed))) for seed in seeds]

    def synthesize(self, request: SynthesisRequest) -> Take:
        """Generate to the end and return the recorded take."""
        handle = self.start(request)
        for _ in handle.stream():
            pass
        if handle.take is None:
            raise RuntimeError("The generation was cancelled before it produced audio.")
        return handle.take

    def _record(self, handle: TakeHandle, prompt_text, voice, style, metrics: Metrics, pieces, fired=(),
                peak_cut_db: float = 0.0) -> Take:
        request = handle.request
        audio = np.concatenate(pieces)
        take = Take(
            id=next(self._take_ids), created=time.time(), text=request.text, prompt_text=prompt_text,
            voice_id=voice.id if voice is not None else None, voice_name=voice.name if voice is not None else None,
            style=style, settings=_settings_of(handle.params), seed=handle.seed, metrics=metrics,
            audio=audio, sample_rate=SAMPLE_RATE, warnings=list(handle.warnings), source=request.source,
            pronunciations=tuple(fired), peak_cut_db=peak_cut_db)
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
        encode = None if self.engine.is_remote else (lambda wav: self.run_exclusive(self.encode_codes, wav))
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



__all__ = ["MAX_TAKES", "MAX_TEXT_CHARS", "Queued", "ServiceBusy", "ServiceClosed", "StudioService", "SynthesisRequest",
           "TooManyTakes"]
