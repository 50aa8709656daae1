"""The scheduler's worker never hangs its takes: a failure in a batched step, in a take's admission or in
the worker's own loop ends every take it reaches, promptly and with a sentence naming the failure, and
the engine's next takes give the codes they gave before. Joins and cancels forced at step boundaries
(a hook on the batched step, not machine load) change no take's codes. Parity checkpoint, fp32 torch."""

import threading
import time

import pytest
import torch

from engine.generate import Engine
from engine.prompt import Prompt, zero_shot_ids
from engine.sampling import NonFiniteLogits
from engine.scheduler import Scheduler
from engine.types import SamplingParams
from tests.helpers import held_pair, take_in_thread, wait_for

PROMPTS = [Prompt(ids=zero_shot_ids(t)) for t in ([9707, 11, 419, 374], [2805, 22636], [576, 4024, 6666])]
PARAMS = [SamplingParams(temperature=0.8, seed=7 + i, max_frames=12, repeat_guard=None) for i in range(3)]


@pytest.fixture(scope="module")
def engine(parity_dir):
    return Engine.load(parity_dir / "tiny_checkpoint", device="cpu", precision="fp32", max_batch=3)


@pytest.fixture(scope="module")
def alone(engine):
    return [engine.predict(prompt=p, params=s) for p, s in zip(PROMPTS, PARAMS)]


def start(engine, i, out, cancel=None):
    """Take i in a thread; its codes, or the exception it raised, land in out[i]."""
    return take_in_thread(engine, out, i, PROMPTS[i], PARAMS[i], cancel)


def joined(threads, seconds=30.0):
    for t in threads:
        t.join(seconds)
    assert not any(t.is_alive() for t in threads), "a take still waits on the scheduler"


def batch_of_two(engine, out):
    """Takes 0 and 1 admitted at one boundary (held), so they decode as one batch."""
    with engine.scheduler.held():
        threads = [start(engine, i, out) for i in (0, 1)]
        while len(engine.scheduler.waiting) < 2:
            time.sleep(0.005)
    return threads


def idle(engine):
    deadline = time.monotonic() + 10
    while engine.scheduler.worker is not None and time.monotonic() < deadline:
        time.sleep(0.005)
    assert engine.scheduler.worker is None and not engine.scheduler.busy and not engine.scheduler.active


def test_a_failing_step_ends_its_takes_with_the_reason_and_the_engine_goes_on(engine, alone, monkeypatch):
    real, calls = engine.runner.decode_rows, []

    def flaky(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("injected device fault")
        return real(*args, **kwargs)

    monkeypatch.setattr(engine.runner, "decode_rows", flaky)
    out = {}
    joined(batch_of_two(engine, out))
    for i in (0, 1):
        assert isinstance(out[i], RuntimeError), out[i]
        assert "batched decode step failed" in str(out[i]) and "injected device fault" in str(out[i])
    idle(engine)
    monkeypatch.setattr(engine.runner, "decode_rows", real)
    assert torch.equal(engine.predict(prompt=PROMPTS[2], params=PARAMS[2]), alone[2])
    out = {}
    joined(batch_of_two(engine, out))
    assert torch.equal(out[0], alone[0]) and torch.equal(out[1], alone[1])


def test_a_take_whose_logits_are_not_finite_ends_alone_with_the_reason(engine, alone, monkeypatch):
    """The colleague's failure: a NaN in one take's logits made `sample` fail with "index 1026 is out of
    bounds" and ended the whole batch. Now that take ends with `NonFiniteLogits`, its neighbour goes on."""
    real, calls = engine.runner.decode_rows, []

    def poisoned(rows, slots, positions, stream=None):
        logits = real(rows, slots, positions, stream)
        calls.append(1)
        if len(calls) == 4:
            slot = next(t.slot for t in engine.scheduler.active if t.params.seed == PARAMS[1].seed)
            logits[slots.index(slot), 3, 5] = float("nan")  # take 1's row of this step
        return logits

    monkeypatch.setattr(engine.runner, "decode_rows", poisoned)
    out = {}
    joined(batch_of_two(engine, out))
    assert isinstance(out[1], NonFiniteLogits) and "NaN or inf" in str(out[1]), out[1]
    assert torch.equal(out[0], alone[0])
    idle(engine)


def test_a_take_that_cannot_be_admitted_ends_alone(engine, alone, monkeypatch):
    real = engine.runner.plan

    def plan(prompt, hit):
        if prompt is PROMPTS[1]:
            raise ValueError("injected bad prompt")
        return real(prompt, hit)

    monkeypatch.setattr(engine.runner, "plan", plan)
    out = {}
    joined(batch_of_two(engine, out))
    assert isinstance(out[1], ValueError) and "injected bad prompt" in str(out[1])
    assert torch.equal(out[0], alone[0])
    idle(engine)


def test_a_worker_that_fails_outside_a_step_ends_every_take_it_holds(engine, alone, monkeypatch):
    """The boundary itself raises while one take runs and another waits: both end with the sentence, none
    hangs, the books are reset and a new worker serves the next take. The boundary hook itself submits the
    waiting take (held) before it raises, so the order is the same however the test's threads are scheduled."""
    real, threads, holds, out = Scheduler._boundary, [], [], {}

    def boundary(self):
        if self.active and len(threads) == 1:  # take 0 runs: take 2 is submitted now, and waits behind a hold
            holds.append(self.held())
            holds[0].__enter__()
            threads.append(start(engine, 2, out))
            deadline = time.monotonic() + 30
            while not self.waiting and time.monotonic() < deadline:
                time.sleep(0.005)
            raise RuntimeError("injected scheduler fault")
        return real(self)

    monkeypatch.setattr(Scheduler, "_boundary", boundary)
    threads.append(start(engine, 0, out))
    try:
        deadline = time.monotonic() + 30
        while len(threads) < 2 and time.monotonic() < deadline:
            time.sleep(0.005)
        joined(threads)
    finally:
        for hold in holds:
            hold.__exit__(None, None, None)
    for i in (0, 2):
        assert isinstance(out[i], RuntimeError) and "scheduler failed" in str(out[i]), out[i]
        assert "injected scheduler fault" in str(out[i])
    idle(engine)
    monkeypatch.setattr(Scheduler, "_boundary", real)
    assert torch.equal(engine.predict(prompt=PROMPTS[1], params=PARAMS[1]), alone[1])


def test_joins_and_cancels_forced_at_each_step_boundary_change_no_codes(engine, alone, monkeypatch):
    """Takes 0 and 1 decode together; at the 3rd step take 2 is submitted (it joins mid-way), at the 10th
    take 1 is cancelled right after its row was sampled (it leaves at the next boundary), and at the 12th
    a take with take 1's prompt joins and reuses the cancelled take's slot and prefix. The hook runs inside
    the step, so the interleaving is the same on any machine."""
    real, steps, threads, out = engine.runner.decode_rows, [], [], {}
    cancel = threading.Event()

    def hooked(rows, slots, positions, stream=None):
        steps.append(len(rows))
        n = len(steps)
        if n == 3:
            threads.append(start(engine, 2, out))
        if n == 10:
            cancel.set()
        if n == 12:
            threads.append(start(engine, 1, rejoin))
        return real(rows, slots, positions, stream)

    rejoin = {}
    monkeypatch.setattr(engine.runner, "decode_rows", hooked)
    threads += held_pair(engine, start, out, cancel)
    wait_for(lambda: len(threads) >= 4, 60)
    joined(threads)
    assert torch.equal(out[0], alone[0]) and torch.equal(out[2], alone[2]), out
    assert torch.equal(rejoin[1], alone[1])
    cut = out[1]
    assert 0 < len(cut) < len(alone[1]) and torch.equal(cut, alone[1][:len(cut)])
    assert max(steps) == 3
    idle(engine)
