"""One take driven for one HTTP request: pulled from the service in a worker thread, held to the request
timeout, and stopped however the request ends.

The client is watched from the first chunk until the take is closed, on the request's own ASGI channel (the
server says `http.disconnect` there when the connection drops). A take answered whole (`stream: false`,
flac, a loudness target, timestamps) sends nothing while it is made, so this watch is the only thing that
notices a client that has gone: without it such a take ran on to its end, up to the request timeout.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

import anyio
import numpy as np
from fastapi import Request
from fastapi.responses import StreamingResponse

from studio.api.model import ApiError, api_error
from studio.takes.take import TakeHandle

# nginx's "client closed request": the answer to a request whose client has gone, never delivered.
CLIENT_CLOSED = 499


class TakeRun:
    """One take driven from async code: pulls `handle.stream()` in a worker thread (through `routes.in_thread`),
    enforces the request timeout, and cancels the take (which frees its place on the line) however it ends:
    finished, failed, timed out, or its client gone at any point."""

    _END = object()

    def __init__(self, routes, handle: TakeHandle, request: Request, *, timeout: float):
        self.routes, self.handle, self.request, self.timeout = routes, handle, request, timeout
        self.timed_out = False
        self.gone = False  # the client closed the connection
        self._gen: Iterator | None = None
        self._watch: asyncio.Task | None = None
        self._timer = threading.Timer(timeout, self._time_out)
        self._timer.daemon = True

    def _time_out(self) -> None:
        self.timed_out = True
        self.handle.cancel.set()

    async def _watch_client(self) -> None:
        # The body has been read, so what the channel says next is the end of the connection (as Starlette's
        # StreamingResponse listens for it).
        while (await self.request.receive())["type"] != "http.disconnect":
            pass
        self.gone = True
        self.handle.cancel.set()

    def _next(self):
        if self._gen is None:
            self._gen = self.handle.stream()
        return next(self._gen, self._END)

    async def _pull(self):
        try:
            item = await self.routes.in_thread(self._next)
        except Exception as exc:
            raise api_error(exc, "the take") from None
        if self.gone:
            raise ApiError(CLIENT_CLOSED, "The client closed the connection; the take was stopped.")
        if self.timed_out:
            raise ApiError(504, f"The request took longer than {self.timeout:g} s (queue wait and generation) and "
                                f"was stopped.")
        return None if item is self._END else item

    async def first(self):
        """The first chunk; from here on the client is watched (a queued take then leaves the queue)."""
        self._timer.start()
        self._watch = asyncio.ensure_future(self._watch_client())
        try:
            chunk = await self._pull()
        except BaseException:
            await self.close()
            raise
        if chunk is None:
            await self.close()
            raise ApiError(500, "The generation ended without producing audio.")
        return chunk

    async def chunks(self, first) -> AsyncIterator[Any]:
        """`first` and every chunk after it; always closes the generation."""
        try:
            chunk = first
            while chunk is not None:
                yield chunk
                if chunk.final:
                    break
                chunk = await self._pull()
        finally:
            with anyio.CancelScope(shield=True):
                await self.close()

    async def collect(self, first) -> tuple[np.ndarray, Any]:
        pieces, last = [], None
        async for chunk in self.chunks(first):
            last = chunk
            if len(chunk.audio):
                pieces.append(np.asarray(chunk.audio, dtype=np.float32))
        return (np.concatenate(pieces) if pieces else np.zeros(0, np.float32)), last

    async def close(self) -> None:
        self._timer.cancel()
        if self._watch is not None:
            self._watch.cancel()
        gen, self._gen = self._gen, None
        if gen is not None:
            self.handle.cancel.set()
            await self.routes.in_thread(gen.close)


class TakeResponse(StreamingResponse):
    """A streamed take that is cancelled however sending ends. The body's own `finally` stops the take
    once the body has started; this also covers a failure before it starts (the server refusing a header,
    the client gone before the first byte), which would otherwise leave the take running on the GPU."""

    def __init__(self, run: TakeRun, content, **kwargs):
        super().__init__(content, **kwargs)
        self.run = run

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            with anyio.CancelScope(shield=True):
                await self.run.close()
