"""The runtime's small pieces on the CPU, with stand-ins for the driver and the loaders: cuda-core launches
on a stream wrapped once, `python -m kernels.runtime` launches one kernel against torch, and `available()`
names the driver that is too old for this torch's CUDA; and the cubin backend's fused rows buffer, sized at
the first `begin` for every take."""

from __future__ import annotations

import types
from pathlib import Path

import pytest
import torch

from kernels import loaders, runtime
from kernels import manifest as mf
from kernels.binding import InterpretedKernels
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


# ---------------------------------------------------------------------------------------------
# python -m kernels.runtime: one kernel launched against torch

class StandInKernels(InterpretedKernels):
    """CubinKernels as `main` uses it, over the Triton interpreter (sm_90a's manifest, on the CPU)."""

    loader_name, loader_reason, device = "interpreter", "a test stand-in", "cpu"

    def __init__(self, loader=None, cc=None):
        super().__init__(mf.load(90))


def test_the_launch_check_passes_on_a_right_kernel_and_fails_on_a_wrong_one(monkeypatch):
    ok, line = runtime.launch_check(StandInKernels(), "cpu")
    assert ok and line.startswith("gemv_bf16 (16 × 256) against torch: rel err "), line
    launch = InterpretedKernels.launch

    def reversed_rows(self, name, grid, x, w, *rest, **kw):  # a kernel reading the wrong weight rows
        launch(self, name, grid, x, w.flip(0).contiguous(), *rest, **kw)

    monkeypatch.setattr(InterpretedKernels, "launch", reversed_rows)
    ok, line = runtime.launch_check(StandInKernels(), "cpu")
    assert not ok and "rel err" in line


def test_main_loads_the_manifest_launches_one_kernel_and_says_pass(monkeypatch, capsys):
    monkeypatch.setattr(runtime, "available", lambda: (True, "NVIDIA H200 (CC 9.0): 55 sm_90a cubins"))
    monkeypatch.setattr(runtime, "probe_driver", lambda device=0: H200)
    monkeypatch.setattr(runtime, "torch_cannot_use_gpu", lambda: None)
    monkeypatch.setattr(runtime, "open_loader", lambda device: "a loader")
    monkeypatch.setattr(runtime, "CubinKernels", StandInKernels)
    assert runtime.main() == 0
    out = capsys.readouterr().out
    assert f"loaded: interpreter (a test stand-in): {len(mf.load(90).kernels)} sm_90a cubins" in out
    assert "PASS: gemv_bf16 (16 × 256) against torch" in out and out.rstrip().endswith("(loader interpreter)")

    def refused(self, name, *args, **kwargs):
        raise RuntimeError("CUDA_ERROR_LAUNCH_FAILED")

    monkeypatch.setattr(InterpretedKernels, "launch", refused)
    assert runtime.main() == 1
    assert "FAIL: gemv_bf16 launch failed: RuntimeError: CUDA_ERROR_LAUNCH_FAILED" in capsys.readouterr().out


def test_main_without_a_driver_prints_the_reason_and_exits_2(monkeypatch, capsys):
    monkeypatch.setattr(runtime, "probe_driver", lambda device=0: runtime.Probe(
        False, "no NVIDIA driver: libcuda.so.1 is not installed on this machine"))
    runtime._available.cache_clear()
    try:
        assert runtime.main() == 2
    finally:
        runtime._available.cache_clear()
    out = capsys.readouterr().out
    assert "cubin path: unavailable: no NVIDIA driver: libcuda.so.1" in out
    assert "loaded:" not in out and "PASS" not in out and "FAIL" not in out


# ---------------------------------------------------------------------------------------------
# The fused single-stream step's rows buffer

def test_the_fused_rows_buffer_holds_max_len_rows_from_the_first_begin(parity_dir):
    """The self-check at load begins a take of a few rows; the buffer is sized to the cache then, so a real
    take's longer `begin` keeps the buffer and the graph captured over it (no recapture on the first take)."""
    pytest.importorskip("triton")
    from engine.backends.cubin import CubinBackend
    from engine.checkpoint import load_checkpoint
    from kernels.runtime import cubin_ops

    ckpt = load_checkpoint(parity_dir / "tiny_checkpoint", progress=False)
    be = CubinBackend(ckpt.dims, ckpt.backbone, ops=cubin_ops(InterpretedKernels(mf.load(90))), device="cpu",
                      precision="bf16", max_len=64)
    logits = torch.zeros(ckpt.dims.codebooks, ckpt.dims.codebook_vocab)
    be.begin(logits, 20, seed=0, temperature=0.0, top_k=0, top_p=1.0, max_rows=4)  # as the self-check does
    assert be.rows_buf.shape == (64, ckpt.dims.codebooks)
    rows_buf, captured = be.rows_buf, object()
    be.graph = captured  # stands in for the CUDA graph `rows` captures over these buffers on a GPU
    be.begin(logits, 10, seed=7, temperature=0.8, top_k=30, top_p=0.9, max_rows=54)
    assert be.rows_buf is rows_buf and be.graph is captured and be.take_rows == 54
    assert bool((be.rows_buf == -1).all())
