"""GPU tier: runs only where an NVIDIA GPU and driver are present (skipped with the reason elsewhere, as
on the CPU CI machines). On a GPU box `python -m pytest -m gpu` exercises the cubin fast path end to end."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kernels.runtime import available

REPO = Path(__file__).resolve().parents[1]
GPU_OK, GPU_REASON = available()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not (GPU_OK and torch.cuda.is_available()),
                                                  reason=f"needs an NVIDIA GPU: {GPU_REASON}")]


def test_gpu_check_quick_passes():
    """Every cubin for this arch against the float64 references, plus a launch from a worker thread."""
    out = subprocess.run([sys.executable, "-m", "bench.gpu_check", "--quick"], cwd=REPO, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert "ALL PASS" in out.stdout


def test_engine_cubin_backend_matches_torch_on_parity(parity_dir):
    from engine import Engine
    from engine.model import rel_error
    from engine.prompt import Prompt

    ids = json.loads((parity_dir / "zero_shot.json").read_text())["prompt_ids"]
    fast = Engine.load(parity_dir / "tiny_checkpoint", device="cuda", backend="cubin", precision="bf16")
    ref = Engine.load(parity_dir / "tiny_checkpoint", device="cuda", backend="torch", precision="bf16")
    prompt = Prompt(ids=ids)
    assert fast.info["backend"] == "cubin"
    assert rel_error(fast.prefill(prompt), ref.prefill(prompt)) < 3e-2
    audio = fast.generate(prompt=prompt, seed=1, max_frames=40)
    assert len(audio) > 0 and len(audio) % 960 == 0
