"""What a public page's visitors may upload, over time: Gradio refuses one file over the size limit as it
arrives (`max_file_size`), and keeps every upload in its cache until `delete_cache` drops it (files older
than an hour, checked hourly: up to two hours on disk). Without a budget over time, a visitor posting one
10 MB clip after another to `/gradio_api/upload` fills the server's disk within that window.

So, on a public page, uploads by anyone but the owner (who carries the key) are counted in a sliding window
as long as a file can stay on disk (`WINDOW_S`): each visitor (known by address, studio/api/access.py
`client_address`) may send `VISITOR_BYTES` in it, and all visitors together `VISITORS_BYTES`. An upload
that would pass either is refused before its body is read (429, with Retry-After: when enough of what was
counted leaves the window), and the page shows the sentence. An upload's largest size is reserved as it is
admitted (uploads sent at once cannot all pass one check) and set to what it really sent when it ends: its
body's bytes as they pass, whatever its Content-Length said; one without a length is reserved as the
largest file the server takes. Memory and event-loop time: a visitor's uploads within a minute are one
entry, so at most 120 entries each, and MAX_VISITORS visitors. The owner's uploads (bundles, books) are not
counted here: the owner's disk is the owner's."""

from __future__ import annotations

import collections
import math
import time

from studio.api.access import Access, client_address

UPLOAD_PATH = "/gradio_api/upload"
WINDOW_S = 2 * 3600  # delete_cache=(3600, 3600) (studio/views/page.py): a file lives up to two hours
VISITOR_BYTES = 100 << 20  # ten of a public page's largest clips, per visitor per window (--public-upload-mb)
VISITORS_BYTES = 2 << 30   # every visitor together, per window
MAX_VISITORS = 4096        # visitors remembered in the window; past it the least recent are forgotten first
BUCKET_S = 60              # a visitor's uploads within a minute are one entry: at most 120 entries each

TOO_MUCH = ("You have uploaded {used} MB in the last two hours, the most this page takes from one visitor; "
            "try again in {wait} minutes.")
FULL = "This page has taken all the uploads it can keep for now; try again in {wait} minutes."


class UploadBudget:
    """ASGI middleware: visitors' uploads to Gradio's upload route within their budgets (module docstring).
    `max_file_size` is the largest file Gradio takes (an upload without a Content-Length counts as that);
    `clock` is for the tests."""

    def __init__(self, app, *, access: Access, max_file_size: int, visitor_bytes: int = VISITOR_BYTES,
                 visitors_bytes: int = VISITORS_BYTES, window_s: float = WINDOW_S, clock=time.monotonic):
        self.app, self.access, self.max_file_size = app, access, max_file_size
        self.visitor_bytes, self.visitors_bytes, self.window_s, self.clock = (visitor_bytes, visitors_bytes,
                                                                             window_s, clock)
        # The books: [time, bytes, in the window] per minute, for each visitor and for everyone (what is on
        # disk, whoever sent it: a visitor forgotten past MAX_VISITORS still counts there).
        self.sent: collections.OrderedDict[str, collections.deque] = collections.OrderedDict()
        self.everyone: collections.deque = collections.deque()
        self.total = 0  # the bytes in `everyone`

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope.get("method") != "POST" or not scope["path"].endswith(UPLOAD_PATH):
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope.get("headers", ())}
        if not (self.access.api_key and self.access.public_page) or self.access.bearer_ok(
                headers.get("authorization")):
            return await self.app(scope, receive, send)
        who = client_address(headers, (scope.get("client") or (None,))[0]) or "unknown"
        try:
            announced = int(headers.get("content-length", ""))
        except ValueError:
            announced = self.max_file_size
        now = self.clock()
        self._forget(now)
        # Reserved now, so uploads sent at once cannot all pass the same check; set to what was sent at the end.
        reserved = min(announced, self.max_file_size)
        refusal = self._refusal(who, reserved, now)
        if refusal is not None:
            return await _refuse(send, *refusal)
        buckets = self._charge(who, reserved, now)
        counted = 0

        async def counting():
            nonlocal counted
            message = await receive()
            if message["type"] == "http.request":
                counted += len(message.get("body", b""))
            return message

        try:
            await self.app(scope, counting, send)
        finally:
            for bucket in buckets:
                if bucket[2]:  # still in the window
                    bucket[1] += counted - reserved
            if buckets[1][2]:
                self.total += counted - reserved

    def _refusal(self, who: str, size: int, now: float) -> tuple[str, int] | None:
        """(the sentence, seconds to wait) when `size` more bytes from `who` would pass a budget, else None."""
        mine = self.sent.get(who, ())
        used = sum(n for _, n, _ in mine)
        if used + size > self.visitor_bytes:
            wait = _wait(mine, used + size - self.visitor_bytes, now, self.window_s)
            return TOO_MUCH.format(used=math.ceil(used / 2**20), wait=math.ceil(wait / 60)), wait
        if self.total + size > self.visitors_bytes:
            wait = _wait(self.everyone, self.total + size - self.visitors_bytes, now, self.window_s)
            return FULL.format(wait=math.ceil(wait / 60)), wait
        return None

    def _charge(self, who: str, size: int, now: float) -> tuple[list, list]:
        """`size` bytes into `who`'s book and everyone's; the two buckets they went to."""
        buckets = []
        for book in (self.sent.setdefault(who, collections.deque()), self.everyone):
            if book and now - book[-1][0] < BUCKET_S:  # leaves with the minute's first: at most a minute early
                book[-1][1] += size
            else:
                book.append([now, size, True])
            buckets.append(book[-1])
        self.sent.move_to_end(who)
        self.total += size
        while len(self.sent) > MAX_VISITORS:
            self.sent.popitem(last=False)
        return buckets[0], buckets[1]

    def _forget(self, now: float) -> None:
        """Drop what left the window."""
        for book in (*self.sent.values(), self.everyone):
            while book and book[0][0] <= now - self.window_s:
                bucket = book.popleft()
                bucket[2] = False
                if book is self.everyone:
                    self.total -= bucket[1]
        for who in [who for who, book in self.sent.items() if not book]:
            del self.sent[who]


def _wait(book, excess: int, now: float, window_s: float) -> int:
    """Seconds until enough of `book` ([time, bytes, …], oldest first) leaves the window to free `excess` bytes."""
    freed = 0
    for t, n, _ in book:
        freed += n
        if freed >= excess:
            return max(1, math.ceil(t + window_s - now))
    return math.ceil(window_s)


async def _refuse(send, sentence: str, wait: int) -> None:
    # Plain text, as Gradio's own refusal of an upload (413) is: the page shows it as the upload's error.
    body = sentence.encode()
    await send({"type": "http.response.start", "status": 429,
                "headers": [(b"content-type", b"text/plain; charset=utf-8"), (b"retry-after", str(wait).encode()),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


NO_URLS = ("This studio does not fetch files from addresses ({url}); send the file itself (gradio_client: "
           "handle_file() of a local path uploads it).")


def refuse_url_files() -> None:
    """Gradio fetches a file input given as an http(s) address (a `FileData` whose path is a URL, which any
    caller of the queue can send) into its cache: protected against private addresses, but with no size
    limit and past every upload budget above (the whole body is read into memory, then written). The studio
    needs no file from an address, so it refuses them all with a sentence (a `gr.Error`, which the caller
    sees). Gradio looks the function up on its module at each call (gradio/blocks.py
    `async_move_resource_to_block_cache`), so replacing it there is enough; call once at start."""
    import gradio as gr
    from gradio import processing_utils

    async def refuse(url: str, cache_dir: str) -> str:
        raise gr.Error(NO_URLS.format(url=url[:80]))

    processing_utils.async_ssrf_protected_download = refuse


def upload_budget(access: Access, max_file_size: int, visitor_bytes: int = VISITOR_BYTES) -> list:
    """The middleware for `Blocks.launch(app_kwargs={"middleware": ...})`: an `UploadBudget` on a public page,
    else none (without one, everyone who can reach the upload route is the owner)."""
    from starlette.middleware import Middleware

    if not (access.api_key and access.public_page):
        return []
    return [Middleware(UploadBudget, access=access, max_file_size=max_file_size, visitor_bytes=visitor_bytes)]


__all__ = ["UPLOAD_PATH", "VISITORS_BYTES", "VISITOR_BYTES", "WINDOW_S", "UploadBudget", "refuse_url_files",
           "upload_budget"]
