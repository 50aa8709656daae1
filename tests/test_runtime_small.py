"""The runtime's small pieces on the CPU, with stand-ins for the driver and the loaders: cuda-core launches
on a stream wrapped once, `python -m kernels.runtime` launches one kernel against torch, and `available()`
names the driver that is too old for this torch's CUDA."""

from __future__ import annotations

import types
from pathlib import Path

import pytest
import torch

from kernels import loaders, runtime
from kernels import manifest as mf
from kernels.packing import Packed
from tests.helpers import TOOLCHAIN

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


# ---------------------------------------------------------------------------------------------
# available(): the reason when torch cannot use the GPU

H200 = runtime.Probe(True, "", cc=90, name="NVIDIA H200", driver_cuda=12080, driver="570.86.15")


@pytest.fixture
def gpu_without_torch_cuda(monkeypatch, tmp_path):
    """The probe finds an H200 on an R570 driver (CUDA 12.8) with a manifest for it; torch is PyPI's CUDA 13.0
    build, which cannot initialise CUDA on that driver; cuda-core is the loader, over cuda-bindings 12."""
    d = tmp_path / "sm_90a"
    d.mkdir()
    (d / mf.MANIFEST).write_text(mf.Manifest(cc=90, target="sm_90a", triton="3.9.0", sources={}, kernels={}, root=d,
                                             toolchain=TOOLCHAIN).to_json())
    monkeypatch.setattr(runtime, "probe_driver", lambda device=0: H200)
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(runtime, "loader_choice", lambda: ("cuda.core", "PyCUDA is not installed"))
    monkeypatch.setattr(runtime, "package_version", lambda name: "12.9.7" if name == "cuda-bindings" else "1.2.2")
    runtime._available.cache_clear()
    yield lambda: runtime.available(root=tmp_path)
    runtime._available.cache_clear()


def test_a_driver_older_than_torchs_cuda_is_named_with_both_versions(gpu_without_torch_cuda):
    ok, why = gpu_without_torch_cuda()
    assert not ok and "no CUDA" not in why
    assert why.startswith("NVIDIA H200's driver 570.86.15 supports CUDA 12.8, too old for this torch's CUDA 13.0 "
                          "(torch ") and "needs driver 580.65.06 or newer" in why
    assert "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128" in why


def test_a_cpu_torch_still_says_it_has_no_cuda(gpu_without_torch_cuda, monkeypatch):
    monkeypatch.setattr(torch.version, "cuda", None)
    ok, why = gpu_without_torch_cuda()
    assert not ok and why.startswith("NVIDIA H200 is present but this torch build has no CUDA")


def test_bindings_newer_than_the_driver_come_first(gpu_without_torch_cuda, monkeypatch):
    monkeypatch.setattr(runtime, "package_version", lambda name: "13.5.0" if name == "cuda-bindings" else "1.2.2")
    ok, why = gpu_without_torch_cuda()
    bindings = runtime.bindings_problem(12080, "13.5.0")
    assert not ok and why.startswith(bindings + "; also NVIDIA H200's driver 570.86.15 supports CUDA 12.8")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # torch fits: the bindings alone refuse
    runtime._available.cache_clear()
    assert gpu_without_torch_cuda() == (False, bindings)
    monkeypatch.setattr(runtime, "loader_choice", lambda: ("pycuda", "PyCUDA is installed, the preferred loader"))
    runtime._available.cache_clear()
    ok, why = gpu_without_torch_cuda()  # PyCUDA loads the cubins: cuda-bindings play no part
    assert ok and "loader pycuda" in why
