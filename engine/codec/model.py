"""`Codec`: the Higgs Audio v2 tokenizer (SPEC Part 2 §6) — RVQ + DAC decoder for speech out, DAC encoder +
HuBERT semantic branch + RVQ for voice-clone codes in. Always fp32: ConvTranspose in bf16 audibly degrades
the waveform and encode codes are an argmin that low precision flips.

Widths come from tensor shapes, so the tiny parity codec and the real one run the same code; module and
parameter names equal transformers' `HiggsAudioV2TokenizerModel`, so `load_state_dict` takes the checkpoint's
codec tensors unchanged (strict).
"""

from __future__ import annotations

import math
import re

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..config import SAMPLE_RATE
from ..resample import resample
from .dac import DacDecoder, DacEncoder
from .semantic import SemanticEncoder, build_hubert, hubert_config, hubert_total_stride, rename_pos_conv
from .stream import StreamDecoder

SEMANTIC_SAMPLE_RATE = 16_000  # HuBERT's rate (codec config `semantic_sample_rate`)
SEMANTIC_PAD = 160  # zeros each side of the 16 kHz input (transformers `_extract_semantic_features`)

# Training-only tensors that a full checkpoint carries and inference never reads.
_IGNORED = re.compile(r"(decoder_semantic\.|fc1\.|semantic_model\.masked_spec_embed$"
                      r"|quantizer\.quantizers\.\d+\.codebook\.(cluster_size|embed_avg|inited)$)")
# Tensors only the encode path needs; a decode-only state dict may leave them out (the quantizers'
# project_in is then ignored if present, as decode-only loaders do).
_ENCODER = re.compile(r"(acoustic_encoder\.|semantic_model\.|encoder_semantic\.|fc\.)")
_PROJECT_IN = re.compile(r"quantizer\.quantizers\.\d+\.project_in\.")


class _Codebook(nn.Module):
    def __init__(self, size: int, dim: int):
        super().__init__()
        self.register_buffer("embed", torch.zeros(size, dim))


class _Quantizer(nn.Module):
    def __init__(self, size: int, dim: int, hidden: int, with_encoder: bool):
        super().__init__()
        self.codebook = _Codebook(size, dim)
        self.project_in = nn.Linear(hidden, dim) if with_encoder else None
        self.project_out = nn.Linear(dim, hidden)

    def lookup(self, idx: torch.Tensor) -> torch.Tensor:
        return self.project_out(F.embedding(idx, self.codebook.embed))

    def nearest(self, x: torch.Tensor) -> torch.Tensor:
        """Index of the closest codebook entry (Euclidean) for each row of project_in(x); written as the
        reference writes it (−(|z|² − 2 z·e + |e|²), argmax) so near-ties break the same way."""
        z = self.project_in(x).reshape(-1, self.codebook.embed.shape[1])
        embed = self.codebook.embed.t()
        dist = -(z.pow(2).sum(1, keepdim=True) - 2 * z @ embed + embed.pow(2).sum(0, keepdim=True))
        return dist.max(dim=-1).indices.view(x.shape[:-1])


class _ResidualVQ(nn.Module):
    def __init__(self, count: int, size: int, dim: int, hidden: int, with_encoder: bool):
        super().__init__()
        self.quantizers = nn.ModuleList(_Quantizer(size, dim, hidden, with_encoder) for _ in range(count))

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """codes [T, Q] → summed projected embeddings [T, hidden]."""
        out = self.quantizers[0].lookup(codes[:, 0])
        for q in range(1, len(self.quantizers)):
            out = out + self.quantizers[q].lookup(codes[:, q])
        return out

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, hidden] → codes [T, Q]: each stage quantizes what the previous stages left."""
        residual, codes = x, []
        for quantizer in self.quantizers:
            idx = quantizer.nearest(residual)
            residual = residual - quantizer.lookup(idx)
            codes.append(idx)
        return torch.stack(codes, dim=1)


class Codec(nn.Module):
    """The codec of one checkpoint: `decode` and `stream` turn frames of 8 codes into 24 kHz audio; `encode`
    (when the encoder weights are loaded) turns a reference clip into frames."""

    def __init__(self, *, quantizers: int, codebook_size: int, codebook_dim: int, hidden: int,
                 decoder: DacDecoder, encoder: DacEncoder | None = None, semantic: nn.Module | None = None,
                 encoder_semantic: SemanticEncoder | None = None, semantic_sample_rate: int = SEMANTIC_SAMPLE_RATE):
        super().__init__()
        with_encoder = encoder is not None
        self.quantizer = _ResidualVQ(quantizers, codebook_size, codebook_dim, hidden, with_encoder)
        self.fc2 = nn.Linear(hidden, decoder.conv1.in_channels)
        self.acoustic_decoder = decoder
        if with_encoder:
            self.acoustic_encoder = encoder
            self.semantic_model = semantic
            self.encoder_semantic = encoder_semantic
            self.fc = nn.Linear(hidden, hidden)
        self.has_encoder = with_encoder
        self.num_quantizers = quantizers
        self.codebook_size = codebook_size
        self.hop = math.prod(decoder.strides)
        self.semantic_sample_rate = semantic_sample_rate
        self.receptive_field_frames: tuple[int, int] = decoder.receptive_field_frames()
        self.eval()

    # ---------------------------------------------------------------- loading
    @classmethod
    def from_state_dict(cls, sd: dict[str, torch.Tensor], config: dict | None = None) -> "Codec":
        """Build from the codec tensors (checkpoint prefix already stripped). `config` is the transformers
        codec config dict (`codec_config.json`); it only supplies what no shape shows: HuBERT's head count
        (else hidden // 64), conv strides and eps, the semantic residual dilations and the semantic rate."""
        config = config or {}
        for key in ("quantizer.quantizers.0.codebook.embed", "quantizer.quantizers.0.project_out.weight",
                    "fc2.weight", "acoustic_decoder.conv1.weight"):
            if key not in sd:
                raise ValueError(f"codec weights are missing {key!r}; is this the Higgs Audio v2 codec "
                                 "(checkpoint prefix tied.embedding.modality_embeddings.0.model. stripped)?")
        count = 1 + max(int(m.group(1)) for k in sd if (m := re.match(r"quantizer\.quantizers\.(\d+)\.", k)))
        size, dim = sd["quantizer.quantizers.0.codebook.embed"].shape
        hidden = sd["quantizer.quantizers.0.project_out.weight"].shape[0]
        sd = rename_pos_conv({k: v for k, v in sd.items() if not _IGNORED.match(k)})
        parts: dict = {}
        if not any(_ENCODER.match(k) for k in sd):
            sd = {k: v for k, v in sd.items() if not _PROJECT_IN.match(k)}
        else:
            for key in ("acoustic_encoder.conv1.weight", "encoder_semantic.conv.weight",
                        "semantic_model.feature_projection.projection.weight"):
                if key not in sd:
                    raise ValueError(f"codec weights have some encoder tensors but not {key!r}; "
                                     "give all encoder weights or none (decode-only)")
            parts = dict(encoder=DacEncoder.from_shapes(sd),
                         semantic=build_hubert(hubert_config(sd, config.get("semantic_model_config"))),
                         encoder_semantic=SemanticEncoder.from_shapes(sd, config.get("block_dilations")),
                         semantic_sample_rate=int(config.get("semantic_sample_rate", SEMANTIC_SAMPLE_RATE)))
        codec = cls(quantizers=count, codebook_size=size, codebook_dim=dim, hidden=hidden,
                    decoder=DacDecoder.from_shapes(sd), **parts)
        expected = codec.state_dict()
        missing = sorted(set(expected) - set(sd))
        unexpected = sorted(set(sd) - set(expected))
        if missing or unexpected:
            raise ValueError("codec weights do not match the Higgs Audio v2 codec layout: "
                             + "; ".join(f"{what} {len(keys)} key(s) e.g. {keys[:4]}"
                                         for what, keys in (("missing", missing), ("unexpected", unexpected)) if keys))
        bad = [k for k, v in expected.items() if v.shape != sd[k].shape]
        if bad:
            raise ValueError(f"codec tensor shapes disagree with each other at {bad[:4]} "
                             f"(e.g. {bad[0]}: {tuple(sd[bad[0]].shape)} vs {tuple(expected[bad[0]].shape)})")
        codec.load_state_dict({k: v.to(torch.float32) for k, v in sd.items()}, strict=True)
        return codec

    # ---------------------------------------------------------------- decode
    def check_codes(self, codes) -> torch.Tensor:
        """Codes as a CPU-or-device LongTensor [T, Q] after validation; raises ValueError otherwise."""
        codes = torch.as_tensor(codes)
        if codes.dim() != 2 or codes.shape[1] != self.num_quantizers:
            raise ValueError(f"codes must have shape [frames, {self.num_quantizers}], got {tuple(codes.shape)}")
        if codes.is_floating_point() or codes.is_complex() or codes.dtype == torch.bool:
            raise ValueError(f"codes must be integers, got {codes.dtype}")
        if codes.numel() and (int(codes.min()) < 0 or int(codes.max()) >= self.codebook_size):
            raise ValueError(f"codes must lie in 0..{self.codebook_size - 1} "
                             f"(got {int(codes.min())}..{int(codes.max())}); "
                             "BOC/EOC ids must be removed before decoding")
        return codes.to(device=self.device, dtype=torch.long)

    @property
    def device(self) -> torch.device:
        return self.fc2.weight.device

    def latent(self, codes: torch.Tensor) -> torch.Tensor:
        """Validated codes [T, Q] → the acoustic decoder's input [T, latent] (RVQ lookup + fc2, per frame)."""
        return self.fc2(self.quantizer.decode(codes))

    def decode_tensor(self, codes: torch.Tensor) -> torch.Tensor:
        """Validated codes [T, Q] → waveform [T·hop] on the codec's device (no validation, no host copy)."""
        with torch.inference_mode():
            return self.acoustic_decoder(self.latent(codes).t()[None])[0, 0]

    def decode(self, codes) -> np.ndarray:
        """codes LongTensor [T, 8] in 0..1023 → float32 waveform of exactly T·960 samples at 24 kHz."""
        codes = self.check_codes(codes)
        if codes.shape[0] == 0:
            return np.zeros(0, dtype=np.float32)
        return self.decode_tensor(codes).cpu().numpy()

    def stream(self) -> StreamDecoder:
        """A decoder that takes frames as they arrive and returns the samples that are already final."""
        return StreamDecoder(self)

    # ---------------------------------------------------------------- encode
    def frames_for(self, samples: int) -> int:
        """Frames `encode` gives for `samples` input samples (set by the HuBERT branch, SPEC §6.2)."""
        length = math.ceil(samples * self.semantic_sample_rate / SAMPLE_RATE) + 2 * SEMANTIC_PAD
        cfg = self.semantic_model.config
        for kernel, stride in zip(cfg.conv_kernel, cfg.conv_stride):
            length = (length - kernel) // stride + 1
        return math.ceil(length / self._semantic_step())

    def _semantic_step(self) -> int:
        """HuBERT frames per codec frame: hop / (24k/16k) / HuBERT stride (960 / 1.5 / 320 = 2)."""
        hubert_stride = hubert_total_stride(self.semantic_model.config)
        return int(self.hop / (SAMPLE_RATE / self.semantic_sample_rate) / hubert_stride)

    def _semantic_features(self, wav: torch.Tensor) -> torch.Tensor:
        """wav [1, L] at 24 kHz → semantic latent [1, hidden_sem, T]."""
        x = resample(wav, SAMPLE_RATE, self.semantic_sample_rate)
        x = F.pad(x, (SEMANTIC_PAD, SEMANTIC_PAD))
        hidden = self.semantic_model(x, output_hidden_states=True).hidden_states
        feats = torch.stack(hidden, dim=1).mean(dim=1)[:, :: self._semantic_step(), :]
        return self.encoder_semantic(feats.transpose(1, 2))

    def encode(self, wav: np.ndarray) -> torch.Tensor:
        """float32 mono 24 kHz waveform [L] → codes LongTensor [T, 8] (on the CPU).

        T comes from the HuBERT branch; when the DAC encoder's own frame count differs (L not close to a
        multiple of 960) the acoustic branch is re-run on the clip padded with hop/2 zeros each side, as
        transformers does. Pad clips to whole frames first to avoid that path (SPEC D7)."""
        if not self.has_encoder:
            raise ValueError("this codec was loaded without encoder weights (decode-only); "
                             "load the full checkpoint to encode reference audio")
        arr = np.asarray(wav)
        if arr.ndim != 1 or not np.issubdtype(arr.dtype, np.floating):
            raise ValueError(f"encode needs a 1-D float waveform (mono 24 kHz), "
                             f"got shape {arr.shape} dtype {arr.dtype}")
        if arr.shape[0] < self.hop:
            raise ValueError(f"reference audio is too short ({arr.shape[0]} samples); need at least {self.hop} "
                             f"samples ({self.hop / SAMPLE_RATE:.2f} s at {SAMPLE_RATE} Hz)")
        if not np.isfinite(arr).all():
            raise ValueError("reference audio contains NaN or infinite samples")
        x = torch.from_numpy(np.ascontiguousarray(arr, dtype=np.float32)).to(self.device)[None]  # [1, L]
        with torch.inference_mode():
            semantic = self._semantic_features(x)
            frames = semantic.shape[2]
            if self.acoustic_encoder.frames(x.shape[1]) != frames:
                x = F.pad(x, (self.hop // 2, self.hop // 2))
            acoustic = self.acoustic_encoder(x[None])
            if acoustic.shape[2] != frames:
                raise ValueError(f"{arr.shape[0]} samples give {acoustic.shape[2]} acoustic but {frames} semantic "
                                 "frames; pad the clip to a whole number of 960-sample frames")
            joint = self.fc(torch.cat([acoustic, semantic], dim=1)[0].t())  # [T, hidden]
            return self.quantizer.encode(joint).cpu()
