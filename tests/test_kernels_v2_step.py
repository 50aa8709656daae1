"""The cubin backend's v2 decode step (kernels/fused.py, 5 launches per layer) against v1 and against the
rounding-matched torch reference of tests/test_kernels_step.py, on the tiny parity checkpoint, CPU
interpreter.

Launch counts come from the backend's launch list (`InterpretedKernels.launches`, the manifest names a
GPU would launch). The numerics run the backend on `kernels.ops` itself (the interpreter's JIT path)
with the few-programs tiles of tests/test_kernels_step.py, since the production head tile costs ~7 s a
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
from tests.test_kernels_step import FAST_TILES, TorchReference, Weights, cosine, embed_row, rel_err  # noqa: E402

interp_rounding.install()

BF16 = torch.bfloat16
MAX_LEN = 64
STEPS = 12
FP8_STEPS = 6
V2_LAYER = ["gemv2_norm_bf16", "decode_attn_fused_d16", "gemv2_bf16_res", "gemv2_norm_bf16", "gemv2_silu_bf16_res"]


@pytest.fixture(scope="module")
def tiny(parity_dir):
    ckpt = load_checkpoint(parity_dir / "tiny_checkpoint", progress=False)
    prompt = json.loads((parity_dir / "zero_shot.json").read_text())
    return ckpt, torch.tensor(prompt["prompt_ids"]), Weights(parity_dir / "tiny_checkpoint")


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
    ckpt, ids, _ = tiny
    layers = ckpt.dims.layers
    v1, v2 = decode_launches(ckpt, ids, "v1"), decode_launches(ckpt, ids, "v2")
    assert v1[-1] == v2[-1] == "audio_head_norm_bf16"      # the head, after the layers, in both
    assert (len(v1) - 1) / layers == 10
    assert v2[:-1] == V2_LAYER * layers                     # 5 per layer, in this order
    print(f"\nlaunches per decode step (tiny, {layers} layers): v1 {len(v1)}, v2 {len(v2)}")


def test_unknown_variant_is_refused(tiny):
    ckpt, _, _ = tiny
    with pytest.raises(ValueError, match="variant must be one of"):
        CubinBackend(ckpt.dims, ckpt.backbone, ops=ops, device="cpu", precision="bf16", max_len=MAX_LEN,
                     variant="v3")


@pytest.fixture(scope="module")
def run(tiny):
    """Prefill, then a greedy take of STEPS rows through the backend's device-sampling loop (sampler kernel,
    fused embedding, v2 step), each step's logits against the reference fed the reference's own rows;
    then FP8 v1 and v2 teacher-forced on those rows against BF16."""
    ckpt, ids, w = tiny
    d = ckpt.dims
    saved = {name: dict(getattr(ops, name)) for name in FAST_TILES}
    for name, tiles in FAST_TILES.items():
        getattr(ops, name).update(tiles)
    saved_v2 = dict(ops.GEMV2_TILES)
    ops.GEMV2_TILES.update(FAST_TILES["GEMV_TILES"])
    try:
        be = CubinBackend(d, ckpt.backbone, ops=ops, device="cpu", precision="bf16", max_len=MAX_LEN)
        ref = TorchReference(w)
        out = dict(kern=[be.prefill(ids, None, 0)], ref=[ref.forward(w.text[ids].float(), 0)], kern_rows=[],
                   ref_rows=[])
        n0 = len(ids)
        be.begin(out["kern"][0], n0, seed=0, temperature=0.0, top_k=0, top_p=1.0, max_rows=STEPS)
        for s in range(STEPS):
            ref_row = out["ref"][-1].argmax(-1)
            ref_row[s + 1:] = d.boc
            out["ref_rows"].append(ref_row.tolist())
            rows, _ = be.rows(1)
            out["kern_rows"].append(rows[0].tolist())
            out["kern"].append(be.logits.view(d.codebooks, d.codebook_vocab).clone())
            out["ref"].append(ref.forward(embed_row(w, ref_row)[None], n0 + s))

        for variant in ("v1", "v2"):
            be8 = CubinBackend(d, ckpt.backbone, ops=ops, device="cpu", precision="fp8", max_len=MAX_LEN,
                               calibration_steps=2, variant=variant)
            logits = [be8.prefill(ids, None, 0)]
            for s in range(FP8_STEPS - 1):
                logits.append(be8.decode(torch.tensor(out["kern_rows"][s]), n0 + s))
            out[f"fp8_{variant}"] = logits
        return out
    finally:
        for name, tiles in saved.items():
            getattr(ops, name).update(tiles)
        ops.GEMV2_TILES.update(saved_v2)


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
