"""The fixture generators themselves: tiny checkpoints in the real layout, the tokenizer cache, the demo dir."""

from __future__ import annotations

import hashlib
import json

import pytest
import torch
from safetensors import safe_open

from engine.checkpoint import load_checkpoint
from engine.config import Dims
from engine.prompt import zero_shot_ids
from engine.demo import (TINY_DIMS, added_tokens, backbone_shapes, cache_dir, demo_checkpoint,
                            reference_tokenizer_path, write_tiny_checkpoint)
from engine.tokenizer import HiggsTokenizer


def _sha(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_tiny_checkpoint_real_layout_and_determinism(tmp_path):
    a = write_tiny_checkpoint(tmp_path / "a", seed=1, codec=False)
    b = write_tiny_checkpoint(tmp_path / "b", seed=1, codec=False)
    c = write_tiny_checkpoint(tmp_path / "c", seed=2, codec=False)
    assert _sha(a / "model.safetensors") == _sha(b / "model.safetensors") != _sha(c / "model.safetensors")
    config = json.loads((a / "config.json").read_text())
    assert "rope_theta" not in config and "rope_theta" not in config["text_config"]
    assert config["text_config"]["rope_parameters"]["rope_theta"] == 1e6
    assert Dims.from_config(config) == TINY_DIMS
    with safe_open(str(a / "model.safetensors"), framework="pt") as f:
        assert set(f.keys()) == set(backbone_shapes(TINY_DIMS))
        assert not any(k.startswith("tied.head.") for k in f.keys())
    assert _sha(a / "tokenizer.json") == _sha(reference_tokenizer_path())


def test_tiny_checkpoint_dtype_and_custom_dims(tmp_path):
    dims = Dims(hidden=32, intermediate=48, layers=3, heads=2, kv_heads=1, head_dim=16, vocab=151936,
                rms_eps=1e-6, rope_theta=1e6, max_positions=512)
    ckpt = load_checkpoint(write_tiny_checkpoint(tmp_path, dims=dims, codec=False, dtype=torch.bfloat16))
    assert ckpt.dims == dims
    assert {t.dtype for t in ckpt.backbone.values()} == {torch.bfloat16}
    assert ckpt.backbone["layers.2.self_attn.k_proj.weight"].shape == (16, 32)


def test_tiny_checkpoint_runs_with_activations_of_order_one(tmp_path):
    from engine.model import HiggsModel

    ckpt = load_checkpoint(write_tiny_checkpoint(tmp_path, codec=False))
    tok = HiggsTokenizer.from_file(ckpt.tokenizer_path)
    model = HiggsModel.from_state_dict(ckpt.dims, ckpt.backbone)
    model.setup_cache(64)
    logits = model.prefill(torch.tensor(zero_shot_ids(tok.encode("Hello there, how are you?"))))
    assert logits.shape == (8, 1026) and torch.isfinite(logits).all()
    assert 0.1 < logits.std() < 10 and logits.abs().max() < 50


def test_added_tokens_fill_unknown_ids_with_placeholders():
    tokens = added_tokens()
    assert list(tokens) == list(range(151643, 151727))
    assert len(set(tokens.values())) == 84
    for i in (151665, 151666, 151675, 151676, 151677, 151702, 151703, 151724):
        assert tokens[i] == f"<|reserved_{i}|>"
    assert tokens[151644] == "<|im_start|>" and tokens[151667] == "<|tts|>"


def test_reference_tokenizer_is_cached_by_ranks_hash(tmp_path, monkeypatch):
    monkeypatch.setenv("HIGGS_STUDIO_CACHE", str(tmp_path))
    assert cache_dir() == tmp_path
    path = reference_tokenizer_path()
    assert path.parent == tmp_path and path.name.startswith("higgs-tokenizer-")
    stamp = path.stat().st_mtime_ns
    assert reference_tokenizer_path() == path and path.stat().st_mtime_ns == stamp


def test_demo_checkpoint_is_cached_and_rebuilt_when_incomplete(tmp_path, monkeypatch):
    codec = pytest.importorskip("engine.codec")
    if not hasattr(codec, "random_codec_state_dict"):
        pytest.skip("engine.codec.random_codec_state_dict is not there yet")
    monkeypatch.setenv("HIGGS_STUDIO_CACHE", str(tmp_path))
    root = demo_checkpoint()
    assert root.parent == tmp_path and (root / ".complete").exists()
    stamp = (root / "model.safetensors").stat().st_mtime_ns
    assert demo_checkpoint() == root and (root / "model.safetensors").stat().st_mtime_ns == stamp
    ckpt = load_checkpoint(root)
    assert ckpt.codec and ckpt.codec_config and ckpt.tokenizer_path
    (root / ".complete").unlink()  # an interrupted write
    (root / "model.safetensors").write_bytes(b"truncated")
    assert demo_checkpoint() == root and (root / ".complete").exists()
    assert load_checkpoint(root).backbone.keys() == ckpt.backbone.keys()
    assert not list(tmp_path.glob(".demo-*"))
