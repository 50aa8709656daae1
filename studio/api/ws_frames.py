"""The speech WebSocket's frames: a client's message read as one JSON object (a person's sentence for anything
else, JSON nested too deep included), events sent as compact JSON, and the close codes (studio/api/stream.py)."""

from __future__ import annotations

import json

from starlette.websockets import WebSocket, WebSocketDisconnect

POLICY_VIOLATION = 1008  # WebSocket close code: not allowed (no key)
GOING_AWAY = 1001  # close code of a stream closed for being idle
TRY_AGAIN_LATER = 1013  # close code of a stream past the open-stream limits
MAX_MESSAGE_CHARS = 1_000_000  # one message, read on the event loop: longer text comes in several messages


async def receive_json(ws: WebSocket) -> dict | None:
    """The next message as a JSON object; None (after telling the client) for anything else."""
    message = await ws.receive()
    if message["type"] == "websocket.disconnect":
        raise WebSocketDisconnect(message.get("code", 1000))
    text = message.get("text")
    if text is None:
        await send_error(ws, "Send JSON text messages; binary frames are for the audio coming back.", "bad_message")
        return None
    if len(text) > MAX_MESSAGE_CHARS:
        await send_error(ws, f"The message is {len(text):,} characters; the limit for one message is "
                             f"{MAX_MESSAGE_CHARS:,}. Send long text in several `text` messages.", "bad_message")
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        await send_error(ws, f"The message is not JSON ({exc.msg} at position {exc.pos}).", "bad_message")
        return None
    except RecursionError:
        await send_error(ws, "The message is JSON nested too deeply to read; send a flat object such as "
                             "{\"text\": \"Hello.\"}.", "bad_message")
        return None
    if not isinstance(value, dict):
        await send_error(ws, "Send a JSON object, e.g. {\"text\": \"Hello.\"}.", "bad_message")
        return None
    return value


async def send_event(ws: WebSocket, event: dict) -> None:
    await ws.send_text(json.dumps(event, separators=(",", ":")))


async def send_error(ws: WebSocket, message: str, code: str) -> None:
    await send_event(ws, {"type": "error", "message": message, "code": code})


async def close_idle(ws: WebSocket, idle_s: float) -> None:
    await send_error(ws, f"Nothing was sent for {idle_s:g} s, so the stream is closed; open a new one to say more.",
                     "idle_timeout")
    await ws.close(GOING_AWAY, f"Idle for {idle_s:g} s; open a new stream to say more.")


__all__ = ["GOING_AWAY", "MAX_MESSAGE_CHARS", "POLICY_VIOLATION", "TRY_AGAIN_LATER", "close_idle", "receive_json",
           "send_error", "send_event"]
