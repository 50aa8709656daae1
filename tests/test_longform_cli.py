"""`python -m engine say --file chapter.txt` in a subprocess on the demo checkpoint."""

import os
import re
import subprocess
import sys

import soundfile as sf

from tests.conftest import REPO


def run(args, cache, timeout=600):
    env = dict(os.environ, HIGGS_STUDIO_CACHE=str(cache), HF_HUB_OFFLINE="1", PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "engine", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=timeout)


def test_say_file_writes_one_long_take(tmp_path, demo_cache):
    chapter = tmp_path / "chapter.txt"
    chapter.write_text("Dr. Smith arrived at 10:30. It was 70 °F and the tea cost $3.50.\n\n"
                       "The second paragraph is here. It has two sentences, and then it ends.\n", encoding="utf-8")
    out = tmp_path / "long.wav"
    proc = run(["say", "--demo", "--file", str(chapter), "--out", str(out), "--seed", "3"], demo_cache)
    assert proc.returncode == 0, proc.stderr
    segments = int(re.search(r"characters in (\d+) segments", proc.stdout).group(1))
    assert segments == 3
    assert proc.stdout.count("segment 3/3") == 1 and "TTFA" in proc.stdout and "RTF" in proc.stdout
    seconds = float(re.search(r"wrote .*: ([\d.]+) s", proc.stdout).group(1))
    wav, rate = sf.read(out, dtype="float32")
    assert rate == 24000 and abs(len(wav) / rate - seconds) < 0.01 and abs(wav).max() > 0


def test_say_rejects_text_and_file_together(tmp_path, demo_cache):
    proc = run(["say", "hi", "--demo", "--file", "x.txt"], demo_cache, timeout=120)
    assert proc.returncode == 2 and proc.stderr.strip() == "error: give either a text or --file, not both"
    proc = run(["say", "--demo", "--file", str(tmp_path / "missing.txt")], demo_cache, timeout=120)
    assert proc.returncode == 2 and "missing.txt" in proc.stderr and "Traceback" not in proc.stderr
