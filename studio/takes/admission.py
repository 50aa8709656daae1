"""Fair admission: which waiting take gets the next free slot. Pure bookkeeping (no threads, no engine), so it
can be tested alone and moved under another queue.

    admission = Admission(slots=16, visitor_running=2, visitor_waiting=4, max_waiting=64)
    admission.add(ticket)            # ticket.caller is a Caller; raises Refused past a limit
    for ticket in admission.start(): # the tickets that may run now, marked running, in the rule's order
        run(ticket)
    admission.done(ticket)           # a running ticket ended (or gave its slot back between segments)
    admission.remove(ticket)         # a waiting ticket left the line (cancelled, timed out)
    admission.position(ticket)       # 1 = next up; what is really ahead of it under the rule

A text stream (the speech WebSocket) counts from the moment it opens, waiting for text or speaking:

    streams = OpenStreams()          # MAX_OPEN_STREAMS_PER_VISITOR each, MAX_OPEN_STREAMS in all
    streams.open(caller)             # raises Refused past a limit
    streams.close(caller)

The rule: the owner's takes start before any visitor's waiting take; among visitors (and among the owner's
own callers) free slots go round robin, one take per caller per turn, callers in the order they joined the
line; a visitor has at most `visitor_running` takes running and `visitor_waiting` waiting. A running take is
never cut: the owner goes first only at the next free slot. A hosted speech service gives each caller a
share rather than a place in one line, so one visitor with a script cannot hold every slot.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import Any

TOO_MANY = ("You already have {waiting} waiting (and {running} running): that is as many as one visitor may "
            "queue. Wait for one of them to finish, then try again.")
QUEUE_FULL = "The queue is full ({waiting} requests waiting); try again shortly."
TOO_MANY_STREAMS = ("You already have {open} streams open; one visitor may have {limit}, waiting for text or "
                    "speaking. Close one, then try again.")
STREAMS_FULL = "The studio has {open} streams open, as many as it serves at once; try again shortly."

# Text streams (the speech WebSocket) open at once. A stream waiting for text holds no slot in the line, so the
# running and waiting limits above never see it; these count it from the moment it opens.
MAX_OPEN_STREAMS_PER_VISITOR = 4  # one visitor's (one address's): a page's type-as-you-go box and a few tabs
MAX_OPEN_STREAMS = 64  # everyone's together, the key holder's too: each speaking stream holds 2 threads
STREAM_IDLE_S = 60.0  # a stream with nothing sent or owed for this long is closed (an LLM pauses for seconds)


@dataclass(frozen=True)
class Caller:
    """Whose take it is. `key` names one caller's share (a visitor's address, a page session); `owner` callers
    come first and have no per-caller limits."""

    key: str
    owner: bool = False

    @classmethod
    def visitor(cls, identity: str) -> Caller:
        return cls(f"visitor:{identity}")

    @property
    def public(self) -> bool:
        """A visitor of a public page: held to the public page's limits (studio/takes/limits.py)."""
        return self.key.startswith("visitor:")


# The key's holder or the logged-in page; on a studio without a key, everyone who reaches it.
OWNER = Caller("owner", owner=True)


class Refused(Exception):
    """A take the line will not take; the message says why. `visitor` is True when the caller's own limit
    is reached (the studio is not full)."""

    def __init__(self, message: str, *, visitor: bool):
        super().__init__(message)
        self.visitor = visitor


class Admission:
    """Waiting tickets per caller, running counts per caller, and the order in which free slots are given."""

    def __init__(self, slots: int, *, visitor_running: int = 2, visitor_waiting: int = 4, max_waiting: int = 64):
        if slots < 1 or visitor_running < 1 or visitor_waiting < 0 or max_waiting < 0:
            raise ValueError("Slots and the visitor's running limit must be at least 1; the waiting limits at "
                             "least 0.")
        self.slots = slots
        self.visitor_running = visitor_running
        self.visitor_waiting = visitor_waiting
        self.max_waiting = max_waiting
        # Callers with waiting tickets, in turn order: a caller served moves to the end.
        self._waiting: collections.OrderedDict[Caller, collections.deque] = collections.OrderedDict()
        self._running: dict[int, Any] = {}  # id(ticket) → ticket
        self._per_caller: collections.Counter[Caller] = collections.Counter()

    # ------------------------------------------------------------------ counts

    @property
    def waiting(self) -> int:
        return sum(len(q) for q in self._waiting.values())

    @property
    def running(self) -> int:
        return len(self._running)

    def running_for(self, caller: Caller) -> int:
        return self._per_caller[caller]

    def waiting_for(self, caller: Caller) -> int:
        return len(self._waiting.get(caller, ()))

    def waiting_tickets(self) -> list:
        return [t for q in self._waiting.values() for t in q]

    # ------------------------------------------------------------------ changes

    def add(self, ticket, *, again: bool = False) -> None:
        """Put `ticket` in line, behind its caller's other waiting takes. `again`: a running take giving its slot
        back between segments (a long take), so each segment takes its turn like a new take; it is never
        refused."""
        caller = ticket.caller
        if not again:
            if self.waiting >= self.max_waiting:
                raise Refused(QUEUE_FULL.format(waiting=self.waiting), visitor=False)
            if not caller.owner and self.waiting_for(caller) >= self.visitor_waiting and not self._starts_now(caller):
                raise Refused(TOO_MANY.format(waiting=_takes(self.waiting_for(caller)),
                                              running=self.running_for(caller)), visitor=True)
        self._waiting.setdefault(caller, collections.deque()).append(ticket)

    def _starts_now(self, caller: Caller) -> bool:
        """Whether a new take of `caller` would start at the next `start()` without waiting."""
        return (len(self._running) < self.slots and _may_run(caller, self._per_caller, self.visitor_running)
                and not self.waiting_for(caller) and not any(c.owner for c in self._waiting))

    def remove(self, ticket) -> None:
        line = self._waiting.get(ticket.caller)
        if line is not None and ticket in line:
            line.remove(ticket)
            if not line:
                del self._waiting[ticket.caller]

    def done(self, ticket) -> None:
        """`ticket` stopped running; a ticket that was not running is ignored."""
        if self._running.pop(id(ticket), None) is not None:
            self._per_caller[ticket.caller] -= 1
            if not self._per_caller[ticket.caller]:
                del self._per_caller[ticket.caller]

    def start(self) -> list:
        """Give every free slot to the next ticket under the rule; returns the tickets started, in order."""
        started = []
        while len(self._running) < self.slots:
            caller = _pick(self._waiting, self._per_caller, self.visitor_running)
            if caller is None:
                break
            ticket = _serve(self._waiting, caller)
            self._running[id(ticket)] = ticket
            self._per_caller[caller] += 1
            started.append(ticket)
        return started

    # ------------------------------------------------------------------ what the visitor sees

    def order(self) -> list:
        """Every waiting ticket in the order the rule will start them, if slots free up one by one and, when
        every caller in line is at its running limit, each of them finishes one take before the next turn."""
        waiting = collections.OrderedDict((c, collections.deque(q)) for c, q in self._waiting.items())
        running = collections.Counter(self._per_caller)
        out = []
        while waiting:
            caller = _pick(waiting, running, self.visitor_running)
            if caller is None:
                running = collections.Counter({c: n - 1 for c, n in running.items() if n > 1})
                continue
            out.append(_serve(waiting, caller))
            running[caller] += 1
        return out

    def position(self, ticket) -> int:
        """1 = next up (it starts at the next free slot); each take the rule starts before it adds one, and
        one more while it cannot start at once (every slot busy, or its caller at its running limit)."""
        ahead = next(i for i, t in enumerate(self.order()) if t is ticket)
        blocked = len(self._running) >= self.slots or not _may_run(ticket.caller, self._per_caller,
                                                                   self.visitor_running)
        return ahead + 1 + int(blocked)


class OpenStreams:
    """The text streams open now, per caller: one waiting for text counts as much as one speaking. A visitor
    may hold `per_visitor`, everyone together `total`; owner callers only count towards the total. Used from
    one event loop, so it needs no lock."""

    def __init__(self, per_visitor: int = MAX_OPEN_STREAMS_PER_VISITOR, total: int = MAX_OPEN_STREAMS):
        if per_visitor < 1 or total < 1:
            raise ValueError("The open-stream limits must be at least 1.")
        self.per_visitor, self.total = per_visitor, total
        self._open: collections.Counter[Caller] = collections.Counter()

    @property
    def open_now(self) -> int:
        return sum(self._open.values())

    def open(self, caller: Caller) -> None:
        if self.open_now >= self.total:
            raise Refused(STREAMS_FULL.format(open=self.open_now), visitor=False)
        if not caller.owner and self._open[caller] >= self.per_visitor:
            raise Refused(TOO_MANY_STREAMS.format(open=self._open[caller], limit=self.per_visitor), visitor=True)
        self._open[caller] += 1

    def close(self, caller: Caller) -> None:
        self._open[caller] -= 1
        if self._open[caller] <= 0:
            del self._open[caller]


def _takes(n: int) -> str:
    return f"{n} take" if n == 1 else f"{n} takes"


def _may_run(caller: Caller, running: collections.Counter, limit: int) -> bool:
    return caller.owner or running[caller] < limit


def _pick(waiting: collections.OrderedDict, running: collections.Counter, limit: int) -> Caller | None:
    """The caller whose turn it is: the first owner caller in line, else the first visitor under its limit."""
    for owners in (True, False):
        for caller, line in waiting.items():
            if line and caller.owner == owners and _may_run(caller, running, limit):
                return caller
    return None


def _serve(waiting: collections.OrderedDict, caller: Caller):
    """Take `caller`'s first ticket and move the caller to the end of the turn order (or out of the line)."""
    line = waiting[caller]
    ticket = line.popleft()
    if line:
        waiting.move_to_end(caller)
    else:
        del waiting[caller]
    return ticket

