"""`Engine`: owns the model, codec, tokenizer and device state; runs prefill → decode loop → streaming
codec decode, with the shared-prefix KV cache (SPEC D1) and per-take metrics. The parts live beside it:
the backends and their choice in engine/backends/, device work in engine/runner.py, continuous batching in
engine/scheduler.py, the push schedule and the drain in engine/streaming.py.

Streaming is the primary path: `generate_stream` yields `Chunk`s as the codec finalises audio, and
`generate` / `predict` drain the same loop. When the engine batches, takes from any number of threads
decode together in one running batch and a take's codes do not depend on its company (batch invariance,
docs/ARCHITECTURE.md). Which engines batch:

* the eager torch path (a `BatchedBackend` without `FusedDecode`): always, max_batch 1 included;
* the GPU backends with both (cubin, torch-graph): when max_batch > 1, and then every take, a lone one
  included, runs through `decode_rows` (same codes alone and in any batch; cubin on CUDA samples the rows
  on the device in one launch, `Runner.device_sampling`, the others on the host, with the same draws). With
  max_batch 1 they run the fused single-stream path instead (the fastest single listener: sampling on the
  device, one CUDA graph per step), one take at a time under the engine lock. The two paths compute the same
  math in different reduction orders, so a seed's codes from max_batch 1 and max_batch > 1 can differ by
  float rounding (each is reproducible).
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from functools import partial
from pathlib import Path

import numpy as np
import torch

from .backends.base import BatchedBackend, FusedDecode
from .config import Dims
from .delay import StopRule, default_max_frames
from .prefix import PrefixStore, checkpoint_fingerprint
from .runner import Runner, SerialRun, prefix_key
from .scheduler import Scheduler, ScheduledTake
from .streaming import drain, take_metrics
from .types import Chunk, EngineInfo, SamplingParams

# KV positions preallocated at load; grown on demand for long prompts + long takes.
DEFAULT_CACHE_LEN = 4096
# The text of a warm-up's prompt: its prefix (the voice's part) is all that is computed.
WARM_TEXT = "Hello."
# Most takes decoded together by default (Engine.load(max_batch=)).
DEFAULT_MAX_BATCH = 16


class Engine:
    """One loaded checkpoint on one device. Build with `Engine.load`."""

    is_remote = False

    def __init__(self, model, codec, tokenizer, dims: Dims, info: EngineInfo, max_batch: int = DEFAULT_MAX_BATCH):
        self.model, self.codec, self.tokenizer, self.dims = model, codec, tokenizer, dims
        self.device = torch.device(info.device)
        # The scheduler samples where the runner can (engine/runner.py `device_sampling`). A backend with its
        # own fused device decode keeps it for max_batch 1 (the fastest single listener) and batches every
        # take otherwise; the torch path always goes through the scheduler (module docstring).
        batched = isinstance(model, BatchedBackend) and (max_batch > 1 or not isinstance(model, FusedDecode))
        self.runner = Runner(model, dims, self.device, batched=batched)
        if batched:
            model.setup_slots(max_batch)
            # Calibrated against at least 16 rows whatever max_batch is, so engines loaded with different
            # max_batch (1 included) pad alike and give a seed the same codes.
            rows = max(max_batch, DEFAULT_MAX_BATCH)
            if model.max_rows != rows:
                model.calibrate_rows(rows)
        # With batching, the scheduler owns the KV slots; without it, takes run one at a time in slot 0.
        self.scheduler = Scheduler(self.runner, max_batch) if batched else None
        self.info = replace(info, max_batch=max_batch if batched else 1, min_rows=model.min_rows if batched else 1)
        if batched and hasattr(model, "read_prefix"):  # prompt prefixes computed once (engine/prefix.py)
            source = checkpoint_fingerprint(info.root) if info.root else f"unsaved model {uuid.uuid4()}"
            self.runner.prefixes = PrefixStore(f"{source}|{model.prefill_scheme}")

    # ---------------------------------------------------------------- loading
    @classmethod
    def load(cls, checkpoint, *, device: str = "auto", precision: str = "auto", backend: str = "auto",
             max_batch: int = DEFAULT_MAX_BATCH) -> "Engine":
        """`checkpoint` is a directory, a hub id or a loaded `Checkpoint`. Device "auto" → CUDA when
        present; precision "auto" → bf16 on CUDA (fp8 W8A8 on the cubin backend); on the CPU fp32 for small
        models and weight-only int8 above 1B parameters, bf16 only where the CPU has native bf16 and it
        measures faster (engine/cpu.py; `info.precision_reason` says which and why); backend "auto" → the
        fastest backend that can run here, else "torch" (the reason is kept in `engine.info.backend_reason`).
        `max_batch`: the most takes decoded together (a backend that cannot batch runs one at a time;
        `info.max_batch` says which)."""
        from .loading import load_parts

        return cls(*load_parts(checkpoint, device=device, precision=precision, backend=backend, max_batch=max_batch,
                               cache_len=DEFAULT_CACHE_LEN))

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
            with self.runner.lock:
                return self.runner.prefill(prompt)[0]
        slot, hit = self.scheduler.reserve(prefix_key(prompt))
        try:
            with self.runner.lock:
                return self.runner.prefill(prompt, slot, hit, mark=self.scheduler.mark)[0]
        finally:
            self.scheduler.release(slot)

    def keep_prefixes(self, directory) -> None:
        """Keep warmed prefixes (`warm_voice`) in `directory` too, so they outlive the process."""
        if self.runner.prefixes is not None:
            self.runner.prefixes.directory = Path(directory)

    def warm_voice(self, voice) -> bool:
        """Compute and keep the prompt prefix of `voice` (an `engine.prompt.VoiceRef`: its reference codes
        and transcript), so a take with it starts from its KV instead of prefilling its clip; on disk too
        after `keep_prefixes`. Runs through the scheduler, chunk by chunk between the running takes' steps.
        True when it was computed now; False when it was kept already (in memory, or on disk: then it is
        read in) or this engine keeps no prefixes."""
        if self.scheduler is None or self.runner.prefixes is None:
            return False
        prompt = self.build_prompt(WARM_TEXT, voice=voice)
        key = prefix_key(prompt)
        if key is None or self.runner.prefixes.get(key) is not None:  # kept (from disk: read in now)
            return False
        self.scheduler.warm(prompt)
        return True

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

        # Each take's thread releases `arrived` once: when its take waits in the scheduler, or when it failed
        # before that. Admission is held until all have, so the takes start at one step boundary, as one batch,
        # however the threads are scheduled (on a loaded machine the first could otherwise end before the last
        # began).
        arrived = threading.Semaphore(0)

        def one(item, p):
            release = [arrived.release]

            def submitted():
                if release:
                    release.pop()()

            try:
                text, prompt = (item, None) if isinstance(item, str) else (None, item)
                result = {}
                waves = [c.audio for c in self._take(text, prompt, voice if text is not None else None, p, {}, None,
                                                     audio=audio, result=result, submitted=submitted)]
            finally:
                submitted()
            wave = np.concatenate(waves) if waves else np.zeros(0, np.float32)
            return Chunk(audio=wave, metrics=result["metrics"], final=True, codes=result["frames"])

        held = self.scheduler.held() if self.scheduler is not None else contextlib.nullcontext()
        with ThreadPoolExecutor(max_workers=max(len(items), 1), thread_name_prefix="take") as pool:
            with held:
                futures = [pool.submit(one, item, p) for item, p in zip(items, per)]
                for _ in futures:
                    arrived.acquire()
            return [f.result() for f in futures]

    def synthesize(self, codes) -> np.ndarray:
        """Codes [T, 8] in 0..1023 → float32 mono 24 kHz waveform of exactly 960·T samples."""
        codec = self._need_codec()
        codes = torch.as_tensor(codes)
        if codes.ndim != 2 or codes.shape[-1] != self.dims.codebooks:
            raise ValueError(f"codes must have shape [frames, {self.dims.codebooks}], got {tuple(codes.shape)}")
        with self.runner.lock:
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
        if not codec.has_encoder:
            raise ValueError("this checkpoint's codec has no encoder weights, so it cannot clone a voice")
        with self.runner.lock:
            return codec.encode(np.asarray(wav24k, dtype=np.float32)).cpu()

    # ---------------------------------------------------------------- the loop
    def _need_codec(self):
        if self.codec is None:
            raise ValueError("this checkpoint has no codec weights, so it can produce codes (predict) but not audio")
        return self.codec

    def _take(self, text, prompt, voice, params, options, cancel, *, audio: bool, result: dict | None = None,
              submitted: Callable[[], None] | None = None) -> Iterator[Chunk]:
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
            self.runner.ensure_room(len(prompt.ids) + rule.max_rows)  # raises the sentence
        return self._loop(prompt, rule, params, cancel, audio, result, submitted)

    def _loop(self, prompt, rule: StopRule, params: SamplingParams, cancel, audio, result,
              submitted=None) -> Iterator[Chunk]:
        """The take, decoded in the scheduler's batch (`submitted` is called once it waits there) or alone."""
        started = time.perf_counter()
        stream = self.codec.stream() if audio else None
        if self.scheduler is not None:
            take = self.scheduler.submit(ScheduledTake(prompt, rule, params, cancel, started, self.dims.codebooks))
            if submitted is not None:
                submitted()
            try:
                yield from self._drain(take, rule, params, stream, cancel, started, result)
            finally:
                take.close()
            return
        runner = self.runner
        with runner.lock:
            if self.device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(self.device)
            runner.ensure_room(len(prompt.ids) + rule.max_rows)
            logits, reused = runner.prefill(prompt)
            runner.sync()
            run = SerialRun(runner, logits, len(prompt.ids), rule, params, cancel)
            run.reused, run.prefill_s = reused, time.perf_counter() - started
            yield from self._drain(run, rule, params, stream, cancel, started, result)

    def _drain(self, run, rule, params, stream, cancel, started, result) -> Iterator[Chunk]:
        """`streaming.drain` with this engine's metrics: `run` keeps the take's timings (`prefill_s`,
        `decode_s`, `queued_s`, `reused`, `batch`)."""
        metrics = partial(take_metrics, run, rule, params, self.info, self.device, started)  # (ttfa, reason) → Metrics
        return drain(run, rule, stream, codebook_size=self.dims.codebook_size, cancel=cancel, started=started,
                     metrics=metrics, result=result)


__all__ = ["Engine", "DEFAULT_MAX_BATCH"]
