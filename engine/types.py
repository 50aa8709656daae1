"""The engine's value types: the sampling settings of a take (`SamplingParams`, with the one set of
defaults and limits, and the one validation), what a take streams (`Chunk`, `Metrics`), what an engine runs (`EngineInfo`), and the interface every
engine offers (`SpeechEngine`, implemented by the local `Engine` and the HTTP `RemoteEngine`).

No torch import: the remote client, the studio and the API read these without loading the model code.
"""

from __future__ import annotations

import math
import numbers
import secrets
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from .config import FRAME_RATE

if TYPE_CHECKING:
    import numpy as np
    import torch

DEFAULT_TEMPERATURE = 0.8
DEFAULT_TOP_K = 30
DEFAULT_TOP_P = 0.8
DEFAULT_REPEAT_GUARD = 32

# The one set of limits: `SamplingParams` refuses anything outside them, and the page's controls span them.
MAX_TEMPERATURE = 2.0  # 0 is greedy
MAX_TOP_P = 1.0  # top_p is in (0, MAX_TOP_P]; 1 turns it off
MAX_FRAMES = 8192  # the backbone's context: no take can be longer than this many frames (~327 s)
MIN_REPEAT_GUARD = 2  # frames: "the last frame equals itself" would end every take at once
# top_k is open above (one at or past the vocabulary keeps every candidate, as 0 does); the page's slider
# stops here.
TOP_K_SLIDER_MAX = 200
# What a visitor of a public page (a key set, no login) may generate: a minute of speech from a short text.
PUBLIC_MAX_FRAMES = 60 * FRAME_RATE

# Seeds are 63-bit (SPEC D6): they fit a signed 64-bit integer everywhere they travel (JSON, SQLite, the
# kernels' i64 arguments), so the studio, the API, the voice library and the engine accept the same range.
SEED_LIMIT = 2 ** 63
MAX_SEED = SEED_LIMIT - 1
# A drawn seed stays below 2**31, so the browser's 32-bit integer arithmetic and any JSON reader hold it
# exactly; a given one may use the whole 63-bit range.
DRAWN_SEED_BITS = 31


def new_seed() -> int:
    """A random seed for a take that was given none (reported with the take so it can be reproduced)."""
    return secrets.randbits(DRAWN_SEED_BITS)


def _whole(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)  # numpy integers count


def _number(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


def check_seed(seed) -> int:
    """`seed` as a Python int, or ValueError when it is not a whole number in [0, 2**63)."""
    if not _whole(seed) or not 0 <= int(seed) < SEED_LIMIT:
        raise ValueError("seed must be a whole number from 0 to 2**63 - 1 (63-bit), or empty for a random one; "
                         f"got {seed!r}")
    return int(seed)


def check_options(temperature: float, top_k: int, top_p: float) -> None:
    """Raise ValueError with a sentence the user can act on."""
    if not _number(temperature) or not 0 <= temperature <= MAX_TEMPERATURE:
        raise ValueError(f"temperature must be a number from 0 (greedy) to {MAX_TEMPERATURE:g}; got {temperature!r}")
    if not _whole(top_k) or top_k < 0:
        raise ValueError(f"top_k must be 0 (off) or a whole number of candidates; got {top_k!r}")
    if not _number(top_p) or not 0 < top_p <= MAX_TOP_P:
        raise ValueError(f"top_p must be in (0, {MAX_TOP_P:g}] ({MAX_TOP_P:g} turns it off); got {top_p!r}")


def check_max_frames(max_frames, limit: int | None = MAX_FRAMES) -> int | None:
    """`max_frames` as an int (None: from the text), or ValueError outside [1, limit]."""
    if max_frames is None:
        return None
    if not _whole(max_frames) or max_frames < 1 or (limit is not None and max_frames > limit):
        most = f" to {limit} ({limit // FRAME_RATE} s)" if limit is not None else ""
        raise ValueError(f"max_frames must be a whole number of frames ({FRAME_RATE} per second) from 1{most}; "
                         f"got {max_frames!r}")
    return int(max_frames)


def check_repeat_guard(repeat_guard) -> int | None:
    """`repeat_guard` as an int (None: off), or ValueError below MIN_REPEAT_GUARD."""
    if repeat_guard is None:
        return None
    if not _whole(repeat_guard) or repeat_guard < MIN_REPEAT_GUARD:
        raise ValueError(f"repeat_guard must be a number of frames ≥ {MIN_REPEAT_GUARD}, or None (0 on the page) to "
                         f"disable it; got {repeat_guard!r}")
    return int(repeat_guard)


@dataclass(frozen=True)
class SamplingParams:
    """How one take is sampled and when it stops. Validated on construction, so a bad value raises at
    the call that made it. `seed=None` means "draw one" (`resolved()` does, and the take reports it);
    `max_frames=None` means "from the text" (engine/delay.py `default_max_frames`); `repeat_guard=None`
    disables the repeat guard."""

    temperature: float = DEFAULT_TEMPERATURE
    top_k: int = DEFAULT_TOP_K
    top_p: float = DEFAULT_TOP_P
    seed: int | None = None
    max_frames: int | None = None
    repeat_guard: int | None = DEFAULT_REPEAT_GUARD

    def __post_init__(self):
        check_options(self.temperature, self.top_k, self.top_p)
        if self.seed is not None:
            object.__setattr__(self, "seed", check_seed(self.seed))
        object.__setattr__(self, "max_frames", check_max_frames(self.max_frames))
        object.__setattr__(self, "repeat_guard", check_repeat_guard(self.repeat_guard))

    @classmethod
    def of(cls, params: SamplingParams | None = None, **options) -> SamplingParams:
        """`params` (default: the defaults) with the given keyword options replacing its fields: how the
        engines turn `temperature=…, seed=…` keywords and `params=` into one validated value."""
        unknown = set(options) - {f.name for f in fields(cls)}
        if unknown:
            raise TypeError(f"unknown sampling option(s) {sorted(unknown)}")
        base = params if params is not None else cls()
        return replace(base, **options) if options else base

    def resolved(self) -> SamplingParams:
        """These settings with a seed: the given one, else a fresh random one."""
        return self if self.seed is not None else replace(self, seed=new_seed())

    def with_seed(self, seed: int) -> SamplingParams:
        return replace(self, seed=seed)

    def as_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True)
class Metrics:
    """Numbers of one take so far (each chunk carries a snapshot; the final chunk's are the totals)."""

    ttfa_ms: float | None  # call → first audio chunk ready
    rtf: float  # wall time / audio time (< 1 is faster than real time)
    frames: int
    rows: int
    ms_per_frame: float  # decode time per generated row (the model's step cost; shared steps count whole)
    prefill_ms: float
    prompt_tokens: int
    reused_tokens: int  # prompt positions whose KV came from the prefix cache
    peak_mem_bytes: int
    mem_kind: str  # "vram" (torch.cuda.max_memory_allocated) or "rss" (peak resident set, /proc)
    precision: str
    backend: str
    device: str
    seed: int | None
    stop_reason: str | None  # "eoc", "max_frames", "repeat_guard", "cancelled"; None until the end
    batch: int = 1  # most takes decoded together in one step while this take ran (1 = alone)
    queued_ms: float = 0.0  # call → a batch slot was free for this take

    @classmethod
    def blank(cls, **values) -> Metrics:
        """Metrics with a neutral value in every field (no audio yet, nothing measured), `values` overriding
        them: what a test's scripted engine reports."""
        neutral = {"ttfa_ms": None, "rtf": 0.0, "frames": 0, "rows": 0, "ms_per_frame": 0.0, "prefill_ms": 0.0,
                   "prompt_tokens": 0, "reused_tokens": 0, "peak_mem_bytes": 0, "mem_kind": "rss", "precision": "",
                   "backend": "", "device": "", "seed": None, "stop_reason": None}
        return cls(**{**neutral, **values})


@dataclass(frozen=True)
class Chunk:
    audio: np.ndarray  # float32 mono 24 kHz samples of this chunk
    metrics: Metrics
    final: bool
    codes: torch.Tensor | None = None  # the take's frames [T, 8] (0..1023), on the final chunk only


_LOCAL = {"kind": "local"}
_REMOTE = {"kind": "remote"}


@dataclass(frozen=True)
class EngineInfo:
    """What an engine runs, for status panels, `/health` and logs: the facts every engine has, then a local
    engine's (`Engine.load` fills them) or a remote one's (`RemoteEngine.info`). `extra` holds a backend's
    own facts (kernel target and loader, self-check, graphs). `as_dict()` is the flat JSON form."""

    device: str
    precision: str
    backend: str
    checkpoint: str = ""
    demo: bool = False
    max_batch: int = 1  # takes decoded (or sent) together
    root: str | None = field(default=None, metadata=_LOCAL)
    precision_reason: str | None = field(default=None, metadata=_LOCAL)
    backend_reason: str | None = field(default=None, metadata=_LOCAL)
    params: int | None = field(default=None, metadata=_LOCAL)
    tokenizer: str | None = field(default=None, metadata=_LOCAL)
    codec: bool = field(default=False, metadata=_LOCAL)
    memory_plan: str | None = field(default=None, metadata=_LOCAL)
    min_rows: int = field(default=1, metadata=_LOCAL)  # a batched step's rows are padded to this many
    remote: str | None = field(default=None, metadata=_REMOTE)  # the server's URL, redacted
    remote_kind: str | None = field(default=None, metadata=_REMOTE)
    server_device: str | None = field(default=None, metadata=_REMOTE)
    server_backend: str | None = field(default=None, metadata=_REMOTE)
    sampling_note: str | None = field(default=None, metadata=_REMOTE)  # the server ignores some settings
    extra: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """The facts as one flat dict: the common ones, this kind's (local or remote; a remote engine's
        `sampling_note` only when set), then `extra`."""
        kind = "remote" if self.remote is not None else "local"
        out = {}
        for f in fields(self):
            where = f.metadata.get("kind")
            unset_note = f.name == "sampling_note" and self.sampling_note is None
            if f.name == "extra" or where not in (None, kind) or unset_note:
                continue
            out[f.name] = getattr(self, f.name)
        return {**out, **self.extra}


@runtime_checkable
class SpeechEngine(Protocol):
    """What the studio drives: a local `engine.generate.Engine` or an `engine.remote.RemoteEngine`.
    Sampling settings come as keyword options (temperature=, top_k=, top_p=, seed=, max_frames=,
    repeat_guard=) or as `params=SamplingParams(...)`. `is_remote`: the engine has no local codec, so a
    saved voice travels as its clip (`encode_voice`), never as codes."""

    is_remote: bool

    @property
    def info(self) -> EngineInfo: ...

    def generate_stream(self, text: str, *, voice=None, params: SamplingParams | None = None,
                        cancel: threading.Event | None = None, **options) -> Iterator[Chunk]: ...

    def generate(self, text: str, **options) -> np.ndarray: ...

    def encode_voice(self, wav, sample_rate: int | None, transcript: str | None = None): ...


__all__ = ["SamplingParams", "Metrics", "Chunk", "EngineInfo", "SpeechEngine", "DEFAULT_TEMPERATURE", "DEFAULT_TOP_K",
           "DEFAULT_TOP_P", "DEFAULT_REPEAT_GUARD", "MAX_TEMPERATURE", "MAX_TOP_P", "MAX_FRAMES", "MIN_REPEAT_GUARD",
           "TOP_K_SLIDER_MAX", "PUBLIC_MAX_FRAMES", "SEED_LIMIT", "MAX_SEED", "DRAWN_SEED_BITS", "new_seed",
           "check_seed", "check_options", "check_max_frames", "check_repeat_guard"]
