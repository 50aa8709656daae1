"""The codec's semantic half: a HuBERT model (transformers `HubertModel`, its config derived from the weight
shapes) and the small conv stack `encoder_semantic` that maps the averaged HuBERT hidden states to the
semantic latent. Parameter names are exactly those inside transformers' `HiggsAudioV2TokenizerModel`.
"""

from __future__ import annotations

import math
import re

import torch
from torch import nn
from transformers import HubertConfig, HubertModel

# What tensor shapes cannot say. HuBERT-base values; a codec_config.json overrides them.
HUBERT_CONV_STRIDES = (5, 2, 2, 2, 2, 2, 2)
HUBERT_HEAD_DIM = 64  # hidden // 64 heads when no config says otherwise (768 → 12)
SEMANTIC_DILATIONS_DEFAULT = 1
POS_CONV = "encoder.pos_conv_embed.conv."


def hubert_config(sd: dict[str, torch.Tensor], config: dict | None = None,
                  prefix: str = "semantic_model.") -> HubertConfig:
    """A `HubertConfig` whose widths come from the tensors under `prefix`; heads, strides, eps and the
    layer-norm placement come from `config` (a `semantic_model_config` dict) when given."""
    config = config or {}
    conv_w = []
    while (key := f"{prefix}feature_extractor.conv_layers.{len(conv_w)}.conv.weight") in sd:
        conv_w.append(sd[key])
    if not conv_w:
        raise ValueError(f"no HuBERT feature-extractor weights under {prefix!r}")
    layers = 1 + max(int(m.group(1)) for k in sd if (m := re.match(re.escape(prefix) + r"encoder\.layers\.(\d+)\.", k)))
    hidden = sd[prefix + "feature_projection.projection.weight"].shape[0]
    v_keys = [k for k in (prefix + POS_CONV + "parametrizations.weight.original1", prefix + POS_CONV + "weight_v")
              if k in sd]
    if not v_keys:
        raise ValueError(f"HuBERT positional conv weight missing ({prefix}{POS_CONV}parametrizations.weight.original1)")
    pos_w = sd[v_keys[0]]
    has_ln = [f"{prefix}feature_extractor.conv_layers.{i}.layer_norm.weight" in sd for i in range(len(conv_w))]
    strides = config.get("conv_stride", HUBERT_CONV_STRIDES)
    if len(strides) != len(conv_w):
        raise ValueError(f"HuBERT has {len(conv_w)} feature-extractor convs but {len(strides)} strides are known; "
                         "pass the codec config's semantic_model_config")
    heads = int(config.get("num_attention_heads", hidden // HUBERT_HEAD_DIM))
    if heads < 1 or hidden % heads:
        raise ValueError(f"cannot split HuBERT hidden size {hidden} into {heads} attention heads; pass the codec "
                         "config (codec_config.json) whose semantic_model_config gives num_attention_heads")
    return HubertConfig(
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=sd[prefix + "encoder.layers.0.feed_forward.intermediate_dense.weight"].shape[0],
        conv_dim=[w.shape[0] for w in conv_w],
        conv_kernel=[w.shape[2] for w in conv_w],
        conv_stride=list(strides),
        conv_bias=prefix + "feature_extractor.conv_layers.0.conv.bias" in sd,
        feat_extract_norm="layer" if all(has_ln) else "group",
        feat_proj_layer_norm=prefix + "feature_projection.layer_norm.weight" in sd,
        num_conv_pos_embeddings=pos_w.shape[2],
        num_conv_pos_embedding_groups=hidden // pos_w.shape[1],
        do_stable_layer_norm=bool(config.get("do_stable_layer_norm", False)),
        layer_norm_eps=float(config.get("layer_norm_eps", 1e-5)),
        hidden_act=config.get("hidden_act", "gelu"),
        feat_extract_activation=config.get("feat_extract_activation", "gelu"),
        mask_time_prob=0.0,  # inference only: no masked_spec_embed parameter
        mask_feature_prob=0.0,
    )


def build_hubert(cfg: HubertConfig) -> HubertModel:
    return HubertModel(cfg).eval()


def hubert_total_stride(cfg: HubertConfig) -> int:
    return math.prod(cfg.conv_stride)


def rename_pos_conv(sd: dict[str, torch.Tensor], prefix: str = "semantic_model.") -> dict[str, torch.Tensor]:
    """Map the old weight-norm spelling (`weight_g`, `weight_v`) onto the parametrization names."""
    out = dict(sd)
    for old, new in (("weight_g", "parametrizations.weight.original0"),
                     ("weight_v", "parametrizations.weight.original1")):
        if prefix + POS_CONV + old in out:
            out[prefix + POS_CONV + new] = out.pop(prefix + POS_CONV + old)
    return out


class SemanticResidualUnit(nn.Module):
    """ELU → conv k (dilated, no bias) → ELU → conv k1 (no bias), plus the input."""

    def __init__(self, channels: int, kernel: int, dilation: int):
        super().__init__()
        self.conv1 = nn.Conv1d(channels, channels, kernel, dilation=dilation, padding=(kernel - 1) // 2 * dilation,
                               bias=False)
        self.conv2 = nn.Conv1d(channels, channels, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv2(nn.functional.elu(self.conv1(nn.functional.elu(x))))


class SemanticBlock(nn.Module):
    def __init__(self, in_ch: int, out_ch: int, unit_kernel: int, kernel: int, dilations: list[int]):
        super().__init__()
        self.res_units = nn.ModuleList(SemanticResidualUnit(in_ch, unit_kernel, d) for d in dilations)
        stride = 1 if kernel == 3 else kernel // 2  # transformers: kernel 3 for stride 1, else 2·stride
        self.conv = nn.Conv1d(in_ch, out_ch, kernel, stride=stride, padding=(kernel - 1) // 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for unit in self.res_units:
            x = unit(x)
        return self.conv(x)


class SemanticEncoder(nn.Module):
    """conv k3 (no bias) → blocks of residual units + conv; [B, hidden, T] → [B, hidden', T]."""

    def __init__(self, channels: int, blocks: list[tuple[int, int, int]], *, kernel: int = 3, unit_kernel: int = 3,
                 dilations: list[int] | tuple[int, ...] = (1, 1)):
        super().__init__()
        self.conv = nn.Conv1d(channels, channels, kernel, padding=kernel // 2, bias=False)
        self.conv_blocks = nn.ModuleList(SemanticBlock(i, o, unit_kernel, k, list(dilations)) for i, o, k in blocks)

    @classmethod
    def from_shapes(cls, sd: dict[str, torch.Tensor], dilations: list[int] | None,
                    prefix: str = "encoder_semantic.") -> "SemanticEncoder":
        """Block widths and kernels from the weights; the residual-unit dilations (not visible in any shape)
        from the codec config's `block_dilations`, else 1."""
        w = sd[prefix + "conv.weight"]
        blocks = []
        while (key := f"{prefix}conv_blocks.{len(blocks)}.conv.weight") in sd:
            out_ch, in_ch, kernel = sd[key].shape
            blocks.append((in_ch, out_ch, kernel))
        unit_key = re.escape(prefix) + r"conv_blocks\.0\.res_units\.\d+\.conv1\.weight"
        units = sum(1 for k in sd if re.fullmatch(unit_key, k))
        dil = list(dilations) if dilations is not None else [SEMANTIC_DILATIONS_DEFAULT] * units
        if len(dil) != units:
            raise ValueError(f"encoder_semantic has {units} residual units per block but {len(dil)} dilations "
                             "are configured (block_dilations)")
        unit_kernel = sd[prefix + "conv_blocks.0.res_units.0.conv1.weight"].shape[2] if units and blocks else 3
        return cls(w.shape[0], blocks, kernel=w.shape[2], unit_kernel=unit_kernel, dilations=dil)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv(x)
        for block in self.conv_blocks:
            x = block(x)
        return x
