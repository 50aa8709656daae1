"""SASS of the batched decode GEMM (kernels/batch.py) in the committed cubins, per arch, without a GPU.

tests/test_kernels_build.py already checks every committed `gemm*` cubin for its arch's tensor-core op,
no spills and its parameter table. This adds the batch-specific property: the MMA is the swap-AB
shape, 16 activation columns beside 64 weight rows (`HGMMA.64x16x16` / `QGMMA.64x16x32` on sm_90a,
the m16n8 mma.sync forms elsewhere), so a bucket of 1-16 rows pays for a 16-wide tile, not a 64-row
one, and every arch multiplies in the activation's own type (no FP8 upcast to f16 on Hopper).
"""

from __future__ import annotations

import pytest

from kernels import manifest as mf
from tests.helpers import committed_cubins, sass_instructions, sass_ops

pytest.importorskip("triton", reason="Triton is not installed (pip install -r requirements-dev.txt)")

MMA = {("sm_90a", "bf16"): "HGMMA.64x16x16.F32.BF16", ("sm_90a", "fp8"): "QGMMA.64x16x32.F32.E4M3.E4M3",
       ("sm_89", "bf16"): "HMMA.16816.F32.BF16", ("sm_89", "fp8"): "QMMA.16832.F32.E4M3.E4M3",
       ("sm_120a", "bf16"): "HMMA.16816.F32.BF16", ("sm_120a", "fp8"): "QMMA.16832.F32.E4M3.E4M3"}
TENSOR_CORE = ("HMMA", "HGMMA", "QMMA", "QGMMA", "OMMA")




SKINNY = committed_cubins("gemm_skinny_")


@pytest.mark.skipif(not SKINNY, reason="no committed batch cubins (python -m kernels.build)")
@pytest.mark.parametrize("cc,name", SKINNY)
def test_skinny_gemm_uses_the_swap_ab_tensor_core_shape(cc, name):
    m = mf.load(cc)
    ops = sass_ops(m.root / m.kernels[name].cubin)
    kind = "fp8" if "w8a8" in name else "bf16"  # W8A16 upcasts its FP8 weight tile and multiplies in BF16
    want = MMA[m.target, kind]
    mma = sorted({o for o in ops if o.startswith(TENSOR_CORE)})
    assert mma == [want], f"{m.target}/{name}: tensor-core ops {mma}, want only {want}"


def test_all_archs_have_the_skinny_gemm():
    names = ("gemm_skinny_bf16", "gemm_skinny_w8a8", "gemm_skinny_w8a16_res_split", "gemm_skinny_bf16_f32")
    assert {(cc, n) for cc in mf.TARGETS for n in names} <= set(SKINNY)


@pytest.mark.skipif(not SKINNY, reason="no committed batch cubins (python -m kernels.build)")
@pytest.mark.parametrize("cc,name", [(cc, n) for cc, n in SKINNY if n.endswith("_split")])
def test_split_k_skinny_gemm_reduces_with_one_integer_ticket(cc, name):
    """The split variants' reduction: one integer `ATOMG.E.ADD` behind a GPU-scope `MEMBAR` (the partials are
    visible before the ticket moves), and no float atomics anywhere; the plain variants have no atomic."""
    m = mf.load(cc)
    ins = sass_instructions(m.root / m.kernels[name].cubin)
    atoms = [i for i, (_, op, _) in enumerate(ins) if op.startswith(("ATOM", "RED"))]
    assert len(atoms) == 1 and ins[atoms[0]][1].startswith("ATOMG.E.ADD") and ".F32" not in ins[atoms[0]][1]
    before = [op for _, op, _ in ins[max(0, atoms[0] - 6):atoms[0]]]
    assert any(op.startswith("MEMBAR") and op.endswith(".GPU") for op in before), (m.target, before)
    plain = name.removesuffix("_split")
    if plain in m.kernels:  # W8A16 (o_proj) is built split only
        plain_ins = sass_instructions(m.root / m.kernels[plain].cubin)
        assert not any(op.startswith(("ATOM", "RED")) for _, op, _ in plain_ins)
