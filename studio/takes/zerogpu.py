"""ZeroGPU (Hugging Face Spaces): the GPU is attached only inside functions decorated with `@spaces.GPU`.

    engine = zerogpu.wrap(engine)   # unchanged unless `spaces` is installed and SPACES_ZERO_GPU is set

On ZeroGPU the `spaces` package (PyPI) hands a process a GPU slice for the length of one decorated call and
refuses a call whose announced `duration` exceeds what the visitor's quota allows, so each call announces
its own: `duration` is a function of the call's arguments, sized from the frames the take will make times
our ms/frame estimate, plus a fixed start cost. The studio's GPU work all goes through three engine methods
(`generate_stream`, a generator, which `spaces` supports; `encode_codes`; `encode_voice`), so those are
the decorated entry points, and nothing else may touch CUDA: on ZeroGPU, app.py loads the engine with the
torch backend and skips the warm-up, so nothing runs on the device at import or load time.

Backend. The cubin path needs a CUDA context, a PyCUDA module load and a graph capture per process; on
ZeroGPU each decorated call may run in a fresh worker, so that set-up would be paid on every take, where
the torch path's first step only pays a kernel warm-up. Under ZeroGPU the torch backend is the default.

What `spaces` needs and this module cannot check off the platform (docs/SPACES.md): that the generator's
chunks arrive as they are made, that cancelling (closing the generator) frees the slice at once, and the
real ms/frame of the slice; the estimate below is a flag.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterator
from dataclasses import replace

from engine.types import EngineInfo, SamplingParams

# The start cost of a call (moving the weights onto the slice, first-step warm-up) and the per-frame cost on
# the slice. The torch path runs far faster than real time on an H200 slice; 40 ms/frame (1 s of speech
# per second) leaves room for a busy slice. Both are flags: HIGGS_ZEROGPU_START_S, HIGGS_ZEROGPU_MS_PER_FRAME.
START_S = float(os.environ.get("HIGGS_ZEROGPU_START_S", 10))
MS_PER_FRAME = float(os.environ.get("HIGGS_ZEROGPU_MS_PER_FRAME", 40))
ENCODE_S = 15  # encoding a ≤ 30 s reference clip


def active() -> bool:
    """True on a ZeroGPU Space with `spaces` installed (the platform sets SPACES_ZERO_GPU). The first call
    imports `spaces`, which must happen before anything initialises CUDA: app.py calls it first."""
    if os.environ.get("SPACES_ZERO_GPU", "").strip().lower() not in ("1", "t", "true"):
        return False
    try:
        import spaces  # noqa: F401
    except ImportError:
        return False
    return True


def generation_seconds(text: str | None, max_frames: int | None = None, *, takes: int = 1,
                       ms_per_frame: float = MS_PER_FRAME) -> int:
    """The GPU time to announce for `takes` takes of `text`: their frames (the cap, or the automatic
    length for the text) times ms/frame, plus the start cost."""
    from engine.delay import default_max_frames

    frames = max_frames or default_max_frames(text or "")
    return math.ceil(START_S + takes * frames * ms_per_frame / 1000)


class ZeroGPUEngine:
    """The engine with its GPU entry points decorated by `spaces.GPU`; everything else is the engine's own."""

    is_remote = False  # `wrap` leaves a remote engine as it is

    def __init__(self, engine, gpu: Callable):
        self._engine = engine

        def stream(text=None, *, params: SamplingParams, **options) -> Iterator:
            # The decorated call may run in another process, which a threading.Event cannot reach: the
            # service's cancel closes this generator instead, which ends the call.
            yield from engine.generate_stream(text, params=params, **options)

        self._stream = gpu(stream, duration=lambda text=None, *, params, **_: generation_seconds(
            text, params.max_frames))
        self.encode_codes = gpu(engine.encode_codes, duration=lambda *_, **__: ENCODE_S)
        self.encode_voice = gpu(engine.encode_voice, duration=lambda *_, **__: ENCODE_S)

    @property
    def info(self) -> EngineInfo:
        """The engine's facts, with `max_batch` 1: each decorated call may run in its own process, where
        takes cannot share a batch, so the studio sends one take at a time."""
        return replace(self._engine.info, max_batch=1)

    def generate_stream(self, text=None, *, voice=None, params: SamplingParams | None = None, cancel=None,
                        **options) -> Iterator:
        for chunk in self._stream(text, voice=voice, params=SamplingParams.of(params, **options)):
            yield chunk
            if cancel is not None and cancel.is_set():
                return  # closing the decorated generator releases the GPU

    def generate(self, text=None, **options):
        import numpy as np
        return np.concatenate([c.audio for c in self.generate_stream(text, **options)])

    def __getattr__(self, name):
        return getattr(self._engine, name)


def wrap(engine):
    """`engine` with its GPU work decorated for ZeroGPU when `active()`, else `engine` itself."""
    if not active() or engine.is_remote:
        return engine
    import spaces

    return ZeroGPUEngine(engine, spaces.GPU)

