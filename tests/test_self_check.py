"""The self-check before the cubin path is trusted, on the CPU under the Triton interpreter: correct kernels
pass, at production's sizes (a long context whose decode step has data in every attention split, prefill at
offsets with reference audio rows, buckets 8 and 16 over three slots, rows sampled at T > 0 against the host
sampler); a deliberately broken GEMV/GEMM (zeroed output, transposed weight, FP8 weight scale off by 16×)
fails, and so do a broken fused path (the sampler's next-input embedding), a broken bucket with padding rows
(every row attending with the last row's length), a combine that drops the splits past the first, KV written
one split early, and a device sampler drawing with another seed, the long-context faults where the old
40-position check passed; then `auto` falls back through the bf16 cubins and torch-graph with every reason
kept, while an explicit `cubin` raises them."""

import math

import pytest
import torch

pytest.importorskip("triton", reason="Triton is not installed (pip install -r requirements-dev.txt)")

from engine import backends
from engine.backends import calibration, cubin, self_check
from engine.checkpoint import load_checkpoint
from engine.model import HiggsModel
from kernels import manifest as mf
from kernels import ops
from tests import interp_rounding
from tests.helpers import BrokenJit
from tests.interp_step import fast_tiles

interp_rounding.install()

MAX_LEN = 64  # the check grows the caches it needs and gives them back
# Production's sizes where they matter (the context, its step at position 1,000, the buckets, the sampled
# rows); the prefill at the offset is 16 positions, not 320 (the interpreter runs ~0.1 s per prefill position).
PRODUCTION = {"prefill": 16}
# Without the long context and the buckets above 4 (FP8, and the faults of the first part).
SHORT = {"context": 0, "buckets": (), "sampled_rows": 2}
# A first part of the fewest steps (its parts are checked at production's sizes above): for the faults.
MINIMAL = {"ids": self_check.SELF_CHECK_IDS[:8], "steps": 2, "rows_steps": 1, "fused_rows": 1}
# Comparisons at production's sizes: prefill, 8 steps, 2 batched, bucket 4; the long prefill and its step;
# slot 2's prefill with audio rows; 3 takes in each of buckets 8 and 16.
COMPARED = 1 + 8 + 2 + 1 + 1 + 1 + 1 + 2 * 3


@pytest.fixture(scope="module")
def tiny(parity_dir):
    ckpt = load_checkpoint(parity_dir / "tiny_checkpoint", progress=False)
    ref = HiggsModel.from_state_dict(ckpt.dims, ckpt.backbone, dtype=torch.bfloat16, max_len=MAX_LEN)
    with fast_tiles():  # the interpreter's cost is programs × loop steps: larger tiles (same kernels)
        yield ckpt, ref


def production_tiles() -> dict:
    """The decode attention's tiles as the committed cubins are built (16 splits of 64 positions)."""
    return mf.load(90).kernels["decode_attn_fused_d16"].constexprs


@pytest.fixture
def cubin_splits():
    """The decode attention split as the committed cubins split it, not as fast_tiles (4 of 256 at 1,000
    positions): the splits' count."""
    built, saved = production_tiles(), dict(ops.DECODE_TILES)
    ops.DECODE_TILES.update(NUM_SPLITS=built["NUM_SPLITS"], BLOCK_S=built["BLOCK_S"])
    yield built["NUM_SPLITS"]
    ops.DECODE_TILES.update(saved)


def splits_with_data(seq_len: int, splits: int, block: int) -> int:
    """How many of the decode attention's splits hold positions at `seq_len` (kernels/attention.py's chunking)."""
    chunk = math.ceil(math.ceil(seq_len / splits) / block) * block
    return sum(1 for split in range(splits) if split * chunk < seq_len)


def fused_input_zeroed(sample):
    """ops.sample writing the next step's input embedding as zeros: only the fused `rows` path uses it."""
    def broken(logits, audio_w, state, params, rows, x_row, *rest):
        sample(logits, audio_w, state, params, rows, x_row, *rest)
        x_row.zero_()
    return broken


def lengths_of_last_row(attention):
    """Batched attention reading every row's length from the last row: right in bucket 1, wrong as soon as
    padding rows (length 1) follow a take."""
    def broken(q, kc, vc, slots, lens, **kwargs):
        return attention(q, kc, vc, slots, lens[-1:].expand_as(lens).contiguous(), **kwargs)
    return broken


def another_seed(sampler_state):
    """The device sampler's state built from the take's seed + 1: greedy rows are right, sampled ones are not."""
    def broken(seed, *args):
        return sampler_state(seed + 1, *args)
    return broken


def without_the_prefix(attention):
    """Prefill attention that sees only its own segment, not the cached positions before its offset (a
    prefix reuse bug): right for any prefill at position 0, as every prefill of the 40-position check is."""
    def broken(q, k_cache, v_cache, pos, **kwargs):
        start = int(pos[0])
        return attention(q, k_cache[:, start:], v_cache[:, start:], torch.zeros_like(pos), **kwargs)
    return broken


class FirstSplitCombine:
    """ops.attn_combine_kernel merging only split 0's partial (the others emptied first): bit for bit the real
    combine while every position is in split 0, wrong once splits past it hold data."""

    def __init__(self, jit):
        self.jit = jit

    def __getitem__(self, grid):
        def launch(m_part, l_part, acc_part, out, **kwargs):
            splits = kwargs["NUM_SPLITS"]
            m_part.view(-1, splits)[:, 1:] = float("-inf")
            l_part.view(-1, splits)[:, 1:] = 0
            acc_part.view(-1, splits, kwargs["HEAD_DIM"])[:, 1:] = 0
            self.jit[grid](m_part, l_part, acc_part, out, **kwargs)
        return launch


PATH_FAULTS = {"fused rows": ("sample", fused_input_zeroed),
               "bucket 4 padding": ("decode_attention_batch", lengths_of_last_row),
               "sampling seed": ("sampler_state", another_seed)}
LONG_FAULTS = {"combine of split 0": ("attn_combine_kernel", FirstSplitCombine),
               "prefill without the prefix": ("prefill_attention", without_the_prefix)}


def run_check(ckpt, ref, precision, fault=None, monkeypatch=None, **sizes):
    if fault in PATH_FAULTS or fault in LONG_FAULTS:
        name, wrap = {**PATH_FAULTS, **LONG_FAULTS}[fault]
        monkeypatch.setattr(ops, name, wrap(getattr(ops, name)))
    elif fault is not None:
        monkeypatch.setattr(ops, "gemv_kernel", BrokenJit(ops.gemv_kernel, fault))
        monkeypatch.setattr(ops, "gemm_kernel", BrokenJit(ops.gemm_kernel, fault))
    backend = cubin.CubinBackend(ckpt.dims, ckpt.backbone, ops=ops, device="cpu", precision=precision,
                                 max_len=MAX_LEN, calibration_steps=2)
    check = self_check.self_check(backend, ref, **sizes)
    assert backend.slots == 1 and backend.max_len == MAX_LEN  # given back
    return check


def recording_splits(monkeypatch) -> list[int]:
    """Record, for every single-row and batched decode attention, the most splits that held data (a split's
    partial max is finite only when it attended to a position)."""
    seen = []
    fused, batch = ops.decode_attention_fused, ops.decode_attention_batch

    def fused_recorded(*args, scratch, **kwargs):
        out = fused(*args, scratch=scratch, **kwargs)
        seen.append(int(torch.isfinite(scratch[0].view(-1, ops.DECODE_TILES["NUM_SPLITS"])).sum(1).max()))
        return out

    def batch_recorded(q, *args, scratch=None, **kwargs):
        out = batch(q, *args, scratch=scratch, **kwargs)
        seen.append(int(torch.isfinite(scratch[0][:q.shape[0] * q.shape[1] * ops.DECODE_TILES["NUM_SPLITS"]]
                                       .view(-1, ops.DECODE_TILES["NUM_SPLITS"])).sum(1).max()))
        return out

    monkeypatch.setattr(ops, "decode_attention_fused", fused_recorded)
    monkeypatch.setattr(ops, "decode_attention_batch", batch_recorded)
    return seen


@pytest.mark.slow
def test_correct_kernels_pass_at_production_sizes(tiny, monkeypatch):
    """Production's sizes through the interpreter: the long step at position 1,000 has data in every split of
    the single-row and the batched attention, as tiled here (fast_tiles: 4 of 256 positions) and as the
    committed cubins are (16 of 64, by their chunking), and everything passes."""
    splits = recording_splits(monkeypatch)
    check = run_check(*tiny, "bf16", **PRODUCTION)
    print(check.summary)
    assert check.ok, check.summary
    assert check.total == 8 * COMPARED
    assert check.rows_total == 1 + 2 + 3 + 4 and check.rows_greedy >= 0.9 * check.rows_total  # fused rows(4)
    assert check.sampled_total == 1 + 2 + 3 + 4 and check.sampled_same + check.sampled_boundary == 10
    assert check.summary.startswith("passed: ") and "bf16 logits" in check.summary
    assert not check.stopped_at and "stopped" not in check.summary
    assert ("32-token prompt + 8 steps + 2 batched steps + 1 in bucket 4 (slot 1 holding the prompt as a kept "
            "prefix, padding rows), a long context to position 1000 (940 positions of the reference's KV as a kept "
            "prefix, then a prefill of 16 at offset 984 with 8 reference audio rows), a step at position 1000, "
            "buckets 8 and 16 (takes in slots 0-2; slot 2 holding slot 1's prompt and 4 reference audio rows "
            "prefilled at offset 32); fused greedy rows 10/10; sampled at T 0.8 / top-k 30 / top-p 0.8: ") in \
        check.summary
    # every split holds data: in the partials the kernels wrote here, and by the cubins' chunking
    assert max(splits) == ops.DECODE_TILES["NUM_SPLITS"] == 4
    built = production_tiles()
    for seq_len in (self_check.SELF_CHECK_CONTEXT + 1, self_check.SELF_CHECK_CONTEXT + self_check.SELF_CHECK_SAMPLED_ROWS):
        assert splits_with_data(seq_len, built["NUM_SPLITS"], built["BLOCK_S"]) == built["NUM_SPLITS"] == 16
        assert splits_with_data(seq_len, 4, ops.DECODE_TILES["BLOCK_S"]) == 4
    old = len(self_check.SELF_CHECK_IDS) + self_check.SELF_CHECK_STEPS  # the 40-position check: split 0 alone
    assert splits_with_data(old, built["NUM_SPLITS"], built["BLOCK_S"]) == splits_with_data(old, 4, 64) == 1


@pytest.mark.slow
def test_fp8_passes(tiny):
    check = run_check(*tiny, "fp8", **SHORT)
    print(check.summary)
    assert check.ok, check.summary
    assert check.total == 8 * (1 + 8 + 2 + 1 + 1) and check.rows_total == 10 and check.sampled_total == 1 + 2
    assert check.summary.startswith("passed: fp8 logits") and "a step at position 44;" in check.summary


@pytest.mark.slow
@pytest.mark.parametrize("fault", list(LONG_FAULTS))
def test_long_context_faults_fail_where_the_old_check_passed(tiny, fault, cubin_splits, monkeypatch):
    """With the decode attention split as the cubins split it, each fault leaves every comparison of the first
    part right (where, as in the old 40-position check, split 0 alone holds data); the long context, where
    all 16 splits do, catches it."""
    splits = recording_splits(monkeypatch)
    check = run_check(*tiny, "bf16", fault, monkeypatch, **MINIMAL, prefill=16, sampled_rows=1)
    print(check.summary)
    assert not check.ok and check.summary.startswith("FAILED: ")
    assert check.total > 8 * (1 + 2 + 1 + 1) and check.rows_total == 1
    assert check.rows_greedy == 1  # the first part passed: the old check would have trusted these kernels
    if fault == "combine of split 0":  # the single-row step combines in its own kernel; the batched step does not
        assert check.stopped_at == "slot 0 of bucket 8 at position 1000"
        # every step of the first part had data in split 0 alone; the single-row step at position 1000 in all 16
        # (the batched step's partials past split 0 are emptied by the fault before they are recorded)
        assert cubin_splits == 16 == max(splits) and set(splits[:splits.index(16)]) == {1}
    else:
        assert check.stopped_at == "the prefill at offset 984 (16 positions, 8 reference audio rows)"


@pytest.mark.slow
@pytest.mark.parametrize("precision,fault", [("bf16", "zeroed"), ("bf16", "transposed"), ("fp8", "scale16")])
def test_broken_kernels_fail(tiny, precision, fault, monkeypatch):
    check = run_check(*tiny, precision, fault, monkeypatch)
    print(check.summary)
    assert not check.ok, check.summary
    assert check.cosine_min < self_check.SELF_CHECK_MIN_COSINE[precision]
    assert check.summary.startswith("FAILED: ")
    # a broken GEMM is wrong from the prompt on: the check ends there, and says so
    assert check.stopped_at == "the prefill" and "stopped at the first failing comparison: the prefill" in check.summary
    assert check.total == 8 and check.rows_total == 0 and check.sampled_total == 0


@pytest.mark.slow
@pytest.mark.parametrize("fault", list(PATH_FAULTS))
def test_broken_production_paths_fail(tiny, fault, monkeypatch):
    """Each fault leaves the teacher-forced steps and bucket 1 right: only the new parts can catch it."""
    sizes = {**SHORT, **MINIMAL, "fused_rows": 4, "sampled_rows": 4}
    check = run_check(*tiny, "bf16", fault, monkeypatch, **sizes)
    print(check.summary)
    assert not check.ok and check.summary.startswith("FAILED: ")
    if fault == "fused rows":  # its rows are wrong, and so is the KV they leave for the next step
        assert check.rows_greedy < self_check.SELF_CHECK_MIN_GREEDY["bf16"] * check.rows_total
        assert check.stopped_at == "the decode step at position 14"
    elif fault == "sampling seed":  # every logit right, the greedy rows too: only the sampled picks differ
        assert check.cosine_min >= self_check.SELF_CHECK_MIN_COSINE["bf16"] and not check.stopped_at
        assert check.rows_greedy >= 0.9 * check.rows_total and check.sampled_total == 1 + 2 + 3 + 4
        assert check.sampled_same + check.sampled_boundary < check.sampled_total
    else:
        assert check.cosine_min < self_check.SELF_CHECK_MIN_COSINE["bf16"]
        assert check.stopped_at == f"slot 1 of bucket {self_check.SELF_CHECK_BUCKET}"


def test_thresholds_and_nan():
    sampled = {"sampled_same": 9, "sampled_boundary": 1, "sampled_total": 10}
    good = self_check.SelfCheck("fp8", 0.995, 60, 72, 0.5, 9, 10, **sampled, ran="a 32-token prompt")
    assert good.ok and "cosine min 0.9950 (needs 0.98)" in good.summary and "greedy 60/72" in good.summary
    assert "a 32-token prompt; fused greedy rows 9/10; " in good.summary
    assert ": 9/10 picks the host sampler's, 1 within rounding of a boundary (needs all); " in good.summary
    assert not self_check.SelfCheck("fp8", 0.995, 30, 72, 0.5, 9, 10, **sampled).ok  # agreement under the floor
    assert not self_check.SelfCheck("fp8", 0.995, 60, 72, 0.5, 4, 10, **sampled).ok  # the fused rows under it
    assert not self_check.SelfCheck("fp8", 0.995, 60, 72, 0.5, **sampled).ok         # no fused rows checked
    assert not self_check.SelfCheck("fp8", 0.995, 60, 72, 0.5, 9, 10).ok             # no sampled rows checked
    assert not self_check.SelfCheck("fp8", 0.995, 60, 72, 0.5, 9, 10, sampled_same=8, sampled_boundary=1,
                                    sampled_total=10).ok  # one pick off the host's, away from any boundary
    assert not self_check.SelfCheck("bf16", 0.998, 72, 72, 0.5, 10, 10, **sampled).ok  # the tighter cosine
    assert not self_check.SelfCheck("bf16", 0.9999, 8, 8, 0.5, 10, 10, "decode step 1", **sampled).ok  # stopped
    x = torch.ones(8, 4)
    assert self_check._cosine(x * float("nan"), x) == -1.0 and self_check._cosine(x, x) == pytest.approx(1.0)
    assert self_check._cosine(torch.zeros(8, 4), x) == pytest.approx(0.0)


def test_a_pick_at_a_boundary_is_told_from_a_wrong_one():
    """A pick the host sampler makes with its draw moved by under 1e-5 counts as a rounding difference; one
    far from the draw does not."""
    from engine.sampling import sample

    temperature, top_k, top_p = self_check.SELF_CHECK_SAMPLING
    logits = torch.linspace(0, 3, 1026)

    def pick(u):
        return int(sample(logits[None], torch.tensor([u]), temperature, top_k, top_p)[0])

    lo, hi = 0.5, 0.9  # bisect the draw down to a boundary between two picks
    assert pick(lo) != pick(hi)
    while hi - lo > 1e-7:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if pick(mid) == pick(lo) else (lo, mid)
    assert self_check._at_boundary(logits, hi, pick(lo)) and self_check._at_boundary(logits, lo, pick(hi))
    assert not self_check._at_boundary(logits, 0.05, pick(hi))


def test_the_long_prompt_is_fixed_and_shaped_like_a_voice_clone_prompt():
    ids, rows = self_check.long_prompt(load_dims(), 956)
    assert len(ids) == 956 and (ids[:8] >= 0).all() and (ids[-8:] >= 0).all() and (ids[8:-8] == -100).all()
    assert rows.shape == (940, 8) and 0 <= rows.min() and rows.max() < 1024
    again = self_check.long_prompt(load_dims(), 956)
    assert torch.equal(ids, again[0]) and torch.equal(rows, again[1])
    (kept, kept_rows), (tail, tail_rows) = self_check._split(ids, rows, 940)
    assert len(kept) == 940 and len(kept_rows) == 932 and len(tail) == 16 and len(tail_rows) == 8
    assert torch.equal(torch.cat([kept_rows, tail_rows]), rows)
    assert (self_check.long_ids(3) == -100).sum() == 1 and (self_check.long_ids(1) == -100).all()


def load_dims():
    from engine.config import Dims

    return Dims(hidden=64, intermediate=128, layers=2, heads=4, kv_heads=2, head_dim=16, vocab=151936,
                rms_eps=1e-6, rope_theta=1e6, max_positions=4096)


def test_the_check_prompt_starts_with_the_calibration_prompt():
    ids = self_check.SELF_CHECK_IDS
    assert len(ids) == 32 and ids[:len(calibration.CALIBRATION_IDS)] == calibration.CALIBRATION_IDS


def test_failed_check_falls_back_under_auto_and_raises_when_explicit(monkeypatch):
    """The engine's start policy with the cubin factory's failure: auto → torch with the figures as the
    reason; backend="cubin" → BackendUnavailable carrying them."""
    failed = self_check.SelfCheck("fp8", 0.12, 3, 72, 0.4)

    def cubin_factory():
        raise self_check.SelfCheckFailed(f"the cubin kernels' self-check {failed.summary}")

    torch_model = object()

    def torch_factory():
        return torch_model

    monkeypatch.setitem(backends.BACKENDS, "torch", torch_factory)
    make = {cubin_factory: cubin_factory, torch_factory: torch_factory}
    model, name, reason = backends.start("cubin", cubin_factory, auto=True, reason=None,
                                                  make=lambda f: make[f]())
    assert model is torch_model and name == "torch"
    assert "self-check FAILED" in reason and "cosine min 0.1200" in reason and "torch path" in reason
    with pytest.raises(backends.BackendUnavailable, match="cosine min 0.1200"):
        backends.start("cubin", cubin_factory, auto=False, reason=None, make=lambda f: make[f]())


def test_load_runs_the_check_and_reports_it(monkeypatch):
    """`load` (the engine hook) refuses a backend whose check fails and records the figures of one that
    passes; the kernels and weights are stand-ins, the policy is the real one."""
    class Kernels:
        manifest = type("M", (), {"target": "sm_90a"})()
        loader_name, loader_reason, stream = "cuda.core", "PyCUDA is not installed", None

    class Backend:
        def __init__(self):
            self.info: dict = {}

    ckpt = type("C", (), {"dims": None, "backbone": None})()
    monkeypatch.setattr("kernels.runtime.CubinKernels", lambda index: Kernels())
    monkeypatch.setattr("kernels.runtime.cubin_ops", lambda kernels: None)
    monkeypatch.setattr(cubin, "CubinBackend", lambda *a, **k: Backend())
    monkeypatch.setattr(cubin, "run_self_check",
                        lambda backend, checkpoint: self_check.SelfCheck("bf16", 0.9999, 72, 72, 0.3, 10, 10,
                                                                         sampled_same=10, sampled_total=10))
    be = cubin.load(ckpt, device="cpu", precision="bf16")
    assert be.info["self_check"].startswith("passed: ")
    assert be.info["kernel_loader"] == "cuda.core (PyCUDA is not installed)"
    monkeypatch.setattr(cubin, "run_self_check",
                        lambda backend, checkpoint: self_check.SelfCheck("bf16", 0.2, 10, 72, 0.3, 10, 10))
    with pytest.raises(self_check.SelfCheckFailed, match="FAILED: bf16 logits vs the torch path, cosine min 0.2000"):
        cubin.load(ckpt, device="cpu", precision="bf16")
