"""The project tools over MCP on `app.py --demo --mcp --api-key` (the shared keyed studio): a render started
by `render_project` and followed with `project_status` to the end; without the key both are refused."""

from __future__ import annotations

import ast
import asyncio
import time

import httpx
import pytest

from tests.studio_server import KEY

BEARER = {"Authorization": f"Bearer {KEY}"}


def call(url: str, name: str, args: dict, headers: dict) -> tuple[bool, str]:
    mcp_client = pytest.importorskip("mcp.client.streamable_http")
    from mcp import ClientSession

    async def run():
        async with mcp_client.streamablehttp_client(f"{url}/gradio_api/mcp/", headers=headers) as (r, w, _):
            async with ClientSession(r, w) as session:
                await session.initialize()
                result = await asyncio.wait_for(session.call_tool(name, args), timeout=120)
                return result.isError, "".join(c.text for c in result.content if c.type == "text")
    # a dict comes back as its Python repr (Gradio's MCP bridge), read with ast.literal_eval
    return asyncio.run(run())


def test_a_render_is_started_and_followed_over_mcp_by_the_owner_only(keyed_studio):
    url = keyed_studio.url
    r = httpx.post(f"{url}/v1/projects", headers=BEARER, timeout=60,
                   json={"title": "MCP book", "text": "# One\n\nHello there.\n\nA second line.\n\n# Two\n\nGood night.",
                         "format": "markdown", "settings": {"seed": 3, "max_frames": 8}})
    assert r.status_code == 201, r.text
    project = r.json()["id"]
    for tool, args in (("render_project", {"project": project}), ("project_status", {"project": project})):
        is_error, text = call(url, tool, args, {})
        assert is_error and "API key" in text
    is_error, text = call(url, "render_project", {"project": project, "chapters": "1"}, BEARER)
    assert not is_error, text
    assert ast.literal_eval(text)["state"] in ("queued", "running", "done")
    deadline = time.monotonic() + 90
    while True:
        is_error, text = call(url, "project_status", {"project": project}, BEARER)
        status = ast.literal_eval(text)
        if status["job"]["state"] == "done":
            break
        assert not is_error and time.monotonic() < deadline, text
        time.sleep(0.3)
    # chapter 1, and chapter 0's first segment: the book's zero-shot anchor and loudness reference
    assert [(c["state"], c["rendered"]) for c in status["chapters"]] == [("not started", 1), ("done", 1)]
    is_error, text = call(url, "render_project", {"project": "nope"}, BEARER)
    assert is_error and "No project 'nope'" in text
    listed = ast.literal_eval(call(url, "project_status", {}, BEARER)[1])
    assert project in [p["id"] for p in listed["projects"]]
