"""Text that arrives in pieces (an LLM's reply as it is written) → the sentences to speak, as soon as each is
complete. Shared by the Wyoming server's streaming events (studio/api/wyoming.py) and the speech WebSocket
(studio/api/stream.py).

    feed = SentenceFeed(style="<|emotion:elation|>")
    feed.add("Dr. Smith paid 3.")    # [] : "3." may go on "5", "Dr." on "Smith"
    feed.add("5 dollars. He")        # ["Dr. Smith paid 3.5 dollars."]: complete, the next one has begun
    feed.flush()                     # ["He"]: speak what is buffered now
    feed.end()                       # the text has ended
    feed.next_segment(cancel)        # on the take's thread: the next Segment (blocks), or None at the end
"""

from __future__ import annotations

import dataclasses
import queue
import threading

from engine.longform import SENTENCE_PAUSE, Segment, plan, split_sentences
from engine.normalize import AUTO
from studio.takes.limits import MAX_INPUT_CHARS

_END = object()
POLL_S = 0.05  # how often a take waiting for text looks at its cancel event
# An unfinished sentence longer than this (~67 s of speech at 15 characters a second) is given out at its last
# space; it bounds what each piece re-reads.
MAX_SENTENCE_CHARS = 1_000


class SentenceBuffer:
    """Text arriving in pieces → the sentences completed so far, by the long form's rules
    (`engine.longform.split_sentences`). A sentence counts as complete once text of the next one follows it,
    so "Dr." or "3." at the end of a piece never cuts (the next piece may go on "Smith" or "5").

    Only the unfinished sentence is kept and re-read when a piece comes, so a piece costs time in its own
    length and that sentence's, never in the text so far (re-reading it all made 7,475 four-character pieces
    cost 112 million characters). A sentence still unfinished past MAX_SENTENCE_CHARS is given out at its
    last space: that bounds what one piece re-reads, and the planner cuts such a sentence at clauses anyway."""

    def __init__(self, limit: int = MAX_INPUT_CHARS):
        self.text, self.limit, self.total = "", limit, 0  # text: the unfinished sentence, as it came

    def add(self, piece: str) -> list[str]:
        if self.total + len(piece) > self.limit:
            raise ValueError(f"The streamed text passed {self.limit} characters; end the stream and start a "
                             "new one.")
        self.total += len(piece)
        self.text += piece
        done = split_sentences(self.text)[:-1]
        if done:
            self.text = self.text[_end_of(self.text, done):]
        if len(self.text) > MAX_SENTENCE_CHARS:
            done += self._cut()
        return done

    def finish(self) -> list[str]:
        return split_sentences(self.text) if self.text.strip() else []

    def flush(self) -> list[str]:
        """Every sentence not yet given out, the unfinished one included; the buffer starts afresh (the
        characters already streamed still count towards the limit)."""
        sentences = self.finish()
        self.text = ""
        return sentences

    def _cut(self) -> list[str]:
        """The over-long unfinished sentence up to its last space (all of it when it has none), as sentences;
        its last word stays, for the next piece to complete."""
        body = self.text.rstrip()
        at = max(body.rfind(" "), body.rfind("\n"))
        cut, self.text = (body[:at], self.text[at:]) if at > 0 else (body, "")
        return split_sentences(cut)


def _end_of(text: str, sentences: list[str]) -> int:
    """Where in `text` its first `sentences` end. The splitter strips spaces and moves tags to the next
    sentence but never reorders what it keeps, so their non-space characters are the first ones of `text`."""
    left = sum(len(s) - sum(c.isspace() for c in s) for s in sentences)
    for at, c in enumerate(text):
        if not c.isspace():
            if not left:
                return at
            left -= 1
    return len(text)


class SentenceFeed:
    """The text side of an open long take (engine/longtake.py `more=`): pieces added on one thread become
    planned segments (the long form's normalisation, style prefix and cut of an over-long sentence,
    `engine.longform.plan`) that the take's thread takes one by one, each followed by a sentence's pause.
    `language` "auto" normalises a sentence only when it reads as English (one sentence may be too short
    to tell: name the language when it is known)."""

    def __init__(self, *, style: str = "", normalize: bool = True, language: str = AUTO,
                 limit: int = MAX_INPUT_CHARS):
        self.style, self.normalize, self.language = style, normalize, language
        self.buffer = SentenceBuffer(limit)
        self._segments: queue.Queue = queue.Queue()
        self.ended = False
        self.planned = 0  # segments queued so far

    def add(self, piece: str) -> list[str]:
        """Add text; returns the sentences it completed (already queued for the take)."""
        self._check_open()
        return self._queue(self.buffer.add(piece))

    def flush(self) -> list[str]:
        self._check_open()
        return self._queue(self.buffer.flush())

    def end(self) -> list[str]:
        """The text has ended: what is buffered is spoken, then the take ends."""
        sentences = self.flush()
        self.ended = True
        self._segments.put(_END)
        return sentences

    def _check_open(self) -> None:
        if self.ended:
            raise ValueError("The text has ended; open a new stream to say more.")

    def _queue(self, sentences: list[str]) -> list[str]:
        """Plan and queue `sentences`. A sentence cut into pieces keeps no `source` on its first piece (the
        planner puts the whole sentence there): each piece then shows what it speaks, as
        studio/audio/captions.py `shown_texts` does for a closed take, and never the whole sentence again."""
        for sentence in sentences:
            pieces = plan(sentence, style=self.style, normalize=self.normalize, language=self.language)
            for segment in pieces:
                source = segment.source if len(pieces) == 1 else ""
                self._segments.put(dataclasses.replace(segment, pause_after=SENTENCE_PAUSE, source=source))
                self.planned += 1
        return sentences

    def next_segment(self, cancel: threading.Event) -> Segment | None:
        """The next segment, waiting for it; None once the text has ended or `cancel` is set."""
        while not cancel.is_set():
            try:
                item = self._segments.get(timeout=POLL_S)
            except queue.Empty:
                continue
            return None if item is _END else item
        return None


__all__ = ["MAX_SENTENCE_CHARS", "SentenceBuffer", "SentenceFeed"]
