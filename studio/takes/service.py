"""The studio's service layer: one engine, one line for the GPU, shared by the Gradio page and the HTTP API.

`StudioService` holds what every take shares: the engine, its batch behind the one fair line
(studio/takes/gpu_queue.py over studio/takes/admission.py), the voice library, the style presets, the
pronunciation dictionary, the limits (studio/takes/limits.py) and a bounded history of takes. A take goes in
one way, whatever door it came by: an `Order` (studio/takes/order.py) is prepared into a `Plan`
(studio/takes/prepare.py) and run (studio/takes/run.py). The engine does the work.

    service = StudioService(engine, voices, presets)
    order = Order(text="Hello there.", voice="Narrator", style="Calm narrator", params=SamplingParams.of(seed=7))
    for chunk in service.stream(order):         # engine Chunks; the last one has final=True
        play(chunk.audio)

    handle = service.start(order)               # prepared now (ValueError with a sentence); a TakeHandle
    handle.warnings                             # tag-lint and resolution notes
    handle.seed                                 # the seed it runs with (drawn when the request had none)
    for item in handle.stream(positions=True):  # also Queued(position) while it waits
        ...
    handle.take.recipe()                        # settings + seed + voice id that reproduce the take

Cancel with `handle.cancel.set()` (from any thread): a waiting take leaves the line at once, a running one stops
within a frame (the engine watches the same event; the takes beside it in the batch go on) and its slot takes the
next one. `order.caller` (default `OWNER`) decides its turn: `Caller.visitor(address)` for a visitor of a
public page.

HTTP API integration: app.py builds the Gradio `Blocks`, adds the documented endpoints that are also the MCP
tools (`studio.api.mcp.register(blocks, ...)`, before launch), launches, and then calls
`studio.api.register(blocks.app, service, api_key=...)`: the routes go on Gradio's own running FastAPI app
(`launch()` builds a new one each time), so the page, `/v1/audio/speech` and MCP share one port, one line and
this one service. Use `service.stream()` / `service.start()` / `service.synthesize()` for generation,
`service.run_exclusive(fn)` for any other GPU work (e.g. encoding a voice), and `studio.audio.formats.encode_audio()`
for response bodies.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from engine.config import FRAME_RATE, SAMPLE_RATE
from engine.normalize import looks_english
from engine.tokenizer import CONTROL_TAGS
from engine.types import SEED_LIMIT, Metrics, SamplingParams
from studio.takes.admission import OWNER, Caller
from studio.takes.gpu_queue import GpuQueue, Queued, ServiceBusy, ServiceClosed, TooManyTakes
from studio.takes.limits import (
    HISTORY_SECONDS,
    HISTORY_TAKES,
    MAX_TAKES,
    QUEUE_TIMEOUT_S,
    VISITOR_RUNNING,
    VISITOR_WAITING,
    TakeLimits,
)
from studio.takes.order import Order
from studio.takes.prepare import Plan, prepare, prepare_open
from studio.takes.run import run
from studio.takes.take import Take, TakeHandle
from studio.text.presets import check_style_prefix
from studio.text.pronounce import Dictionary, DictionaryStore, digest, merged
from studio.voices import Consent, VoiceNotFound
from studio.voices.aliases import Alias, VoiceAliases
from studio.voices.warm import warm_voices


def _settings_of(params: SamplingParams) -> dict[str, Any]:
    """A take's settings as the history, the recipe and the page's "Use settings" read them (the seed apart)."""
    return {k: v for k, v in params.as_dict().items() if k != "seed"}


class StudioService:
    """One engine, its batch behind the studio's one fair line, a bounded history behind them."""

    def __init__(self, engine, voices=None, presets=None, *, aliases: VoiceAliases | None = None,
                 history_size: int = HISTORY_TAKES, queue_timeout: float = QUEUE_TIMEOUT_S,
                 visitor_concurrency: int = VISITOR_RUNNING, visitor_queue: int = VISITOR_WAITING,
                 dictionary: DictionaryStore | None = None, limits: TakeLimits | None = None, listener=None):
        self.engine = engine
        self.limits = limits if limits is not None else TakeLimits()
        self.listener = listener  # studio/audio/listen.py: a long take's segments heard when its order asks
        self.voices = voices
        self.presets = presets
        self.dictionary = dictionary  # the owner's pronunciation dictionary (studio/text/pronounce.py), or None
        # OpenAI's voice names (what chat clients send) → voices and styles; the built-in table by default.
        self.aliases = aliases if aliases is not None else VoiceAliases.build(voices=voices, presets=presets)
        self.line = GpuQueue(max(1, engine.info.max_batch), timeout=queue_timeout, visitor_running=visitor_concurrency,
                             visitor_waiting=visitor_queue, max_waiting=self.limits.max_queue)
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
        """`transcriber` (studio/audio/asr.py) with its calls made as device work in `caller`'s turn in the line:
        captions asked by the page or the API. None stays None."""
        return None if transcriber is None else transcriber.through(
            lambda fn, *args: self.run_exclusive(fn, *args, caller=caller))

    def close(self) -> None:
        self.line.close()

    @property
    def max_queue(self) -> int:
        return self.limits.max_queue

    def handle(self, order: Order, params: SamplingParams, warnings: list[str], work) -> TakeHandle:
        """A handle for other `work` in this service's line, in `order.caller`'s turn (a project's render job)."""
        return TakeHandle(self.line, order, params, warnings, work)

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
            found = merged(owner, project, sets=2)  # each within the caps; together up to twice them
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

    def respell_segments(self, segments: list, voice_of=lambda segment: None, *, project: Dictionary | None = None,
                         only: Dictionary | None = None) -> list:
        """Planned (normalised) segments with the pronunciation dictionary (the owner's, then `project`'s; or
        `only` these rules) applied: the text the model reads. `voice_of(segment)` is the segment's saved voice
        record (None: zero-shot), or its name as the voices map wrote it, for the rules scoped to a voice."""
        def names(segment) -> tuple[str, ...]:
            voice = voice_of(segment)
            return (voice,) if isinstance(voice, str) else (voice.id, voice.name) if voice is not None else ()
        return [dataclasses.replace(s, text=self.respell(s.text, names(s), project=project, only=only))
                for s in segments]

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

    def plan(self, order: Order) -> Plan:
        """`order` checked and planned (studio/takes/prepare.py): what `start` would run."""
        return prepare(self, order)

    def start(self, order: Order, **options) -> TakeHandle:
        """Prepare `order` on the caller's thread (ValueError with a sentence for a bad one) and return its
        handle, with its warnings and its seed; nothing is queued until `handle.stream()`. `options` go to
        studio/takes/run.py `run` (`record`, `pieces`, `listener`)."""
        return run(self, prepare(self, order), **options)

    def start_open(self, order: Order, feed, **options) -> TakeHandle:
        """An open long take whose sentences come from `feed` (studio/takes/sentences.py) as they are written."""
        return run(self, prepare_open(self, order), feed=feed, **options)

    def stream(self, order: Order, *, positions: bool = False) -> Iterator[Any]:
        """Prepare, queue, generate: yields the engine's Chunks (the last has `final=True`), and with
        `positions=True` first a `Queued` each time the take's place in the line changes. Raises ValueError
        for bad orders, ServiceBusy when the wait times out. A stopped take ends with a final chunk whose
        `metrics.stop_reason` is "cancelled"."""
        yield from self.start(order).stream(positions=positions)

    def variants(self, handle: TakeHandle, takes: int) -> list[TakeHandle]:
        """`takes - 1` more takes like `handle`'s, with the seeds after its seed, for takes compared side by side
        (PRODUCT §7.9). Streamed beside it, they run in free slots and the engine decodes them in one batch with
        it; each gives the take its seed gives alone. A long take is one take: it has no side-by-side."""
        if isinstance(takes, bool) or not isinstance(takes, int) or not 1 <= takes <= MAX_TAKES:
            raise ValueError(f"Takes must be a whole number from 1 to {MAX_TAKES}.")
        if takes > 1 and handle.plan is not None and handle.plan.long:
            handle.warnings.append("a long take is made once: Takes side by side compare one-prompt takes")
            return []
        seeds = [(handle.seed + i) % SEED_LIMIT for i in range(1, takes)]
        return [self.start(dataclasses.replace(handle.order, params=handle.params.with_seed(seed)), record=True)
                for seed in seeds]

    def synthesize(self, order: Order) -> Take:
        """Generate to the end and return the recorded take (a long one too)."""
        handle = self.start(order, record=True)
        for _ in handle.stream():
            pass
        if handle.take is None:
            raise RuntimeError("The generation was cancelled before it produced audio.")
        return handle.take

    def record(self, handle: TakeHandle, prompt_text: str, metrics: Metrics, pieces, fired=(),
               peak_cut_db: float = 0.0) -> Take:
        """A finished take into the history: at most HISTORY_TAKES takes and, beyond the newest, HISTORY_SECONDS
        of audio in all (the oldest go first)."""
        order, plan = handle.order, handle.plan
        voice = plan.voice if plan is not None else None
        audio = np.concatenate(pieces) if len(pieces) else np.zeros(0, np.float32)
        take = Take(
            id=next(self._take_ids), created=time.time(), text=plan.text if plan is not None else order.text,
            prompt_text=prompt_text,
            voice_id=voice.id if voice is not None else None, voice_name=voice.name if voice is not None else None,
            style=plan.style if plan is not None else None, settings=_settings_of(handle.params), seed=handle.seed,
            metrics=metrics, audio=audio, sample_rate=SAMPLE_RATE, warnings=list(handle.warnings), door=order.door,
            pronunciations=tuple(fired), peak_cut_db=peak_cut_db)
        with self._history_lock:
            self._history.append(take)
            self._last_batch = metrics.batch
            while len(self._history) > 1 and sum(t.seconds for t in self._history) - take.seconds > HISTORY_SECONDS:
                self._history.popleft()
        return take

    def trim(self, take_id: int, samples: int) -> Take | None:
        """A stopped take cut, in place in the history, to its first `samples`: what its listener heard before
        Stop (the engine runs ahead of playback, so more was made). A take already that short is kept as is."""
        with self._history_lock:
            for i, take in enumerate(self._history):
                if take.id == int(take_id) and 0 < samples < len(take.audio):
                    frames = min(take.metrics.frames, -(-samples * FRAME_RATE // SAMPLE_RATE))
                    self._history[i] = dataclasses.replace(
                        take, audio=take.audio[:samples], metrics=dataclasses.replace(take.metrics, frames=frames))
                    break
        return self.take(take_id)

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
        voice = self.voices.add((int(sample_rate), np.asarray(audio, dtype=np.float32)), name=name,
                                transcript=transcript or None, description=description or "",
                                style=self.resolve_style(style), seed=seed, consent=consent, encode=encode)
        warm_voices(self, [voice.id])  # its prompt prefix, kept for its takes (after any real take's prefill)
        return voice

    def list_styles(self) -> list[tuple[str, str]]:
        """(name, prefix) of every style preset, built-in first."""
        return [(p.name, p.prefix) for p in self.presets.list()] if self.presets is not None else []

    def save_style(self, name: str, style: str, *, description: str = ""):
        """Save the current style (a preset name or tag prefix) as a user preset; returns the preset."""
        if self.presets is None:
            raise ValueError("No preset store is configured.")
        return self.presets.add(name, self.resolve_style(style), description=description)

    # ---------------------------------------------------------------- status

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


__all__ = ["MAX_TAKES", "Order", "Queued", "ServiceBusy", "ServiceClosed", "StudioService", "TooManyTakes"]
