"""One rule for the owner on a keyed studio (`app.py --demo --mcp --api-key SECRET`, the page behind a login):
whoever sends `Authorization: Bearer <key>` is the owner on every door, through the real clients.

* `gradio_client` with the header alone (or the page's login alone) loads the page's API, calls `/synthesize`
  and downloads its audio; without the header or with a wrong key it is refused.
* The WAV URL MCP's `synthesize` returns answers 200 to the key and 401 without it or with a wrong one.
* A browser without credentials (or with a wrong key) still gets Gradio's login, not the app.
"""

from __future__ import annotations

import asyncio
import io

import httpx
import pytest
import soundfile as sf

from engine.config import SAMPLE_RATE
from tests.studio_server import KEY

gradio_client = pytest.importorskip("gradio_client")
mcp_client = pytest.importorskip("mcp.client.streamable_http")
from gradio_client.exceptions import AuthenticationError
from mcp import ClientSession

pytestmark = pytest.mark.slow

BEARER = {"Authorization": f"Bearer {KEY}"}
WRONG = {"Authorization": "Bearer wrong"}
BROWSER = {"Accept": "text/html,application/xhtml+xml", "User-Agent": "Mozilla/5.0 (X11; Linux x86_64) Firefox/140.0"}


def mcp_synthesize(url: str, text: str) -> str:
    """The text MCP's `synthesize` tool answers with, called with the owner's key."""
    async def run():
        async with mcp_client.streamablehttp_client(f"{url}/gradio_api/mcp/", headers=BEARER) as (r, w, _), \
                ClientSession(r, w) as session:
            await session.initialize()
            result = await asyncio.wait_for(session.call_tool("synthesize", {"text": text, "seed": 3}), 120)
            assert not result.isError, result
            return "".join(c.text for c in result.content if c.type == "text")
    return asyncio.run(run())


@pytest.mark.parametrize("credentials", [{"headers": BEARER}, {"auth": ("anyone", KEY)}], ids=["bearer", "login"])
def test_gradio_client_with_the_key_alone_is_the_owner(keyed_studio, credentials):
    # The header alone, or the page's login alone: either is the key, for the page's routes and for the tool.
    client = gradio_client.Client(keyed_studio.url, verbose=False, **credentials)
    path = client.predict(text="Hello there.", seed=1, api_name="/synthesize")  # downloaded with the same credentials
    audio, rate = sf.read(path)
    assert rate == SAMPLE_RATE and len(audio) > 0
    assert "speech-seed1-" in path


@pytest.mark.parametrize("headers", [None, WRONG], ids=["no key", "wrong key"])
def test_gradio_client_without_the_key_is_refused(keyed_studio, headers):
    with pytest.raises(AuthenticationError):
        gradio_client.Client(keyed_studio.url, headers=headers, verbose=False)
    # Nor can it skip the config and call the endpoint or its file route directly.
    r = httpx.post(f"{keyed_studio.url}/gradio_api/call/synthesize", headers=headers, json={"data": ["Hi."]})
    assert r.status_code == 401


def test_the_mcp_audio_url_answers_the_key_and_no_one_else(keyed_studio):
    url = mcp_synthesize(keyed_studio.url, "A file for the owner.").strip()
    assert url.startswith(f"{keyed_studio.url}/gradio_api/file=") and "speech-seed3-" in url, url
    owner = httpx.get(url, headers=BEARER, timeout=30)
    assert owner.status_code == 200, owner.text
    audio, rate = sf.read(io.BytesIO(owner.content))
    assert rate == SAMPLE_RATE and len(audio) > 0
    for headers in (None, WRONG):
        r = httpx.get(url, headers=headers, timeout=30)
        assert r.status_code == 401 and b"RIFF" not in r.content


@pytest.mark.parametrize("headers", [{}, WRONG], ids=["no key", "wrong key"])
def test_a_browser_without_the_key_still_gets_the_login(keyed_studio, headers):
    page = httpx.get(keyed_studio.url + "/", headers={**BROWSER, **headers}, timeout=30)
    assert page.status_code == 200
    assert '"auth_required":true' in page.text and '"dependencies":[]' in page.text  # the login, not the app
    assert httpx.get(f"{keyed_studio.url}/config", headers={**BROWSER, **headers}, timeout=30).status_code == 401
