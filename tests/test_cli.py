"""`python -m engine say` in a subprocess: the --demo take is a valid WAV, errors are one line with exit 2."""

import os
import re
import subprocess
import sys

import pytest
import soundfile as sf

from tests.conftest import REPO


def run(args, cache, timeout=600):
    env = dict(os.environ, HIGGS_STUDIO_CACHE=str(cache), HF_HUB_OFFLINE="1", PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "engine", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture(scope="module")
def cache(demo_cache):
    return demo_cache


def test_say_demo_writes_wav(cache, tmp_path):
    out = tmp_path / "take.wav"
    proc = run(["say", "Hello from the demo.", "--demo", "--out", str(out), "--seed", "4", "--stream",
                "--max-frames", "60"], cache)
    assert proc.returncode == 0, proc.stderr
    assert "RANDOM weights" in proc.stdout
    for label in ("TTFA", "RTF", "ms/frame", "peak rss"):
        assert label in proc.stdout
    frames = int(re.search(r"(\d+) frames", proc.stdout).group(1))
    wav, rate = sf.read(out, dtype="float32")
    assert rate == 24000 and wav.ndim == 1
    assert 0 < frames <= 60 and len(wav) == 960 * frames
    assert abs(wav).max() > 0


@pytest.mark.parametrize("args,message", [
    (["say", "hi", "--demo", "--temperature", "-1"], "temperature"),
    (["say", "hi", "--demo", "--top-p", "2"], "top_p"),
    (["say", "hi", "--checkpoint", "/nonexistent/ckpt"], "/nonexistent/ckpt"),
    (["say"], "text"),
    (["say", "hi", "--seed", "abc"], "seed"),
])
def test_errors_are_one_line(cache, args, message):
    proc = run(args, cache, timeout=120)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and message in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr
