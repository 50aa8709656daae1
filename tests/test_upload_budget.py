"""A public page's visitors upload within a budget over time (studio/api/uploads.py), against Gradio's own upload
route in process: a visitor's uploads pass until their budget is spent, the next is refused before its body is
read (429, a sentence, Retry-After), and passes again once the window moves on; every visitor together have one
budget; uploads sent at once cannot all pass one check; what a chunked upload really sent is counted; the
owner's key and a page that is not public are not counted; a minute's uploads are one entry, so the books
stay small; a file input given as an address is refused, never fetched."""

from __future__ import annotations

import gradio as gr
import httpx
import pytest
from starlette.middleware import Middleware
from starlette.testclient import TestClient

from studio.api import uploads
from studio.api.access import Access

KEY = "SECRET"
MB = 2**20


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def blocks():
    with gr.Blocks() as demo:
        gr.File()
    return demo


def client(blocks, *, public=True, clock=None, visitor=3 * MB, visitors=5 * MB, max_file=2 * MB):
    """Gradio's app for `blocks` with the budget in front, as app.py launches it."""
    access = Access(KEY, public_page=public)
    blocks.max_file_size = max_file
    middleware = [Middleware(uploads.UploadBudget, access=access, max_file_size=max_file, visitor_bytes=visitor,
                             visitors_bytes=visitors, clock=clock or Clock())] if public else []
    return gr.routes.App.create_app(blocks, app_kwargs={"middleware": middleware})


def http(app, address: str = "203.0.113.7") -> TestClient:
    """A client of `app` from `address` (the visitor)."""
    return TestClient(app, base_url="http://localhost", client=(address, 1234))


def upload(app, size: int, *, address: str = "203.0.113.7", headers: dict | None = None) -> httpx.Response:
    return http(app, address).post("/gradio_api/upload", files={"files": ("clip.wav", b"\0" * size)},
                                   headers=headers)


def test_a_visitor_uploads_within_the_budget_then_is_refused_with_a_sentence_until_the_window_moves(blocks):
    clock = Clock()
    app = client(blocks, clock=clock)
    for _ in range(2):
        assert upload(app, 1 * MB).status_code == 200
        clock.now += 600
    refused = upload(app, int(1.5 * MB))
    assert refused.status_code == 429
    assert refused.text.startswith("You have uploaded 3 MB in the last two hours") and "try again in" in refused.text
    # Room for 1.5 MB comes back when the first upload leaves the window, 1200 s after it was made.
    assert int(refused.headers["retry-after"]) == uploads.WINDOW_S - 1200
    assert upload(app, MB // 2, address="203.0.113.8").status_code == 200  # another visitor has their own
    clock.now += int(refused.headers["retry-after"])
    assert upload(app, int(1.5 * MB)).status_code == 200  # the window moved on


def test_every_visitor_together_has_one_budget(blocks):
    app = client(blocks, visitor=3 * MB, visitors=5 * MB)
    assert upload(app, 2 * MB - 1000, address="198.51.100.1").status_code == 200
    assert upload(app, 2 * MB - 1000, address="198.51.100.2").status_code == 200
    full = upload(app, 2 * MB - 1000, address="198.51.100.3")
    assert full.status_code == 429 and full.text.startswith("This page has taken all the uploads it can keep")


def test_what_a_chunked_upload_sent_is_counted_and_an_oversized_one_is_still_gradios_413(blocks):
    app = client(blocks, visitor=3 * MB)
    boundary = "b"

    def body(size):
        yield (f'--{boundary}\r\nContent-Disposition: form-data; name="files"; filename="c.wav"\r\n'
               "Content-Type: audio/wav\r\n\r\n").encode()
        for _ in range(size // (256 * 1024)):
            yield b"\0" * (256 * 1024)
        yield f"\r\n--{boundary}--\r\n".encode()

    headers = {"Content-Type": f"multipart/form-data; boundary={boundary}"}
    assert http(app).post("/gradio_api/upload", content=body(int(1.5 * MB)), headers=headers).status_code == 200
    # Without a Content-Length an upload is admitted as the largest file (2 MB here): 1.5 MB + 2 MB > 3 MB.
    assert http(app).post("/gradio_api/upload", content=body(MB // 4), headers=headers).status_code == 429
    assert upload(app, MB).status_code == 200  # a declared 1 MB still fits: 1.5 MB was counted, not 2
    # A file over the size limit is still refused by Gradio as it arrives (and what it sent is counted).
    assert upload(app, 3 * MB, address="203.0.113.9").status_code == 413


def test_the_owners_key_and_a_page_that_is_not_public_are_not_counted(blocks):
    app = client(blocks, visitor=1 * MB)
    for _ in range(3):
        assert upload(app, MB, headers={"Authorization": f"Bearer {KEY}"}).status_code == 200
    assert upload(app, int(0.6 * MB)).status_code == 200
    assert upload(app, int(0.6 * MB)).status_code == 429
    for _ in range(3):
        assert upload(client(blocks, public=False), MB).status_code == 200
    assert uploads.upload_budget(Access(KEY, public_page=False), MB) == []
    assert uploads.upload_budget(Access(None, public_page=True), MB) == []
    assert [m.cls for m in uploads.upload_budget(Access(KEY, public_page=True), MB)] == [uploads.UploadBudget]


def test_uploads_sent_at_once_cannot_all_pass_one_check():
    """Each upload's size is reserved as it is admitted: of two sent together that fit only one at a time, the
    second is refused while the first is still arriving; its reservation becomes what it sent."""
    import asyncio

    clock = Clock()
    arriving = asyncio.Event

    async def run():
        release, statuses = arriving(), []

        async def gradio(scope, receive, send):  # Gradio's route: reads the body, then waits, then answers
            while (await receive()).get("more_body"):
                pass
            await release.wait()
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"[]"})

        budget = uploads.UploadBudget(gradio, access=Access(KEY, public_page=True), max_file_size=2 * MB,
                                      visitor_bytes=3 * MB, clock=clock)

        async def post(size):
            scope = {"type": "http", "method": "POST", "path": uploads.UPLOAD_PATH, "client": ("203.0.113.7", 1),
                     "headers": [(b"content-length", str(size).encode())]}

            async def receive():
                return {"type": "http.request", "body": b"\0" * (size // 2), "more_body": False}

            async def send(message):
                if message["type"] == "http.response.start":
                    statuses.append(message["status"])
            await budget(scope, receive, send)

        first = asyncio.create_task(post(2 * MB))
        await asyncio.sleep(0.01)
        await post(2 * MB)  # refused at once: 2 MB is reserved for the first
        release.set()
        await first
        assert statuses == [429, 200]
        assert budget.total == MB and [n for _, n, _ in budget.sent["203.0.113.7"]] == [MB]  # what it sent
        await post(2 * MB)  # 1 MB sent + 2 MB fits in 3 MB now
        assert statuses[-1] == 200

    asyncio.run(run())


def test_a_minutes_uploads_are_one_entry_and_what_left_the_window_is_forgotten():
    clock = Clock()
    budget = uploads.UploadBudget(None, access=Access(KEY, public_page=True), max_file_size=MB, clock=clock)
    for _ in range(1000):
        budget._charge("a", 10, clock.now)
        clock.now += 0.05
    assert len(budget.sent["a"]) == 1 and len(budget.everyone) == 1 and budget.total == 10_000
    clock.now += uploads.BUCKET_S
    budget._charge("a", 10, clock.now)
    assert len(budget.sent["a"]) == 2
    budget._forget(clock.now + uploads.WINDOW_S - uploads.BUCKET_S + 1)  # the first minute left the window
    assert [n for _, n, _ in budget.sent["a"]] == [10] and budget.total == 10


def test_a_file_input_given_as_an_address_is_refused_with_a_sentence_not_fetched(blocks, monkeypatch):
    """Gradio would fetch it into its cache, of any size (the whole body in memory first): the studio fetches
    nothing from addresses, for anyone (app.py installs this at start)."""
    import asyncio

    from gradio import processing_utils

    fetched = []

    async def fetch(url, cache_dir):  # what Gradio would do: a download, here only noted
        fetched.append(url)
        return "/tmp/never"

    monkeypatch.setattr(processing_utils, "async_ssrf_protected_download", fetch)
    audio = gr.Audio(type="filepath")
    payload = {"path": "https://example.com/huge.wav", "meta": {"_type": "gradio.FileData"}}
    asyncio.run(processing_utils.async_move_files_to_cache(payload, audio, check_in_upload_folder=True))
    assert fetched == ["https://example.com/huge.wav"]  # Gradio's own behaviour, without the refusal

    uploads.refuse_url_files()  # undone by monkeypatch at the end: it set the attribute first
    with pytest.raises(gr.Error) as refused:
        asyncio.run(processing_utils.async_move_files_to_cache(payload, audio, check_in_upload_folder=True))
    assert refused.value.message.startswith("This studio does not fetch files from addresses (https://example.com/")
    assert fetched == ["https://example.com/huge.wav"]
