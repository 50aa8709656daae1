"""ZeroGPU (studio/takes/zerogpu.py): the engine's GPU entry points are decorated with `spaces.GPU` and a duration
that follows the request; nothing else touches CUDA; without ZeroGPU nothing changes.

The platform cannot run here. A stand-in `spaces` module records what is decorated and, like ZeroGPU, lets
CUDA be touched only inside a decorated call: `torch.cuda._lazy_init` and `torch.cuda.init` fail outside."""

from __future__ import annotations

import sys
import threading
import types

import numpy as np
import pytest
import torch

from studio.takes import zerogpu


class FakeSpaces(types.ModuleType):
    """`spaces` as ZeroGPU behaves: CUDA only inside decorated calls; durations asked per call."""

    def __init__(self):
        super().__init__("spaces")
        self.decorated, self.durations = [], []
        self.inside = threading.local()

    def GPU(self, fn, *, duration):  # noqa: N802 — the real decorator's name
        self.decorated.append(fn.__name__)
        fake = self

        def call(*args, **kwargs):
            fake.durations.append(duration(*args, **kwargs))
            fake.inside.on = True
            try:
                result = fn(*args, **kwargs)
                if hasattr(result, "__next__"):
                    result = list(result)  # a generator: run it inside the call
            finally:
                fake.inside.on = False
            return iter(result) if isinstance(result, list) else result
        return call


@pytest.fixture()
def zero(monkeypatch):
    fake = FakeSpaces()
    monkeypatch.setitem(sys.modules, "spaces", fake)
    monkeypatch.setenv("SPACES_ZERO_GPU", "true")

    def guarded():
        def check(*args, **kwargs):
            if not getattr(fake.inside, "on", False):
                raise AssertionError("CUDA was touched outside a @spaces.GPU call")
            return None
        return check

    monkeypatch.setattr(torch.cuda, "_lazy_init", guarded())
    monkeypatch.setattr(torch.cuda, "init", guarded())
    return fake


def test_duration_grows_with_the_text_and_the_takes():
    short = zerogpu.generation_seconds("Hi.")
    longer = zerogpu.generation_seconds("Hi. " * 60)
    assert short < longer
    assert zerogpu.generation_seconds("Hi.", takes=3) > short
    assert zerogpu.generation_seconds("Hi.", 500) == pytest.approx(zerogpu.START_S + 500 * zerogpu.MS_PER_FRAME / 1000,
                                                                  abs=1)


def test_without_zerogpu_nothing_changes(monkeypatch):
    engine = object()
    monkeypatch.delenv("SPACES_ZERO_GPU", raising=False)
    assert not zerogpu.active() and zerogpu.wrap(engine) is engine
    monkeypatch.setenv("SPACES_ZERO_GPU", "true")
    monkeypatch.setitem(sys.modules, "spaces", None)  # `spaces` not installed: an ImportError
    assert not zerogpu.active() and zerogpu.wrap(engine) is engine


def test_the_real_spaces_package_off_zerogpu_returns_the_function_itself(monkeypatch):
    spaces = pytest.importorskip("spaces", reason="the `spaces` package (requirements-dev.txt) is not installed")

    def fn():
        return 1
    assert spaces.GPU(fn, duration=lambda: 5) is fn  # off the platform the decorator is the identity


def test_gpu_entry_points_are_decorated_and_nothing_touches_cuda_at_load(zero, tmp_path):
    import app
    from engine.types import SamplingParams
    from studio.takes.service import StudioService, Order
    from studio.voices import VoiceLibrary
    from studio.voices.catalog import VoiceCatalog

    assert zerogpu.active()
    args = app.parse_args(["--demo", "--voices-dir", str(tmp_path / "voices")])
    engine = app.load_engine(args)  # import + load: any CUDA touch raises here
    assert isinstance(engine, zerogpu.ZeroGPUEngine) and engine.info.backend == "torch"
    assert sorted(zero.decorated) == ["encode_codes", "encode_voice", "stream"]
    with pytest.raises(AssertionError, match="outside"):  # the guard is live
        torch.cuda._lazy_init()

    service = StudioService(engine, VoiceCatalog(VoiceLibrary(tmp_path / "voices")))
    assert service.slots == 1 < engine._engine.info.max_batch  # one decorated call at a time
    try:
        take = service.synthesize(Order(text="Hello there.", params=SamplingParams(seed=1, max_frames=8)))
        assert take.audio.size > 0
        clip = np.sin(np.arange(24000) / 7.0).astype(np.float32) * 0.3
        service.save_voice(clip, 24000, name="Mine", transcript="", consent=True)
    finally:
        service.close()
    # One generation (duration from its cap) and one encode, each announced.
    assert zero.durations == [zerogpu.generation_seconds("Hello there.", 8), zerogpu.ENCODE_S]
