"""The studio's one line for the GPU: fair admission (studio/takes/admission.py) in front of the engine's batch.

    queue = GpuQueue(slots=engine.info.max_batch, visitor_running=2, visitor_waiting=4, max_waiting=64)
    for item in queue.run(work, cancel, caller=caller, positions=True):   # Queued(position), then work's output
        ...
    queue.run_exclusive(fn, *args)                                         # other device work, in turn

The line holds as many jobs running as the engine decodes together, one thread each; the engine's scheduler
batches their steps (engine/scheduler.py). So every take this line starts finds a batch slot at the engine's
next step boundary: the scheduler's own list of arrivals never grows past one step's newcomers, and the order
in which takes get the GPU is this line's, the admission rule's. An engine that does not batch reports
max_batch 1, and then the line runs one job at a time.

Which waiting job gets a free slot is the admission rule: the owner's first, then round robin across callers,
a visitor with at most `visitor_running` running and `visitor_waiting` waiting. A job made of parts (a long
take's segments) gives its slot back between parts with `job.turn()`, so each part takes its turn.
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from studio.takes.admission import OWNER, Admission, Caller, Refused


class ServiceBusy(TimeoutError):
    """The request waited longer than the queue timeout for a free slot on the GPU."""


class TooManyTakes(ServiceBusy):
    """A visitor already has as many takes waiting as one visitor may; the message says so."""


class ServiceClosed(RuntimeError):
    """The service was shut down."""


@dataclass(frozen=True)
class Queued:
    """Yielded by `run(..., positions=True)` while a job waits for a slot, each time its place changes:
    1 = next up (a slot is free: it starts at once), 2 = it cannot start at once (every slot busy, or the
    visitor's own takes fill its share) or one job is ahead of it; each further job that the admission rule
    starts before it adds one."""

    position: int


class Job:
    """One unit of GPU work in the line. `work(job)` runs on its own thread once admitted and puts results in
    `out`; work made of several parts (a long take's segments) calls `job.turn()` between them."""

    _ids = itertools.count(1)

    def __init__(self, work: Callable[[Job], None], cancel: threading.Event, caller: Caller, line: GpuQueue):
        self.id = next(self._ids)
        self.work = work
        self.cancel = cancel
        self.caller = caller
        self.started = False
        self.thread: threading.Thread | None = None
        self.out: queue.Queue = queue.Queue()
        self._line = line

    def turn(self, wait: Callable[[], Any] | None = None) -> Any:
        """Give the slot back and wait for the next turn under the admission rule, so a long take counts
        segment by segment. Returns at once when cancelled (the work then stops on its own). `wait()` (an open
        take waiting for its next text) runs first, holding no slot; its value is returned."""
        return self._line.requeue(self, wait)


_DONE = object()


class GpuQueue:
    """The admission rule's line over `slots` running jobs, each on its own thread."""

    def __init__(self, slots: int, *, timeout: float = 600.0, visitor_running: int = 2, visitor_waiting: int = 4,
                 max_waiting: int = 64):
        self.slots = slots
        self.timeout = timeout
        self.admission = Admission(slots, visitor_running=visitor_running, visitor_waiting=visitor_waiting,
                                   max_waiting=max_waiting)
        self._cond = threading.Condition()  # guards `admission` and every job's `started`
        self._closed = False

    @property
    def depth(self) -> int:
        """Jobs waiting or running."""
        with self._cond:
            return self.admission.waiting + self.admission.running

    def run(self, work: Callable[[Job], None], cancel: threading.Event, *, caller: Caller = OWNER,
            positions: bool = False) -> Iterator[Any]:
        """Run `work(job)` in a slot, in turn with every other job (`caller`'s turn under the admission rule),
        and yield what it puts in `job.out`; with `positions=True`, first a `Queued` each time the job's place
        in the line changes. Nothing is yielded after a cancel while waiting (the job leaves the line)."""
        job = self._submit(work, cancel, caller)
        for position in self._wait_turn(job, self.timeout):
            if positions:
                yield Queued(position)
        if not job.started:  # cancelled while waiting
            return
        yield from self._results(job)

    def run_exclusive(self, fn: Callable[..., Any], *args, timeout: float | None = None, caller: Caller = OWNER,
                      **kwargs) -> Any:
        """Run `fn(*args, **kwargs)` (e.g. encoding a voice) in a slot, in `caller`'s turn with generations: it
        holds one slot while it runs, and the engine's lock keeps its device work apart from the batch's steps.
        Not from inside a job: that job already holds a slot."""
        job = self._submit(lambda j: j.out.put(("value", fn(*args, **kwargs))), threading.Event(), caller)
        for _ in self._wait_turn(job, self.timeout if timeout is None else timeout):
            pass
        results = list(self._results(job))  # to the end: the slot is free when this returns
        if not results:
            raise RuntimeError("GPU work finished without a result")
        return results[0][1]

    def close(self) -> None:
        with self._cond:
            self._closed = True
            for job in self.admission.waiting_tickets():
                job.cancel.set()
            self._cond.notify_all()

    def requeue(self, job: Job, wait: Callable[[], Any] | None = None) -> Any:
        value = None
        if wait is not None:
            with self._cond:  # the slot goes to the next job while this one waits
                self.admission.done(job)
                self._dispatch()
            value = wait()
        with self._cond:
            self.admission.done(job)
            job.started = False
            if self._closed:
                return value
            self.admission.add(job, again=True)
            self._dispatch()
            while not job.started:
                if job.cancel.is_set() or self._closed:
                    self.admission.remove(job)
                    self._cond.notify_all()
                    return value
                self._cond.wait(0.1)
        return value

    # ---------------------------------------------------------------- the line's workings

    def _dispatch(self) -> None:
        """Start every job the admission rule lets start now (call with `_cond` held)."""
        for job in self.admission.start():
            job.started = True
            if job.thread is None:
                job.thread = threading.Thread(target=self._work, args=(job,), name=f"higgs-take-{job.id}",
                                              daemon=True)
                job.thread.start()
        self._cond.notify_all()

    def _work(self, job: Job) -> None:
        try:
            if not job.cancel.is_set():
                job.work(job)
        except BaseException as exc:  # handed to the caller's thread, never kills the service
            job.out.put(exc)
        finally:
            with self._cond:  # the slot is free before the consumer hears the end
                self.admission.done(job)
                self._dispatch()
            job.out.put(_DONE)

    def _submit(self, work: Callable[[Job], None], cancel: threading.Event, caller: Caller) -> Job:
        job = Job(work, cancel, caller, self)
        with self._cond:
            if self._closed:
                raise ServiceClosed("The studio is shutting down.")
            try:
                self.admission.add(job)
            except Refused as exc:
                raise (TooManyTakes if exc.visitor else ServiceBusy)(str(exc)) from None
            self._dispatch()
        return job

    def _wait_turn(self, job: Job, timeout: float | None) -> Iterator[int]:
        """Yield `job`'s position each time it changes, until it is admitted (then `job.started` is True) or
        it is cancelled while waiting (it leaves the line; `job.started` stays False)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        last = None
        while True:
            with self._cond:
                if job.started:
                    return
                if job.cancel.is_set() or (deadline is not None and time.monotonic() >= deadline):
                    self.admission.remove(job)
                    self._cond.notify_all()
                    if job.cancel.is_set():
                        return
                    raise ServiceBusy(f"Waited {timeout:.0f} s for a free slot on the GPU; try again.")
                position = self.admission.position(job)
                if position == last:
                    # Cancellation is an Event outside this condition, so wake up a few times a second to see it.
                    self._cond.wait(0.1)
                    continue
            last = position
            yield position  # outside the lock: the consumer may take its time

    @staticmethod
    def _results(job: Job) -> Iterator[Any]:
        while True:
            item = job.out.get()
            if item is _DONE:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
