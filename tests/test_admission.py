"""The fair admission rule (studio/takes/admission.py) as bookkeeping, without a model or threads: the owner first,
round robin across visitors, each visitor's running and waiting limits, positions that count what the rule
really starts first, and a long take's segments taking turns."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from studio.takes.admission import OWNER, Admission, Caller, Refused

A, B, C = Caller.visitor("10.0.0.1"), Caller.visitor("10.0.0.2"), Caller.visitor("10.0.0.3")


@dataclass(eq=False)
class Ticket:
    name: str
    caller: Caller


def drain(admission: Admission, running: list) -> list[str]:
    """Finish running tickets one at a time (oldest first) and record the order the rule starts the rest."""
    started = []
    while running:
        admission.done(running.pop(0))
        new = admission.start()
        started += [t.name for t in new]
        running += new
    return started


def test_three_visitors_and_the_keyed_caller_are_admitted_owner_first_then_round_robin():
    admission = Admission(1)
    holder = Ticket("holder", B)
    admission.add(holder)
    assert admission.start() == [holder]  # the one slot is busy: everything below waits
    burst = [Ticket(n, c) for n, c in (("a1", A), ("a2", A), ("a3", A), ("b1", B), ("b2", B), ("c1", C),
                                       ("owner", OWNER))]
    for ticket in burst:  # all at once, the owner's key last
        admission.add(ticket)
    expected = ["owner", "a1", "b1", "c1", "a2", "b2", "a3"]
    assert [t.name for t in admission.order()] == expected
    # Positions count what is really ahead: 2 for the owner (every slot busy), then one more per take.
    assert [admission.position(t) for t in sorted(burst, key=lambda t: expected.index(t.name))] == \
        list(range(2, 2 + len(expected)))
    assert drain(admission, [holder]) == expected


def test_a_visitor_has_its_share_and_then_the_sentence():
    admission = Admission(16, visitor_running=2, visitor_waiting=4)
    tickets = [Ticket(f"a{i}", A) for i in range(24)]
    admitted, refusals = [], []
    for ticket in tickets:
        try:
            admission.add(ticket)
        except Refused as exc:
            refusals.append(exc)
            continue
        admitted.append(ticket)
        admission.start()
    assert len(admitted) == 6 and len(refusals) == 18
    assert admission.running_for(A) == 2 and admission.waiting_for(A) == 4
    assert all(r.visitor for r in refusals)
    assert str(refusals[0]).startswith("You already have 4 takes waiting (and 2 running)")
    # B is not held behind A's line: a slot is free and B is under its own limit, so it starts at once.
    b = Ticket("b", B)
    admission.add(b)
    assert admission.start() == [b]
    # A's waiting takes cannot start while its two run: their positions say they wait for A's own takes.
    assert [admission.position(t) for t in admitted[2:]] == [2, 3, 4, 5]


def test_one_visitor_alone_still_runs_up_to_its_concurrency_together():
    admission = Admission(16, visitor_running=3)
    for i in range(4):
        admission.add(Ticket(f"a{i}", A))
    assert [t.name for t in admission.start()] == ["a0", "a1", "a2"]  # three decode in one batch


def test_the_owner_has_no_per_caller_limit_but_the_queue_has_one():
    admission = Admission(4, visitor_running=1, visitor_waiting=1, max_waiting=3)
    for i in range(7):
        admission.add(Ticket(f"o{i}", OWNER))
        admission.start()
    assert admission.running_for(OWNER) == 4 and admission.waiting_for(OWNER) == 3
    with pytest.raises(Refused, match="queue is full") as refused:
        admission.add(Ticket("v", A))
    assert not refused.value.visitor


def test_the_owner_goes_first_at_the_next_free_slot_and_never_cuts_a_running_take():
    admission = Admission(2)
    a1, a2, a3 = (Ticket(f"a{i}", A) for i in range(1, 4))
    for ticket in (a1, a2, a3):
        admission.add(ticket)
    assert admission.start() == [a1, a2]
    owner = Ticket("owner", OWNER)
    admission.add(owner)
    assert admission.start() == []  # both slots stay with A's running takes
    assert admission.position(owner) == 2 and admission.position(a3) == 3
    admission.done(a1)
    assert admission.start() == [owner]


def test_a_long_takes_segments_take_turns_with_other_callers():
    admission = Admission(1)
    long, short = Ticket("long", A), Ticket("short", B)
    admission.add(long)
    assert admission.start() == [long]
    admission.add(short)
    # Between segments the long take gives its slot back; the short take waiting meanwhile goes first.
    admission.done(long)
    admission.add(long, again=True)
    assert admission.start() == [short]
    admission.done(short)
    assert admission.start() == [long]


def test_a_requeued_segment_is_never_refused():
    admission = Admission(1, visitor_running=1, visitor_waiting=0)
    long = Ticket("long", A)
    admission.add(long)
    admission.start()
    with pytest.raises(Refused):
        admission.add(Ticket("more", A))
    admission.done(long)
    admission.add(long, again=True)
    assert admission.start() == [long]


def test_leaving_the_line_and_finishing_twice_keep_the_counts_right():
    admission = Admission(1)
    a, b = Ticket("a", A), Ticket("b", B)
    admission.add(a)
    admission.add(b)
    admission.start()
    admission.remove(b)
    admission.done(a)
    admission.done(a)  # a take that gave its slot back, then ended: ignored
    admission.done(b)  # never ran
    assert (admission.running, admission.waiting) == (0, 0) and admission.start() == []


def test_bad_limits_are_a_sentence():
    with pytest.raises(ValueError, match="at least 1"):
        Admission(1, visitor_running=0)
