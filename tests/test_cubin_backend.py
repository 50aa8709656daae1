"""The cubin backend's composition on the CPU: every launch goes through the same ops shim, manifest
variant resolution and argument checks as on a GPU, but runs the Triton source in the interpreter
(`InterpretedKernels`). Compared with the torch reference on the tiny parity checkpoint."""

import json

import pytest
import torch

pytest.importorskip("triton", reason="Triton is not installed (pip install -r requirements-dev.txt)")

from engine.backends.cubin import CubinBackend, probe, resolve_precision
from engine.checkpoint import load_checkpoint
from engine.model import HiggsModel, rel_error
from kernels import manifest as mf
from kernels.runtime import InterpretedKernels, cubin_ops
from tests import interp_rounding
from tests.helpers import cosine

interp_rounding.install()  # the interpreter's bf16 rounding and bf16 tl.dot defects (see that module)

MAX_LEN = 64


@pytest.fixture(scope="module")
def tiny(parity_dir):
    if not (mf.CUBIN_DIR / "sm_90a" / mf.MANIFEST).exists():
        pytest.skip("no committed cubins (python -m kernels.build)")
    ckpt = load_checkpoint(parity_dir / "tiny_checkpoint", progress=False)
    ids = torch.tensor(json.loads((parity_dir / "zero_shot.json").read_text())["prompt_ids"])
    ref = HiggsModel.from_state_dict(ckpt.dims, ckpt.backbone, dtype=torch.float32, max_len=MAX_LEN)
    return ckpt, ids, ref


def backend(ckpt, precision):
    """Calibration runs 2 decode steps instead of 16: the interpreter is slow, and the scales only
    need to be sane here (FP8 accuracy on real weights is the GPU check's job)."""
    kernels = InterpretedKernels(mf.load(90))
    return CubinBackend(ckpt.dims, ckpt.backbone, ops=cubin_ops(kernels), device="cpu", precision=precision,
                        max_len=MAX_LEN, calibration_steps=2), kernels


def greedy_row(logits, step, boc):
    row = logits.argmax(-1)
    row[step + 1:] = boc
    return row


def close(got, want, precision):
    """BF16: max error within 3 % of the largest logit. FP8 W8A8 (3 mantissa bits, static activation
    scales) on random weights: direction preserved (cosine) and max error within 20 %."""
    if precision == "bf16":
        return rel_error(got, want) < 3e-2
    return cosine(got, want) > 0.99 and rel_error(got, want) < 0.2


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["bf16", "fp8"])
def test_composition_matches_torch_reference(tiny, precision):
    ckpt, ids, ref = tiny
    be, kernels = backend(ckpt, precision)
    # Two segments, as the engine prefills: [0, split) then [split, L) at a cache offset.
    split = 5
    be.prefill(ids[:split], None, 0)
    got = be.prefill(ids[split:], None, split)
    ref.prefill(ids[:split], None, 0)
    want = ref.prefill(ids[split:], None, split)
    assert got.shape == (8, 1026) and got.dtype == torch.float32
    assert close(got, want, precision), (rel_error(got, want), cosine(got, want))
    pos = len(ids)
    for step in range(3):  # decode steps fed with the reference's greedy rows (teacher forcing)
        row = greedy_row(want, step, ckpt.dims.boc)
        got, want = be.decode(row, pos + step), ref.decode(row, pos + step)
        assert close(got, want, precision), (step, rel_error(got, want), cosine(got, want))
    used = set(kernels.launches)
    # prefill: the GEMMs; decode: the default v2 step (kernels/fused.py)
    expect = {"gemm_w8a8", "gemv2_norm_w8a8", "gemv2_w8a16_res", "gemv2_silu_w8a8_res"} if precision == "fp8" else \
        {"gemm_bf16", "gemm_bf16_res", "gemv2_norm_bf16", "gemv2_bf16_res", "gemv2_silu_bf16_res"}
    assert expect <= used, sorted(used)
    if precision == "fp8":
        L = be.layers[0]
        assert L.qkv.dtype == torch.float8_e4m3fn and L.x_qkv.shape == (1,) and float(L.x_qkv) > 0


@pytest.mark.slow
def test_fused_device_sampling_matches_step_by_step(tiny):
    """rows(n) (sampler kernel + step on the device) gives the rows the host-side greedy loop gives."""
    ckpt, ids, _ = tiny
    be, _ = backend(ckpt, "bf16")
    logits = be.prefill(ids, None, 0)
    pos = len(ids)
    be.begin(logits, pos, seed=1, temperature=0.0, top_k=0, top_p=1.0, max_rows=8)
    rows, done = be.rows(4)
    assert rows.shape == (4, 8) and not done
    # the same backend, step by step from the same prefill: rows() wrote KV from pos on only, and each decode
    # rewrites its position before it reads it
    want = logits
    for step in range(4):
        row = greedy_row(want, step, ckpt.dims.boc)
        assert rows[step].tolist() == row.tolist(), step
        if step < 3:  # the last row's logits are not compared
            want = be.decode(row, pos + step)


def test_precision_resolution_and_probe():
    assert resolve_precision("auto", torch.bfloat16) == "fp8"
    assert resolve_precision("bf16", torch.bfloat16) == "bf16"
    with pytest.raises(ValueError, match="bf16/fp8"):
        resolve_precision("auto", torch.float32)


def test_probe_passes_the_runtime_reason_through(monkeypatch):
    from kernels import runtime

    monkeypatch.setattr(runtime, "available", lambda device=0: (False, "no NVIDIA driver: a test reason"))
    assert probe("cuda") == "no NVIDIA driver: a test reason"
    monkeypatch.setattr(runtime, "available", lambda device=0: (True, "a GPU"))
    assert probe("cuda") is None  # triton is installed here (requirements-dev.txt)
