"""MCP tools (`studio.api.mcp`): the schema Gradio publishes, and real tool calls over MCP's streamable HTTP
transport, against the real engine on the tiny checkpoint. The tools are registered on a small Blocks
served in-process on 127.0.0.1; `python app.py --demo --mcp` is checked for the same three tools."""

from __future__ import annotations

import asyncio
import base64
import io
import threading
import time

import httpx
import numpy as np
import pytest
import soundfile as sf

from engine.config import SAMPLE_RATE, SAMPLES_PER_FRAME
from tests.helpers import clip_bytes
from tests.studio_server import free_port

gr = pytest.importorskip("gradio")
mcp_client = pytest.importorskip("mcp.client.streamable_http")
from mcp import ClientSession  # noqa: E402

pytestmark = pytest.mark.slow

KEY = "mcp-key"
TOOLS = {"synthesize", "list_voices", "add_voice"}


@pytest.fixture(scope="module")
def served(tmp_path_factory, shared_engine):
    """A Blocks with only the MCP tools, mounted with mcp_server=True, on a free port."""
    import fastapi
    import uvicorn

    from studio.api import mcp
    from studio.text.presets import PresetStore, load_builtin_presets
    from studio.takes.service import StudioService
    from studio.voices import VoiceLibrary

    root = tmp_path_factory.mktemp("mcp")
    library = VoiceLibrary(root / "voices")
    service = StudioService(shared_engine(device="auto"), library,
                            PresetStore(root / "presets.json", builtins=load_builtin_presets()))
    with gr.Blocks() as blocks:
        gr.Markdown("MCP test")
    mcp.register(blocks, service, api_key=KEY)
    app = gr.mount_gradio_app(fastapi.FastAPI(), blocks, path="/", mcp_server=True)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "the MCP test server did not start"
        time.sleep(0.1)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=20)
    service.close()


def call(base: str, calls: list[tuple[str, dict]], key: str | None = KEY) -> list:
    """Run tool calls in one MCP session; returns (is_error, text) per call."""
    async def run():
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        async with mcp_client.streamablehttp_client(f"{base}/gradio_api/mcp/", headers=headers) as (r, w, _):
            async with ClientSession(r, w) as session:
                await session.initialize()
                out = []
                for name, args in calls:
                    result = await asyncio.wait_for(session.call_tool(name, args), timeout=180)
                    out.append((result.isError, "".join(c.text for c in result.content if c.type == "text")))
                return out
    return asyncio.run(run())


def clip_data_url(seconds: float = 2.0) -> str:
    return "data:audio/wav;base64," + base64.b64encode(clip_bytes(seconds, pitch=170, rate=SAMPLE_RATE)).decode()


def test_schema_lists_the_three_tools_with_descriptions(served):
    schema = httpx.get(f"{served}/gradio_api/mcp/schema", timeout=30).json()
    tools = {t["name"]: t for t in schema}
    assert TOOLS <= set(tools)
    synth = tools["synthesize"]
    assert "no instruction slot" in synth["description"]
    assert set(synth["inputSchema"]["properties"]) == {"text", "voice", "style", "seed"}
    assert synth["inputSchema"]["required"] == ["text"]
    assert "inline control tags" in synth["inputSchema"]["properties"]["text"]["description"]
    add = tools["add_voice"]
    assert set(add["inputSchema"]["required"]) == {"audio", "transcript", "name", "consent"}
    assert "permission" in add["description"] and add["meta"]["file_data_present"]
    assert all(tools[name]["meta"]["headers"] == ["authorization"] for name in TOOLS)


def test_tools_synthesize_clone_and_list(served):
    (err1, url1), (err2, url2), (err3, added), (err4, listed), (err5, cloned_url), (err6, refused) = call(served, [
        ("synthesize", {"text": "Hello from MCP.", "seed": 42}),
        ("synthesize", {"text": "Hello from MCP.", "seed": 42}),
        ("add_voice", {"audio": clip_data_url(), "transcript": "A hum.", "name": "Hummer", "consent": True}),
        ("list_voices", {}),
        ("synthesize", {"text": "Hello again.", "voice": "Hummer", "style": "Calm narrator", "seed": 7}),
        ("add_voice", {"audio": clip_data_url(1.5), "transcript": "x", "name": "NoConsent", "consent": False}),
    ])
    assert not (err1 or err2 or err3 or err4 or err5)
    assert url1.startswith(served) and "speech-seed42-" in url1
    first, second = httpx.get(url1, timeout=30), httpx.get(url2, timeout=30)
    audio, rate = sf.read(io.BytesIO(first.content), dtype="int16")
    assert rate == SAMPLE_RATE and len(audio) > 0 and len(audio) % SAMPLES_PER_FRAME == 0
    assert np.array_equal(audio, sf.read(io.BytesIO(second.content), dtype="int16")[0])  # same seed, same take
    assert "Hummer" in added and "'id': 'v_" in added
    assert "Hummer" in listed and "Calm narrator" in listed
    assert "speech-seed7-" in cloned_url and httpx.get(cloned_url, timeout=30).status_code == 200
    assert err6 and "consent" in refused


def test_tools_need_the_key(served):
    (err, text), = call(served, [("list_voices", {})], key="wrong")
    assert err and "API key" in text
    (err, text), = call(served, [("synthesize", {"text": "Hi."})], key=None)
    assert err and "API key" in text


def test_tool_errors_are_messages(served):
    (err1, text1), (err2, text2) = call(served, [
        ("synthesize", {"text": "Hi.", "voice": "nobody"}),
        ("synthesize", {"text": "Hi.", "style": "<|emotion:calm|>"}),
    ])
    assert err1 and "nobody" in text1
    assert err2 and "not a known control tag" in text2


def test_app_serves_the_tools_with_mcp_flag(keyed_studio):
    names = {t["name"] for t in httpx.get(f"{keyed_studio.url}/gradio_api/mcp/schema", timeout=30).json()}
    assert TOOLS <= names
