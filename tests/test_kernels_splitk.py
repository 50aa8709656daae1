"""The split-K GEMVs of the v3 step (kernels/splitk.py) against float64 on the CPU interpreter, outputs
NaN-poisoned, production tiles; K chosen so that one split is partial and one is empty. The rounding
points are gemv2's: the silu·mul input rounded to bf16 or quantised to e4m3 at the static scale."""

import pytest
import torch

from kernels import ops
from tests import interp_rounding
from tests.helpers import gemv_reference, gemv_weights, nan_like, rel_err

interp_rounding.install()

BF16 = torch.bfloat16


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def poisoned_scratch(n):
    part, count = ops.gemv_splitk_scratch(n, "cpu")
    part.fill_(float("nan"))                            # every partial is written before it is read
    return part, count


@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "w8a16"])
def test_gemv_splitk_plain_with_residual(fp8):
    # bf16 splits of 512: K 1100 gives [0, 512), [512, 1024), [1024, 1100) and an empty fourth;
    # fp8 splits of 1024: K 2100 gives two full, one of 52 and an empty one.
    n, k = 29, 2100 if fp8 else 1100
    x = torch.randn(k).to(BF16)
    w, ws = gemv_weights(n, k, fp8)
    r = torch.randn(n).to(BF16)
    scratch = poisoned_scratch(n)
    for _ in range(2):                                  # the ticket counters are reset for the next launch
        y = ops.gemv_splitk(x, w, w_scale=ws, residual=r, scratch=scratch, out=nan_like((n,)))
        assert not torch.isnan(y.float()).any()
        assert rel_err(y, gemv_reference(x, w.float(), ws, residual=r)) < 5e-3
        assert (scratch[1] == 0).all()


@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "w8a8"])
def test_gemv_splitk_silu_prologue_residual_in_place(fp8):
    n, inter = 40, 1552
    gu = (torch.randn(2 * inter) * 2).to(BF16)
    w, ws = gemv_weights(n, inter, fp8)
    g, u = gu.float().chunk(2)
    act = torch.nn.functional.silu(g) * u
    xs = (act.abs().max() * 1.5 / 448).reshape(1) if fp8 else None
    x = ops.quantize_fp8(act, xs).float() if fp8 else act.to(BF16).float()
    h = torch.randn(n).to(BF16)
    want = gemv_reference(x, w.float(), ws, xs, residual=h)
    y = ops.gemv_splitk(gu, w, prologue="silu", w_scale=ws, x_scale=xs, residual=h, out=h,
                        scratch=poisoned_scratch(n))
    assert y is h and not torch.isnan(h.float()).any()
    assert rel_err(h, want) < 5e-3

