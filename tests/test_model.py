"""Model math (engine/model.py): parity prefill logits and greedy rows against the fixture, the step
interface's two-segment prefill, RoPE rounding, GQA, and the reduced precisions."""

import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from engine.config import Dims
from engine.layers import apply_rope, rope_table, signed_sin
from engine.model import HiggsModel, param_count, rel_error

STORED = {"tied.embedding.text_embedding.weight": "text_embedding.weight",
          "tied.embedding.modality_embeddings.0.embedding.weight": "audio_embedding.weight",
          "body.norm.weight": "norm.weight"}


@pytest.fixture(scope="module")
def tiny(parity_dir):
    """Dims + internal-name state dict of the parity checkpoint, mapped here directly so these tests
    exercise model.py alone (the loader has its own tests)."""
    dims = Dims.from_file(parity_dir / "tiny_checkpoint" / "config.json")
    raw = load_file(parity_dir / "tiny_checkpoint" / "model.safetensors")
    state = {STORED.get(k, k.removeprefix("body.")): v for k, v in raw.items()
             if k in STORED or k.startswith("body.layers.")}
    return dims, state


def case(parity_dir, name):
    d = json.loads((parity_dir / f"{name}.json").read_text())
    ids = torch.tensor(d["prompt_ids"])
    rows = torch.tensor(d["ref_rows"]) if d["ref_rows"] else None
    ref = torch.from_numpy(np.load(parity_dir / f"{name}_prefill_logits.npy"))
    return d, ids, rows, ref


@pytest.mark.parametrize("name", ["zero_shot", "voice_clone"])
def test_prefill_logits_and_greedy_rows_fp32(tiny, parity_dir, name):
    d, ids, ref_rows, ref = case(parity_dir, name)
    model = HiggsModel.from_state_dict(*tiny, max_len=256)
    logits = model.prefill(ids, ref_rows, 0)
    assert logits.dtype == torch.float32 and logits.shape == (8, 1026)
    assert rel_error(logits, ref) < 1e-4
    rows, pos = [], len(ids)
    for s in range(150):
        row = logits.argmax(-1)
        row[s + 1:] = 1024  # delay window (no EOC appears in these 150 rows)
        rows.append(row.tolist())
        logits = model.decode(row, pos)
        pos += 1
    assert rows == d["rows"]


def test_two_segment_prefill_matches_one_and_is_reproducible(tiny, parity_dir):
    _, ids, ref_rows, ref = case(parity_dir, "voice_clone")
    model = HiggsModel.from_state_dict(*tiny, max_len=256)
    whole = model.prefill(ids, ref_rows, 0)
    split = 10  # inside the placeholder block: the second segment gets the remaining reference rows
    used = int((ids[:split] == -100).sum())
    model.prefill(ids[:split], ref_rows, 0)
    seg = model.prefill(ids[split:], ref_rows[used:], split)
    assert rel_error(seg, whole) < 1e-5
    again = model.prefill(ids[split:], ref_rows[used:], split)  # prefix KV untouched by the first run
    assert torch.equal(seg, again)


def test_placeholders_need_reference_rows(tiny, parity_dir):
    _, ids, _, _ = case(parity_dir, "voice_clone")
    model = HiggsModel.from_state_dict(*tiny, max_len=128)
    with pytest.raises(ValueError, match="placeholders"):
        model.prefill(ids, None, 0)


@pytest.mark.parametrize("precision", [torch.bfloat16, torch.float16])
def test_reduced_precision_close(tiny, parity_dir, precision):
    _, ids, ref_rows, ref = case(parity_dir, "zero_shot")
    model = HiggsModel.from_state_dict(*tiny, dtype=precision, max_len=128)
    assert model.layers[0].self_attn.q_proj.weight.dtype == precision
    assert model.text_embedding.weight.dtype == torch.bfloat16  # stored dtype kept: lookups only
    logits = model.prefill(ids, ref_rows, 0)
    assert logits.dtype == torch.float32
    assert rel_error(logits, ref) < 5e-2
    assert torch.isfinite(model.decode(logits.argmax(-1), len(ids))).all()


def test_rope_tables_are_bf16_values_in_fp32():
    dims = Dims(hidden=64, intermediate=128, layers=1, heads=4, kv_heads=2, head_dim=16, vocab=10,
                rms_eps=1e-6, rope_theta=1e6, max_positions=4096)
    cos, sin = rope_table(dims, 300, torch.float32)
    assert cos.dtype == torch.float32
    assert torch.equal(cos, cos.to(torch.bfloat16).float()) and torch.equal(sin, sin.to(torch.bfloat16).float())
    pos = torch.arange(300, dtype=torch.float64)[:, None]
    inv = 1e6 ** (-torch.arange(0, 16, 2, dtype=torch.float64) / 16)
    exact = torch.cat([pos * inv, pos * inv], -1)
    assert (cos.double() - exact.cos()).abs().max() < 4e-3  # bf16 has 8 mantissa bits
    # A rotation by position p and its inverse give back the input (NeoX half rotation, cos²+sin² ≈ 1).
    x = torch.randn(2, 300, 16)
    rotated = apply_rope(x, cos, signed_sin(sin))
    half = torch.cat([-x[..., 8:], x[..., :8]], -1)  # rotate_half, spelled out
    assert torch.equal(rotated, x * cos + half * sin)
    back = apply_rope(rotated, cos, signed_sin(-sin))
    assert (back - x).abs().max() < 2e-2


def test_param_count_full_size():
    from engine.config import FULL_SIZE
    n = param_count(FULL_SIZE)
    assert 4.0e9 < n < 4.6e9  # "TTS-4B"
