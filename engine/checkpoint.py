"""Find a checkpoint (a local directory or a Hugging Face repo id), read its weights lazily and map the
stored key names (SPEC Part 2 §2) onto the engine's names (docs/ARCHITECTURE.md).

Every tensor keeps its stored dtype; the model decides what to convert. Shapes are checked against
`config.json` from the safetensors headers before any tensor is read, so a mismatched file fails fast with
the names of the offending keys instead of a shape error deep inside the model.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import safe_open

from .config import Dims
from .model import LAYER_SUFFIXES

log = logging.getLogger(__name__)

DEFAULT_REPO = "bosonai/higgs-tts-3-4b"  # the renamed bosonai/higgs-audio-v3-tts-4b; same files
ALLOW_PATTERNS = ["config.json", "tokenizer.json", "tokenizer_config.json", "model*.safetensors",
                  "model.safetensors.index.json", "*.json"]

CODEC_PREFIX = "tied.embedding.modality_embeddings.0.model."
HEAD_PREFIX = "tied.head."
_FIXED_NAMES = {
    "body.norm.weight": "norm.weight",
    "tied.embedding.text_embedding.weight": "text_embedding.weight",
    "tied.embedding.modality_embeddings.0.embedding.weight": "audio_embedding.weight",
}
_LAYER_KEY = re.compile(r"body\.layers\.(\d+)\.(.+)")
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*")


class CheckpointError(ValueError):
    """A checkpoint could not be found or does not match its config; the message says what to do."""


@dataclass
class Checkpoint:
    """Everything read from one checkpoint: dims, backbone tensors under internal names, the codec's state
    dict (transformers `HiggsAudioV2TokenizerModel` names) and where the tokenizer lives."""

    root: Path
    dims: Dims
    backbone: dict[str, torch.Tensor] = field(repr=False)
    codec: dict[str, torch.Tensor] = field(repr=False)
    tokenizer_path: Path | None
    codec_config: dict | None = field(repr=False)
    source: str


def expected_shapes(dims: Dims) -> dict[str, tuple[int, ...]]:
    """Internal backbone name → shape, as `config.json` implies (no biases anywhere)."""
    q, kv = dims.heads * dims.head_dim, dims.kv_heads * dims.head_dim
    per_layer = {
        "input_layernorm.weight": (dims.hidden,), "post_attention_layernorm.weight": (dims.hidden,),
        "self_attn.q_proj.weight": (q, dims.hidden), "self_attn.k_proj.weight": (kv, dims.hidden),
        "self_attn.v_proj.weight": (kv, dims.hidden), "self_attn.o_proj.weight": (dims.hidden, q),
        "self_attn.q_norm.weight": (dims.head_dim,), "self_attn.k_norm.weight": (dims.head_dim,),
        "mlp.gate_proj.weight": (dims.intermediate, dims.hidden),
        "mlp.up_proj.weight": (dims.intermediate, dims.hidden),
        "mlp.down_proj.weight": (dims.hidden, dims.intermediate),
    }
    shapes = {f"layers.{i}.{s}": shape for i in range(dims.layers) for s, shape in per_layer.items()}
    shapes["norm.weight"] = (dims.hidden,)
    shapes["text_embedding.weight"] = (dims.vocab, dims.hidden)
    shapes["audio_embedding.weight"] = (dims.audio_rows, dims.hidden)
    return shapes


def internal_name(stored: str, dims: Dims) -> str | None:
    """The engine's name for a stored backbone key, or None when the key is not part of the backbone."""
    if stored in _FIXED_NAMES:
        return _FIXED_NAMES[stored]
    m = _LAYER_KEY.fullmatch(stored)
    if m and int(m.group(1)) < dims.layers and m.group(2) in LAYER_SUFFIXES:
        return f"layers.{int(m.group(1))}.{m.group(2)}"
    return None


def resolve(source: str | Path, *, progress: bool = True) -> Path:
    """A local checkpoint directory for `source`, downloading a hub id into the hub cache if needed."""
    path = Path(source).expanduser()
    if path.is_file():
        path = path.parent
    if path.is_dir():
        return path
    text = str(source)
    if not _HUB_ID.fullmatch(text):
        raise CheckpointError(f"no checkpoint directory at {text}. Pass a directory holding config.json and "
                              f"model.safetensors, a Hugging Face id such as {DEFAULT_REPO}, or --demo.")
    return _download(text, progress)


def _download(repo_id: str, progress: bool) -> Path:
    from huggingface_hub import snapshot_download
    from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars

    advice = (f"There is no local directory {repo_id!r}, so it was taken as a hub id. Download it once with "
              f"`hf download {repo_id} --local-dir ./{repo_id.split('/')[-1]}` on a machine with access to "
              "huggingface.co and pass that directory, or start with --demo to try the studio on a tiny random "
              "checkpoint.")
    was_disabled = are_progress_bars_disabled()
    if not progress:
        disable_progress_bars()
    try:
        return Path(snapshot_download(repo_id, allow_patterns=ALLOW_PATTERNS))
    except Exception as exc:  # the hub raises a zoo of HTTP/offline/validation errors; all mean the same here
        first = (str(exc).strip().splitlines() or [""])[0].split(". ")[0].rstrip(".")
        reason = f"{type(exc).__name__}: {first[:200]}" if first else type(exc).__name__
        raise CheckpointError(f"could not get {repo_id} from the Hugging Face hub ({reason}). {advice}") from None
    finally:
        if not progress and not was_disabled:
            enable_progress_bars()


def _weight_files(root: Path) -> dict[Path, list[str] | None]:
    """Safetensors files to read: file → keys the index assigns to it (None: every key in the file)."""
    index = root / "model.safetensors.index.json"
    if index.exists():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise CheckpointError(f"{index} is not a valid safetensors index ({exc}); re-download the "
                                  "checkpoint") from None
        files: dict[Path, list[str]] = {}
        for key, filename in weight_map.items():
            files.setdefault(root / filename, []).append(key)
        absent = sorted(str(f.name) for f in files if not f.exists())
        if absent:
            raise CheckpointError(f"{root} is incomplete: the index names {len(absent)} missing weight file(s) "
                                  f"({', '.join(absent[:5])}); finish the download")
        return files
    single = root / "model.safetensors"
    if single.exists():
        return {single: None}
    raise CheckpointError(f"{root} has no model.safetensors or model.safetensors.index.json. Download the weights "
                          f"(`hf download {DEFAULT_REPO} --local-dir {root}`) or start with --demo.")


def _listing(names: list[str], limit: int = 10) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" … and {len(names) - limit} more" if len(names) > limit else "")


def _tied_heads(config: dict) -> bool:
    text_tied = (config.get("text_config") or {}).get("tie_word_embeddings", True)
    audio_tied = (config.get("audio_encoder_config") or {}).get("tie_word_embeddings", True)
    return bool(text_tied) and bool(audio_tied)


def load_checkpoint(source: str | Path, *, progress: bool = True) -> Checkpoint:
    """Load a Higgs Audio v3 checkpoint from a directory or hub id, validated against its config.json."""
    root = resolve(source, progress=progress)
    config_path = root / "config.json"
    try:
        config = json.loads(config_path.read_text())
        dims = Dims.from_config(config)
    except FileNotFoundError:
        raise CheckpointError(f"{root} has no config.json; is it a Higgs Audio v3 checkpoint directory?") from None
    except (ValueError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{config_path}: {exc}") from None

    backbone: dict[str, torch.Tensor] = {}
    codec: dict[str, torch.Tensor] = {}
    for file, entries in _plan(root, dims, tied=_tied_heads(config)).items():
        with safe_open(str(file), framework="pt") as f:  # memory-mapped: one tensor at a time
            for key, is_codec, name in entries:
                (codec if is_codec else backbone)[name] = f.get_tensor(key)
    if not codec:
        log.warning("%s holds no codec tensors (%s*); it can generate codes but not audio", root, CODEC_PREFIX)

    codec_config = None
    if (root / "codec_config.json").exists():
        try:
            codec_config = json.loads((root / "codec_config.json").read_text())
        except json.JSONDecodeError as exc:
            raise CheckpointError(f"{root / 'codec_config.json'} is not valid JSON ({exc})") from None
    tokenizer_path = root / "tokenizer.json"
    return Checkpoint(root=root, dims=dims, backbone=backbone, codec=codec,
                      tokenizer_path=tokenizer_path if tokenizer_path.exists() else None,
                      codec_config=codec_config, source=str(source))


def _plan(root: Path, dims: Dims, *, tied: bool) -> dict[Path, list[tuple[str, bool, str]]]:
    """Check every stored key and backbone shape against `dims` from the safetensors headers alone, and
    return what to read: file → (stored key, is codec, internal name). All problems are reported at once."""
    shapes = expected_shapes(dims)
    plan: dict[Path, list[tuple[str, bool, str]]] = {}
    seen: set[str] = set()
    unexpected, wrong_shape, heads = [], [], []
    for file, keys in _weight_files(root).items():
        entries = plan.setdefault(file, [])
        with safe_open(str(file), framework="pt") as f:
            available = set(f.keys())
            for key in keys if keys is not None else sorted(available):
                if key not in available:
                    raise CheckpointError(f"{file.name} lacks {key}, which model.safetensors.index.json places "
                                          "there; re-download the checkpoint")
                if key.startswith(CODEC_PREFIX):
                    entries.append((key, True, key[len(CODEC_PREFIX):]))
                    continue
                if key.startswith(HEAD_PREFIX):
                    heads.append(key)
                    continue
                name = internal_name(key, dims)
                if name is None:
                    unexpected.append(key)
                    continue
                shape = tuple(f.get_slice(key).get_shape())
                if shape != shapes[name]:
                    wrong_shape.append(f"{key} is {list(shape)}, expected {list(shapes[name])}")
                seen.add(name)
                entries.append((key, False, name))
    if heads and not tied:
        unexpected.extend(heads)  # an untied head would change the output; only tied heads are implemented
    elif heads:
        log.info("ignoring %d stored head tensors (%s): the heads are tied to the embeddings", len(heads), heads[0])

    missing = [stored_name(n) for n in shapes if n not in seen]
    problems = []
    if missing:
        problems.append(f"{len(missing)} missing: {_listing(missing)}")
    if unexpected:
        problems.append(f"{len(unexpected)} unexpected: {_listing(sorted(unexpected))}")
    if wrong_shape:
        problems.append(f"{len(wrong_shape)} with the wrong shape: {_listing(wrong_shape)}")
    if problems:
        raise CheckpointError(f"the weights in {root} do not match its config.json ({'; '.join(problems)}). "
                              "Re-download the checkpoint, or check that config.json belongs to these weights.")
    return plan


def stored_name(internal: str) -> str:
    """The stored key for an internal backbone name (for error messages: users see their file's names)."""
    for stored, name in _FIXED_NAMES.items():
        if name == internal:
            return stored
    return "body." + internal
