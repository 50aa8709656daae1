"""What the hostile-input tests measure on a running server: its process, its memory, and how long its event
loop keeps `/health` waiting while something else is going on."""

from __future__ import annotations

import contextlib
import threading
import time
from pathlib import Path

import httpx

LOOP_STALL_LIMIT_S = 0.1  # no one request may hold the event loop longer than this


def server_pid(url: str) -> int:
    """The pid of the `app.py` child serving `url`."""
    port = url.rsplit(":", 1)[1]
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().split(b"\0")
        except OSError:
            continue
        if b"app.py" in args and port.encode() in args:
            return int(cmdline.parent.name)
    raise AssertionError(f"no app.py process serves {url}")


def memory_kb(pid: int, field: str) -> int:
    """A field of /proc/PID/status in kB (VmRSS, VmHWM, Threads is a count)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(field)


def thread_count(pid: int) -> int:
    return memory_kb(pid, "Threads")


@contextlib.contextmanager
def peak_growth_mb(pid: int):
    """Yields a dict whose "mb" is, after the block, how far the process's peak RSS rose above its RSS at
    the start of the block (the peak is reset first, so an earlier peak does not hide this one)."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # reset VmHWM to the current RSS
    start = memory_kb(pid, "VmRSS")
    out = {"mb": 0.0}
    try:
        yield out
    finally:
        out["mb"] = (memory_kb(pid, "VmHWM") - start) / 1024


@contextlib.contextmanager
def health_latency(url: str, period_s: float = 0.02, headers: dict | None = None):
    """Polls `url/health` from a thread while the block runs; yields the list of each answer's latency in
    seconds (filled as it runs; a request that fails counts as the time it took to fail). The worst of them
    is how long the server's event loop was kept from answering."""
    latencies: list[float] = []
    stop = threading.Event()

    def poll():
        with httpx.Client(base_url=url, timeout=30, headers=headers) as client:
            while not stop.is_set():
                t0 = time.perf_counter()
                with contextlib.suppress(httpx.HTTPError):
                    client.get("/health")
                latencies.append(time.perf_counter() - t0)
                stop.wait(period_s)

    thread = threading.Thread(target=poll, daemon=True)
    thread.start()
    try:
        yield latencies
    finally:
        stop.set()
        thread.join(35)


__all__ = ["LOOP_STALL_LIMIT_S", "health_latency", "memory_kb", "peak_growth_mb", "server_pid", "thread_count"]
