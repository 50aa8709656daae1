"""Why a take failed, said once for every door: `Failure.of(exc)` sorts any exception into one of four kinds,
each with the sentence the person is told and the HTTP status that goes with it. Each door renders it in its
own form (an HTTP JSON error, a WebSocket event, an MCP tool error, a Gradio toast, a Wyoming `error`).

    user      the request itself: empty text, an unknown voice, a limit passed (400; 404 for a voice)
    busy      the line is full, the caller's share is used, the studio is shutting down (503)
    remote    the --remote server refused or failed (its own answer; 400 when it refused the content)
    internal  a bug or a fault: the person hears that it failed and that the log has why; only the log gets
              the exception
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from engine.wire import RemoteError
from studio.takes.gpu_queue import ServiceBusy, ServiceClosed, TooManyTakes
from studio.takes.order import OrderError
from studio.voices import VoiceNotFound

log = logging.getLogger("higgs.studio")

INTERNAL = ("The take failed inside the studio; the details are in its log. Try again, and report it if it keeps "
            "happening.")


@dataclass(frozen=True)
class Failure:
    kind: str  # "user" | "busy" | "remote" | "internal"
    message: str
    status: int  # the HTTP status a door that speaks HTTP answers with
    code: str | None = None  # a stable machine name where the kind has one ("voice_not_found", …)

    @property
    def retry(self) -> bool:
        """Trying again later may succeed (the studio was busy, or the remote server was)."""
        return self.kind == "busy" or self.status == 503

    @classmethod
    def of(cls, exc: BaseException, what: str = "take") -> Failure:
        """The failure `exc` stands for. An internal one is logged here, with `what` naming the request."""
        if isinstance(exc, VoiceNotFound):
            return cls("user", str(exc), 404, "voice_not_found")
        if isinstance(exc, TooManyTakes):
            return cls("busy", str(exc), 503, "too_many_takes")
        if isinstance(exc, (ServiceBusy, ServiceClosed)):
            return cls("busy", str(exc), 503, "busy")
        if isinstance(exc, RemoteError):
            return cls("user" if exc.client_status == 400 else "remote", str(exc), exc.client_status, "remote")
        if isinstance(exc, OrderError):
            return cls("user", str(exc), 400, exc.code)
        if isinstance(exc, ValueError) and not isinstance(exc, UnicodeError):  # a codec's error is not a sentence
            return cls("user", str(exc), 400)
        log.error("%s failed", what, exc_info=exc)
        return cls("internal", INTERNAL, 500, "internal_error")


__all__ = ["INTERNAL", "Failure"]
