"""Checkpoint loading: the parity checkpoint, tiny round trips, sharded indexes, corrupt files and the hub."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from engine.checkpoint import CODEC_PREFIX, CheckpointError, expected_shapes, load_checkpoint, stored_name
from engine.config import Dims
from engine.demo import TINY_DIMS, random_backbone, write_tiny_checkpoint


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return write_tiny_checkpoint(tmp_path_factory.mktemp("tiny"), seed=3, codec=False)


def _rewrite(src, dst, edit=None, config_edit=None):
    """Copy a checkpoint directory, applying `edit` to its tensors and `config_edit` to its config."""
    shutil.copytree(src, dst)
    if edit:
        tensors = load_file(src / "model.safetensors")
        edit(tensors)
        save_file(tensors, str(dst / "model.safetensors"))
    if config_edit:
        config = json.loads((src / "config.json").read_text())
        config_edit(config)
        (dst / "config.json").write_text(json.dumps(config))
    return dst


def test_parity_checkpoint_names_shapes_dtypes(parity_dir):
    root = parity_dir / "tiny_checkpoint"
    ckpt = load_checkpoint(root)
    assert ckpt.dims == Dims(hidden=64, intermediate=128, layers=2, heads=4, kv_heads=2, head_dim=16, vocab=151936,
                             rms_eps=1e-6, rope_theta=1e6, max_positions=4096)
    assert set(ckpt.backbone) == set(expected_shapes(ckpt.dims))
    assert len(ckpt.backbone) == 2 * 11 + 3
    for name, shape in expected_shapes(ckpt.dims).items():
        assert tuple(ckpt.backbone[name].shape) == shape, name
    # Stored dtypes are kept: the fixture keeps the text table in bf16 and everything else in fp32.
    assert ckpt.backbone["text_embedding.weight"].dtype == torch.bfloat16
    assert {t.dtype for n, t in ckpt.backbone.items() if n != "text_embedding.weight"} == {torch.float32}
    assert len(ckpt.codec) == 367
    assert all(not k.startswith("tied.") for k in ckpt.codec)
    assert "acoustic_decoder.conv1.weight" in ckpt.codec
    assert ckpt.codec_config["model_type"] == "higgs_audio_v2_tokenizer"
    assert ckpt.tokenizer_path is None
    with safe_open(str(root / "model.safetensors"), framework="pt") as f:
        assert torch.equal(ckpt.backbone["audio_embedding.weight"],
                           f.get_tensor("tied.embedding.modality_embeddings.0.embedding.weight"))
        assert torch.equal(ckpt.backbone["layers.1.self_attn.k_norm.weight"],
                           f.get_tensor("body.layers.1.self_attn.k_norm.weight"))
        assert torch.equal(ckpt.codec["acoustic_decoder.conv1.weight"],
                           f.get_tensor(CODEC_PREFIX + "acoustic_decoder.conv1.weight"))


def test_round_trip_maps_every_stored_name(tiny_dir):
    ckpt = load_checkpoint(tiny_dir)
    assert ckpt.dims == TINY_DIMS
    assert ckpt.tokenizer_path == tiny_dir / "tokenizer.json"
    assert ckpt.codec == {} and ckpt.codec_config is None
    stored = random_backbone(TINY_DIMS, seed=3)
    assert set(stored) == {stored_name(n) for n in ckpt.backbone}
    for name, tensor in ckpt.backbone.items():
        assert torch.equal(tensor, stored[stored_name(name)]), name
    assert stored_name("layers.0.mlp.up_proj.weight") == "body.layers.0.mlp.up_proj.weight"
    assert stored_name("audio_embedding.weight") == "tied.embedding.modality_embeddings.0.embedding.weight"


def test_sharded_index_loads_like_a_single_file(tmp_path, tiny_dir):
    sharded = write_tiny_checkpoint(tmp_path / "sharded", seed=3, codec=False, shards=3)
    assert not (sharded / "model.safetensors").exists()
    assert len(list(sharded.glob("model-*-of-00003.safetensors"))) == 3
    a, b = load_checkpoint(sharded), load_checkpoint(tiny_dir)
    assert a.backbone.keys() == b.backbone.keys()
    assert all(torch.equal(a.backbone[k], b.backbone[k]) for k in a.backbone)


def test_index_naming_a_missing_shard_is_reported(tmp_path):
    sharded = write_tiny_checkpoint(tmp_path / "sharded", seed=3, codec=False, shards=2)
    (sharded / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(CheckpointError, match="model-00002-of-00002.safetensors"):
        load_checkpoint(sharded)


def test_config_without_rope_theta_is_refused(tmp_path, tiny_dir):
    def drop_theta(config):
        del config["text_config"]["rope_parameters"]

    bad = _rewrite(tiny_dir, tmp_path / "bad", config_edit=drop_theta)
    with pytest.raises(CheckpointError, match="rope theta"):
        load_checkpoint(bad)


def test_missing_key_is_named(tmp_path, tiny_dir):
    bad = _rewrite(tiny_dir, tmp_path / "bad", edit=lambda t: t.pop("body.layers.1.mlp.up_proj.weight"))
    with pytest.raises(CheckpointError, match=r"1 missing: body\.layers\.1\.mlp\.up_proj\.weight"):
        load_checkpoint(bad)


def test_many_missing_keys_are_counted(tmp_path, tiny_dir):
    def drop_layer_1(tensors):
        for k in [k for k in tensors if k.startswith("body.layers.1.")]:
            del tensors[k]

    bad = _rewrite(tiny_dir, tmp_path / "bad", edit=drop_layer_1)
    with pytest.raises(CheckpointError, match=r"11 missing: .*… and 1 more"):
        load_checkpoint(bad)


@pytest.mark.parametrize("extra", ["body.layers.0.self_attn.q_proj.bias", "body.layers.2.input_layernorm.weight",
                                   "lm_head.weight"])
def test_unexpected_key_is_named(tmp_path, tiny_dir, extra):
    bad = _rewrite(tiny_dir, tmp_path / "bad", edit=lambda t: t.__setitem__(extra, torch.zeros(64)))
    with pytest.raises(CheckpointError, match="1 unexpected: " + extra.replace(".", r"\.")):
        load_checkpoint(bad)


def test_wrong_shape_is_named_with_both_shapes(tmp_path, tiny_dir):
    bad = _rewrite(tiny_dir, tmp_path / "bad",
                   edit=lambda t: t.__setitem__("body.layers.0.self_attn.k_proj.weight", torch.zeros(64, 64)))
    with pytest.raises(CheckpointError, match=r"body\.layers\.0\.self_attn\.k_proj\.weight is \[64, 64\], "
                                              r"expected \[32, 64\]"):
        load_checkpoint(bad)


def test_config_that_disagrees_with_the_weights_is_refused(tmp_path, tiny_dir):
    def more_layers(config):
        config["text_config"]["num_hidden_layers"] = 3

    bad = _rewrite(tiny_dir, tmp_path / "bad", config_edit=more_layers)
    with pytest.raises(CheckpointError, match=r"11 missing: body\.layers\.2\."):
        load_checkpoint(bad)


def test_stored_tied_head_is_ignored_but_untied_head_refused(tmp_path, tiny_dir):
    head = "tied.head.modality_heads.0.weight"
    add_head = lambda t: t.__setitem__(head, torch.zeros(TINY_DIMS.audio_rows, TINY_DIMS.hidden))  # noqa: E731
    tied = _rewrite(tiny_dir, tmp_path / "tied", edit=add_head)
    assert "audio_embedding.weight" in load_checkpoint(tied).backbone

    def untie(config):
        config["audio_encoder_config"]["tie_word_embeddings"] = False

    untied = _rewrite(tiny_dir, tmp_path / "untied", edit=add_head, config_edit=untie)
    with pytest.raises(CheckpointError, match="unexpected: " + head.replace(".", r"\.")):
        load_checkpoint(untied)


def test_directory_without_weights_says_what_to_do(tmp_path, tiny_dir):
    (tmp_path / "config.json").write_text((tiny_dir / "config.json").read_text())
    with pytest.raises(CheckpointError, match=r"no model\.safetensors.*hf download.*--demo"):
        load_checkpoint(tmp_path)


def test_directory_without_config(tmp_path):
    with pytest.raises(CheckpointError, match="no config.json"):
        load_checkpoint(tmp_path)


def test_local_path_that_does_not_exist(tmp_path):
    with pytest.raises(CheckpointError, match="no checkpoint directory at"):
        load_checkpoint(tmp_path / "nowhere" / "ckpt")


@pytest.mark.parametrize("repo", ["bosonai/higgs-tts-3-4b", "bosonai/higgs-audio-v3-tts-4b"])
def test_offline_hub_id_gives_advice_not_a_traceback(tmp_path, monkeypatch, repo):
    import huggingface_hub.constants as hub

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(hub, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(hub, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.chdir(tmp_path)  # so `repo` cannot resolve to a local directory
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(repo, progress=False)
    message = str(info.value)
    assert f"hf download {repo} --local-dir" in message
    assert "--demo" in message
    assert info.value.__cause__ is None and info.value.__suppress_context__


def test_codec_tensors_round_trip(tmp_path):
    codec = pytest.importorskip("engine.codec")
    if not hasattr(codec, "random_codec_state_dict"):
        pytest.skip("engine.codec.random_codec_state_dict is not there yet")
    root = write_tiny_checkpoint(tmp_path / "ckpt", seed=5, codec=True)
    ckpt = load_checkpoint(root)
    expected = codec.random_codec_state_dict(seed=5)
    assert ckpt.codec.keys() == expected.keys()
    assert all(torch.equal(ckpt.codec[k], expected[k]) for k in expected)
    assert ckpt.codec_config == json.loads(json.dumps(codec.tiny_codec_config()))
