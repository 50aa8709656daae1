"""app.py: flags and environment, Spaces defaults, and a missing checkpoint explained without a traceback."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import app
from tests.studio_server import REPO


def test_flags_and_env(monkeypatch):
    for name in ("SPACE_ID", "PORT", "GRADIO_SERVER_PORT", "HIGGS_DEMO", "HIGGS_CHECKPOINT", "HIGGS_API_KEY",
                 "HIGGS_MAX_BATCH"):
        monkeypatch.delenv(name, raising=False)
    args = app.parse_args([])
    assert (args.host, args.port, args.demo, args.checkpoint) == ("127.0.0.1", 7860, False, app.DEFAULT_CHECKPOINT)

    monkeypatch.setenv("HIGGS_DEMO", "1")
    monkeypatch.setenv("GRADIO_SERVER_PORT", "9000")
    monkeypatch.setenv("HIGGS_API_KEY", "k")
    args = app.parse_args([])
    assert (args.demo, args.port, args.api_key) == (True, 9000, "k")
    monkeypatch.setenv("PORT", "9100")  # PORT wins: it is what container platforms set
    assert app.parse_args([]).port == 9100
    assert app.parse_args(["--port", "9200", "--device", "cpu"]).port == 9200


def test_max_batch_flag_and_env(monkeypatch):
    monkeypatch.delenv("HIGGS_MAX_BATCH", raising=False)
    assert app.parse_args([]).max_batch == 16
    monkeypatch.setenv("HIGGS_MAX_BATCH", "4")
    assert app.parse_args([]).max_batch == 4
    assert app.parse_args(["--max-batch", "1"]).max_batch == 1


def test_spaces_binds_all_interfaces_and_keeps_downloads_on_data(monkeypatch, tmp_path):
    """On a Space: all interfaces, a public page, voices private to each visitor, downloads on /data."""
    monkeypatch.setenv("SPACE_ID", "someone/higgs-studio")
    monkeypatch.delenv("HF_HOME", raising=False)
    for name in ("HIGGS_PRIVATE_VOICES", "HIGGS_PUBLIC_PAGE", "HIGGS_VOICE_PRESETS"):
        monkeypatch.delenv(name, raising=False)
    args = app.parse_args([])
    assert (args.host, args.public_page, args.private_voices) == ("0.0.0.0", True, True)
    monkeypatch.setenv("HIGGS_VOICE_PRESETS", str(tmp_path / "presets"))
    assert app.parse_args([]).voices_presets == str(tmp_path / "presets")
    app.configure_spaces(tmp_path)
    assert os.environ["HF_HOME"] == str(tmp_path / ".huggingface")
    monkeypatch.delenv("SPACE_ID")
    assert not app.parse_args([]).private_voices and app.parse_args(["--private-voices"]).private_voices


@pytest.mark.slow
@pytest.mark.parametrize("source", ["/nonexistent/higgs-checkpoint", "bosonai/higgs-tts-3-4b"])
def test_missing_checkpoint_says_what_to_do(source, tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path), "HIGGS_VOICES_DIR": str(tmp_path / "v")}
    env.pop("HIGGS_DEMO", None)
    proc = subprocess.run([sys.executable, "app.py", "--checkpoint", source, "--port", "0"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    assert "Traceback" not in out
    assert "--demo" in out


@pytest.mark.slow
def test_demo_in_int8_speaks_and_the_page_says_int8(tmp_path):
    """`python app.py --demo --precision int8`: the CPU path's weight-only int8 serves takes, and the page's
    engine chips and /health name the precision it really runs."""
    import httpx

    from tests.studio_server import running_studio

    with running_studio(tmp_path, "--precision", "int8") as url:
        assert httpx.get(f"{url}/health", timeout=30).json()["precision"] == "int8"
        assert "<b>precision</b> int8" in httpx.get(f"{url}/config", timeout=30).text
        r = httpx.post(f"{url}/v1/audio/speech", timeout=120,
                       json={"input": "Eight bits a weight.", "response_format": "wav", "max_frames": 12, "seed": 1})
        assert r.status_code == 200 and r.content[:4] == b"RIFF" and len(r.content) > 44
