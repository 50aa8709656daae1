"""Model dimensions read from a checkpoint's `config.json`, and the fixed facts of the audio format.

Every size the engine uses comes from `Dims` or from the named constants below, so a tiny test
checkpoint and the real 4B model run through exactly the same code.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

# Audio format (SPEC Part 2 §6): 24 kHz mono, 25 frames/s, 960 samples per frame.
SAMPLE_RATE = 24_000
FRAME_RATE = 25
SAMPLES_PER_FRAME = SAMPLE_RATE // FRAME_RATE

# Placeholder id for reference-audio rows inside prompt ids (config `audio_token_id`).
AUDIO_PLACEHOLDER = -100

# The audio tokenizer's code layout (SPEC Part 2 §1.3): 8 codebooks of 1024 codec codes, plus BOC and
# EOC in the model's 1026-entry vocabulary per codebook.
CODEBOOKS = 8
CODEBOOK_SIZE = 1024


@dataclass(frozen=True, slots=True)
class Dims:
    """Backbone and audio-head sizes of one checkpoint (SPEC Part 2 §1)."""

    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    rms_eps: float
    rope_theta: float
    max_positions: int
    codebooks: int = CODEBOOKS
    codebook_vocab: int = CODEBOOK_SIZE + 2  # codec codes + BOC + EOC

    @property
    def codebook_size(self) -> int:
        """Number of real codec codes per codebook (1024)."""
        return self.codebook_vocab - 2

    @property
    def boc(self) -> int:
        """Begin-of-codes id inside each codebook (1024)."""
        return self.codebook_vocab - 2

    @property
    def eoc(self) -> int:
        """End-of-codes id inside each codebook (1025)."""
        return self.codebook_vocab - 1

    @property
    def delay(self) -> int:
        """Rows by which the last codebook lags the first (7): rows = frames + delay."""
        return self.codebooks - 1

    @property
    def audio_rows(self) -> int:
        """Rows of the fused audio embedding / tied audio head (8 × 1026)."""
        return self.codebooks * self.codebook_vocab

    def validate(self) -> None:
        problems = []
        for name in ("hidden", "intermediate", "layers", "heads", "kv_heads", "head_dim", "vocab",
                     "max_positions", "codebooks", "codebook_vocab"):
            if getattr(self, name) <= 0:
                problems.append(f"{name} must be positive (got {getattr(self, name)})")
        if self.kv_heads > 0 and self.heads % self.kv_heads:
            problems.append(f"heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads})")
        if self.head_dim % 2:
            problems.append(f"head_dim ({self.head_dim}) must be even for rotary embeddings")
        if self.codebook_vocab < 3:
            problems.append("codebook_vocab must leave room for BOC and EOC")
        if not self.rope_theta > 0:
            problems.append(f"rope_theta must be positive (got {self.rope_theta})")
        if not 0 < self.rms_eps < 1:
            problems.append(f"rms_norm_eps looks wrong ({self.rms_eps})")
        if problems:
            raise ValueError("invalid model config: " + "; ".join(problems))

    @classmethod
    def from_config(cls, config: dict) -> "Dims":
        """Read the `higgs_multimodal_qwen3` layout: backbone under `text_config`, audio under
        `audio_encoder_config`. The rope theta lives in `text_config.rope_parameters` and has no
        silent default (a loader that fell back to 1e4 would quietly change every position)."""
        text = config.get("text_config")
        if not isinstance(text, dict):
            raise ValueError("config.json has no `text_config` section; is this a Higgs Audio v3 checkpoint?")
        audio = config.get("audio_encoder_config") or {}
        theta = (text.get("rope_parameters") or {}).get("rope_theta")
        if theta is None:
            theta = text.get("rope_theta")
        if theta is None:
            raise ValueError("config.json gives no rope theta (expected text_config.rope_parameters.rope_theta)")
        if audio.get("encoder_type", "discrete") != "discrete":
            raise ValueError(f"audio_encoder_config.encoder_type {audio.get('encoder_type')!r} is not supported "
                             "(only the discrete codec path generates speech)")
        try:
            heads = int(text["num_attention_heads"])
            hidden = int(text["hidden_size"])
            dims = cls(
                hidden=hidden,
                intermediate=int(text["intermediate_size"]),
                layers=int(text["num_hidden_layers"]),
                heads=heads,
                kv_heads=int(text.get("num_key_value_heads", heads)),
                head_dim=int(text.get("head_dim") or hidden // heads),
                vocab=int(text["vocab_size"]),
                rms_eps=float(text.get("rms_norm_eps", 1e-6)),
                rope_theta=float(theta),
                max_positions=int(text.get("max_position_embeddings", 32768)),
                codebooks=int(audio.get("num_codebooks", CODEBOOKS)),
                codebook_vocab=int(audio.get("vocab_size", CODEBOOK_SIZE + 2)),
            )
        except KeyError as exc:
            raise ValueError(f"config.json text_config is missing {exc.args[0]!r}") from None
        out_dim = audio.get("out_dim")
        if out_dim is not None and int(out_dim) != dims.hidden:
            raise ValueError(f"audio_encoder_config.out_dim ({out_dim}) differs from hidden_size ({dims.hidden})")
        dims.validate()
        return dims

    @classmethod
    def from_file(cls, path: str | Path) -> "Dims":
        path = Path(path)
        try:
            config = json.loads(path.read_text())
        except FileNotFoundError:
            raise ValueError(f"no config.json at {path}") from None
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path} is not valid JSON: {exc}") from None
        return cls.from_config(config)


# The real bosonai/higgs-audio-v3-tts-4b dimensions (SPEC Part 2 §1.2), for benchmarks and size checks.
FULL_SIZE = Dims(hidden=2560, intermediate=9728, layers=36, heads=32, kv_heads=8, head_dim=128, vocab=151936,
                 rms_eps=1e-6, rope_theta=1e6, max_positions=32768)
