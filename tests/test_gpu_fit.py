"""A GPU that torch cannot use is named, never silently replaced by the CPU: the driver probe and torch
are monkeypatched, one case each (CPU-only torch, driver too old, arch not in the build, no GPU)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from engine import device as engine_device
from kernels import compat, runtime

REPO = Path(__file__).resolve().parents[1]

H200 = runtime.Probe(True, "", cc=90, name="NVIDIA H200", driver_cuda=12040, driver="550.54.15")
RTX5090 = runtime.Probe(True, "", cc=120, name="NVIDIA GeForce RTX 5090", driver_cuda=12080, driver="570.86.15")
NO_GPU = runtime.Probe(False, "no NVIDIA driver: libcuda.so.1 is not installed on this machine")


def fake_torch(cuda: str | None, available: bool, archs=("sm_80", "sm_86", "sm_90", "sm_100", "sm_120")):
    return SimpleNamespace(__version__=f"2.13.0+{'cpu' if cuda is None else 'cu' + cuda.replace('.', '')}",
                           version=SimpleNamespace(cuda=cuda),
                           cuda=SimpleNamespace(is_available=lambda: available, get_arch_list=lambda: list(archs)))


def test_gpu_with_cpu_only_torch_names_gpu_driver_and_fitting_build():
    msg = compat.torch_mismatch(H200, fake_torch(None, False, archs=()))
    assert "NVIDIA H200" in msg and "550.54.15" in msg and "CUDA 12.4" in msg
    assert "torch 2.13.0+cpu (CUDA none)" in msg and "no CUDA" in msg
    # the driver supports CUDA 12.4: the oldest 12.x build runs there by minor-version compatibility
    assert "`pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cu126`" in msg
    assert "--device cpu" in msg


def test_gpu_with_driver_too_old_for_torch_cuda():
    msg = compat.torch_mismatch(H200, fake_torch("13.0", False))
    assert "NVIDIA H200" in msg and "550.54.15" in msg and "(CUDA 13.0)" in msg
    assert "driver is older than torch's CUDA 13.0 needs (driver 580.65.06 or newer)" in msg
    assert msg.count("pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cu126") == 1
    assert "--device cpu" in msg


def test_gpu_with_compute_capability_missing_from_torch_build():
    msg = compat.torch_mismatch(RTX5090, fake_torch("12.6", True, archs=("sm_80", "sm_86", "sm_90")))
    assert "NVIDIA GeForce RTX 5090" in msg and "570.86.15" in msg and "(CUDA 12.6)" in msg
    assert "compute capability 12.0 is not in this torch build (built for sm_80, sm_86, sm_90)" in msg
    assert "--index-url https://download.pytorch.org/whl/cu128`" in msg and "--device cpu" in msg


def test_no_gpu_or_a_fitting_torch_says_nothing():
    assert compat.torch_mismatch(NO_GPU, fake_torch(None, False)) is None
    assert compat.torch_mismatch(H200, fake_torch("12.6", True)) is None
    # sm_80 SASS runs on 8.9 (same major, newer minor); PTX for 9.0 JIT-compiles for 12.0
    assert compat.arch_in_build(89, ["sm_80"]) and compat.arch_in_build(120, ["compute_90"])
    assert not compat.arch_in_build(90, ["sm_80", "sm_86"]) and not compat.arch_in_build(120, ["sm_90"])


def test_driver_older_than_every_build_asks_for_a_driver_update():
    old = runtime.Probe(True, "", cc=89, name="NVIDIA L4", driver_cuda=11080, driver="520.61.05")
    msg = compat.torch_mismatch(old, fake_torch(None, False))
    assert "No torch 2.13.0 build runs on this driver: update the NVIDIA driver to 560.28.03 or newer" in msg


@pytest.fixture
def gpu_but_cpu_torch(monkeypatch):
    """This machine's CPU torch, with the probe claiming an H200."""
    monkeypatch.setattr(runtime, "probe_driver", lambda device=0: H200)


@pytest.mark.parametrize("device", ["auto", "cuda"])
def test_engine_stops_auto_and_cuda_with_the_paragraph(gpu_but_cpu_torch, device):
    with pytest.raises(engine_device.GpuUnusable) as exc:
        engine_device.resolve_device(device)
    assert "NVIDIA H200" in str(exc.value) and "--device cpu" in str(exc.value)
    assert "\n" not in str(exc.value)  # one paragraph: the CLI prints it whole on one line


def test_device_cpu_goes_ahead(gpu_but_cpu_torch):
    assert engine_device.resolve_device("cpu") == torch.device("cpu")


def test_no_gpu_auto_is_cpu_without_message(monkeypatch):
    monkeypatch.setattr(runtime, "probe_driver", lambda device=0: NO_GPU)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert engine_device.resolve_device("auto") == torch.device("cpu")


def test_engine_say_prints_the_paragraph_and_cpu_override_runs(gpu_but_cpu_torch, capsys, tmp_path):
    from engine.__main__ import main

    assert main(["say", "hi", "--demo", "--out", str(tmp_path / "a.wav"), "--max-frames", "2"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: NVIDIA H200 (compute capability 9.0, driver 550.54.15") and "--device cpu" in err
    assert main(["say", "hi", "--demo", "--device", "cpu", "--out", str(tmp_path / "b.wav"),
                 "--max-frames", "2", "--seed", "1"]) == 0
    assert (tmp_path / "b.wav").exists()


def test_runtime_reports_loader_and_no_driver_without_hang():
    """`python -m kernels.runtime` in a fresh interpreter: the loader and why, then the probe's reason."""
    out = subprocess.run([sys.executable, "-m", "kernels.runtime"], cwd=REPO, capture_output=True, text=True,
                         timeout=60)
    name, why = runtime.loader_choice()
    assert out.stdout.startswith(f"loader: {name or 'none'} ({why})"), out.stdout + out.stderr
    ok, reason = runtime.available()
    assert f"cubin path: {'available' if ok else 'unavailable'}: {reason}" in out.stdout
    assert out.returncode == (0 if ok else 2)


def test_loader_choice_prefers_pycuda_and_says_why(monkeypatch):
    monkeypatch.setattr(runtime, "loader_candidates", lambda: ["pycuda", "cuda.core"])
    assert runtime.loader_choice() == ("pycuda", "PyCUDA is installed, the preferred loader")
    monkeypatch.setattr(runtime, "loader_candidates", lambda: ["cuda.core"])
    assert runtime.loader_choice()[0] == "cuda.core" and "PyCUDA is not installed" in runtime.loader_choice()[1]
    monkeypatch.setattr(runtime, "loader_candidates", lambda: [])
    assert runtime.loader_choice()[0] is None
