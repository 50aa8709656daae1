"""The cubin backend's v2 decode step (kernels/fused.py, 5 launches per layer) and its split-K variant v3
(kernels/splitk.py for o_proj and down) against v1 and against the rounding-matched torch reference of
tests/interp_step.py, on the tiny parity checkpoint, CPU interpreter.

Launch counts come from the backend's launch list (`InterpretedKernels.launches`, the manifest names a
GPU would launch). The numerics run the backend on `kernels.ops` itself (the interpreter's JIT path)
with the few-programs tiles of tests/interp_step.py, since the production head tile costs ~7 s a
launch here; the production tiles of the new kernels are covered by tests/test_kernels_fused.py.
"""

import json

import pytest
import torch

from engine.backends.cubin import CubinBackend
from engine.checkpoint import load_checkpoint
from kernels import manifest as mf
from kernels import ops
from kernels.runtime import InterpretedKernels, cubin_ops
from tests import interp_rounding
from tests.helpers import cosine, rel_err
from tests.interp_step import fast_tiles

interp_rounding.install()

BF16 = torch.bfloat16
MAX_LEN = 64
STEPS = 12
FP8_STEPS = 6
V2_LAYER = ["gemv2_norm_bf16", "decode_attn_fused_d16", "gemv2_bf16_res", "gemv2_norm_bf16", "gemv2_silu_bf16_res"]
V3_LAYER = ["gemv2_norm_bf16", "decode_attn_fused_d16", "gemv3_bf16_res", "gemv2_norm_bf16", "gemv3_silu_bf16_res"]
# Split-K tiles for the tiny model (o_proj K 64, down K 128): four real splits, one row block.
FAST_SPLITK = {"bf16": dict(BLOCK_N=64, BLOCK_K=16, SPLIT_K=4), "fp8": dict(BLOCK_N=64, BLOCK_K=32, SPLIT_K=4)}


@pytest.fixture(scope="module")
def tiny(parity_dir):
    ckpt = load_checkpoint(parity_dir / "tiny_checkpoint", progress=False)
    prompt = json.loads((parity_dir / "zero_shot.json").read_text())
    return ckpt, torch.tensor(prompt["prompt_ids"])


def decode_launches(ckpt, variant):
    """The manifest names one decode step (at position 3) launches, from the backend's launch list. No
    prefill before it: which kernels a step launches follows from the variant and the shapes, never from
    what the KV cache holds."""
    if not (mf.CUBIN_DIR / "sm_90a" / mf.MANIFEST).exists():
        pytest.skip("no committed cubins (python -m kernels.build)")
    kernels = InterpretedKernels(mf.load(90))
    be = CubinBackend(ckpt.dims, ckpt.backbone, ops=cubin_ops(kernels), device="cpu", precision="bf16",
                      max_len=MAX_LEN, variant=variant)
    kernels.launches.clear()
    be.decode(torch.full((ckpt.dims.codebooks,), ckpt.dims.boc), 3)
    return list(kernels.launches)


@pytest.mark.slow
def test_launches_per_layer(tiny):
    ckpt, _ = tiny
    layers = ckpt.dims.layers
    v1, v2, v3 = (decode_launches(ckpt, v) for v in ("v1", "v2", "v3"))
    assert v1[-1] == v2[-1] == v3[-1] == "audio_head_norm_bf16"      # the head, after the layers, in all
    assert (len(v1) - 1) / layers == 10
    assert v2[:-1] == V2_LAYER * layers                     # 5 per layer, in this order
    assert v3[:-1] == V3_LAYER * layers
    print(f"\nlaunches per decode step (tiny, {layers} layers): v1 {len(v1)}, v2 {len(v2)}")


def test_unknown_variant_is_refused(tiny):
    ckpt, _ = tiny
    with pytest.raises(ValueError, match="variant must be one of"):
        CubinBackend(ckpt.dims, ckpt.backbone, ops=ops, device="cpu", precision="bf16", max_len=MAX_LEN,
                     variant="v9")


@pytest.fixture(scope="module")
def run(tiny, interp_take):
    """Prefill, then a greedy take of STEPS rows through the backend's device-sampling loop (sampler kernel,
    fused embedding), each step's logits against the reference fed the reference's own rows; then FP8
    teacher-forced on those rows against BF16. The v2 take and FP8 v1 and v2 are the first STEPS rows and
    FP8_STEPS logits of the session's `interp_take` (tests/interp_step.py): the same backend, prompt, tiles
    and rows, so the same bits as running them here; the split-K v3 runs here."""
    ckpt, ids = tiny
    d = ckpt.dims
    out = dict(ref=interp_take["ref"][:STEPS + 1], ref_rows=interp_take["ref_rows"][:STEPS],
               kern=interp_take["kern"][:STEPS + 1], kern_rows=interp_take["kern_rows"][:STEPS],
               fp8_v1=interp_take["fp8_v1"][:FP8_STEPS], fp8_v2=interp_take["fp8_v2"][:FP8_STEPS])
    saved_v3 = dict(ops.SPLITK_TILES)
    ops.SPLITK_TILES.update(FAST_SPLITK)
    try:
        with fast_tiles():
            n0 = len(ids)
            be = CubinBackend(d, ckpt.backbone, ops=ops, device="cpu", precision="bf16", max_len=MAX_LEN,
                              variant="v3")
            kern, kern_rows = [be.prefill(ids, None, 0)], []
            be.begin(kern[0], n0, seed=0, temperature=0.0, top_k=0, top_p=1.0, max_rows=STEPS)
            for _ in range(STEPS):
                rows, _ = be.rows(1)
                kern_rows.append(rows[0].tolist())
                kern.append(be.logits.view(d.codebooks, d.codebook_vocab).clone())
            out["kern_v3"], out["kern_rows_v3"] = kern, kern_rows
            be8 = CubinBackend(d, ckpt.backbone, ops=ops, device="cpu", precision="fp8", max_len=MAX_LEN,
                               calibration_steps=2, variant="v3")
            logits = [be8.prefill(ids, None, 0)]
            for s in range(FP8_STEPS - 1):
                logits.append(be8.decode(torch.tensor(out["kern_rows"][s]), n0 + s))
            out["fp8_v3"] = logits
        return out
    finally:
        ops.SPLITK_TILES.update(saved_v3)


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


@pytest.mark.slow
def test_v3_bf16_step_and_greedy_take_match_reference(run):
    """The split-K step: the same rounding points, so within the v2 tolerance, and the same greedy take;
    the reference is fed the reference's own rows, which equal v3's while the takes agree."""
    errs = [rel_err(k, r) for k, r in zip(run["kern_v3"], run["ref"])]
    print(f"\nv3 BF16 step vs bf16-storage torch reference: max logit rel err {max(errs):.2e}")
    assert max(errs) < 1e-5
    assert run["kern_rows_v3"] == run["ref_rows"]


@pytest.mark.slow
def test_v3_fp8_teacher_forced_cosine(run):
    cos = min(cosine(a, b) for a, b in zip(run["fp8_v3"], run["kern"]))
    print(f"\nFP8 v3 vs BF16 logits, teacher-forced over {FP8_STEPS} steps: cosine min {cos:.5f}")
    assert cos >= 0.9934
