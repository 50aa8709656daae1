"""Bundles a visitor downloads, on the server's disk briefly and within a budget.

An export is written once, into Gradio's cache folder: that is where Gradio serves a component's files from,
and a path already inside it is handed out as it is, not copied. Each page keeps its latest export only; one
visitor's exports (every page from one address) stay within `VISITOR_EXPORT_BYTES`, their oldest removed to
make room; everyone's together within `EXPORTS_TOTAL_BYTES`, beyond which an export is refused until older
ones expire. An export is removed `FETCHED_GRACE_S` after its page downloads it (`gr.File`'s download event,
sent as the browser starts the download, so the download gets a head start), `EXPORT_TTL_S` after it is
written, or when its page closes, whichever comes first (Gradio's own `delete_cache` would keep it an hour).

    shelf = ExportShelf(gradio.utils.get_upload_folder())
    path = shelf.put(visitor, page, "my-voices.zip", data)   # ValueError when everyone's budget is spent
    shelf.fetched(page)                                       # the page downloaded it
    shelf.drop_page(page)                                     # the page closed
"""

from __future__ import annotations

import os
import secrets
import shutil
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path

from studio.files.archive import MB, size
from studio.voices.bundles import MAX_VOICE_INFLATED
from studio.voices.private import MAX_PRIVATE_VOICES

EXPORT_TTL_S = 600  # an export lives 10 minutes: time to click its link, not to pile up
FETCHED_GRACE_S = 60  # after its download starts: an open file is read to its end even once it is removed
# One visitor's exports on disk at once: a bundle of every voice a browser keeps (12 voices of 30 s) fits.
VISITOR_EXPORT_BYTES = MAX_PRIVATE_VOICES * MAX_VOICE_INFLATED
EXPORTS_TOTAL_BYTES = 256 * MB  # every visitor's exports together
EXPORT_DIR_PREFIX = "export-"  # one folder per export in the cache, so the file keeps its plain name


@dataclass(frozen=True)
class _Export:
    path: Path
    visitor: str
    page: str
    size: int
    expires: float  # time.monotonic()


class ExportShelf:
    """The exports on disk now, by visitor and page; a daemon thread removes each when its time is up.
    Thread-safe."""

    def __init__(self, root: str | os.PathLike, *, ttl_s: float = EXPORT_TTL_S,
                 visitor_bytes: int = VISITOR_EXPORT_BYTES, total_bytes: int = EXPORTS_TOTAL_BYTES):
        self.root = Path(root)
        self.ttl_s, self.visitor_bytes, self.total_bytes = ttl_s, visitor_bytes, total_bytes
        self._items: list[_Export] = []  # oldest first
        self._wake = threading.Condition()
        self._sweeper: threading.Thread | None = None

    def put(self, visitor: str, page: str, name: str, data: bytes) -> str:
        """Write `data` as `name` for `visitor`'s `page`; the path Gradio serves it from. Raises ValueError when
        it is larger than one visitor's budget, or when everyone's exports leave no room for it."""
        if len(data) > self.visitor_bytes:
            raise ValueError(f"This export is {size(len(data))}; the limit for one visitor's exports is "
                             f"{size(self.visitor_bytes)}. Export fewer voices at a time.")
        with self._wake:
            for item in [i for i in self._items if i.page == page]:  # the page's earlier export: replaced
                self._remove(item)
            mine = [i for i in self._items if i.visitor == visitor]
            while mine and sum(i.size for i in mine) + len(data) > self.visitor_bytes:
                self._remove(mine.pop(0))
            if sum(i.size for i in self._items) + len(data) > self.total_bytes:
                minutes = max(1, round(self.ttl_s / 60))
                raise ValueError(f"The studio is holding {size(self.total_bytes)} of other visitors' exports, "
                                 f"its limit; try again in a few minutes (an export is kept {minutes} minutes).")
            folder = self.root / f"{EXPORT_DIR_PREFIX}{secrets.token_hex(16)}"
            path = folder / name
            try:
                folder.mkdir(parents=True)
                path.write_bytes(data)
            except OSError:
                shutil.rmtree(folder, ignore_errors=True)
                raise ValueError("The studio could not write your export (its disk may be full); try again "
                                 "later.") from None
            self._items.append(_Export(path, visitor, page, len(data), time.monotonic() + self.ttl_s))
            if self._sweeper is None:
                self._sweeper = threading.Thread(target=self._sweep, name="export-sweeper", daemon=True)
                self._sweeper.start()
            self._wake.notify()
        return str(path)

    def fetched(self, page: str, grace_s: float = FETCHED_GRACE_S) -> None:
        """`page` started downloading its export: it goes `grace_s` from now, unless it was due sooner."""
        with self._wake:
            due = time.monotonic() + grace_s
            self._items = [replace(i, expires=min(i.expires, due)) if i.page == page else i for i in self._items]
            self._wake.notify()

    def drop_page(self, page: str) -> None:
        """Remove what `page` exported (it closed: nobody is left to download it)."""
        with self._wake:
            for item in [i for i in self._items if i.page == page]:
                self._remove(item)

    def held_bytes(self, visitor: str | None = None) -> int:
        """Bytes on disk now, for `visitor` or everyone."""
        with self._wake:
            return sum(i.size for i in self._items if visitor in (None, i.visitor))

    def _remove(self, item: _Export) -> None:
        self._items.remove(item)
        shutil.rmtree(item.path.parent, ignore_errors=True)  # Gradio's delete_cache may have been first

    def _sweep(self) -> None:
        with self._wake:
            while True:
                now = time.monotonic()
                for item in [i for i in self._items if i.expires <= now]:
                    self._remove(item)
                due = min((i.expires for i in self._items), default=None)
                self._wake.wait(None if due is None else due - now)
