"""Every limit on a take, in one place: built once from the flags, read by `prepare` for every door.

    limits = TakeLimits(max_input_chars=args.max_input_chars, public_max_chars=args.public_max_chars,
                    public_max_frames=args.public_max_seconds * FRAME_RATE)
    limits.check_text(text, caller)            # ValueError with a sentence past the caller's limit
    params = limits.hold(params, text, caller)  # a visitor's length capped to the public page's

The owner's text may be up to `max_input_chars` (a text longer than one prompt holds is planned as a long
take: studio/takes/prepare.py); a visitor of a public page speaks up to `public_max_chars` at a time, in takes
of up to `public_max_frames`.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.config import FRAME_RATE
from engine.delay import default_max_frames
from engine.types import PUBLIC_MAX_FRAMES, SamplingParams

MAX_INPUT_CHARS = 100_000  # --max-input-chars: a long chapter, ~110 minutes of speech, in one long take
MAX_TEXT_CHARS = 4096  # text a tool (pronunciation preview, the dictionary's `apply`) reads at once
PUBLIC_MAX_TEXT_CHARS = 1000  # --public-max-chars: a visitor's text at once
MAX_TAKES = 4  # takes of one text made side by side (the page's "Takes")
MAX_QUEUE = 64  # --queue-size: takes waiting for the GPU in the studio's line (and in Gradio's queue)
VISITOR_RUNNING = 2  # a visitor's takes running at once
VISITOR_WAITING = 4  # a visitor's takes waiting at once
QUEUE_TIMEOUT_S = 600.0  # how long a take waits for its turn before it is refused as busy
HISTORY_TAKES = 50  # takes the history keeps (the page's history, "Use settings", recipes)
HISTORY_SECONDS = 30 * 60  # audio the history keeps in all, beyond the newest take (oldest dropped first)


@dataclass(frozen=True)
class TakeLimits:
    """The studio's limits on what one take may ask, by caller: a visitor of a public page (`caller.public`) has
    the public page's; everyone else (the owner, a Wyoming client on the LAN) the studio's."""

    max_input_chars: int = MAX_INPUT_CHARS
    public_max_chars: int = PUBLIC_MAX_TEXT_CHARS
    public_max_frames: int = PUBLIC_MAX_FRAMES
    max_takes: int = MAX_TAKES
    max_queue: int = MAX_QUEUE

    def __post_init__(self):
        if min(self.max_input_chars, self.public_max_chars, self.public_max_frames, self.max_queue) < 1:
            raise ValueError("Every limit must be at least 1.")

    def max_chars(self, caller) -> int:
        return self.public_max_chars if caller.public else self.max_input_chars

    def check_text(self, text: str, caller) -> None:
        """The caller's limit on the characters sent (before SSML, `clean` or the dictionary touch them)."""
        most = self.max_chars(caller)
        if len(text) <= most:
            return
        if not caller.public:
            raise ValueError(f"Text is {len(text)} characters; the limit for one take is {most} (the studio's "
                             "--max-input-chars). Split it.")
        raise ValueError(f"The public page speaks up to {most} characters at a time (this text has {len(text)}). "
                         "Split it.")

    def hold(self, params: SamplingParams, text: str, caller) -> SamplingParams:
        """A visitor's settings held to the public page's take length (an automatic length is capped too);
        anyone else's as they are. ValueError past the limit."""
        if not caller.public:
            return params
        most = self.public_max_frames
        if params.max_frames is not None and params.max_frames > most:
            raise ValueError(f"The public page makes takes of up to {most} frames ({most // FRAME_RATE} s). Lower "
                             "the max length.")
        return SamplingParams.of(params, max_frames=min(params.max_frames or default_max_frames(text), most))


__all__ = ["HISTORY_SECONDS", "HISTORY_TAKES", "TakeLimits", "MAX_INPUT_CHARS", "MAX_QUEUE", "MAX_TAKES",
           "MAX_TEXT_CHARS", "PUBLIC_MAX_TEXT_CHARS", "QUEUE_TIMEOUT_S", "VISITOR_RUNNING", "VISITOR_WAITING"]
