"""Continuous batching: takes from any number of threads decode together, one row each per step.

The engine hands each take to a `Scheduler` (when its backend can batch: `BatchedBackend`). The scheduler
keeps the books (who waits, who runs, which KV slot holds whose prefix); the device work goes through the
engine's `Runner` (engine/runner.py). One worker thread, started on demand and gone when idle, repeats:

1. at the step boundary, takes that finished or were cancelled leave and free their KV slot, and waiting
   takes are admitted while slots are free (`max_batch`; the overflow waits in arrival order);
2. one prefill chunk (`prefill_chunk` positions) of the oldest admitted take that is still prefilling;
3. one decode step for every take that has finished its prefill: each samples its row with its own seed
   and settings (SPEC D6, the same draws as alone), its own stop rule decides when it ends, and the
   surviving rows go through `model.decode_rows` together.

Where the rows are sampled (`_sample`): on the device where the runner can (`Runner.device_sampling`: a
`BatchedSampling` backend on CUDA, the cubin one), in ONE launch for every take of the step, each with its
own seed, settings, step and EOC countdown, from logits that never leave the device; only the rows and
a few flags come back, and each row is pushed to its take's stop rule (engine/delay.py), which also keeps
the length cap and the repeat guard. Elsewhere (the CPU path, the torch backends) the step's logits for
every take come back in one device-to-host copy and each take samples on the host (`sampling.sample_row`).
Both make the draws of engine/sampling.py for the same seed (the device's picks can differ only where u
or top_p falls within float rounding of a boundary), and a take's row depends only on its own logits and
books, so batch invariance is untouched either way.

One host transfer per step, either way (engine/runner.py `to_host`): queued on the backend's own stream
where it has one (the cubin kernels') and waited for on an event of that stream — not a device-wide sync.
The whole step runs with that stream current, so neither its launches nor the copy queue behind the
codec's work, which the listeners' threads put on torch's default stream.

A newcomer's prefill therefore costs the takes already decoding at most one chunk per step, not a whole
prompt: their time to first audio and their row rate stay close to alone, and the newcomer joins the
batch at the first step boundary after its last chunk.

KV slots: each take gets a slot, a preallocated contiguous [kv_heads, max_len, head_dim] cache per layer
(engine/layers.py `KVCache`, allocated on first use). Contiguous slots keep the batch-1 decode attention
unchanged per sequence (bit-identical to alone) and keep the shared-prefix reuse what it was: a slot
remembers whose prompt prefix sits in its first positions, and a take whose prefix matches a free slot's
gets that slot and skips those positions. Paging would save memory for short takes but needs a gather
in attention (a new kernel on the GPU path) for a cache that is at most max_batch × max_len anyway.

Failures never hang a take: a step that raises ends the takes still in it with a sentence naming the
failure (the worker goes on with the others), a take whose admission fails or whose logits cannot be
sampled (NaN or inf: `sampling.NonFiniteLogits`) ends alone, and anything else
the worker raises ends every take it holds, running or queued, and resets the books; the next submit
starts a fresh worker. A take that ends gets its step's figures first and is then never touched again by
the worker (`ScheduledTake.close` relies on it).

The consumer side (`ScheduledTake.advance`) runs in the caller's thread: it waits for rows while the worker runs
ahead, and the caller streams them through its own codec state, so codec work overlaps decode steps.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque

import torch

from .delay import StopRule
from .runner import Runner, prefix_key
from .sampling import sample_row, uniforms
from .types import SamplingParams


class ScheduledTake:
    """One take's state, shared by its caller (which reads rows) and the worker (which writes them)."""

    def __init__(self, prompt, rule, params, cancel: threading.Event | None, started: float, codebooks: int):
        self.prompt, self.rule, self.params = prompt, rule, params
        self.cancel = cancel
        self.started = started
        self.u = uniforms(params.seed, 0, codebooks, steps=rule.max_rows).view(-1, codebooks)
        self.cond = threading.Condition()
        self.scheduler: Scheduler | None = None
        self.slot: int | None = None
        self.segments: list = []  # prefill chunks still to run: (ids, ref_rows, start)
        self.restore = False  # the prefix's KV is copied from the runner's store before the first chunk
        self.warm_only = False  # a warm-up (`Scheduler.warm`): ends once its prefix is computed and kept
        self.logits = None
        self.pos = self.prompt_tokens = len(prompt.ids)
        self.finished = self.abandoned = False
        self.error: BaseException | None = None
        # metrics
        self.queued_s = self.prefill_s = self.decode_s = 0.0
        self.admitted = None
        self.reused = 0
        self.batch = 1

    def stopped(self) -> bool:
        return self.abandoned or (self.cancel is not None and self.cancel.is_set())

    # ---------------------------------------------------------------- caller side
    def advance(self, n: int) -> None:
        """Wait until n more rows exist, or the take ended."""
        target = len(self.rule.rows) + n
        with self.cond:
            # A cancel event set elsewhere notifies no one: look again every 50 ms.
            while not (self.finished or self.stopped() or len(self.rule.rows) >= target):
                self.cond.wait(0.05)
        if self.error is not None:
            raise self.error

    def close(self) -> None:
        """Leave the batch (closed generator or cancel) and wait until the worker has let go of the rows.
        A take still waiting for a slot leaves the queue at once."""
        if self.scheduler is not None:
            self.scheduler.withdraw(self)
        with self.cond:
            self.abandoned = True
            self.cond.wait_for(lambda: self.finished)

    # ---------------------------------------------------------------- worker side
    def finish(self, error: BaseException | None = None) -> None:
        with self.cond:
            self.finished, self.error = True, error if self.error is None else self.error
            self.cond.notify_all()

    def notify(self) -> None:
        with self.cond:
            self.cond.notify_all()


class Scheduler:
    def __init__(self, runner: Runner, max_batch: int):
        self.runner, self.max_batch = runner, max_batch
        self.stream = runner.model.stream  # where the backend launches (None: torch's current)
        self.cond = threading.Condition()
        self.waiting: deque[ScheduledTake] = deque()
        self.active: list[ScheduledTake] = []
        self.keys: list = [None] * max_batch  # prefix cache key whose KV sits at the start of each slot
        self.busy: set[int] = set()
        self.worker: threading.Thread | None = None
        self.steps = 0  # decode steps run (tests read it)
        self.largest = 0  # the most takes decoded in one step so far
        self._holds = 0  # while > 0 no waiting take is admitted (`held`)

    def submit(self, take: ScheduledTake) -> ScheduledTake:
        with self.cond:
            take.scheduler = self
            self.waiting.append(take)
            if self.worker is None:
                self.worker = threading.Thread(target=self._run, name="engine-scheduler", daemon=True)
                self.worker.start()
            self.cond.notify_all()
        return take

    def warm(self, prompt) -> None:
        """Compute and keep `prompt`'s prefix (persisted where the runner's store has a directory), chunk by
        chunk between the running takes' steps, and decode nothing: a warm-up (`Engine.warm_voice`)."""
        codebooks = self.runner.dims.codebooks
        rule = StopRule(codebooks, self.runner.dims.boc, self.runner.dims.eoc, 1, None)
        take = ScheduledTake(prompt, rule, SamplingParams(seed=0), None, time.perf_counter(), codebooks)
        take.warm_only = True
        self.submit(take)
        with take.cond:
            take.cond.wait_for(lambda: take.finished)
        if take.error is not None:
            raise take.error

    @contextlib.contextmanager
    def held(self):
        """Admit no waiting take while inside; on leaving, the takes that arrived meanwhile are admitted at
        one step boundary. For tests and benchmarks that need N concurrent takes to start as one batch
        whatever the timing of the threads that submit them."""
        with self.cond:
            self._holds += 1
        try:
            yield self
        finally:
            with self.cond:
                self._holds -= 1
                self.cond.notify_all()

    def withdraw(self, take: ScheduledTake) -> None:
        with self.cond:
            if take in self.waiting:
                self.waiting.remove(take)
                take.finish()

    def reserve(self, key) -> tuple[int, bool]:
        """A free slot for a take (or a direct prefill) with prefix `key`, waiting while all are busy;
        returns (slot, whether its prefix KV is already `key`). A free slot holding the same prefix wins,
        else the lowest free one, so takes one after another always use slot 0 (as a batch-1 engine)."""
        with self.cond:
            self.cond.wait_for(lambda: len(self.busy) < self.max_batch)
            return self._pick(key)

    def _pick(self, key) -> tuple[int, bool]:  # with self.cond held and a slot free
        free = [s for s in range(self.max_batch) if s not in self.busy]
        slot = next((s for s in free if key is not None and self.keys[s] == key), free[0])
        self.busy.add(slot)
        hit = key is not None and self.keys[slot] == key
        if not hit:
            self.keys[slot] = None  # its prefix is about to be overwritten
        return slot, hit

    def release(self, slot: int) -> None:
        with self.cond:
            self.busy.discard(slot)
            self.cond.notify_all()

    def mark(self, slot: int, key) -> None:
        with self.cond:
            self.keys[slot] = key

    def forget_prefixes(self) -> None:
        with self.cond:
            self.keys = [None] * self.max_batch

    # ---------------------------------------------------------------- the worker
    def _run(self) -> None:
        """The worker's loop; whatever it raises ends the takes it holds with that reason instead of
        leaving their callers waiting on a thread that is gone (`_fail`), and the next take starts a new
        worker on clean books."""
        try:
            while self._boundary():
                self._run_step(list(self.active))
        except BaseException as exc:
            self._fail(exc)

    def _boundary(self) -> bool:
        """The step boundary (module docstring, 1.); False when the worker has nothing left and is gone."""
        with self.cond:
            for take in [t for t in self.active if t.finished]:
                self.active.remove(take)
                self.busy.discard(take.slot)
            while self.waiting and len(self.busy) < self.max_batch and not self._holds:
                take = self.waiting.popleft()
                if take.stopped():
                    take.finish()
                    continue
                try:
                    self._admit(take)
                except Exception as exc:  # this take's prompt is the problem: only it ends
                    take.finish(exc)
            if not self.active:
                if self.waiting:  # held: wait for the release (or a withdrawal) without spinning
                    self.cond.wait(0.05)
                    return True
                self.worker = None
                self.cond.notify_all()
                return False
            return True

    def _run_step(self, active: list[ScheduledTake]) -> None:
        # The backend's stream current: its launches then wait for nothing queued on torch's default
        # stream by the listeners' codec pushes (`_on_stream` orders after the caller's stream).
        on_stream = torch.cuda.stream(self.stream) if self.stream is not None else contextlib.nullcontext()
        with self.runner.lock, on_stream:
            try:
                self._step(active)
            except Exception as exc:  # a device failure ends every take still in the step, and only those
                failed = [t for t in active if not t.finished]
                error = _failure("batched decode step", exc, f"it ended the {len(failed)} take(s) of its batch")
                for take in failed:
                    self._end_faulty(take, error)

    def _fail(self, exc: BaseException) -> None:
        """The worker itself failed: every take it holds, running or waiting, ends with the reason; the
        books are reset (no slot kept, no prefix trusted) and the worker is gone, so the next submit
        starts a fresh one."""
        error = _failure("scheduler", exc, "the takes it held were ended")
        with self.cond:
            held = [*self.active, *self.waiting]
            for take in self.active:
                self.busy.discard(take.slot)
            self.active.clear()
            self.waiting.clear()
            self.forget_prefixes()  # the condition's lock is re-entrant
            self.worker = None
            self.cond.notify_all()
        for take in held:
            take.finish(error)

    def _end_faulty(self, take: ScheduledTake, error: BaseException) -> None:
        """End a take a fault reached; what the fault left in its slot is unknown, so no prefix is kept there."""
        self.mark(take.slot, None)
        take.finish(error)

    def _admit(self, take: ScheduledTake) -> None:
        key = prefix_key(take.prompt)
        slot, hit = self._pick(key)
        try:
            take.restore = not hit and self.runner.stored(key)
            take.segments, take.reused = self.runner.plan(take.prompt, hit or take.restore)
        except BaseException:
            self.busy.discard(slot)
            raise
        take.slot, take.admitted = slot, time.perf_counter()
        take.queued_s = take.admitted - take.started
        self.active.append(take)

    def _step(self, active: list[ScheduledTake]) -> None:
        runner = self.runner
        prefilling = [t for t in active if t.segments and not t.finished]
        if prefilling:  # a take's chunk before a warm-up's (`Engine.warm_voice` runs in the background)
            take = next((t for t in prefilling if not t.warm_only), prefilling[0])
            try:
                if take.stopped():
                    take.finish()
                else:
                    self._prefill_chunk(take)
            except Exception as exc:  # this take's prompt is the problem (too long, bad rows): only it ends
                take.finish(exc)
        decoding = [t for t in active if not t.segments and not t.finished]
        if not decoding:
            return
        tick = time.perf_counter()
        rows, slots, positions, stepping, ended = [], [], [], [], []
        try:
            live = []
            for take in decoding:  # one look at each cancel event: a take is either ended or sampled
                if take.stopped():
                    ended.append((take, None))
                else:
                    live.append(take)
            for take, row in zip(live, self._sample(live)):
                if isinstance(row, Exception):  # this take's logits are the problem (NonFiniteLogits): only it ends
                    ended.append((take, row))
                    continue
                if take.rule.done:
                    ended.append((take, None))
                    continue
                rows.append(row)
                slots.append(take.slot)
                positions.append(take.pos)
                stepping.append(take)
            if stepping:
                logits = runner.decode_rows(rows, slots, positions, self.stream)
                for take, out in zip(stepping, logits):
                    take.logits, take.pos = out, take.pos + 1
            self.steps += 1
            self.largest = max(self.largest, len(decoding))
        finally:
            # The step's figures first, then `finish`: a finished take is its caller's alone (`close`).
            spent = time.perf_counter() - tick
            for take in decoding:
                take.decode_s += spent
                take.batch = max(take.batch, len(decoding))
            for take, error in ended:
                if error is None:
                    take.finish()
                else:
                    self._end_faulty(take, error)
        for take in stepping:
            take.notify()

    def _sample(self, takes: list[ScheduledTake]) -> list:
        """Each take's next row, pushed to its stop rule, or the exception that ends it alone: on the device in
        one launch where the runner can (module docstring), else on the host, take by take."""
        if self.runner.device_sampling:
            return self.runner.sample_rows([t.logits for t in takes], [t.rule for t in takes],
                                           [t.params for t in takes], self.stream) if takes else []
        out = []
        for take in takes:
            p = take.params
            try:
                out.append(sample_row(take.logits, take.u, take.rule, p.temperature, p.top_k, p.top_p))
            except Exception as exc:  # handed back: this take ends alone
                out.append(exc)
        return out

    def _prefill_chunk(self, take: ScheduledTake) -> None:
        self.runner.ensure_room(len(take.prompt.ids) + take.rule.max_rows)
        if take.restore:  # the kept prefix KV, copied in (or, evicted since admission, computed after all)
            take.restore = False
            key = prefix_key(take.prompt)
            if self.runner.restore(take.slot, key):
                self.mark(take.slot, key)
            else:
                take.segments, take.reused = self.runner.plan(take.prompt, False)
        ids, ref_rows, start, key = take.segments.pop(0)
        take.logits = self.runner.prefill_segment(ids, ref_rows, start, take.slot, self.stream)
        if key is not None:  # the prefix is complete in this slot
            self.mark(take.slot, key)
        if take.warm_only and (key is not None or take.reused):  # a warm-up needs no more than the prefix
            self.runner.remember(take.slot, prefix_key(take.prompt), persist=True)
            take.segments.clear()
            take.finish()
        elif key is not None:
            self.runner.remember(take.slot, key)
        take.prefill_s = time.perf_counter() - take.admitted


def _failure(what: str, exc: BaseException, ended: str) -> RuntimeError:
    """The sentence a take ended by a fault gets: what failed, why, what it ended; the fault is its cause."""
    error = RuntimeError(f"the engine's {what} failed ({type(exc).__name__}: {exc}); {ended}, the engine takes "
                         "new ones")
    error.__cause__ = exc
    return error
