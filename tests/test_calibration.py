"""FP8 calibration (engine/backends/calibration.py): the three prompt kinds, the exact saturation and
underflow counts, and the cubin backend calibrated through Triton's interpreter on the tiny parity
checkpoint."""

import pytest
import torch

from engine.backends import calibration as cal
from engine.config import AUDIO_PLACEHOLDER
from engine.demo import TINY_DIMS

# scale 1: 0 is not an underflow; 1e-4 and 2^-10 (the tie, to even) round to zero; 1.5e-3 rounds up to 2^-9;
# 449, -500 and 1000 are clipped at 448; 448 itself is not
CRAFTED = torch.tensor([0.0, 1e-4, 2.0 ** -10, 1.5e-3, 1.0, -3.0, 448.0, 449.0, -500.0, 1000.0])


def test_fp8_rates_on_a_crafted_tensor():
    saturated, underflow = cal.fp8_rates(CRAFTED, 1.0)
    assert saturated == pytest.approx(3 / 10) and underflow == pytest.approx(2 / 10)
    # scale 2: only 1000 clips; 1.5e-3 / 2 rounds to zero too, as torch's own e4m3 cast says
    q = (CRAFTED / 2.0).clamp(-448, 448).to(torch.float8_e4m3fn).float()
    assert int(((q == 0) & (CRAFTED != 0)).sum()) == 3
    assert cal.fp8_rates(CRAFTED, 2.0) == (pytest.approx(1 / 10), pytest.approx(3 / 10))


def test_the_recorders_histogram_gives_the_amax_and_the_rates_exactly():
    """Observed in two pieces, the histogram's amax is the tensor's, and its counts under the final scale are
    what quantising the tensor gives; a headroom under 1 makes the largest values saturate."""
    x = (CRAFTED * torch.tensor([1.0, -1.0]).repeat(5)).to(torch.bfloat16)
    rec = cal.Recorder(kinds=1, layers=1, device="cpu")
    rec.observe(0, "down", x[:4])
    rec.observe(0, "down", x[4:])
    prompts = [cal.CalibrationPrompt("text", torch.zeros(3, dtype=torch.long))]
    got = rec.result(prompts, headroom=0.5)
    k = cal.SITES.index("down")
    assert float(got.amax[0, 0, k]) == float(x.float().abs().max()) == 1000.0
    assert float(got.scales[0, k]) == pytest.approx(1000.0 * 0.5 / 448)
    saturated, underflow = got.rates()
    want = cal.fp8_rates(x, float(got.scales[0, k]))
    assert (float(saturated[0, k]), float(underflow[0, k])) == pytest.approx(want) and want[0] > 0 and want[1] > 0
    assert float(got.values[0, 0, k]) == 10 and got.positions == (3,)
    assert got.values[0, 0, :k].sum() == 0   # the other sites saw nothing
    # counted under given scales instead (another calibration's): what quantising with that scale gives
    other = rec.result(prompts, scales=torch.full((1, 3), 2.0))
    assert float(other.scales[0, k]) == 2.0 and float(other.amax[0, 0, k]) == 1000.0
    assert tuple(float(r[0, k]) for r in other.rates()) == pytest.approx(cal.fp8_rates(x, 2.0))


def test_the_three_prompt_kinds_fit_the_cache_and_are_the_same_every_time():
    steps = cal.CALIBRATION_DECODE_STEPS
    prompts = cal.calibration_prompts(TINY_DIMS, 4096, steps)
    assert [p.kind for p in prompts] == list(cal.CALIBRATION_PROMPTS)
    text, clone, long = prompts
    assert tuple(text.ids.tolist()) == cal.CALIBRATION_IDS and text.ref_rows is None and text.decode is None
    assert int((clone.ids == AUDIO_PLACEHOLDER).sum()) == len(clone.ref_rows) == cal.CLONE_REFERENCE_FRAMES + 7
    assert long.positions == len(long.ids) + steps == cal.LONG_CONTEXT_POSITIONS and long.ref_rows is None
    # the long context's decode steps feed audio rows in the delay pattern: BOC above the step's codebook
    assert long.decode.shape == (steps, 8) and int(long.decode[0, 1]) == TINY_DIMS.boc > int(long.decode[15].max())
    again = cal.calibration_prompts(TINY_DIMS, 4096, steps)
    assert all(torch.equal(a.ids, b.ids) for a, b in zip(prompts, again))
    assert torch.equal(clone.ref_rows, again[1].ref_rows) and torch.equal(long.decode, again[2].decode)
    # a short cache: the clone and long prompts fill half of it at most, decode steps included
    short = cal.calibration_prompts(TINY_DIMS, 64, 2)
    assert [p.kind for p in short] == list(cal.CALIBRATION_PROMPTS)
    assert [p.positions for p in short] == [21, 32, 32] and len(short[1].ref_rows) == 8


@pytest.fixture(scope="module")
def tiny_ckpt(parity_dir):
    pytest.importorskip("triton", reason="Triton is not installed (pip install -r requirements-dev.txt)")
    from engine.checkpoint import load_checkpoint
    from kernels import manifest as mf
    from tests import interp_rounding

    if not (mf.CUBIN_DIR / "sm_90a" / mf.MANIFEST).exists():
        pytest.skip("no committed cubins (python -m kernels.build)")
    interp_rounding.install()
    return load_checkpoint(parity_dir / "tiny_checkpoint", progress=False)


def _fp8_backend(ckpt):
    from engine.backends.cubin import CubinBackend
    from kernels import manifest as mf
    from kernels.runtime import InterpretedKernels, cubin_ops

    return CubinBackend(ckpt.dims, ckpt.backbone, ops=cubin_ops(InterpretedKernels(mf.load(90))), device="cpu",
                        precision="fp8", max_len=64, calibration_steps=1)


def test_the_cubin_backend_calibrates_on_the_three_kinds_through_the_interpreter(tiny_ckpt):
    be = _fp8_backend(tiny_ckpt)
    got = be.calibration
    assert got.kinds == cal.CALIBRATION_PROMPTS and got.positions == (21, 32, 32)
    layers = tiny_ckpt.dims.layers
    assert got.amax.shape == (3, layers, 3) and bool((got.amax > 0).all())   # every kind reached every input
    # the static scales the kernels read are the calibration's: max over the kinds, with the headroom
    want = got.amax.amax(0).clamp(min=1e-6) * cal.CALIBRATION_HEADROOM / cal.FP8_MAX
    assert torch.equal(got.scales, want)
    for i, layer in enumerate(be.layers):
        assert torch.equal(torch.cat([layer.x_qkv, layer.x_gate_up, layer.x_down]), got.scales[i])
    saturated, underflow = got.rates()
    assert float(saturated.max()) == 0.0                     # headroom 2: nothing it was calibrated on clips
    assert 0.0 <= float(underflow.min()) and float(underflow.max()) < 0.05
    assert sum(got.set_by().values()) == 3 * layers and "saturation max 0.000%" in got.summary
    with pytest.raises(ValueError, match="BF16 path"):   # its weights are FP8 now
        be.record(cal.calibration_prompts(tiny_ckpt.dims, 64, 1)[:1])
    # deterministic: a second load computes the same scales, bit for bit
    assert torch.equal(_fp8_backend(tiny_ckpt).calibration.scales, got.scales)
