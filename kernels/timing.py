"""The one timer of the device check and the benchmarks: seconds per call of a function, from two CUDA events
on the current stream (device time) or, off the GPU, from the wall clock.
"""

from __future__ import annotations

import time

import torch


def seconds_per_call(fn, *, calls: int = 1, repeat: int = 1, warmup: int = 1, cuda: bool = True) -> float:
    """Median over `repeat` measurements of `calls` back-to-back calls of `fn`, per call, after `warmup`
    untimed calls (lazy allocations, autotuning, first-launch module loads). On CUDA each measurement is the
    interval between two events recorded on the current stream around the calls, so run it on the stream the
    work is launched on; many calls per measurement (or a replayed graph) keep the host's launch cost out."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(calls):
                fn()
            end.record()
            end.synchronize()
            seconds = start.elapsed_time(end) / 1e3
        else:
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            seconds = time.perf_counter() - t0
        times.append(seconds / calls)
    return sorted(times)[len(times) // 2]
