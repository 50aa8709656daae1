"""Execution on the device for the engine and its scheduler: one `Runner` owns the backend, the lock that
serialises device work, the prefill plan and the KV room; `SerialRun` runs one take at a time through a
backend's fused decode (or `HostRows`, the fused protocol on the host).

The scheduler (engine/scheduler.py) keeps the books of a running batch and asks the runner for prefill
chunks, rows and steps; without batching, the engine runs a take as a `SerialRun` with the runner's lock
held. With `device_sampling` (a `BatchedSampling` backend on CUDA) the scheduler's logits stay on the device
and `sample_rows` samples a step's takes there in one launch, only their rows coming back; otherwise every
step's logits come to the host (`to_host`) and the scheduler samples them there (`sampling.sample_row`).
"""

from __future__ import annotations

import threading
import time

import torch

from .backends.base import BatchedSampling, FusedDecode, RowDraw, StepBackend
from .config import AUDIO_PLACEHOLDER, Dims
from .delay import StopRule
from .device import sync
from .sampling import NonFiniteLogits, sample_row, uniforms
from .types import SamplingParams


def to_host(logits: torch.Tensor, stream=None) -> torch.Tensor:
    """`logits` copied to a new host tensor in ONE transfer: on CUDA into pinned memory, queued on `stream`
    (else the current one), then a wait on an event recorded after it on that stream."""
    if logits.device.type != "cuda":
        host = torch.empty(logits.shape, dtype=logits.dtype)
        host.copy_(logits)
        return host
    stream = stream or torch.cuda.current_stream(logits.device)
    host = torch.empty(logits.shape, dtype=logits.dtype, pin_memory=True)
    done = torch.cuda.Event()
    with torch.cuda.stream(stream):
        host.copy_(logits, non_blocking=True)
        done.record(stream)
    done.synchronize()
    return host


def prefix_key(prompt):
    """What identifies a prompt's reusable prefix KV (None when it has none to reuse)."""
    split = min(prompt.prefix_len, len(prompt.ids) - 1)
    return (prompt.cache_key, split) if split > 0 else None


class Runner:
    """The backend of one engine and what runs on it. `batched`: the scheduler owns the KV slots (and
    each slot's prefix); otherwise takes run one at a time in slot 0, whose prefix is `prefix`."""

    def __init__(self, model: StepBackend, dims: Dims, device: torch.device, *, batched: bool):
        self.model, self.dims, self.device, self.batched = model, dims, device, batched
        self.lock = threading.Lock()  # device state: one step, prefill or codec call at a time
        self.prefix = None  # without batching: the prompt prefix whose KV sits in [0, prefix_len)
        self.prefixes = None  # a `PrefixStore` (engine/prefix.py) where the backend can copy its KV
        # The scheduler's takes sample on the device where the backend can. Off CUDA (the cubin backend under
        # the interpreter, in CPU tests) the host samples unless a test turns this on: the interpreted
        # sampler costs far more than `sample_row`.
        self.device_sampling = batched and device.type == "cuda" and isinstance(model, BatchedSampling)

    # ---------------------------------------------------------------- kept prefixes
    def stored(self, key) -> bool:
        return self.prefixes is not None and self.prefixes.has(key)

    def restore(self, slot: int, key) -> bool:
        """Copy the kept KV of prefix `key` into `slot` (with the lock held); False when there is none."""
        kv = self.prefixes.get(key) if self.prefixes is not None else None
        if kv is None:
            return False
        self.model.write_prefix(slot, kv)
        return True

    def remember(self, slot: int, key, persist: bool = False) -> None:
        """Keep the prefix KV that `slot` now holds (with the lock held), unless it is kept already;
        `persist` writes it to the store's directory too (a saved voice, not a one-off clip)."""
        if self.prefixes is not None and key is not None and (persist or not self.prefixes.has(key)):
            self.prefixes.put(key, self.model.read_prefix(slot, key[1]), persist=persist)

    def sync(self) -> None:
        sync(self.device)

    def ensure_room(self, positions: int) -> None:
        """Grow the KV cache to hold `positions`, or raise the sentence when the model cannot."""
        if positions > self.dims.max_positions:
            raise ValueError(f"prompt and take need {positions} positions but the model allows "
                             f"{self.dims.max_positions}; shorten the text or the reference clip")
        if positions > self.model.max_len:
            self.model.setup_cache(min(self.dims.max_positions, max(positions, 2 * self.model.max_len)))
            if not self.batched:  # a batching backend's cache keeps its contents as it grows
                self.prefix = None

    def decode_rows(self, rows: list[list[int]], slots: list[int], positions: list[int], stream=None) -> torch.Tensor:
        """One batched step (the scheduler's), its logits [B, 8, 1026] on the host in one transfer (on the
        device with `device_sampling`)."""
        logits = self.model.decode_rows(torch.tensor(rows, device=self.device), slots, positions)
        return logits if self.device_sampling else to_host(logits, stream)

    def prefill_segment(self, ids, ref_rows, start: int, slot: int, stream=None) -> torch.Tensor:
        """One prefill segment into KV slot `slot`, its logits on the host (on the device with
        `device_sampling`)."""
        logits = self.model.prefill(ids, ref_rows, start, slot=slot)
        return logits if self.device_sampling else to_host(logits, stream)

    def sample_rows(self, logits: list[torch.Tensor], rules: list[StopRule], params: list[SamplingParams],
                    stream=None) -> list:
        """The next row of B takes, sampled on the device in one launch (`BatchedSampling.sample_rows`) from
        their logits there, and pushed to each take's stop rule as `sampling.sample_row` pushes it on the
        host; only the rows and flags come back, in one transfer. Per take, its row (the one to feed back)
        or the error that ends it alone: `NonFiniteLogits`, or a device stop state the rule does not share."""
        k = self.dims.codebooks
        draws = [RowDraw(p.seed, p.temperature, p.top_k, p.top_p, r.step, -1 if r.countdown is None else r.countdown)
                 for r, p in zip(rules, params)]
        out = []
        for rule, got in zip(rules, to_host(self.model.sample_rows(logits, draws), stream).tolist()):
            if not got[k + 1]:
                out.append(NonFiniteLogits.at(rule.step))
                continue
            row = rule.push(got[:k])
            if bool(got[k]) != (rule.stop_reason == "eoc"):
                out.append(RuntimeError(f"the device sampler's stop state and engine/delay.py's stop rule disagree "
                                        f"at row {rule.step - 1} (device: {'ended' if got[k] else 'goes on'}, rule: "
                                        f"{rule.stop_reason or 'goes on'}); the backend's sampler is faulty"))
                continue
            out.append(row)
        return out

    def plan(self, prompt, hit: bool) -> tuple[list, int]:
        """The prefill as segments (ids, ref_rows, start, key), run in order: [0, prefix_len) unless its KV
        is cached (`hit`), then [prefix_len, L). A backend with a `prefill_chunk` gets each part cut into
        chunks of that many positions at fixed offsets from the part's start, so a newcomer's prefill
        interleaves with the batch's steps (engine/scheduler.py). The same matmuls of the same shapes run
        whether the prefix was cached or not, so a warm prefill is bit-identical to a cold one. `key` is
        set on the segment that completes the prefix. Returns (segments, reused positions)."""
        ids = torch.tensor(prompt.ids, dtype=torch.long)
        rows = prompt.ref_rows
        key = prefix_key(prompt)
        split = key[1] if key else 0
        chunk = self.model.prefill_chunk or len(ids)
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

    def prefill(self, prompt, slot: int = 0, hit: bool | None = None, mark=None) -> tuple[torch.Tensor, int]:
        """Run the whole prefill into `slot`, with the lock held. Without batching the slot's prefix is
        `self.prefix`; with it `mark(slot, key)` records the prefix a slot now holds (the scheduler's
        books). Returns (logits, reused positions)."""
        key = prefix_key(prompt)
        if hit is None:
            hit = key is not None and key == self.prefix
        self.ensure_room(len(prompt.ids) + 1)
        segments, reused = self.plan(prompt, hit)
        if not self.batched and not hit:
            self.prefix = None  # the prefix KV is being overwritten
        for ids, rows, start, done in segments:
            logits = (self.model.prefill(ids, rows, start) if not self.batched
                      else self.model.prefill(ids, rows, start, slot=slot))
            if done is not None:
                if self.batched:
                    mark(slot, done)
                else:
                    self.prefix = done
        return logits, reused


class HostRows:
    """The fused decode protocol (`begin`, then `rows(n)` runs n steps and returns the sampled rows and the
    stop flag), implemented on the host for a backend that only has the per-step `decode`: each step
    samples here (`sampling.sample_row`, the same draws as the device sampler) and feeds the row back. Its
    own stop rule ends on <eoc> and the length cap, as the device's does; the caller's rule adds the
    repeat guard."""

    def __init__(self, model: StepBackend, dims: Dims, cancel: threading.Event | None = None):
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
            out.append(sample_row(self.logits, self.u, self.rule, *self.options))
            if not self.rule.done:
                self.logits = self.model.decode(torch.tensor(out[-1], device=self.logits.device), self.pos)
                self.pos += 1
        return torch.tensor(out, dtype=torch.long).view(-1, self.codebooks), self.rule.done


class SerialRun:
    """One take on a backend that does not batch, with the runner's lock held by the caller: `advance(n)`
    runs n more steps of the fused protocol (the backend's own, or `HostRows`); the host rule applies the
    length cap and the repeat guard, and rows sampled past the stop are discarded."""

    queued_s, batch, finished = 0.0, 1, False

    def __init__(self, runner: Runner, logits, pos: int, rule: StopRule, params: SamplingParams, cancel):
        model = runner.model
        self.fused = model if isinstance(model, FusedDecode) else HostRows(model, runner.dims, cancel)
        self.fused.begin(logits, pos, seed=params.seed, temperature=params.temperature, top_k=params.top_k,
                         top_p=params.top_p, max_rows=rule.max_rows)
        self.runner, self.rule, self.prompt_tokens = runner, rule, pos
        self.reused, self.prefill_s, self.decode_s = 0, 0.0, 0.0

    def advance(self, n: int) -> None:
        tick = time.perf_counter()
        rows, device_done = self.fused.rows(n)
        self.runner.sync()
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
