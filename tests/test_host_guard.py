"""DNS rebinding (docs/SECURITY.md): a keyless local studio answers only to local names and IP addresses.
The guard is checked here on a bare app; tests/test_security.py checks it on a running studio."""

from __future__ import annotations

import pytest
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.responses import PlainTextResponse
from starlette.routing import Route, WebSocketRoute
from starlette.testclient import TestClient
from starlette.websockets import WebSocketDisconnect

from studio.api.access import HostGuard, host_allowed, host_guard


@pytest.mark.parametrize("host", ["localhost", "localhost:7860", "LOCALHOST:7860", "localhost.:7860",
                                  "studio.localhost:7860", "127.0.0.1:7860", "[::1]:7860", "192.168.1.20:7860",
                                  None, ""])
def test_local_names_and_addresses_are_answered(host):
    assert host_allowed(host)


@pytest.mark.parametrize("host", ["evil.example", "evil.example:7860", "localhost.evil.example",
                                  "127.0.0.1.nip.io:7860", "[::1", "my-box.lan"])
def test_other_names_are_refused(host):
    assert not host_allowed(host)


def test_allowed_names_and_subdomains():
    allowed = {"my-box.lan", ".gradio.live"}
    assert host_allowed("my-box.lan:7860", allowed) and host_allowed("abc123.gradio.live", allowed)
    assert not host_allowed("other.lan", allowed) and not host_allowed("gradio.live.evil.example", allowed)


def _app(allowed=()):
    async def home(request):
        return PlainTextResponse("the library")

    async def ws(socket):
        await socket.accept()
        await socket.send_text("hello")
        await socket.close()

    return Starlette(routes=[Route("/", home), WebSocketRoute("/ws", ws)],
                     middleware=[Middleware(HostGuard, allowed=allowed)])


def test_the_guard_refuses_reads_and_websockets_from_a_rebound_name():
    client = TestClient(_app(), base_url="http://evil.example:7860")
    r = client.get("/")
    assert r.status_code == 403 and "the library" not in r.text
    message = r.json()["error"]["message"]
    assert "evil.example:7860" in message and "--allowed-hosts" in message
    # the websocket's Host comes from its URL (TestClient ignores base_url there)
    with pytest.raises(WebSocketDisconnect), client.websocket_connect("ws://evil.example:7860/ws") as socket:
        socket.receive_text()
    local = TestClient(_app(), base_url="http://localhost:7860")
    assert local.get("/").text == "the library"
    with local.websocket_connect("ws://localhost:7860/ws") as socket:
        assert socket.receive_text() == "hello"
    assert TestClient(_app({"evil.example"}), base_url="http://evil.example:7860").get("/").status_code == 200


def test_only_a_keyless_loopback_server_is_guarded():
    assert host_guard("0.0.0.0", None) == []                  # on the network: names cannot be guessed
    assert host_guard("127.0.0.1", "SECRET") == []            # the key protects it
    (guard,) = host_guard("127.0.0.1", None, ["My-Box.lan", " ", ""], share=True)
    assert guard.cls is HostGuard
    assert guard.kwargs["allowed"] == {"my-box.lan", "127.0.0.1", ".gradio.live"}
    (guard,) = host_guard("localhost", None)
    assert guard.kwargs["allowed"] == set()
