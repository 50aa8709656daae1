"""Start `python app.py --demo` on a free localhost port for the client and browser tests.

`running_studio` starts one for a block of code. The studios that many files only need running are started
once per test process instead (`shared_studio`, behind tests/conftest.py's `demo_studio`, `keyed_studio`,
`public_studio` and `space_studio`)."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
KEY = "SECRET"  # the owner's API key of the shared studios
START_TIMEOUT_S = 240  # load + warm-up of the tiny demo model, on a busy 2-core CI machine


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def need_ffmpeg() -> None:
    if shutil.which("ffmpeg") is None:
        pytest.skip("ffmpeg is not on PATH: Gradio's streaming audio output needs it (apt-get install ffmpeg)")


@contextlib.contextmanager
def spawned_studio(tmp: Path, *args: str, env: dict[str, str] | None = None):
    """Start `app.py --demo` on a free port (its output in `tmp/app.log`, its voices and projects under `tmp`)
    and yield `(process, port)` at once, without waiting for it; it is stopped when the block ends. `env` adds
    to the environment it starts with."""
    port = free_port()
    env = {**os.environ, "HIGGS_VOICES_DIR": str(tmp / "voices"), "HIGGS_PROJECTS_DIR": str(tmp / "projects"),
           "GRADIO_ANALYTICS_ENABLED": "False", "PYTHONUNBUFFERED": "1", **(env or {})}
    env.pop("SPACE_ID", None)
    log = open(tmp / "app.log", "w")
    proc = subprocess.Popen([sys.executable, "app.py", "--demo", "--port", str(port), *args], cwd=REPO, env=env,
                            stdout=log, stderr=subprocess.STDOUT)
    try:
        yield proc, port
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


@contextlib.contextmanager
def running_studio(tmp: Path, *args: str, env: dict[str, str] | None = None):
    """Yield the base URL of a studio started with --demo, once `/health` answers; its output goes to
    `tmp/app.log`. `env` adds to the environment it starts with."""
    with spawned_studio(tmp, *args, env=env) as (proc, port):
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"app.py exited with {proc.returncode}:\n{(tmp / 'app.log').read_text()[-3000:]}")
            with contextlib.suppress(OSError):
                with urllib.request.urlopen(url + "/health", timeout=2) as r:
                    if r.status == 200:
                        break
            if time.monotonic() > deadline:
                raise RuntimeError(f"app.py did not answer in {START_TIMEOUT_S} s:\n"
                                   f"{(tmp / 'app.log').read_text()[-3000:]}")
            time.sleep(0.1)  # a refused connection costs nothing: poll often, answer sooner
        yield url


@dataclass(frozen=True)
class Studio:
    """A running studio: its base URL, its voice library's folder and the folder it was started in."""

    url: str
    voices: Path
    root: Path


def shared_studio(tmp_path_factory, *args: str, contained: bool = False):
    """The body of a session fixture: yields the `Studio` started with `args`, stops it at the session's end.
    `contained`: every file it writes (its temp files and Gradio's upload cache too) lands under its root."""
    root = tmp_path_factory.mktemp("studio")
    env = None
    if contained:
        (root / "tmp").mkdir()
        env = {"TMPDIR": str(root / "tmp"), "GRADIO_TEMP_DIR": str(root / "gradio")}
    with running_studio(root, *args, env=env) as url:
        yield Studio(url, root / "voices", root)
