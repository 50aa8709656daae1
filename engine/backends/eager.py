"""The eager torch path: `HiggsModel` itself (engine/model.py) as the backend, on the CPU or a GPU, in
fp32 / bf16 / fp16, or weight-only int8 / int4 on the CPU (engine/quant.py). Every other backend falls
back to it."""

from __future__ import annotations

import torch

from engine.model import HiggsModel
from engine.quant import QUANTIZED


def load(checkpoint, *, device: torch.device, dtype: torch.dtype | None, max_len: int,
         precision: str | None = None) -> HiggsModel:
    quant = precision if precision in QUANTIZED else None
    if dtype is None and quant is None:
        raise ValueError(f"precision {precision!r} needs the cubin backend (NVIDIA GPU); the torch path runs "
                         "fp32, bf16, fp16, or int8 / int4 on the CPU")
    return HiggsModel.from_state_dict(checkpoint.dims, checkpoint.backbone, dtype=dtype or torch.bfloat16,
                                      device=device, max_len=max_len, quant=quant)
