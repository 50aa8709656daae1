"""A visitor's flood against another visitor, on `app.py --demo --api-key … --public-page`:
`python -m bench.fair [--flood 24] [--frames 600] [--runs 3]`.

Visitor A opens `--flood` live takes of `--frames` frames at once with one page token (from 127.0.0.1);
visitor B, from 127.0.0.2, starts a 40-frame take once A's share is running. Reported: B's time to first
audio (POST to the first PCM line) alone and under the flood, and A's aggregate frames/s (frames of A's
finished takes / the flood's wall time) alone and with B beside it, each as a ratio to alone. Medians over
`--runs`. The same figures come from a studio started with a share as wide as the engine (16 running, 64
waiting), where A's flood fills every slot as the FIFO line did. The demo's weights are random, so frames/s
is the tiny model's, not the real one's.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from bench.common import Table, machine_line
from tests.live_client import LiveTake, client, page_token, wait
from tests.studio_server import running_studio

KEY = "bench-fair-key"
SHORT = dict(max_frames=40, seed=11)


def first_audio(http, token) -> float:
    take = LiveTake(http, token, **SHORT)
    take.join(300)
    assert take.end == "done", take.lines
    return take.first_audio


def flood(http, token, n: int, frames: int, *, beside=None) -> tuple[float, float | None]:
    """A's aggregate frames/s, and B's first audio when `beside` = (B's client, B's token)."""
    started = time.perf_counter()
    takes = [LiveTake(http, token, text="A visitor with a script. " * 4, max_frames=frames, seed=i)
             for i in range(n)]
    b = None
    if beside is not None:
        wait(lambda: sum(t.first_audio is not None for t in takes) >= 2, 300, "A's share to run")
        b = first_audio(*beside)
    for take in takes:
        take.join(1800)
    wall = max(t.ended for t in takes) - started
    return sum(t.frames for t in takes) / wall, b


# The rule as shipped, and the same studio with a share as wide as the engine (what one FIFO line amounted to).
SETUPS = (("fair share (2 running, 4 waiting)", ()),
          ("no share (16 running, 64 waiting)", ("--visitor-concurrency", "16", "--visitor-queue", "64")))


def measure(flags, args) -> list[float]:
    """Medians: B alone, B under the flood, A alone, A with B beside it, A's takes finished per flood."""
    with tempfile.TemporaryDirectory() as tmp, \
            running_studio(Path(tmp), "--api-key", KEY, "--public-page", *flags) as url:
        a_http, b_http = client(url, "127.0.0.1"), client(url, "127.0.0.2")
        a_token, b_token = page_token(a_http), page_token(b_http)
        first_audio(b_http, b_token)  # warm-up
        b_alone, b_flood, a_alone, a_with_b = [], [], [], []
        for _ in range(args.runs):
            b_alone.append(first_audio(b_http, b_token))
            a_alone.append(flood(a_http, a_token, args.flood, args.frames)[0])
            rate, b = flood(a_http, a_token, args.flood, args.frames, beside=(b_http, b_token))
            a_with_b.append(rate)
            b_flood.append(b)
    return [statistics.median(x) for x in (b_alone, b_flood, a_alone, a_with_b)]


def main(argv=None) -> Table:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--flood", type=int, default=24)
    parser.add_argument("--frames", type=int, default=600)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args(argv)
    rows = []
    for name, flags in SETUPS:
        b_alone, b_flood, a_alone, a_with_b = measure(flags, args)
        rows += [[name, "B first audio, ms", f"{1e3 * b_alone:.0f}", f"{1e3 * b_flood:.0f}",
                  f"{b_flood / b_alone:.2f}"],
                 [name, "A aggregate frames/s", f"{a_alone:.0f}", f"{a_with_b:.0f} (B beside it)",
                  f"{a_with_b / a_alone:.2f}"]]
    table = Table(f"Fair share: visitor A floods {args.flood} live takes of {args.frames} frames, visitor B one "
                  f"of 40 (demo, medians of {args.runs}; {machine_line()})",
                  ["studio", "figure", "alone", "under the flood", "ratio"], rows)
    print(table.markdown(), flush=True)
    return table


if __name__ == "__main__":
    main()
