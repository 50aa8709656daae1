"""The CPU path's weight-only precisions (engine/quant.py, `precision="int8"` / `"int4"`): the packed
matrices multiply as their dequantised selves, a full-width model keeps its logits (the fidelity figures
are printed: `pytest -s`), the parity checkpoint runs in int8, the load packs layer by layer, and "auto"
picks by the CPU and the model."""

from __future__ import annotations

import dataclasses
import json
import mmap

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from engine import cpu
from engine.config import FULL_SIZE
from engine.demo import random_backbone
from engine.generate import Engine
from engine.model import PROJECTIONS, HiggsModel, rel_error
from engine.quant import Int4Weight, Int8Weight, linear, quantize, release_pages, weight_bytes

# Full width (hidden 2560, intermediate 9728, 32/8 heads of 128) with two layers: the real matrix shapes
# and per-channel statistics, small enough for the suite.
FULL_WIDTH = dataclasses.replace(FULL_SIZE, layers=2, vocab=4096)


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(F.cosine_similarity(a.double().flatten(), b.double().flatten(), dim=0))


# ----------------------------------------------------------------------------------------- packed matrices
@pytest.mark.parametrize("kind", ["int8", "int4"])
@pytest.mark.parametrize("shape", [(96, 256), (48, 64), (32, 160)])
def test_packed_matrix_multiplies_as_its_dequantised_self(kind, shape):
    gen = torch.Generator().manual_seed(1)
    w = torch.randn(shape, generator=gen) / shape[1] ** 0.5
    packed = quantize(w, kind)
    assert packed.shape == shape and packed.kind == kind
    x = torch.randn(5, shape[1], generator=gen).bfloat16()
    want = x.double() @ packed.dequantized().double().t()
    got = linear(x, packed)
    assert got.dtype == torch.bfloat16 and got.shape == (5, shape[0])
    # bf16 output: within a few bf16 ulps of the exact product of the dequantised matrix
    assert float((got.double() - want).abs().max()) <= 2 ** -7 * float(want.abs().max())
    # and the dequantised matrix is the original within half a quantisation step (int8: exactly, as the
    # values are rounded against the stored bf16 scale; int4: plus the bf16 rounding of the group's zero)
    err = (packed.dequantized() - w).abs()
    if kind == "int8":
        assert bool((err <= packed.scales.float()[:, None] / 2 * (1 + 1e-6)).all())
    else:
        groups = w.view(shape[0], -1, packed.group)
        step = ((groups.amax(-1) - groups.amin(-1)) / 15).repeat_interleave(packed.group, 1)
        slack = groups.abs().amax(-1).repeat_interleave(packed.group, 1) * 2 ** -7
        assert bool((err <= step * 0.5 * (1 + 2 ** -6) + slack).all())


def test_int8_rows_do_not_depend_on_the_row_count():
    """The property `decode_rows` relies on (checked again at load by `calibrate_rows`)."""
    w = quantize(torch.randn(64, 256), "int8")
    x = torch.randn(16, 256).bfloat16()
    full = w(x)
    for m in range(1, 16):
        assert torch.equal(w(x[:m]), full[:m])


def test_int4_group_follows_the_width():
    assert quantize(torch.randn(16, 256), "int4").group == 128
    assert quantize(torch.randn(16, 64), "int4").group == 64
    with pytest.raises(ValueError, match="multiple of 32"):
        Int4Weight.from_float(torch.randn(16, 48))
    with pytest.raises(ValueError, match="multiple of 16"):
        Int4Weight.from_float(torch.randn(8, 64))
    assert isinstance(quantize(torch.randn(8, 64), "int8"), Int8Weight)


def test_released_pages_keep_their_contents(tmp_path):
    """MADV_PAGEOUT only reclaims: a file-backed tensor reads the same afterwards, and so does anonymous memory."""
    data = np.arange(3 * mmap.PAGESIZE, dtype=np.uint8) * 7
    path = tmp_path / "blob"
    path.write_bytes(data.tobytes())
    mapped = torch.from_file(str(path), shared=False, size=data.size, dtype=torch.uint8)
    before = mapped.clone()
    release_pages(mapped)
    assert torch.equal(mapped, before)
    anonymous = torch.arange(5 * mmap.PAGESIZE, dtype=torch.int32)
    release_pages(anonymous)
    assert torch.equal(anonymous, torch.arange(5 * mmap.PAGESIZE, dtype=torch.int32))


# ----------------------------------------------------------------------------------------- full-width fidelity
@pytest.fixture(scope="module")
def full_width():
    state = random_backbone(FULL_WIDTH, seed=3, dtype=torch.bfloat16, names="internal")
    models = {kind: HiggsModel.from_state_dict(FULL_WIDTH, state, dtype=torch.bfloat16, max_len=256,
                                               quant=None if kind == "bf16" else kind)
              for kind in ("bf16", "int8", "int4")}
    return models


@pytest.mark.slow
def test_full_width_prefill_and_100_teacher_forced_steps(full_width):
    """int8 against bf16 on the real widths: prefill logits cosine ≥ 0.999; over 100 teacher-forced decode
    steps (the bf16 model's greedy rows fed to all three) the minimum cosine and the greedy agreement per
    codebook are printed for int8 and int4, with floors that a broken packing or scale would miss."""
    gen = torch.Generator().manual_seed(5)
    ids = torch.randint(10, FULL_WIDTH.vocab, (40,), generator=gen)
    logits = {k: m.prefill(ids) for k, m in full_width.items()}
    prefill_cos = {k: cosine(logits[k], logits["bf16"]) for k in ("int8", "int4")}
    rows = []
    row = logits["bf16"].argmax(-1)
    cos = {"int8": [], "int4": []}
    agree = {"int8": torch.zeros(8), "int4": torch.zeros(8)}
    for step in range(100):
        pos = len(ids) + step
        out = {k: m.decode_rows(row[None], [0], [pos])[0] for k, m in full_width.items()}
        for k in cos:
            cos[k].append(cosine(out[k], out["bf16"]))
            agree[k] += (out[k].argmax(-1) == out["bf16"].argmax(-1)).float()
        row = out["bf16"].argmax(-1)
        rows.append(row)
    print(f"\nfull width, 2 layers: prefill cosine int8 {prefill_cos['int8']:.6f}, int4 {prefill_cos['int4']:.6f}")
    for k in cos:
        print(f"{k}: 100 teacher-forced steps, min cosine {min(cos[k]):.6f}, greedy agreement per codebook "
              f"{[round(float(a) / 100, 2) for a in agree[k]]}")
    assert prefill_cos["int8"] >= 0.999
    assert min(cos["int8"]) >= 0.999 and float(agree["int8"].min()) >= 80
    assert prefill_cos["int4"] >= 0.98 and min(cos["int4"]) >= 0.98


def test_full_width_int8_load_keeps_no_float_projection(full_width):
    """Packed layer by layer: no projection survives as a float parameter, and the packed bytes are about
    half of bf16's (the scales add N·2 bytes per matrix)."""
    model = full_width["int8"]
    names = [n for n, _ in model.named_parameters()]
    assert not [n for n in names if any(n.endswith(p) for p in PROJECTIONS)]
    layer = model.layers[0]
    packed = sum(weight_bytes(w) for w in (layer.self_attn.wqkv, layer.self_attn.wo, layer.mlp.w_gate_up,
                                           layer.mlp.w_down))
    ref = full_width["bf16"].layers[0]
    float_bytes = sum(weight_bytes(w) for w in (ref.self_attn.wqkv, ref.self_attn.wo, ref.mlp.w_gate_up, ref.mlp.w_down))
    assert 0.5 <= packed / float_bytes <= 0.501
    assert model.precision == "int8" and full_width["int4"].precision == "int4" and model.dtype == torch.bfloat16


# ----------------------------------------------------------------------------------------- the parity checkpoint
@pytest.mark.parametrize("name", ["zero_shot", "voice_clone"])
def test_parity_checkpoint_in_int8_against_the_reference_logits(parity_dir, name):
    """The fixtures' prefill logits (the reference implementation, fp32) against the int8 engine: the
    relative error is printed and bounded at a few percent (int8 per channel on 64-wide matrices, bf16
    activations), and a greedy take decodes."""
    from engine.prompt import Prompt

    engine = Engine.load(parity_dir / "tiny_checkpoint", device="cpu", precision="int8")
    assert engine.info.precision == "int8"
    fixture = json.loads((parity_dir / f"{name}.json").read_text())
    prompt = Prompt(ids=fixture["prompt_ids"], ref_rows=fixture["ref_rows"])
    want = torch.from_numpy(np.load(parity_dir / f"{name}_prefill_logits.npy"))
    err = rel_error(engine.prefill(prompt), want)
    print(f"\nparity {name} prefill logits: int8 relative error {err:.2e}")
    assert err <= 0.05
    codes = engine.predict(prompt=prompt, temperature=0, max_frames=12)
    assert codes.shape[1] == 8 and len(codes) > 0


# ----------------------------------------------------------------------------------------- "auto"
NO_BF16 = {"cpu": "AMD EPYC", "isa": ["AVX2"], "native_bf16": False, "kernels": "AVX2", "threads": 2}
BF16 = {"cpu": "Intel Xeon", "isa": ["AVX-512", "AVX-512 BF16"], "native_bf16": True, "kernels": "AVX512", "threads": 2}


def test_auto_picks_by_the_model_and_the_cpu():
    def never(*_):
        raise AssertionError("measured where no measurement is needed")

    assert cpu.auto_precision(10_000_000, 64, 128, NO_BF16, never)[0] == "fp32"
    assert cpu.auto_precision(10_000_000, 64, 128, BF16, never)[0] == "fp32"
    precision, why = cpu.auto_precision(4_000_000_000, 2560, 9728, NO_BF16, never)
    assert precision == "int8" and "no native bf16" in why and "AMD EPYC" in why
    assert cpu.auto_precision(4_000_000_000, 2560, 9728, BF16, lambda h, i: (3.0, 5.0))[0] == "bf16"
    precision, why = cpu.auto_precision(4_000_000_000, 2560, 9728, BF16, lambda h, i: (5.0, 3.0))
    assert precision == "int8" and "3.0 vs 5.0" in why


def test_measure_mlp_times_both_kinds():
    bf16_ms, int8_ms = cpu.measure_mlp(256, 512, repeats=3)
    assert bf16_ms > 0 and int8_ms > 0


def test_cpu_facts_name_the_machine():
    facts = cpu.cpu_facts()
    assert facts["cpu"] and facts["kernels"] and isinstance(facts["native_bf16"], bool)


def test_engine_auto_on_the_demo_is_fp32_and_says_why(shared_engine):
    engine = shared_engine()  # Engine.load(demo_checkpoint(), device="cpu"), precision "auto"
    assert engine.info.precision == "fp32" and "small model" in engine.info.precision_reason


def test_int8_on_a_gpu_is_refused_with_a_sentence():
    from engine.demo import demo_checkpoint

    with pytest.raises(ValueError, match="CPU path"):
        Engine.load(demo_checkpoint(), device="cuda", precision="int8")
    with pytest.raises(ValueError, match="int8"):
        Engine.load(demo_checkpoint(), device="cpu", precision="int9")
