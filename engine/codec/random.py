"""Random codecs in the exact checkpoint layout, for tests (tiny) and benchmarks (full size).

`random_codec_state_dict()` has the same 367 keys and shapes as the parity fixture's codec: the real layer
structure (DAC strides 8·5·4·2·3, kernel sizes, dilations, HuBERT feature-extractor kernels and strides,
8 quantizers of 1024 codes) with shrunk widths, plus the training-only tensors a real checkpoint carries.
Weights are drawn from one seeded generator and scaled so activations stay O(1) and the decoded waveform
has an rms around 0.2.
"""

from __future__ import annotations

import torch
from transformers import HubertConfig

from .dac import DacDecoder, DacEncoder
from .model import Codec
from .semantic import HUBERT_CONV_STRIDES, SemanticEncoder, build_hubert

STRIDES = (8, 5, 4, 2, 3)
QUANTIZERS = 8
CODEBOOK_SIZE = 1024
HUBERT_KERNELS = (10, 3, 3, 3, 3, 2, 2)
TARGET_RMS = 0.2
WEIGHT_GAIN = 0.7  # × 1/sqrt(fan_in), as in the parity fixture
RESIDUAL_GAIN = 0.3

SIZES = {
    # name: DAC encoder width, decoder width, acoustic latent, codebook dim,
    #       HuBERT hidden, layers, heads, FFN, feature-extractor width, pos-conv kernel, pos-conv groups
    "tiny": dict(enc=4, dec=64, latent=16, cb_dim=8, sem=32, layers=2, heads=2, ffn=64, fe=16, pos=16, groups=2),
    "full": dict(enc=64, dec=1024, latent=256, cb_dim=64, sem=768, layers=12, heads=12, ffn=3072, fe=512, pos=128,
                 groups=16),
}


def _codec_config(d: dict) -> dict:
    """The transformers `HiggsAudioV2TokenizerConfig` dict for these sizes (the fields that matter)."""
    return {
        "model_type": "higgs_audio_v2_tokenizer",
        "sample_rate": 24000, "semantic_sample_rate": 16000, "downsample_factor": 320,
        "codebook_size": CODEBOOK_SIZE, "codebook_dim": d["cb_dim"], "target_bandwidths": [0.5, 1, 1.5, 2],
        "kernel_size": 3, "unit_kernel_size": 3, "strides": [1, 1], "channel_ratios": [1, 1],
        "block_dilations": [1, 1],
        "acoustic_model_config": {
            "model_type": "dac", "encoder_hidden_size": d["enc"], "decoder_hidden_size": d["dec"],
            "hidden_size": d["latent"], "downsampling_ratios": list(STRIDES), "upsampling_ratios": list(STRIDES),
            "hop_length": 960, "codebook_size": CODEBOOK_SIZE,
        },
        "semantic_model_config": {
            "model_type": "hubert", "hidden_size": d["sem"], "num_hidden_layers": d["layers"],
            "num_attention_heads": d["heads"], "intermediate_size": d["ffn"], "conv_dim": [d["fe"]] * 7,
            "conv_kernel": list(HUBERT_KERNELS), "conv_stride": list(HUBERT_CONV_STRIDES), "conv_bias": False,
            "feat_extract_norm": "group", "feat_proj_layer_norm": True, "do_stable_layer_norm": False,
            "num_conv_pos_embeddings": d["pos"], "num_conv_pos_embedding_groups": d["groups"],
            "layer_norm_eps": 1e-5, "hidden_act": "gelu", "feat_extract_activation": "gelu",
            "mask_time_prob": 0.0,
        },
    }


def tiny_codec_config() -> dict:
    """The codec_config.json content matching `random_codec_state_dict()` (HuBERT 32 wide, 2 heads)."""
    return _codec_config(SIZES["tiny"])


def _fill(name: str, t: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """A fresh value for one parameter: norms at identity, Snake α near 1, weights ~ N(0, 1/fan_in)."""
    last = name.rsplit(".", 1)[-1]
    if "norm" in name and last in ("weight", "bias") and t.dim() == 1:
        return torch.ones_like(t) if last == "weight" else torch.zeros_like(t)
    if last == "alpha":
        return 1.0 + 0.05 * torch.randn(t.shape, generator=gen)
    if last == "bias" or t.dim() == 1:
        return 0.02 * torch.randn(t.shape, generator=gen)
    if last == "embed":
        return torch.randn(t.shape, generator=gen)
    if last == "original0":  # weight-norm magnitude of HuBERT's positional conv
        return torch.ones_like(t)
    fan_in = t[0].numel() if "conv_t1" not in name else t.shape[0] * t.shape[2] // 2
    # Residual branches get a small gain so 15 stacked units do not grow the activations (which would
    # amplify fp32 rounding far beyond the real codec's 4e-7 relative floor).
    gain = RESIDUAL_GAIN if "res_unit" in name and name.endswith("conv2.weight") else WEIGHT_GAIN
    return gain * torch.randn(t.shape, generator=gen) / fan_in ** 0.5


def random_codec_state_dict(*, seed: int = 0, size: str = "tiny") -> dict[str, torch.Tensor]:
    """A random codec state dict with the checkpoint's key names (prefix stripped), `size` "tiny" (the parity
    fixture's widths) or "full" (the real widths: DAC 64/1024, latent 256, codebook dim 64, HuBERT-base)."""
    if size not in SIZES:
        raise ValueError(f"size must be one of {sorted(SIZES)}, got {size!r}")
    d = SIZES[size]
    sem_cfg = HubertConfig(**{k: v for k, v in _codec_config(d)["semantic_model_config"].items() if k != "model_type"},
                           mask_feature_prob=0.0)
    hidden = d["latent"] + d["sem"]
    codec = Codec(quantizers=QUANTIZERS, codebook_size=CODEBOOK_SIZE, codebook_dim=d["cb_dim"], hidden=hidden,
                  decoder=DacDecoder(d["latent"], d["dec"], STRIDES),
                  encoder=DacEncoder(d["enc"], d["latent"], STRIDES), semantic=build_hubert(sem_cfg),
                  encoder_semantic=SemanticEncoder(d["sem"], [(d["sem"], d["sem"], 3)] * 2))
    gen = torch.Generator().manual_seed(seed)
    sd = {k: _fill(k, v, gen).to(torch.float32) for k, v in codec.state_dict().items()}
    # Training-only tensors the real checkpoint also stores (inference ignores them).
    for k, v in codec.encoder_semantic.state_dict().items():  # decoder_semantic mirrors its shapes
        k = "conv1.weight" if k == "conv.weight" else k
        sd["decoder_semantic." + k] = _fill(k, v, gen)
    sd["decoder_semantic.conv2.weight"] = _fill("conv2.weight", sd["decoder_semantic.conv1.weight"], gen)
    sd["fc1.weight"] = _fill("fc1.weight", torch.zeros(d["sem"], hidden), gen)
    sd["fc1.bias"] = torch.zeros(d["sem"])
    for q in range(QUANTIZERS):
        p = f"quantizer.quantizers.{q}.codebook."
        sd[p + "inited"] = torch.ones(1)
        sd[p + "cluster_size"] = torch.ones(CODEBOOK_SIZE)
        sd[p + "embed_avg"] = sd[p + "embed"].clone()
    # Rescale the last conv so the waveform of random codes has rms TARGET_RMS (measured, not guessed).
    codec.load_state_dict({k: v for k, v in sd.items() if k in codec.state_dict()})
    probe = torch.randint(0, CODEBOOK_SIZE, (20, QUANTIZERS), generator=gen)
    rms = float(torch.as_tensor(codec.decode(probe)).pow(2).mean().sqrt())
    sd["acoustic_decoder.conv2.weight"] = sd["acoustic_decoder.conv2.weight"] * (TARGET_RMS / rms)
    sd["acoustic_decoder.conv2.bias"] = sd["acoustic_decoder.conv2.bias"] * (TARGET_RMS / rms)
    return {k: v.contiguous() for k, v in sd.items()}
