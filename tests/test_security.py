"""The hostile probe, replayed: every refusal that docs/SECURITY.md promises, against real servers.

* `app.py --demo --mcp --api-key SECRET` (the page behind the owner's login): every Gradio event by
  `fn_index` (queue/join, run/predict, call/<api_name>) without the login; MCP tools without the key; decode
  bombs made with ffmpeg (peak RSS growth of the server printed); control characters in tags; lone
  surrogates; deep JSON; negative consent.
* `--api-key SECRET --public-page` (a Space's page): visitors may generate within the public limits, and every
  event that shows, changes or exports the library or saves presets refuses them, however it is called;
  oversized uploads.
* A keyless server driving a credentialed `--remote`: cross-site simple requests and requests to a rebound
  host name are refused, and neither `/health` nor the page shows the remote's credentials.
Each probe checks that the voices directory is unchanged and `/health` still answers. In-process: the
interrupted-import crash test (a subprocess killed at random points) and the hang-up on a failing header.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import io
import json
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
import zipfile
from pathlib import Path

import httpx
import numpy as np
import pytest
import soundfile as sf

from tests.fakes import ScriptedEngine
from tests.helpers import clip_bytes, events, ffmpeg_children, refused, run_event, wait_for
from tests.probes import memory_kb, server_pid
from tests.studio_server import KEY, REPO, free_port, running_studio

pytestmark = pytest.mark.slow

BEARER = {"Authorization": f"Bearer {KEY}"}
OWNER_EVENTS = ("_save_voice", "_save_preset", "_edit_voice", "_delete_voice", "_export_all", "_pick_voice",
                "_import", "_voice_rows")


# ---------------------------------------------------------------------------------------------- helpers

def tree_hash(root: Path) -> str:
    """sha256 over every file's path and bytes under `root` (the lock file aside)."""
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file() and p.name != ".lock"):
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def bomb(path: Path, seconds: float, rate: int = 192_000, layout: str = "7.1") -> bytes:
    """Silence that compresses to almost nothing but claims `seconds` × `rate` × 8 channels."""
    subprocess.run(["ffmpeg", "-v", "error", "-y", "-f", "lavfi", "-i", f"anullsrc=r={rate}:cl={layout}",
                    "-t", str(seconds), "-c:a", "flac", "-compression_level", "8", str(path)], check=True, timeout=120)
    return path.read_bytes()


def healthy(url: str) -> bool:
    return httpx.get(f"{url}/health", timeout=30).json()["status"] == "ok"


def post_voice(url: str, name: str, consent: str, headers: dict | None = None, audio: bytes | None = None):
    return httpx.post(f"{url}/v1/audio/voices", headers=headers, timeout=120,
                      data={"name": name, "ref_text": "A test tone.", "consent": consent},
                      files={"audio_sample": ("clip.flac", audio if audio is not None else clip_bytes(), "audio/wav")})


# ---------------------------------------------------------------------------------------------- servers

@pytest.fixture(scope="module")
def keyed(keyed_studio):
    """`app.py --demo --mcp --api-key SECRET` with one saved voice; (url, voices dir)."""
    assert post_voice(keyed_studio.url, "Owner Voice", "true", BEARER).status_code == 201
    return keyed_studio.url, keyed_studio.voices


@pytest.fixture(scope="module")
def public(public_studio):
    """`--api-key SECRET --public-page` with one saved voice; (url, voices dir)."""
    assert post_voice(public_studio.url, "Owner Voice", "true", BEARER).status_code == 201
    return public_studio.url, public_studio.voices


# ---------------------------------------------------------------------------------------------- the key

def test_every_page_event_needs_the_owners_login(keyed):
    url, voices = keyed
    before = tree_hash(voices)
    owner = httpx.Client(base_url=url, timeout=60)
    assert owner.post("/login", data={"username": "mallory", "password": "wrong"}).status_code >= 400
    assert owner.get("/config").status_code == 401
    assert owner.post("/login", data={"username": "owner", "password": KEY}).status_code == 200
    config = owner.get("/config").json()
    stranger = httpx.Client(base_url=url, timeout=60)
    for fn_index, dep in enumerate(config["dependencies"]):
        assert run_event(stranger, fn_index, [None] * len(dep["inputs"]))[0] == 401, dep["api_name"]
        r = stranger.post("/gradio_api/run/predict", json={"data": [], "fn_index": fn_index, "session_hash": "s"})
        assert r.status_code == 401
        if dep.get("api_name"):
            assert stranger.post(f"/gradio_api/call/{dep['api_name']}", json={"data": []}).status_code == 401
    assert stranger.post("/gradio_api/upload", files={"files": ("x.zip", b"PK")}).status_code == 401
    assert stranger.get(f"/gradio_api/file={voices}/presets.json").status_code == 401
    assert stranger.get("/config").status_code == 401
    assert tree_hash(voices) == before and healthy(url)
    # The check is the login, not a blanket refusal: the owner's session runs the same event.
    status, message = run_event(owner, events(config)["_save_preset"], ["Owner preset", "<|emotion:awe|>"])
    assert status == 200 and message["success"], message


def test_mcp_has_only_the_keyed_tools_and_refuses_without_the_key(keyed, tmp_path):
    url, voices = keyed
    mcp_client = pytest.importorskip("mcp.client.streamable_http")
    from mcp import ClientSession

    before = tree_hash(voices)
    schema = httpx.get(f"{url}/gradio_api/mcp/schema", timeout=30).json()
    assert {tool["name"] for tool in schema} == {"synthesize", "list_voices", "add_voice", "render_project",
                                                 "project_status"}  # no page events

    clip = "data:audio/wav;base64," + base64.b64encode(clip_bytes()).decode()

    async def call_all(headers, audio=clip):
        async with mcp_client.streamablehttp_client(f"{url}/gradio_api/mcp/", headers=headers) as (r, w, _):
            async with ClientSession(r, w) as session:
                await session.initialize()
                out = []
                for name, args in (("synthesize", {"text": "Hello."}), ("list_voices", {}),
                                   ("add_voice", {"audio": audio, "transcript": "A tone.", "name": "Intruder",
                                                  "consent": True})):
                    result = await asyncio.wait_for(session.call_tool(name, args), timeout=120)
                    out.append((result.isError, "".join(c.text for c in result.content if c.type == "text")))
                return out

    for headers in ({}, {"Authorization": "Bearer wrong"}):
        for is_error, text in asyncio.run(call_all(headers)):
            assert is_error and "API key" in text, text
            assert "Owner Voice" not in text
    assert tree_hash(voices) == before and healthy(url)
    # With the key the same tools answer (the page's login does not stand in their way).
    # The bomb goes through MCP's add_voice to the same bounded decoder.
    big = "data:audio/flac;base64," + base64.b64encode(bomb(tmp_path / "bomb.flac", 300)).decode()
    (_, spoken), (_, listed), (is_error, added) = asyncio.run(call_all(BEARER, big))
    assert "speech-seed" in spoken and "Owner Voice" in listed
    assert is_error and "5,760,000 samples" in added, added
    assert tree_hash(voices) == before


def test_the_public_page_generates_within_limits_and_cannot_touch_the_library(public, tmp_path):
    url, voices = public
    visitor = httpx.Client(base_url=url, timeout=120)
    config = visitor.get("/config").json()  # no login: the page is public
    by_name = events(config)
    voice_id = next(v["id"] for v in httpx.get(f"{url}/v1/audio/voices", headers=BEARER).json()["voices"]
                    if v["name"] == "Owner Voice")
    presets = httpx.get(f"{url}/v1/audio/styles", headers=BEARER).json()
    before = tree_hash(voices)
    upload = visitor.post("/gradio_api/upload", files={"files": ("bundle.zip", b"PK\x05\x06" + b"\0" * 18)})
    bundle = {"path": upload.json()[0], "meta": {"_type": "gradio.FileData"}}
    probes = {"_save_voice": [None, "words", "Intruder", "", "", True],
              "_save_preset": ["Intruder preset", "<|emotion:awe|>"],
              "_edit_voice": [voice_id, "Renamed", "new words", "", "", True],
              "_delete_voice": [voice_id, True],
              "_export_all": [],
              "_pick_voice": [],
              "_import": [bundle],
              "_voice_rows": []}
    assert set(probes) == set(OWNER_EVENTS)
    for name, data in probes.items():
        event_data = {"index": [0, 0], "value": "Owner Voice", "row_value": ["Owner Voice", voice_id]} \
            if name == "_pick_voice" else None
        status, message = run_event(visitor, by_name[name], data, event_data=event_data)
        assert status == 200 and "Only the studio's owner" in refused(message), name
        assert "A test tone." not in json.dumps(message)  # the owner voice's transcript
    assert tree_hash(voices) == before
    assert httpx.get(f"{url}/v1/audio/styles", headers=BEARER).json() == presets
    assert httpx.get(f"{url}/v1/audio/voices").status_code == 401  # the API still needs the key

    generate = by_name["generate"]
    args = ["Hello from a visitor.", "", "", None, "", 0.8, 0.8, 30, 1, 2000, 32, 1, False, "speak", [], ""]
    status, message = run_event(visitor, generate, args)
    assert "up to 1500 frames" in refused(message)
    args[9] = 8
    status, message = run_event(visitor, generate, args)
    assert message["success"], message
    args[2] = voice_id  # the owner's voice is private until shared: neither listed nor usable
    assert "Owner Voice" not in json.dumps(run_event(visitor, by_name["refresh_lists"], [])[1]["output"])
    assert "No voice called" in refused(run_event(visitor, generate, args)[1])
    assert httpx.patch(f"{url}/v1/audio/voices/{voice_id}", headers=BEARER, json={"shared": True}).status_code == 200
    assert "Owner Voice" in json.dumps(run_event(visitor, by_name["refresh_lists"], [])[1]["output"])
    status, message = run_event(visitor, generate, args)
    assert message["success"], message
    assert httpx.patch(f"{url}/v1/audio/voices/{voice_id}", headers=BEARER, json={"shared": False}).status_code == 200
    before = tree_hash(voices)
    args[2] = ""
    # The one-off clip is decoded under the same sample budget as every other entry point.
    clip = visitor.post("/gradio_api/upload", files={"files": ("bomb.flac", bomb(tmp_path / "b.flac", 300))})
    args[2:4] = ["__clip__", {"path": clip.json()[0], "meta": {"_type": "gradio.FileData"}}]
    status, message = run_event(visitor, generate, args)
    assert "5,760,000 samples" in refused(message)
    # Long texts and scripts (the Long form tab) are beyond the public limits: the owner's.
    status, message = run_event(visitor, by_name["long_generate"], ["A visitor's chapter. " * 80, "", "", "", True, 1])
    assert "Long texts and scripts are for the studio's owner" in refused(message)
    assert tree_hash(voices) == before and healthy(url)
    # The owner's key, sent as a Bearer header on the same event, is the owner.
    status, message = run_event(visitor, by_name["_save_preset"], ["Owner preset", "<|emotion:awe|>"],
                                headers=BEARER)
    assert message["success"], message



def test_public_limits_hold_visitors_only():
    from engine.delay import default_max_frames
    from engine.types import PUBLIC_MAX_FRAMES, SamplingParams
    from studio.api.access import Access
    from studio.takes.limits import TakeLimits

    class Visitor:
        username, headers = None, {}

    access, limits = Access(KEY, public_page=True), TakeLimits()
    visitor = access.page_caller(Visitor())
    short = limits.hold(SamplingParams(), "Hello.", visitor)
    words = "Words and more words. " * 45
    assert short.max_frames == default_max_frames("Hello.") < PUBLIC_MAX_FRAMES  # "auto" as for the owner...
    assert default_max_frames(words) > PUBLIC_MAX_FRAMES == limits.hold(SamplingParams(), words, visitor).max_frames
    with pytest.raises(ValueError, match="up to 1000 characters"):
        limits.check_text("a" * 1001, visitor)
    owner = Visitor()
    owner.headers = {"authorization": BEARER["Authorization"]}  # as gr.Request gives them: lower case
    unlimited = SamplingParams(max_frames=8000)
    assert access.page_caller(owner).owner and limits.hold(unlimited, "a" * 4000, access.page_caller(owner)) is unlimited
    assert Access(None).page_caller(Visitor()).owner  # no key: all are the owner


def test_the_page_needs_a_login_unless_it_is_public(monkeypatch):
    import app
    from studio.api.access import Access

    monkeypatch.delenv("SPACE_ID", raising=False)
    monkeypatch.delenv("HIGGS_PUBLIC_PAGE", raising=False)
    assert app.parse_args(["--api-key", KEY]).public_page is False
    assert "auth" in Access(KEY).launch_kwargs()
    assert Access(KEY).login("any name", KEY) and not Access(KEY).login("any name", "wrong")
    assert Access(KEY, public_page=True).launch_kwargs() == {} and Access(None).launch_kwargs() == {}
    monkeypatch.setenv("SPACE_ID", "someone/studio")
    assert app.parse_args(["--api-key", KEY]).public_page is True  # Spaces: the page is public


# ---------------------------------------------------------------------------------------------- decoding

def test_too_many_channels_are_refused_from_the_header():
    from engine.audio import ReferenceAudioError, load_audio

    buf = io.BytesIO()
    sf.write(buf, np.zeros((100, 33), np.float32), 48_000, format="WAV", subtype="PCM_16")
    with pytest.raises(ReferenceAudioError, match="33 channels; the limit is 32"):
        load_audio(buf.getvalue())


def test_decode_bombs_are_refused_by_work_with_bounded_memory(keyed, tmp_path):
    url, voices = keyed
    before = tree_hash(voices)
    pid = server_pid(url)
    big = bomb(tmp_path / "bomb300.flac", 300)  # the probe's 129 KB file: 300 s, 192 kHz, 8 channels
    assert len(big) < 200_000
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # reset the peak (VmHWM) to the current RSS
    rss = memory_kb(pid, "VmRSS")
    r = post_voice(url, "Bomb", "true", BEARER, audio=big)
    growth_mb = (memory_kb(pid, "VmHWM") - rss) / 1024
    print(f"\ndecode bomb: {len(big) / 1024:.0f} KB FLAC (300 s, 192 kHz, 8 ch) -> {r.status_code} "
          f"in {r.elapsed.total_seconds():.2f} s; server peak RSS growth {growth_mb:.1f} MB")
    assert r.status_code == 400 and "5,760,000 samples" in r.json()["error"]["message"]
    assert growth_mb < 100

    # Within the header's budget, 8 channels are mixed down block by block (20 s × 192 kHz × 8 ch would
    # be 123 MB as float32 decoded whole): the silent result is refused for what it is.
    Path(f"/proc/{pid}/clear_refs").write_text("5")
    rss = memory_kb(pid, "VmRSS")
    r = post_voice(url, "Bomb", "true", BEARER, audio=bomb(tmp_path / "bomb20.flac", 20))
    growth_mb = (memory_kb(pid, "VmHWM") - rss) / 1024
    print(f"decode of 20 s, 192 kHz, 8 ch: {r.status_code}; server peak RSS growth {growth_mb:.1f} MB")
    assert r.status_code == 400 and "silent" in r.json()["error"]["message"]
    assert growth_mb < 100

    ref = base64.b64encode(big).decode()
    r = httpx.post(f"{url}/v1/audio/speech", headers=BEARER, timeout=120,
                   json={"input": "Hi.", "ref_audio": ref, "response_format": "wav"})
    assert r.status_code == 400 and "samples" in r.json()["error"]["message"]
    assert tree_hash(voices) == before and healthy(url)


# ---------------------------------------------------------------------------------------------- inputs

@pytest.mark.parametrize("char", ["\u0000", "\r", "\x0b"])
def test_control_characters_in_a_tag_never_reach_a_header(keyed, char):
    url, _ = keyed
    r = httpx.post(f"{url}/v1/audio/speech", headers=BEARER, timeout=120,
                   json={"input": f"<|emotion:a{char}b|>Hello.", "response_format": "pcm", "max_frames": 8,
                         "seed": 1})
    assert r.status_code == 200 and r.content
    warning = r.headers["x-warnings"]
    assert "emotion" in warning and not any(ord(c) < 32 or ord(c) == 127 for c in warning)
    assert healthy(url)


def test_lone_surrogates_and_deep_json_are_400s(keyed):
    url, voices = keyed
    before = tree_hash(voices)
    for body in ('{"input": "caf\\ud800e"}', '{"input": "Hi.", "ref_text": "\\udfff",'
                                              ' "ref_audio": "' + base64.b64encode(clip_bytes()).decode() + '"}',
                 "[" * 100_000 + "]" * 100_000, '{"input": ' + "[" * 100_000 + "]" * 100_000 + "}"):
        r = httpx.post(f"{url}/v1/audio/speech", headers={**BEARER, "Content-Type": "application/json"},
                       content=body.encode(), timeout=120)
        assert r.status_code in (400, 422), r.text
        message = r.json()["error"]["message"]
        assert "surrogate" in message or "nested" in message or "Invalid request" in message, message
    assert tree_hash(voices) == before and healthy(url)


@pytest.mark.parametrize("consent", ["", "n", "nope", "no", "false", "0", "off", "ok", "I do not consent",
                                     "no, never agreed"])
def test_consent_must_be_an_explicit_yes(keyed, consent):
    url, voices = keyed
    before = tree_hash(voices)
    r = post_voice(url, "Unconsented", consent, BEARER)
    assert r.status_code == 400 and r.json()["error"]["param"] == "consent"
    assert tree_hash(voices) == before and healthy(url)


def test_limits_are_stated_as_the_docs_state_them(keyed):
    url, _ = keyed
    r = httpx.post(f"{url}/v1/audio/speech", headers={**BEARER, "Content-Type": "application/json"},
                   content=b" " * (17 * 2**20), timeout=120)
    assert r.status_code == 413 and "the limit is 16 MB" in r.json()["error"]["message"]


def test_an_oversized_upload_is_refused_as_it_arrives(public):
    url, voices = public
    before = tree_hash(voices)
    size = 300 * 2**20

    def body():
        chunk = b"\0" * 2**20
        yield b'--b\r\nContent-Disposition: form-data; name="files"; filename="big.zip"\r\n' \
              b'Content-Type: application/zip\r\n\r\n'
        for _ in range(size // len(chunk)):
            yield chunk
        yield b"\r\n--b--\r\n"

    try:
        r = httpx.post(f"{url}/gradio_api/upload", content=body(), timeout=300,
                       headers={"Content-Type": "multipart/form-data; boundary=b"})
        status = r.status_code
    except httpx.HTTPError as exc:  # the server may close the connection while the body is still coming
        status = repr(exc)
    print(f"\n300 MB upload to the page: {status}")
    assert status == 413
    # A public page takes no upload larger than a reference clip (10 MB): only the owner imports bundles.
    r = httpx.post(f"{url}/gradio_api/upload", timeout=60, files={"files": ("clip.wav", b"\0" * (11 * 2**20))})
    assert r.status_code == 413
    assert tree_hash(voices) == before and healthy(url)


# ---------------------------------------------------------------------------------------------- keyless

def test_keyless_server_refuses_cross_site_writes_and_hides_remote_credentials(tmp_path, keyed):
    remote = keyed[0].replace("http://", "http://user:hunter2@") + "/?token=t0ps3cret"
    with running_studio(tmp_path, "--remote", remote) as url:
        voices = tmp_path / "voices"
        health = httpx.get(f"{url}/health", timeout=30).text
        page = httpx.get(f"{url}/config", timeout=30).text
        for secret in ("hunter2", "user:", "t0ps3cret"):
            assert secret not in health and secret not in page
        assert keyed[0].split("//")[1] in json.loads(health)["device"]  # the host is still shown

        # DNS rebinding: a site whose name now points at 127.0.0.1 is refused, reads included; local names pass.
        port = url.rsplit(":", 1)[1]
        for path in ("/", "/config", "/v1/audio/voices", "/health"):
            r = httpx.get(f"{url}{path}", headers={"Host": f"rebind.example:{port}"}, timeout=30)
            assert r.status_code == 403 and "DNS rebinding" in r.json()["error"]["message"], path
        assert httpx.get(f"{url}/v1/audio/voices", headers={"Host": f"localhost:{port}"}, timeout=30).status_code == 200

        before = tree_hash(voices)
        evil = {"Origin": "https://evil.example"}
        r = httpx.post(f"{url}/v1/audio/speech", headers={**evil, "Content-Type": "text/plain"},
                       content=b'{"input": "Hello."}', timeout=60)
        assert r.status_code == 403 and "another site" in r.json()["error"]["message"]
        r = httpx.post(f"{url}/v1/audio/speech", headers={"Content-Type": "text/plain"},
                       content=b'{"input": "Hello."}', timeout=60)
        assert r.status_code == 415  # a simple request (text/plain) never generates
        assert post_voice(url, "Cross Site", "true", evil).status_code == 403
        # A JSON body from another site needs a preflight, and the answer does not let that site through.
        preflight = httpx.options(f"{url}/v1/audio/speech", timeout=30, headers={
            **evil, "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "content-type"})
        assert preflight.headers.get("access-control-allow-origin") not in ("*", evil["Origin"])
        assert tree_hash(voices) == before
        # The studio's own page (same origin) and local pages may write.
        same = post_voice(url, "Same Site", "true", {"Origin": url})
        assert same.status_code == 201, same.text
        r = httpx.delete(f"{url}/v1/audio/voices/{same.json()['id']}", headers=evil, timeout=60)
        assert r.status_code == 403
        r = httpx.delete(f"{url}/v1/audio/voices/{same.json()['id']}", headers={"Origin": "http://localhost:3000"},
                         timeout=60)
        assert r.status_code == 200
        assert tree_hash(voices) == before and healthy(url)


# ---------------------------------------------------------------------------------------------- in-process

IMPORT_CHILD = """
import os, sys, time
from studio.voices import VoiceLibrary
lib = VoiceLibrary(sys.argv[1])
if sys.argv[3] == "rename":  # slow the renames down so the kill lands between two of them
    real = os.rename
    def rename(src, dst):
        if os.path.basename(os.path.dirname(src)).startswith(".stage-"):
            print("renaming", flush=True)
            time.sleep(0.02)
        return real(src, dst)
    os.rename = rename
lib.import_zip(sys.argv[2])
print("done", flush=True)
"""


def test_an_import_killed_at_any_point_leaves_all_or_none(tmp_path):
    from studio.voices import Consent, VoiceLibrary

    source = VoiceLibrary(tmp_path / "source")
    t = np.arange(24_000) / 24_000
    for i in range(150):
        tone = 0.4 * np.sin(2 * np.pi * (120 + 3 * i) * t) * (0.6 + 0.4 * np.sin(2 * np.pi * 3 * t))
        source.add((24_000, tone.astype(np.float32)), name=f"Voice {i}", consent=Consent("test"))
    bundle = tmp_path / "bundle.zip"
    bundle.write_bytes(source.export_zip())
    assert len(zipfile.ZipFile(bundle).namelist()) == 300

    def trial(n: int, mode: str, delay: float | None) -> int:
        target = tmp_path / f"target{n}"
        child = subprocess.Popen([sys.executable, "-c", IMPORT_CHILD, str(target), str(bundle), mode], cwd=REPO,
                                 stdout=subprocess.PIPE, text=True)
        if delay is None:  # wait until the renames into place have begun
            assert child.stdout.readline().strip() == "renaming"
            for _ in range(random.randint(1, 100)):
                child.stdout.readline()
        else:
            time.sleep(delay)
        child.send_signal(signal.SIGKILL)
        child.wait()
        child.stdout.close()
        return len(VoiceLibrary(target).list())  # opening the library completes or removes the write

    started = time.monotonic()
    whole = subprocess.run([sys.executable, "-c", IMPORT_CHILD, str(tmp_path / "whole"), str(bundle), "plain"],
                           cwd=REPO, capture_output=True, text=True, timeout=300)
    duration = time.monotonic() - started  # start-up, checks, staging, renames: the kills fall anywhere in it
    assert whole.stdout.strip() == "done" and len(VoiceLibrary(tmp_path / "whole").list()) == 150
    rng = random.Random(10)
    results = [trial(1, "rename", None), trial(2, "rename", None), trial(3, "rename", None)]
    results += [trial(4 + i, "plain", rng.uniform(0.1, duration)) for i in range(5)]
    print(f"\nvoices after each killed import: {results}")
    assert all(n in (0, 150) for n in results), results
    assert results[:3] == [150, 150, 150]  # killed after the commit mark: the next open finished the import


def test_a_failing_header_cancels_the_take_and_frees_the_queue(monkeypatch):
    if shutil.which("ffmpeg") is None:
        pytest.skip("ffmpeg is not on PATH")
    import uvicorn
    from fastapi import FastAPI

    from studio import api
    from studio.takes.service import StudioService

    service = StudioService(ScriptedEngine())
    app = FastAPI()
    api.register(app, service, request_timeout=60.0)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="critical"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        assert wait_for(lambda: server.started)
        baseline = ffmpeg_children()
        # A header value the HTTP layer refuses (what an unsanitised tag did): sending the response fails.
        monkeypatch.setattr(api.speech, "header_value", lambda value: f"{value}\r\nbroken")
        with pytest.raises(httpx.HTTPError):
            httpx.post(f"http://127.0.0.1:{port}/v1/audio/speech", timeout=30,
                       json={"input": "slow take", "response_format": "mp3"})  # 100 frames × 0.1 s
        assert wait_for(lambda: service.queue_depth == 0, 1.0), "the take kept the queue"
        assert service.history[-1].stop_reason == "cancelled"
        assert ffmpeg_children() == baseline
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        service.close()
