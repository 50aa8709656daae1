"""What the hostile-input tests measure on a running server: its process, its memory, and how long its event
loop keeps `/health` waiting while something else is going on."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import threading
import urllib.parse
from pathlib import Path

LOOP_STALL_LIMIT_S = 0.1  # no one request may hold the event loop longer than this


def loop_held(waits: list[float]) -> bool:
    """Whether the server's event loop was held past LOOP_STALL_LIMIT_S, from how long `/health` (or another
    quick answer) waited, polled all along. One wait a little past the limit (under 3×) is the loaded 2-core
    machine's own scheduling (the test's process, Chromium and two workers share it), not a hold: a hold shows
    as several waits past the limit or one far past it (the holes these tests guard against held it 1.6-24 s)."""
    over = [w for w in waits if w >= LOOP_STALL_LIMIT_S]
    return not waits or len(over) > 1 or any(w >= 3 * LOOP_STALL_LIMIT_S for w in over)


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


# The poller runs in a process of its own: in the test's process it would wait for the GIL behind whatever
# the test itself does meanwhile (sending thousands of messages), and count that as the server's delay.
_POLLER = """
import http.client, json, sys, time
host, port, period, headers = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), json.loads(sys.argv[4])
conn = None
while True:
    t0 = time.perf_counter()
    try:
        conn = conn or http.client.HTTPConnection(host, port, timeout=30)
        conn.request("GET", "/health", headers=headers)
        conn.getresponse().read()
    except (OSError, http.client.HTTPException):
        conn = None
    print(time.perf_counter() - t0, flush=True)
    time.sleep(period)
"""


@contextlib.contextmanager
def health_latency(url: str, period_s: float = 0.02, headers: dict | None = None):
    """Polls `url/health` from a process of its own while the block runs; yields the list of each answer's
    latency in seconds, filled as answers come (a request that fails counts as the time it took to fail). The
    first answer has come before the block starts and one more after it ends, so the polls cover it whole.
    The worst of them is how long the server's event loop was kept from answering."""
    parts = urllib.parse.urlsplit(url)
    poller = subprocess.Popen([sys.executable, "-c", _POLLER, parts.hostname, str(parts.port), str(period_s),
                               json.dumps(headers or {})], stdout=subprocess.PIPE, text=True)
    latencies: list[float] = []
    arrived = threading.Condition()

    def read():
        for line in poller.stdout:
            with arrived:
                latencies.append(float(line))
                arrived.notify_all()

    def answers(n: int) -> None:
        with arrived:
            arrived.wait_for(lambda: len(latencies) >= n or poller.poll() is not None, timeout=60)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        answers(1)
        yield latencies
        answers(len(latencies) + 1)
    finally:
        poller.terminate()
        poller.wait(10)
        reader.join(10)


__all__ = ["LOOP_STALL_LIMIT_S", "health_latency", "loop_held", "memory_kb", "peak_growth_mb", "server_pid", "thread_count"]
