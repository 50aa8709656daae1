"""The streaming side of a take: when rows become codec pushes, and the drain that turns a take's rows into
`Chunk`s of audio as they become final.

Push schedule: the codec holds back its right look-ahead (`StreamDecoder.right` frames), so the first
push comes once look-ahead + 2 frames exist, then pushes grow 4, 8, 16 up to one second of frames. The
stateful decoder does the same conv work however the frames are split, but every push is one pass of ~40
small ops, so pushes grow; the first one is small because time-to-first-audio is what a listener notices.
A take's pushes are exactly the schedule's, however far decoding runs ahead of the listener (a batch does),
because the codec's float sums depend on how frames are split and a take must sound the same whatever ran
beside it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Protocol

import numpy as np
import torch

from .config import SAMPLE_RATE, SAMPLES_PER_FRAME
from .delay import StopRule, undelay
from .device import peak_memory
from .types import Chunk, Metrics

FIRST_PUSH_FRAMES = 2
MAX_PUSH_FRAMES = 25


class PushSchedule:
    """The frame boundaries of a take's codec pushes: [0, right + 2), then pushes of 4, 8, 16, 25, 25, …"""

    def __init__(self, right: int):
        self.pushed, self.size = 0, FIRST_PUSH_FRAMES
        self.due = right + FIRST_PUSH_FRAMES  # the end of the next push

    def advance(self) -> tuple[int, int]:
        """Frames [lo, hi) of the push now due; the schedule moves on to the one after it."""
        lo, hi = self.pushed, self.due
        self.pushed, self.size = hi, min(2 * self.size, MAX_PUSH_FRAMES)
        self.due = self.pushed + self.size
        return lo, hi


def push_sizes(frames: int, right: int) -> list[int]:
    """The push sizes of a take of `frames` frames through a codec with look-ahead `right`, the last
    (partial) push at the end of the take included: what the engine sends the codec."""
    schedule, sizes = PushSchedule(right), []
    while frames > schedule.due:
        lo, hi = schedule.advance()
        sizes.append(hi - lo)
    if frames > schedule.pushed:
        sizes.append(frames - schedule.pushed)
    return sizes


class FrameStream(Protocol):
    """A codec's streaming decoder (engine/codec/stream.py `StreamDecoder`)."""

    right: int

    def push(self, frames) -> np.ndarray: ...

    def flush(self) -> np.ndarray: ...


def decode_streamed(stream: FrameStream, codes: torch.Tensor) -> np.ndarray:
    """`codes` [T, 8] through `stream` on the engine's schedule, then the flush: the take's whole waveform."""
    pieces, at = [], 0
    for size in push_sizes(len(codes), stream.right):
        pieces.append(stream.push(codes[at:at + size]))
        at += size
    pieces.append(stream.flush())
    return np.concatenate(pieces)


class Rows(Protocol):
    """A take's rows as they are decoded into its stop rule (engine/runner.py `SerialRun`, or the
    scheduler's `Take`)."""

    finished: bool

    def advance(self, n: int) -> None:
        """Return once n more rows are in the rule, or the take ended."""

    def close(self) -> None:
        """Stop producing rows; from here on the rule is the caller's alone."""


def drain(run: Rows, rule: StopRule, stream: FrameStream | None, *, codebook_size: int, cancel,
          started: float, metrics: Callable[[float | None, str | None], Metrics],
          result: dict | None = None) -> Iterator[Chunk]:
    """Stream one take's rows through its codec state (`stream`; None for codes only) as `run` produces
    them, yielding a `Chunk` per push with audio and a final one with the tail and the take's codes.
    `metrics(ttfa_ms, stop_reason)` snapshots the take's numbers; `result`, when given, receives the
    take's "frames" and final "metrics"."""
    schedule = PushSchedule(stream.right if stream is not None else 0)
    ttfa = None

    def push(upto: int) -> np.ndarray:  # frames [pushed, upto) are complete: rows [pushed, upto + 7) exist
        return stream.push(undelay(rule.rows[schedule.pushed:upto + rule.delay], codebook_size))

    def push_scheduled() -> Iterator[Chunk]:
        nonlocal ttfa
        chunk = push(schedule.due)
        schedule.advance()
        if len(chunk):
            if ttfa is None:
                ttfa = 1e3 * (time.perf_counter() - started)
            yield Chunk(audio=chunk, metrics=metrics(ttfa, None), final=False)

    while not rule.done and not (cancel is not None and cancel.is_set()) and not run.finished:
        # Generate up to the next codec push (frame t is complete once row t + 7 exists).
        want = schedule.due + rule.delay - len(rule.rows) if stream is not None else MAX_PUSH_FRAMES
        if want > 0:
            run.advance(want)
        if stream is not None and len(rule.rows) - rule.delay >= schedule.due and not rule.done:
            yield from push_scheduled()
    run.close()
    reason = rule.stop_reason or "cancelled"
    frames_total = max(len(rule.rows) - rule.delay, 0)
    # A batch can finish a take while its listener lags behind: the frames past the next push still go
    # out on the schedule's boundaries (module docstring).
    while stream is not None and frames_total > schedule.due:
        yield from push_scheduled()
    codes = undelay(rule.rows, codebook_size) if rule.rows else torch.zeros(0, rule.codebooks, dtype=torch.long)
    if result is not None:
        result["frames"] = codes
        result["metrics"] = metrics(ttfa, reason)
    if stream is not None:
        tail = push(frames_total) if frames_total > schedule.pushed else np.zeros(0, np.float32)
        tail = np.concatenate([tail, stream.flush()])
        if ttfa is None and len(tail):
            ttfa = 1e3 * (time.perf_counter() - started)
        yield Chunk(audio=tail.astype(np.float32, copy=False), metrics=metrics(ttfa, reason), final=True,
                    codes=codes)


def take_metrics(run, rule: StopRule, params, info, device, started: float, ttfa, reason: str) -> Metrics:
    """A take's `Metrics` as it stands: `run` keeps its timings (`prefill_s`, `decode_s`, `queued_s`, `reused`,
    `batch`, `prompt_tokens`), `info` is the engine's `EngineInfo`, `started` when the take was asked for."""
    frames = max(len(rule.rows) - rule.delay, 0)
    elapsed = time.perf_counter() - started
    mem, kind = peak_memory(device)
    return Metrics(ttfa_ms=ttfa, rtf=elapsed / max(frames * SAMPLES_PER_FRAME / SAMPLE_RATE, 1e-9),
                   frames=frames, rows=len(rule.rows),
                   ms_per_frame=1e3 * run.decode_s / max(len(rule.rows), 1), prefill_ms=1e3 * run.prefill_s,
                   prompt_tokens=run.prompt_tokens, reused_tokens=run.reused, peak_mem_bytes=mem,
                   mem_kind=kind, precision=info.precision, backend=info.backend,
                   device=info.device, seed=params.seed, stop_reason=reason, batch=run.batch,
                   queued_ms=1e3 * run.queued_s)
