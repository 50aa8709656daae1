"""Projects benchmark on the demo: `python -m bench.projects [--chars 30000] [--chapters 10] [--max-frames N]`.

Starts `app.py --demo` with an empty projects folder, creates a project of about `--chars` characters in
`--chapters` chapters over the HTTP API, renders it, `kill -9`s the server halfway through the job, starts
it again (the job resumes from disk) and waits for the end. Reported: throughput (characters per minute of
rendering, RTF from the job's own figures), and what the kill cost: the restart (process start to
/health; the job resumes before the page is up), the work lost (the segment in flight), and the whole
overhead: the job's elapsed time less its rendering time.
The demo's random weights fall into repeated codes, so most segments are cut short and generated twice
(the retry): the figures are the worst case. `--max-frames` caps each segment to keep a run short.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import httpx

from bench.common import Table, machine_line
from bench.longform import PARAGRAPH
from tests.studio_server import free_port

REPO = Path(__file__).resolve().parents[1]


def book_of(chars: int, chapters: int, seed: int = 0) -> str:
    """About `chars` characters in `chapters` chapters of sentences drawn from the bench's paragraph's words:
    no two alike, so no segment is a render that already exists (the cache would make the figures lie)."""
    rng = random.Random(seed)
    words = sorted({w.strip(".,:").lower() for w in PARAGRAPH.split() if w.isalpha() or w.strip(".,:").isalpha()})
    per = max(1, chars // chapters)
    parts = []
    for n in range(chapters):
        paragraphs, size = [], 0
        while size < per:
            sentences = [" ".join(rng.choice(words) for _ in range(rng.randint(6, 14))).capitalize() + "."
                         for _ in range(rng.randint(2, 4))]
            paragraphs.append(" ".join(sentences))
            size += len(paragraphs[-1]) + 2
        parts.append(f"# Chapter {n + 1}\n\n" + "\n\n".join(paragraphs))
    return "\n\n".join(parts)


def start(folder: Path, port: int, log) -> tuple[subprocess.Popen, float]:
    """`app.py --demo` on `port` with its projects in `folder`; (process, seconds until /health answers)."""
    env = {**os.environ, "HIGGS_VOICES_DIR": str(folder / "voices"), "GRADIO_ANALYTICS_ENABLED": "False"}
    env.pop("SPACE_ID", None)
    started = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "app.py", "--demo", "--port", str(port), "--projects-dir",
                             str(folder / "projects")], cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"app.py exited with {proc.returncode}; see {log.name}")
        with contextlib.suppress(OSError):
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                return proc, time.perf_counter() - started
        time.sleep(0.2)


def job(url: str, job_id: str) -> dict:
    return httpx.get(f"{url}/v1/jobs/{job_id}", timeout=30).json()


def main(argv=None) -> Table:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chars", type=int, default=30_000)
    parser.add_argument("--chapters", type=int, default=10)
    parser.add_argument("--max-frames", type=int, default=None)
    args = parser.parse_args(argv)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    folder = Path(tempfile.mkdtemp(prefix="higgs-bench-projects-"))
    log = open(folder / "app.log", "w")
    text = book_of(args.chars, args.chapters)
    settings = {"seed": 1, **({"max_frames": args.max_frames} if args.max_frames else {})}
    proc, first_start = start(folder, port, log)
    try:
        r = httpx.post(f"{url}/v1/projects", json={"title": "Bench", "text": text, "format": "markdown",
                                                   "settings": settings}, timeout=120)
        r.raise_for_status()
        project = r.json()["id"]
        job_id = httpx.post(f"{url}/v1/projects/{project}/render", json={}, timeout=30).json()["id"]
        began = time.perf_counter()
        done, last_step = 0, time.perf_counter()
        while True:
            state = job(url, job_id)
            if state["done"] != done:
                done, last_step = state["done"], time.perf_counter()
            if state["done"] >= state["total"] // 2:
                break
            time.sleep(0.05)
        time.sleep(0.5 * state["wall_s"] / max(state["rendered"], 1))  # halfway into the next segment
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        lost = time.perf_counter() - last_step
        proc, restart = start(folder, port, log)
        while (state := job(url, job_id))["state"] != "done":
            assert state["state"] in ("queued", "running"), state
            time.sleep(0.2)
        elapsed = time.perf_counter() - began
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()
    minutes = state["wall_s"] / 60
    table = Table(f"Projects on the demo ({machine_line()})",
                  ["characters", "chapters", "segments", "audio s", "render s", "chars/min", "RTF",
                   "elapsed s", "start s", "restart s", "lost s", "overhead s"],
                  [[len(text), args.chapters, state["total"], state["audio_s"], state["wall_s"],
                    len(text) / max(minutes, 1e-9), state["rtf"], elapsed, first_start, restart, lost,
                    elapsed - state["wall_s"]]])
    print(table.markdown())
    return table


if __name__ == "__main__":
    main()
