"""Batched takes: a take's codes do not depend on its company, and the scheduler admits, steps and retires
takes at step boundaries. Parity checkpoint (fp32, and weight-only int8) and a tiny bf16 checkpoint."""

import json
import threading
import time

import numpy as np
import pytest
import torch

from engine.generate import Engine
from engine.prompt import Prompt
from engine.quant import linear
from engine.runner import prefix_key
from engine.types import SamplingParams


@pytest.fixture(scope="module")
def fp32(parity_dir):
    return Engine.load(parity_dir / "tiny_checkpoint", device="cpu", precision="fp32", max_batch=8)


@pytest.fixture(scope="module")
def bf16(tmp_path_factory):
    from engine.demo import write_tiny_checkpoint
    root = write_tiny_checkpoint(tmp_path_factory.mktemp("bf16"), seed=4, codec=True, dtype=torch.bfloat16)
    return Engine.load(root, device="cpu", precision="bf16", max_batch=8)


@pytest.fixture(scope="module")
def int8(parity_dir):
    return Engine.load(parity_dir / "tiny_checkpoint", device="cpu", precision="int8", max_batch=8)


@pytest.fixture
def engines(fp32, bf16, int8):
    return {"fp32": fp32, "bf16": bf16, "int8": int8}


def fixture(parity_dir, name):
    d = json.loads((parity_dir / f"{name}.json").read_text())
    return d, Prompt(ids=d["prompt_ids"], ref_rows=d["ref_rows"])


def prompts(parity_dir):
    return [fixture(parity_dir, "voice_clone")[1], fixture(parity_dir, "zero_shot")[1]]


def settings(n, temperature):
    return [SamplingParams(temperature=temperature, seed=100 + i, max_frames=30 + 7 * i, repeat_guard=None)
            for i in range(n)]


def alone(engine, prompt, params):
    return engine.predict(prompt=prompt, params=params)


def test_min_rows_makes_every_row_count_alike(engines):
    """The calibrated padding is what makes a row independent of M: every M in [min_rows, max_rows]
    gives the same rows in every decode matmul shape (int8's packed matrices included)."""
    for engine in engines.values():
        model = engine.model
        low = model.min_rows
        assert engine.info.min_rows == low and 1 <= low <= model.max_rows == 16
        for w in (model.layers[0].self_attn.wqkv, model.layers[0].mlp.w_down, model.audio_embedding.weight):
            x = torch.randn(16, w.shape[1]).to(model.dtype)
            want = linear(x, w)
            for m in range(low, 17):
                assert torch.equal(linear(x[:m], w), want[:m])


@pytest.mark.parametrize("precision", ["fp32", "bf16", "int8"])
def test_decode_logits_bit_identical_in_any_company_and_slot(engines, precision):
    """The property itself, below sampling (a sampled code rarely flips on a 1e-7 logit change, so
    codes alone would not catch a broken padding): one sequence's logits are the same bits alone and at
    any row of a batch of 2, 3 or 8, whatever slot it sits in and whatever positions the others are at.
    Without the padding to `min_rows` this fails for fp32 on this machine's GEMM (M = 1, 2 and ≥ 3 sum
    in different orders)."""
    model = engines[precision].model
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(100, 5000, (8, 30), generator=gen)
    rows = torch.randint(0, 1024, (8, 8), generator=gen)
    lengths = [30 - 2 * i for i in range(8)]
    with torch.inference_mode():
        for slot in range(8):
            model.prefill(ids[slot, :lengths[slot]], None, 0, slot=slot)
        ref = model.decode_rows(rows[:1], [0], [lengths[0]])[0]
        for b in (2, 3, 8):
            for at in {0, b - 1}:
                order = [*range(1, b)]
                order.insert(at, 0)
                out = model.decode_rows(rows[order], order, [lengths[i] for i in order])
                assert torch.equal(out[at], ref)
        # the same sequence in another slot (same prompt, same position) computes the same bits
        model.prefill(ids[0, :lengths[0]], None, 0, slot=5)
        out = model.decode_rows(rows[[1, 0]], [1, 5], [lengths[1], lengths[0]])
        assert torch.equal(out[1], ref)


@pytest.mark.parametrize("precision", ["fp32", "bf16", "int8"])
@pytest.mark.parametrize("temperature", [0.8, 0.0])
@pytest.mark.parametrize("n", [2, 3, 8])
def test_codes_alone_equal_codes_in_a_batch(engines, parity_dir, precision, temperature, n):
    engine = engines[precision]
    items = [prompts(parity_dir)[i % 2] for i in range(n)]
    params = settings(n, temperature)
    want = [alone(engine, p, s) for p, s in zip(items, params)]
    got = engine.generate_batch(items, params)
    assert engine.scheduler.largest >= 2
    for chunk, ref in zip(got, want):
        assert torch.equal(chunk.codes, ref)
        assert chunk.metrics.batch >= 2 and chunk.metrics.seed is not None


def test_a_batch_starts_as_one_even_when_its_threads_start_late(fp32, parity_dir, monkeypatch):
    """generate_batch holds admission until every take waits: a thread descheduled for longer than the first
    take lasts (a loaded machine) still joins that take's batch."""
    real, calls = fp32._take, []

    def late(*args, **kwargs):
        calls.append(None)
        if len(calls) > 1:
            time.sleep(0.5)  # 30 frames of the first take take ~60 ms
        return real(*args, **kwargs)

    monkeypatch.setattr(fp32, "_take", late)
    got = fp32.generate_batch(prompts(parity_dir), settings(2, 0.8))
    assert [chunk.metrics.batch for chunk in got] == [2, 2]


@pytest.mark.parametrize("precision", ["fp32", "bf16", "int8"])
def test_joining_mid_way_and_a_cancel_change_nothing(engines, parity_dir, precision):
    engine = engines[precision]
    voice, zero = prompts(parity_dir)
    long = SamplingParams(temperature=0.8, seed=7, max_frames=80, repeat_guard=None)
    late = SamplingParams(temperature=0.8, seed=8, max_frames=30, repeat_guard=None)
    doomed = SamplingParams(temperature=0.8, seed=9, max_frames=80, repeat_guard=None)
    want_long, want_late = alone(engine, voice, long), alone(engine, zero, late)
    cancel = threading.Event()
    first = engine.generate_stream(prompt=voice, params=long)
    next(first)  # the long take is decoding; the others join its batch mid-way
    cancelled = engine.generate_stream(prompt=voice, params=doomed, cancel=cancel)
    next(cancelled)  # decoding beside the long take
    out = {}
    joiner = threading.Thread(target=lambda: out.update(late=engine.predict(prompt=zero, params=late)))
    joiner.start()
    cancel.set()
    stopped = [*cancelled][-1]
    chunks = [*first]
    joiner.join()
    assert torch.equal(chunks[-1].codes, want_long) and torch.equal(out["late"], want_late)
    assert chunks[-1].metrics.batch >= 2 and stopped.metrics.stop_reason == "cancelled"
    assert 0 < len(stopped.codes) < 80  # stopped early; its frames so far are its own
    assert torch.equal(stopped.codes, alone(engine, voice, doomed)[:len(stopped.codes)])


def test_fixture_greedy_frames_reproduced_in_a_batch(fp32, parity_dir):
    d, voice = fixture(parity_dir, "voice_clone")
    dz, zero = fixture(parity_dir, "zero_shot")
    greedy = SamplingParams(temperature=0, max_frames=d["predict_max_frames"], repeat_guard=None)
    others = settings(4, 0.8)
    got = fp32.generate_batch([voice, zero, voice, zero, voice, zero], [greedy, greedy.with_seed(1), *others])
    assert got[0].codes.tolist() == d["frames"] and got[1].codes.tolist() == dz["frames"]


def test_max_batch_respected_and_overflow_waits(parity_dir):
    engine = Engine.load(parity_dir / "tiny_checkpoint", device="cpu", precision="fp32", max_batch=2)
    voice, zero = prompts(parity_dir)
    params = settings(5, 0.8)
    want = [alone(engine, voice, p) for p in params]
    got = engine.generate_batch([voice] * 5, params)
    assert engine.scheduler.largest == 2
    assert all(torch.equal(c.codes, w) for c, w in zip(got, want))
    assert max(c.metrics.queued_ms for c in got) > 0 and all(c.metrics.batch <= 2 for c in got)


def test_cancelled_take_frees_its_slot(parity_dir):
    engine = Engine.load(parity_dir / "tiny_checkpoint", device="cpu", precision="fp32", max_batch=1)
    voice, zero = prompts(parity_dir)
    hog = engine.generate_stream(prompt=voice, params=SamplingParams(seed=1, max_frames=2000, repeat_guard=None))
    next(hog)
    done = {}
    waiter = threading.Thread(target=lambda: done.update(codes=engine.predict(
        prompt=zero, params=SamplingParams(seed=2, max_frames=10, repeat_guard=None))))
    waiter.start()
    waiter.join(0.5)
    assert waiter.is_alive()  # one slot, held by the long take: the newcomer waits
    # a queued take that is cancelled leaves the queue at once, without waiting for a slot
    cancel, gave_up = threading.Event(), {}
    quitter = threading.Thread(target=lambda: gave_up.update(chunks=list(engine.generate_stream(
        prompt=zero, params=SamplingParams(seed=3, max_frames=10), cancel=cancel))))
    quitter.start()
    cancel.set()
    quitter.join(10)
    assert not quitter.is_alive() and gave_up["chunks"][-1].metrics.stop_reason == "cancelled"
    assert waiter.is_alive() and not engine.scheduler.waiting[-1].stopped()
    hog.close()  # the long take leaves; its slot goes to the waiting take
    waiter.join(60)
    assert not waiter.is_alive() and len(done["codes"]) > 0


def test_each_take_has_its_own_metrics_and_stop(fp32, parity_dir):
    voice, zero = prompts(parity_dir)
    params = [SamplingParams(temperature=0.8, seed=5, max_frames=12, repeat_guard=None),
              SamplingParams(temperature=0.8, seed=6, max_frames=40, repeat_guard=None)]
    short, long = fp32.generate_batch([zero, voice], params, audio=True)
    assert (short.metrics.frames, long.metrics.frames) == (len(short.codes), len(long.codes))
    assert short.metrics.stop_reason in ("max_frames", "eoc") and short.metrics.frames <= 12
    assert long.metrics.frames > short.metrics.frames
    assert (short.metrics.seed, long.metrics.seed) == (5, 6)
    assert short.metrics.prompt_tokens == len(zero.ids) and long.metrics.prompt_tokens == len(voice.ids)
    assert len(short.audio) == 960 * short.metrics.frames and len(long.audio) == 960 * long.metrics.frames


def test_prefix_reused_per_slot_and_bit_identical_to_cold(parity_dir):
    engine = Engine.load(parity_dir / "tiny_checkpoint", device="cpu", precision="fp32", max_batch=4)
    voice, zero = prompts(parity_dir)
    params = settings(2, 0.8)
    cold = engine.generate_batch([voice, zero], params)  # slots 0 and 1 now hold the two prefixes
    assert [c.metrics.reused_tokens for c in cold] == [0, 0]
    warm = engine.generate_batch([zero, voice], params[::-1])  # each finds its prefix in its own slot
    assert [c.metrics.reused_tokens for c in warm] == [zero.prefix_len, voice.prefix_len]
    assert torch.equal(warm[0].codes, cold[1].codes) and torch.equal(warm[1].codes, cold[0].codes)
    # which take got slot 0 depends on which thread submitted first; each prefix sits in one slot
    assert set(engine.scheduler.keys[:2]) == {prefix_key(voice), prefix_key(zero)}


def test_streamed_chunks_do_not_depend_on_company(fp32, parity_dir):
    voice, zero = prompts(parity_dir)
    p = SamplingParams(temperature=0.8, seed=3, max_frames=60, repeat_guard=None)
    solo = list(fp32.generate_stream(prompt=voice, params=p))
    together = fp32.generate_batch([voice, zero, zero], [p, *settings(2, 0.8)], audio=True)[0]
    assert np.array_equal(np.concatenate([c.audio for c in solo]), together.audio)
    assert torch.equal(solo[-1].codes, together.codes)
