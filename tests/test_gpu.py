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
    assert fast.info.backend == "cubin"
    assert rel_error(fast.prefill(prompt), ref.prefill(prompt)) < 3e-2
    audio = fast.generate(prompt=prompt, seed=1, max_frames=40)
    assert len(audio) > 0 and len(audio) % 960 == 0


def test_default_path_fp8_graph_replay_and_device_sampling(parity_dir):
    """The default a user gets (device/precision/backend "auto"): the cubin backend in FP8, trusted by its
    self-check against the torch path, and the fused decode (device sampling, CUDA graph replay) giving the
    rows the same backend gives step by step on the host."""
    from engine import Engine

    ids = torch.tensor(json.loads((parity_dir / "zero_shot.json").read_text())["prompt_ids"])
    engine = Engine.load(parity_dir / "tiny_checkpoint")
    info = engine.info
    assert (info.device, info.backend, info.precision) == ("cuda", "cubin", "fp8"), info
    assert info.extra["self_check"].startswith("passed: fp8"), info.extra["self_check"]
    be = engine.model
    logits = be.prefill(ids, None, 0)
    be.begin(logits, len(ids), seed=1, temperature=0.0, top_k=0, top_p=1.0, max_rows=8)
    first, _ = be.rows(3)
    rest, _ = be.rows(3)  # a second call replays the captured graph from where the first stopped
    assert be.graph is not None
    rows = torch.cat([first, rest])
    want = be.prefill(ids, None, 0)
    for step in range(6):
        row = want.argmax(-1)
        row[step + 1:] = be.dims.boc
        assert rows[step].tolist() == row.tolist(), step
        want = be.decode(row, len(ids) + step)
