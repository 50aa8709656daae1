"""The cubin backend's v2 decode step (kernels/fused.py, 5 launches per layer) against v1 and against the
rounding-matched torch reference of tests/interp_step.py, on the tiny parity checkpoint, CPU
interpreter.

Launch counts come from the backend's launch list (`InterpretedKernels.launches`, the manifest names a
GPU would launch). The numerics run the backend on `kernels.ops` itself (the interpreter's JIT path)
with the few-programs tiles of tests/interp_step.py, since the production head tile costs ~7 s a
launch here; the production tiles of the new kernels are covered by tests/test_kernels_fused.py.
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import json  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

from engine.backends.cubin import CubinBackend  # noqa: E402
from engine.checkpoint import load_checkpoint  # noqa: E402
from kernels import manifest as mf, ops  # noqa: E402
from kernels.runtime import InterpretedKernels, cubin_ops  # noqa: E402
from tests import interp_rounding  # noqa: E402
from tests.helpers import cosine, rel_err  # noqa: E402
from tests.interp_step import MAX_LEN  # noqa: E402

interp_rounding.install()

STEPS = 12
FP8_STEPS = 6
V2_LAYER = ["gemv2_norm_bf16", "decode_attn_fused_d16", "gemv2_bf16_res", "gemv2_norm_bf16", "gemv2_silu_bf16_res"]


@pytest.fixture(scope="module")
def tiny(parity_dir):
    ckpt = load_checkpoint(parity_dir / "tiny_checkpoint", progress=False)
    prompt = json.loads((parity_dir / "zero_shot.json").read_text())
    return ckpt, torch.tensor(prompt["prompt_ids"])


def decode_launches(ckpt, ids, variant):
    """The manifest names one decode step launches, from the backend's launch list."""
    if not (mf.CUBIN_DIR / "sm_90a" / mf.MANIFEST).exists():
        pytest.skip("no committed cubins (python -m kernels.build)")
    kernels = InterpretedKernels(mf.load(90))
    be = CubinBackend(ckpt.dims, ckpt.backbone, ops=cubin_ops(kernels), device="cpu", precision="bf16",
                      max_len=MAX_LEN, variant=variant)
    be.prefill(ids[:3], None, 0)
    kernels.launches.clear()
    be.decode(torch.full((ckpt.dims.codebooks,), ckpt.dims.boc), 3)
    return list(kernels.launches)


@pytest.mark.slow
def test_launches_per_layer(tiny):
    ckpt, ids = tiny
    layers = ckpt.dims.layers
    v1, v2 = decode_launches(ckpt, ids, "v1"), decode_launches(ckpt, ids, "v2")
    assert v1[-1] == v2[-1] == "audio_head_norm_bf16"      # the head, after the layers, in both
    assert (len(v1) - 1) / layers == 10
    assert v2[:-1] == V2_LAYER * layers                     # 5 per layer, in this order
    print(f"\nlaunches per decode step (tiny, {layers} layers): v1 {len(v1)}, v2 {len(v2)}")


def test_unknown_variant_is_refused(tiny):
    ckpt, _ = tiny
    with pytest.raises(ValueError, match="variant must be one of"):
        CubinBackend(ckpt.dims, ckpt.backbone, ops=ops, device="cpu", precision="bf16", max_len=MAX_LEN,
                     variant="v3")


@pytest.fixture(scope="module")
def run(interp_take):
    """The first STEPS rows of the session's greedy take (tests/interp_step.py: the backend's default step is
    v2) with their logits (prefill first), and FP8 v1 and v2 on the first FP8_STEPS of them."""
    out = dict(kern=interp_take["kern"][:STEPS + 1], ref=interp_take["ref"][:STEPS + 1],
               kern_rows=interp_take["kern_rows"][:STEPS], ref_rows=interp_take["ref_rows"][:STEPS])
    out.update({f"fp8_{v}": interp_take[f"fp8_{v}"][:FP8_STEPS] for v in ("v1", "v2")})
    return out


@pytest.mark.slow
def test_v2_bf16_step_matches_reference(run):
    errs = [rel_err(k, r) for k, r in zip(run["kern"], run["ref"])]
    print(f"\nv2 BF16 step vs bf16-storage torch reference: max logit rel err {max(errs):.2e} over {len(errs)} steps")
    assert max(errs) < 1e-5                                 # the v1 step's tolerance (tests/test_kernels_step.py)


@pytest.mark.slow
def test_v2_bf16_greedy_take_matches_reference(run):
    assert run["kern_rows"] == run["ref_rows"]


@pytest.mark.slow
def test_v2_fp8_teacher_forced_cosine(run):
    cos = {v: min(cosine(a, b) for a, b in zip(run[f"fp8_{v}"], run["kern"])) for v in ("v1", "v2")}
    print(f"\nFP8 vs BF16 logits, teacher-forced over {FP8_STEPS} steps: cosine min v1 {cos['v1']:.5f}, "
          f"v2 {cos['v2']:.5f}")
    assert cos["v2"] >= 0.9934
