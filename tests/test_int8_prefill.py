"""An int8 prefill of many rows multiplies each packed matrix as a bf16 GEMM through one reused scratch
(engine/quant.py `linear`, `HiggsModel.gemm_rows`): at 6 real-width layers its logits stay within cosine
0.999 of bf16's on the same weights, with one buffer for the whole model and no float copy kept."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from engine.config import FULL_SIZE
from engine.demo import random_backbone
from engine.model import PREFILL_GEMM_ROWS, HiggsModel, gemm_rows_for
from engine.quant import Int8Weight, linear, quantize

SIX_LAYERS = dataclasses.replace(FULL_SIZE, layers=6, vocab=4096)


def cosine(a, b) -> float:
    return float(F.cosine_similarity(a.double().flatten(), b.double().flatten(), dim=0))


def test_the_gemm_path_is_chosen_by_precision_and_cpu():
    assert gemm_rows_for("int8", native_bf16=True) == PREFILL_GEMM_ROWS
    assert gemm_rows_for("int8", native_bf16=False) is None  # bf16 GEMMs run scalar loops there
    assert gemm_rows_for("int4", native_bf16=True) is None and gemm_rows_for(None, native_bf16=True) is None


def test_dequantised_into_the_scratch_multiplies_as_the_packed_matrix():
    gen = torch.Generator().manual_seed(2)
    w = quantize(torch.randn(96, 256, generator=gen) / 16, "int8")
    scratch = torch.full((96 * 256 + 50,), float("nan"), dtype=torch.bfloat16)
    x = torch.randn(40, 256, generator=gen).bfloat16()
    got, want = linear(x, w, scratch), linear(x, w)
    assert got.dtype == torch.bfloat16 and cosine(got, want) > 0.9999
    assert bool(scratch[96 * 256:].isnan().all())  # only the matrix's own N·K elements are written
    # one rounding of the exact product q·s
    assert torch.equal(scratch[:96 * 256].view(96, 256), (w.q.float() * w.scales.float()[:, None]).bfloat16())


@pytest.mark.slow
def test_six_real_width_layers_prefill_cosine_against_bf16():
    state = random_backbone(SIX_LAYERS, seed=7, dtype=torch.bfloat16, names="internal")
    bf16 = HiggsModel.from_state_dict(SIX_LAYERS, state, dtype=torch.bfloat16, max_len=192)
    int8 = HiggsModel.from_state_dict(SIX_LAYERS, state, dtype=torch.bfloat16, max_len=192, quant="int8")
    del state
    ids = torch.randint(10, SIX_LAYERS.vocab, (150,), generator=torch.Generator().manual_seed(8))
    want = bf16.prefill(ids)
    int8.gemm_rows = None
    packed = int8.prefill(ids)
    int8.gemm_rows = 1  # on every CPU kind, whatever this one's default
    gemm = int8.prefill(ids)
    print(f"\n6 layers, 150 tokens: prefill cosine vs bf16, packed {cosine(packed, want):.6f}, "
          f"GEMM through the scratch {cosine(gemm, want):.6f}")
    assert cosine(gemm, want) >= 0.999 and cosine(packed, want) >= 0.999
    assert not torch.equal(gemm, packed)  # the GEMM path really ran
    # one scratch for the model, the size of its largest matrix, and every projection still packed
    layer = int8.layers[0]
    assert int8.scratch.numel() == layer.mlp.w_gate_up.shape[0] * layer.mlp.w_gate_up.shape[1]
    assert all(isinstance(w, Int8Weight) for block in int8.layers
               for w in (block.self_attn.wqkv, block.self_attn.wo, block.mlp.w_gate_up, block.mlp.w_down))
