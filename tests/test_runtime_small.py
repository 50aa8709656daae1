"""The runtime's small pieces on the CPU, with stand-ins for the driver and the loaders: cuda-core launches
on a stream wrapped once, `python -m kernels.runtime` launches one kernel against torch, and `available()`
names the driver that is too old for this torch's CUDA."""

from __future__ import annotations

import types
from pathlib import Path

from kernels import loaders
from kernels.packing import Packed

REPO = Path(__file__).resolve().parents[1]


class FakeTorchStream:
    def __init__(self, handle: int):
        self.cuda_stream = handle


def cuda_core_loader_with_fakes(handle: int):
    """A CudaCoreLoader over a stand-in torch stream whose cuda-core calls are recorded (no GPU)."""
    log = {"wrapped": [], "launched": []}

    class Stream:
        @staticmethod
        def from_handle(h):
            log["wrapped"].append(h)
            return ("core stream", h)

    loader = object.__new__(loaders.CudaCoreLoader)
    loader.context = types.SimpleNamespace(ensure=lambda: None)
    loader.Stream, loader.LaunchConfig = Stream, lambda **kw: kw
    loader._launch = lambda stream, config, kernel, *args: log["launched"].append(stream)
    loader.core_streams = {}
    loader.stream = FakeTorchStream(handle)
    return loader, log


def test_cuda_core_launches_on_a_stream_wrapped_once_per_handle():
    loader, log = cuda_core_loader_with_fakes(0x7000)
    handle = (None, "kernel", [int])
    for _ in range(3):
        loader.launch(handle, (1, 1, 1), (128, 1, 1), 0, Packed(values=[4], format="i"))
    assert log["wrapped"] == [0x7000]  # wrapped at the first launch, not handed over as a torch stream
    assert log["launched"] == [("core stream", 0x7000)] * 3
    loader.stream = FakeTorchStream(0x8000)
    loader.launch(handle, (1, 1, 1), (128, 1, 1), 0, Packed(values=[4], format="i"))
    assert log["wrapped"] == [0x7000, 0x8000] and log["launched"][-1] == ("core stream", 0x8000)


def test_requirements_pin_cuda_core_to_the_api_the_loader_uses():
    """`Stream.from_handle` and the top-level `cuda.core` names: 1.2 is what the loader is written and
    checked against; a 2.x may move them again."""
    from packaging.requirements import Requirement

    lines = (REPO / "requirements.txt").read_text().splitlines()
    (req,) = [Requirement(line.split("#")[0]) for line in lines if line.startswith("cuda-core")]
    assert "1.2.0" in req.specifier and "1.2.2" in req.specifier
    assert "1.1.1" not in req.specifier and "2.0.0" not in req.specifier
    assert str(req.marker) == 'platform_system == "Linux" and platform_machine == "x86_64"'
