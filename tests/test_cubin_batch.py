"""The cubin backend's batched step on the CPU: `decode_rows` over per-slot caches, run by Triton's
interpreter on the tiny checkpoints. A take's logits are the same bits alone and in any company and slot
(batch invariance by construction, engine/backends/cubin.py), close to the torch reference, and an Engine
with max_batch > 1 on this backend gives a take the same codes alone and in a running batch.

Two ways to run the kernels: `cubin_ops(InterpretedKernels(manifest))`, every launch resolved against the
committed manifest exactly as on a GPU (the invariance test, which thereby also checks that every kernel the
batched step launches has its cubin), and plain `kernels.ops` with larger tiles (`fast`), for the tests that
run many steps: interpreter time grows with programs, and each kernel's production tiling has its own test
(tests/test_kernels_batch*.py)."""

import json
import threading
import time
from contextlib import contextmanager

import pytest
import torch

pytest.importorskip("triton", reason="Triton is not installed (pip install -r requirements-dev.txt)")

from engine.backends.cubin import ROW_BUCKETS, CubinBackend
from engine.checkpoint import load_checkpoint
from engine.generate import Engine
from engine.model import HiggsModel, rel_error
from engine.prompt import Prompt, zero_shot_ids
from engine.types import EngineInfo, SamplingParams
from kernels import manifest as mf
from kernels import ops
from kernels.runtime import InterpretedKernels, cubin_ops
from tests import interp_rounding
from tests.helpers import BrokenJit, cosine
from tests.interp_step import fast_tiles

interp_rounding.install()

MAX_LEN = 64


@contextmanager
def fast():
    """tests/interp_step.py's fast tiles, and skinny GEMMs of 1024 weight rows per program (the head's 8208
    rows in 9 programs instead of 129); the 16-row activation tile, which batch invariance rests on, stays."""
    saved = {kind: dict(t) for kind, t in ops.SKINNY_TILES.items()}
    with fast_tiles():
        for tiles in ops.SKINNY_TILES.values():
            tiles["BLOCK_N"] = 1024
        try:
            yield
        finally:
            for kind, tiles in saved.items():
                ops.SKINNY_TILES[kind].update(tiles)


@pytest.fixture(scope="module")
def parity(parity_dir):
    ckpt = load_checkpoint(parity_dir / "tiny_checkpoint", progress=False)
    ids = torch.tensor(json.loads((parity_dir / "zero_shot.json").read_text())["prompt_ids"])
    return ckpt, ids


def backend(ckpt, precision, *, kernels_ops=ops, slots=4):
    """Calibration runs 2 decode steps (the scales only need to be sane here; see test_cubin_backend)."""
    be = CubinBackend(ckpt.dims, ckpt.backbone, ops=kernels_ops, device="cpu", precision=precision, max_len=MAX_LEN,
                      calibration_steps=2)
    be.setup_slots(slots)
    return be


def test_buckets():
    assert ROW_BUCKETS == (1, 4, 8, 16)
    assert [CubinBackend.bucket(m) for m in range(1, 17)] == [1, *[4] * 3, *[8] * 4, *[16] * 8]


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["bf16", "fp8"])
def test_decode_rows_bit_identical_alone_and_in_any_company_and_slot(parity, precision):
    """One take's logits: the same bits alone (bucket 1), at either end of a batch of 2 or 3 (bucket 4) beside
    takes at other positions, and in another slot holding the same prefill. Every launch goes through the
    committed manifest (InterpretedKernels), so every kernel of the batched step has its cubin."""
    ckpt, ids = parity
    kernels = InterpretedKernels(mf.load(90))
    be = backend(ckpt, precision, kernels_ops=cubin_ops(kernels))
    lengths = [12, 9, 7]
    for slot, n in enumerate(lengths):
        be.prefill(ids[slot:slot + n], None, 0, slot=slot)
    be.prefill(ids[:lengths[0]], None, 0, slot=3)          # take 0's sequence again, in slot 3
    rows = torch.randint(0, 1024, (3, 8), generator=torch.Generator().manual_seed(1))
    ref = be.decode_rows(rows[:1], [0], [lengths[0]])[0]
    assert ref.shape == (8, 1026) and ref.dtype == torch.float32 and torch.isfinite(ref).all()
    for order in ([1, 0], [0, 2, 1]):
        out = be.decode_rows(rows[order], order, [lengths[i] for i in order])
        assert torch.equal(out[order.index(0)], ref), order
    out = be.decode_rows(rows[[2, 0]], [2, 3], [lengths[2], lengths[0]])
    assert torch.equal(out[1], ref)
    used = set(kernels.launches)
    gemms = {"gemm_skinny_w8a8", "gemm_skinny_w8a8_res_split", "gemm_skinny_w8a16_res_split"} if precision == "fp8" \
        else {"gemm_skinny_bf16", "gemm_skinny_bf16_res_split"}
    assert gemms | {"gemm_skinny_bf16_f32", "qk_norm_rope_kv_batch_d16", "decode_attn_batch_d16"} <= used, sorted(used)


@pytest.mark.slow
def test_padding_rows_write_nothing_and_graphs_are_per_bucket(parity):
    """A step of 3 takes runs in bucket 4: the fourth row is padding (code 0, slot 0, position -1, length 1);
    it leaves every cache cell but the takes' own untouched, and its logits are discarded."""
    ckpt, ids = parity
    with fast():
        be = backend(ckpt, "bf16")
        for slot in range(3):
            be.prefill(ids[:10 - slot], None, 0, slot=slot)
        before = [(L.kc.clone(), L.vc.clone()) for L in be.layers]
        rows = torch.randint(0, 1024, (3, 8), generator=torch.Generator().manual_seed(2))
        out = be.decode_rows(rows, [2, 0, 1], [8, 10, 9])
    assert out.shape == (3, 8, 1026) and tuple(sorted(be.row_graphs)) == ROW_BUCKETS  # captured at setup_slots
    assert be.b_meta[:, 3].tolist() == [0, -1, 1] and not be.b_rows[3].any()
    written = torch.zeros(be.slots, MAX_LEN, dtype=torch.bool)
    written[2, 8] = written[0, 10] = written[1, 9] = True
    for L, (k, v) in zip(be.layers, before):
        changed = (L.kc != k).any(-1).any(1) | (L.vc != v).any(-1).any(1)
        assert not (changed & ~written).any()                 # nothing but the takes' own positions
        assert changed[written].all()


@pytest.mark.slow
def test_more_than_16_takes_run_as_steps_of_at_most_16(parity):
    """17 takes: a step of 16 and a step of 1, each take's logits those of the take alone (zero caches: each
    attends to its own fresh key only, which is all this needs)."""
    ckpt, _ = parity
    with fast():
        be = backend(ckpt, "bf16", slots=17)
        rows = torch.randint(0, 1024, (17, 8), generator=torch.Generator().manual_seed(3))
        out = be.decode_rows(rows, list(range(17)), [3] * 17)
        assert tuple(sorted(be.row_graphs)) == ROW_BUCKETS
        for i in (0, 16):
            assert torch.equal(out[i], be.decode_rows(rows[i:i + 1], [i], [3])[0]), i


@pytest.mark.slow
def test_self_check_covers_the_batched_step(parity, monkeypatch):
    """The load-time self-check runs its last steps through decode_rows too: a skinny GEMM that writes
    nothing (the single-stream GEMVs untouched) fails it."""
    from engine.backends.self_check import SELF_CHECK_IDS, SELF_CHECK_MIN_COSINE, SELF_CHECK_STEPS, self_check

    ckpt, _ = parity
    ref = HiggsModel.from_state_dict(ckpt.dims, ckpt.backbone, dtype=torch.bfloat16,
                                     max_len=len(SELF_CHECK_IDS) + SELF_CHECK_STEPS)
    monkeypatch.setattr(ops, "skinny_gemm_kernel", BrokenJit(ops.skinny_gemm_kernel, "zeroed"))
    with fast():
        check = self_check(backend(ckpt, "bf16", slots=1), ref)
    assert not check.ok and check.cosine_min < SELF_CHECK_MIN_COSINE["bf16"], check.summary


def greedy(logits, step, boc):
    row = logits.argmax(-1)
    row[step + 1:] = boc                                        # the delay window: codebook k is BOC until step k
    return row


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["bf16", "fp8"])
def test_decode_rows_matches_the_torch_reference(parity, precision):
    """Teacher-forced on the reference's greedy rows, a take decoded beside another: BF16 within 3 % of the
    largest logit (test_cubin_backend's bound), FP8 W8A8/W8A16 cosine > 0.99 and max error within 20 %.
    Then, BF16, the free-running greedy take of decode_rows equals the reference's."""
    ckpt, ids = parity
    ref = HiggsModel.from_state_dict(ckpt.dims, ckpt.backbone, dtype=torch.float32, max_len=MAX_LEN)
    with fast():
        be = backend(ckpt, precision)
        n = len(ids)
        be.prefill(ids[:9], None, 0, slot=0)                   # the neighbour
        got, want = be.prefill(ids, None, 0, slot=2), ref.prefill(ids, None, 0)
        neighbour = torch.zeros(8, dtype=torch.long)
        cosines = []
        for step in range(3):
            row = greedy(want, step, ckpt.dims.boc)
            got = be.decode_rows(torch.stack([neighbour, row]), [0, 2], [9 + step, n + step])[1]
            want = ref.decode(row, n + step)
            cosines.append(cosine(got, want))
            if precision == "bf16":
                assert rel_error(got, want) < 3e-2, (step, rel_error(got, want))
            else:
                assert cosines[-1] > 0.99 and rel_error(got, want) < 0.2, (step, cosines[-1], rel_error(got, want))
        print(f"{precision} decode_rows vs torch, teacher-forced cosine: {[round(c, 5) for c in cosines]}")
        if precision == "fp8":
            return
        got, want = be.prefill(ids, None, 0, slot=1), ref.prefill(ids, None, 0)
        for step in range(6):
            a, b = greedy(got, step, ckpt.dims.boc), greedy(want, step, ckpt.dims.boc)
            assert a.tolist() == b.tolist(), step
            got = be.decode_rows(a[None], [1], [n + step])[0]
            want = ref.decode(b, n + step)


# ------------------------------------------------------------------------------------------- the engine
@pytest.fixture(scope="module")
def engine(tiny_checkpoint):
    """An Engine on the interpreted cubin backend (bf16) with the tiny checkpoint's codec, max_batch 3."""
    from engine.codec import Codec

    ckpt = load_checkpoint(tiny_checkpoint, progress=False)
    codec = Codec.from_state_dict(ckpt.codec, ckpt.codec_config)
    be = CubinBackend(ckpt.dims, ckpt.backbone, ops=ops, device="cpu", precision="bf16", max_len=MAX_LEN)
    return Engine(be, codec, None, ckpt.dims, EngineInfo(device="cpu", precision="bf16", backend="cubin"), max_batch=3)


def test_max_batch_picks_the_path(tiny_checkpoint):
    """max_batch 1 keeps the fused single-stream path (begin / rows, one slot); above 1 every take batches."""
    ckpt = load_checkpoint(tiny_checkpoint, progress=False)
    be = CubinBackend(ckpt.dims, ckpt.backbone, ops=ops, device="cpu", precision="bf16", max_len=MAX_LEN)
    info = EngineInfo(device="cpu", precision="bf16", backend="cubin")
    one = Engine(be, None, None, ckpt.dims, info, max_batch=1)
    assert one.scheduler is None and one.info.max_batch == 1 and be.slots == 1
    many = Engine(be, None, None, ckpt.dims, info, max_batch=5)
    assert many.scheduler is not None and many.info.max_batch == 5 and many.info.min_rows == 1
    assert be.slots == 5 and be.layers[0].kc.shape[0] == 5


def prompt(*text):
    return Prompt(ids=zero_shot_ids(list(text)))


def wait_for(condition, out, timeout=300.0):
    """Until `condition()`, failing at once when a take raised (its rows will never come) and after
    `timeout` seconds (a step of the interpreter takes seconds on a loaded machine)."""
    deadline = time.monotonic() + timeout
    while not condition():
        failed = {name: got for name, got in out.items() if isinstance(got, BaseException)}
        assert not failed, f"a take failed: {failed}"
        assert time.monotonic() < deadline, "the scheduler did not get there"
        time.sleep(0.02)


def rows_of(engine, seed):
    """Rows the running take with this seed has so far (0 before it is admitted)."""
    return next((len(t.rule.rows) for t in list(engine.scheduler.active) if t.params.seed == seed), 0)


@pytest.fixture
def fast_kernels():
    with fast():
        yield


@pytest.mark.slow
def test_engine_codes_alone_equal_codes_in_a_batch_with_a_joiner_and_a_cancel(engine, fast_kernels):
    """Takes alone, then together: a long take decoding alone, one joining it mid-way and cancelled after a
    few frames, and one joining later: every take's codes are its codes alone (the cancelled one's so far)."""
    first, late, doomed = prompt(9707, 11, 419, 374), prompt(2805, 22636), prompt(576, 4024, 6666)
    long = SamplingParams(temperature=0.8, seed=7, max_frames=16, repeat_guard=None)
    short = SamplingParams(temperature=0.8, seed=8, max_frames=3, repeat_guard=None)
    cut = SamplingParams(temperature=0.8, seed=9, max_frames=16, repeat_guard=None)
    want_long, want_late = engine.predict(prompt=first, params=long), engine.predict(prompt=late, params=short)
    assert engine.scheduler.largest == 1 and engine.info.max_batch == 3
    out, cancel = {}, threading.Event()

    def run(name, p, params, stop=None):
        try:
            out[name] = engine.predict(prompt=p, params=params, cancel=stop)
        except Exception as exc:  # the waits below fail on it instead of waiting for rows that never come
            out[name] = exc

    threads = [threading.Thread(target=run, args=("long", first, long))]
    threads[0].start()
    wait_for(lambda: rows_of(engine, 7) >= 2, out)             # decoding alone; the others join mid-way
    threads.append(threading.Thread(target=run, args=("cut", doomed, cut, cancel)))
    threads[1].start()
    wait_for(lambda: rows_of(engine, 9) >= 1, out)
    threads.append(threading.Thread(target=run, args=("late", late, short)))
    threads[2].start()
    wait_for(lambda: rows_of(engine, 9) >= 10, out)            # three frames or so, then stop it
    cancel.set()
    for t in threads:
        t.join()
    assert not [got for got in out.values() if isinstance(got, BaseException)], out
    assert engine.scheduler.largest == 3
    assert torch.equal(out["long"], want_long) and torch.equal(out["late"], want_late)
    assert 0 < len(out["cut"]) < 16
    # its frames so far are its own: a take alone with the same seed, capped at that length, gives them
    assert torch.equal(out["cut"], engine.predict(prompt=doomed, params=SamplingParams.of(
        cut, max_frames=len(out["cut"]))))


# ------------------------------------------------------------------------------------------- torch-graph
def test_torch_graph_engine_batches_above_max_batch_one(parity_dir):
    """torch-graph with max_batch > 1 runs `HiggsModel.decode_rows` under the scheduler: the same codes as the
    eager torch engine, alone and in a batch."""
    from engine.backends.torch_graph import TorchGraphBackend

    graph = Engine.load(parity_dir / "tiny_checkpoint", device="cpu", precision="fp32", backend="torch-graph",
                        max_batch=4)
    eager = Engine.load(parity_dir / "tiny_checkpoint", device="cpu", precision="fp32", max_batch=4)
    assert isinstance(graph.model, TorchGraphBackend) and graph.scheduler is not None
    assert graph.info.max_batch == 4 and graph.info.min_rows == graph.model.min_rows == eager.info.min_rows
    prompts = [prompt(9707, 11, 419), prompt(2805, 22636, 11652)]
    params = [SamplingParams(temperature=0.8, seed=3 + i, max_frames=12, repeat_guard=None) for i in range(2)]
    batch = graph.generate_batch(prompts, params)
    assert graph.scheduler.largest == 2
    for chunk, p, s in zip(batch, prompts, params):
        assert torch.equal(chunk.codes, graph.predict(prompt=p, params=s))
        assert torch.equal(chunk.codes, eager.predict(prompt=p, params=s))
