"""Wyoming events read with their sizes checked before anything is read. The `wyoming` package's own reader
(`wyoming.event.async_read_event`) reads whatever `data_length` and `payload_length` a header declares: a
header claiming 2 GB made the server buffer all that was sent after it. This reader frames an event exactly
as the package does (one JSON header line; then `data_length` bytes of JSON, merged into the header's `data`;
then `payload_length` bytes of payload) and refuses, with a sentence, a header line, data or payload over its
cap, or a header that is not one.

    event = await read_event(reader, wait_s=60)   # None at the end of the stream
    # BadEvent (a ValueError): refused, the connection cannot go on; TimeoutError: no header began in wait_s
"""

from __future__ import annotations

import asyncio
import json

from wyoming.event import Event

MAX_HEADER_BYTES = 64 * 1024  # one header line: asyncio's own stream limit, which the package's servers keep
MAX_DATA_BYTES = 1024 * 1024  # an event's JSON data: a `synthesize` of the longest text (100,000 characters) fits
MAX_PAYLOAD_BYTES = 1024 * 1024  # an event's binary payload: a TTS server is sent none; an audio chunk is a few KB


class BadEvent(ValueError):
    """An event this server will not read; the message says why. The connection cannot go on after it (what
    follows is not known to start a header)."""


async def read_event(reader: asyncio.StreamReader, *, wait_s: float | None = None) -> Event | None:
    """The next event, or None when the stream ends (also in the middle of an event, as the package's own
    reader does). `wait_s` bounds the wait for a header (TimeoutError, nothing read) and for the rest of an
    event once its header has come (BadEvent)."""
    try:
        line = await asyncio.wait_for(reader.readuntil(b"\n"), wait_s)  # cancelled, it leaves the buffer as it was
    except asyncio.IncompleteReadError as exc:
        line = exc.partial  # a last line without its newline, as `readline` gives it to the package
    except asyncio.LimitOverrunError:
        raise BadEvent(f"An event's header line is over {MAX_HEADER_BYTES:,} bytes, the limit for one; it was "
                       "not read.") from None
    if not line.strip():
        return None
    if len(line) > MAX_HEADER_BYTES:
        raise BadEvent(f"An event's header line is {len(line):,} bytes; the limit is {MAX_HEADER_BYTES:,}.")
    header = _json(line, "header")
    if not isinstance(header, dict) or not isinstance(header.get("type"), str) or \
            not isinstance(header.get("data", {}), dict):
        raise BadEvent("An event's header must be a JSON object with a `type` (and any `data` an object), as the "
                       "Wyoming protocol writes it.")
    data_length = _length(header, "data_length", MAX_DATA_BYTES, "data")
    payload_length = _length(header, "payload_length", MAX_PAYLOAD_BYTES, "payload")
    data = header.get("data", {})
    if data_length:
        raw = await _exactly(reader, data_length, wait_s, "data")
        if raw is None:
            return None
        extra = _json(raw, "data")
        if not isinstance(extra, dict):
            raise BadEvent("An event's data must be a JSON object.")
        data.update(extra)
    payload = None
    if payload_length:
        payload = await _exactly(reader, payload_length, wait_s, "payload")
        if payload is None:
            return None
    return Event(type=header["type"], data=data, payload=payload)


def _length(header: dict, key: str, cap: int, what: str) -> int:
    """A declared length, checked before anything is read (0 when absent, as the package reads it)."""
    value = header.get(key)
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadEvent(f"An event's `{key}` must be a whole number of bytes; got {json.dumps(value)[:40]}.")
    if value > cap:
        raise BadEvent(f"An event declares {value:,} bytes of {what}; the limit for an event's {what} is "
                       f"{cap:,} bytes, so it was not read.")
    return max(value, 0)


async def _exactly(reader: asyncio.StreamReader, n: int, wait_s: float | None, what: str) -> bytes | None:
    try:
        return await asyncio.wait_for(reader.readexactly(n), wait_s)
    except asyncio.IncompleteReadError:
        return None
    except asyncio.TimeoutError:
        raise BadEvent(f"An event's {what} ({n:,} bytes) did not all come within {wait_s:g} s.") from None


def _json(raw: bytes, what: str):
    try:
        return json.loads(raw)
    except RecursionError:
        raise BadEvent(f"An event's {what} is JSON nested too deeply to read.") from None
    except ValueError:  # not JSON, or not UTF-8
        raise BadEvent(f"An event's {what} is not JSON; a Wyoming event starts with one JSON line.") from None


__all__ = ["MAX_DATA_BYTES", "MAX_HEADER_BYTES", "MAX_PAYLOAD_BYTES", "BadEvent", "read_event"]
