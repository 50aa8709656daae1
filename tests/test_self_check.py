"""The self-check before the cubin path is trusted, on the CPU under the Triton interpreter: correct kernels
pass; a deliberately broken GEMV/GEMM (zeroed output, transposed weight, FP8 weight scale off by 16×) fails,
and so do a broken fused path (the sampler's next-input embedding) and a broken bucket with padding rows
(every row attending with the last row's length); then `auto` falls back to the torch path with the
figures while an explicit `cubin` raises them."""

import pytest
import torch

pytest.importorskip("triton", reason="Triton is not installed (pip install -r requirements-dev.txt)")

from engine import backends
from engine.backends import cubin, self_check
from engine.checkpoint import load_checkpoint
from engine.model import HiggsModel
from kernels import ops
from tests import interp_rounding
from tests.helpers import BrokenJit
from tests.interp_step import fast_tiles

interp_rounding.install()

MAX_LEN = 64


@pytest.fixture(scope="module")
def tiny(parity_dir):
    ckpt = load_checkpoint(parity_dir / "tiny_checkpoint", progress=False)
    ref = HiggsModel.from_state_dict(ckpt.dims, ckpt.backbone, dtype=torch.bfloat16,
                                     max_len=len(self_check.SELF_CHECK_IDS) + self_check.SELF_CHECK_STEPS)
    with fast_tiles():  # the interpreter's cost is programs × loop steps: larger tiles (same kernels)
        yield ckpt, ref


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


PATH_FAULTS = {"fused rows": ("sample", fused_input_zeroed), "bucket 4 padding": ("decode_attention_batch",
                                                                               lengths_of_last_row)}


def run_check(ckpt, ref, precision, fault=None, monkeypatch=None):
    if fault in PATH_FAULTS:
        name, wrap = PATH_FAULTS[fault]
        monkeypatch.setattr(ops, name, wrap(getattr(ops, name)))
    elif fault is not None:
        monkeypatch.setattr(ops, "gemv_kernel", BrokenJit(ops.gemv_kernel, fault))
        monkeypatch.setattr(ops, "gemm_kernel", BrokenJit(ops.gemm_kernel, fault))
    backend = cubin.CubinBackend(ckpt.dims, ckpt.backbone, ops=ops, device="cpu", precision=precision,
                                 max_len=MAX_LEN, calibration_steps=2)
    return self_check.self_check(backend, ref)


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["bf16", "fp8"])
def test_correct_kernels_pass(tiny, precision):
    check = run_check(*tiny, precision)
    print(check.summary)
    assert check.ok, check.summary
    # the batched step's too: slot 0 in bucket 1, then slot 1 in bucket 4 beside padding rows
    assert check.total == 8 * (1 + self_check.SELF_CHECK_STEPS + self_check.SELF_CHECK_ROWS_STEPS + 1)
    assert check.rows_total == 1 + 2 + 3 + 4 and check.rows_greedy >= 0.5 * check.rows_total  # fused rows(4)
    assert check.summary.startswith("passed: ") and f"{precision} logits" in check.summary
    assert not check.stopped_at and "stopped" not in check.summary


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
    assert check.total == 8 and check.rows_total == 0


@pytest.mark.slow
@pytest.mark.parametrize("fault", list(PATH_FAULTS))
def test_broken_production_paths_fail(tiny, fault, monkeypatch):
    """Each fault leaves the teacher-forced steps and bucket 1 right: only the new parts can catch it."""
    check = run_check(*tiny, "bf16", fault, monkeypatch)
    print(check.summary)
    assert not check.ok and check.summary.startswith("FAILED: ")
    if fault == "fused rows":
        assert check.cosine_min >= self_check.SELF_CHECK_MIN_COSINE["bf16"]
        assert check.rows_greedy < self_check.SELF_CHECK_MIN_GREEDY["bf16"] * check.rows_total
        assert not check.stopped_at
    else:
        assert check.cosine_min < self_check.SELF_CHECK_MIN_COSINE["bf16"]
        assert check.stopped_at == f"slot 1 of bucket {self_check.SELF_CHECK_BUCKET}"


def test_thresholds_and_nan():
    good = self_check.SelfCheck("fp8", 0.995, 60, 72, 0.5, 9, 10)
    assert good.ok and "cosine min 0.9950 (needs 0.98)" in good.summary and "greedy 60/72" in good.summary
    assert "fused greedy rows 9/10" in good.summary
    assert not self_check.SelfCheck("fp8", 0.995, 30, 72, 0.5, 9, 10).ok  # agreement under the floor
    assert not self_check.SelfCheck("fp8", 0.995, 60, 72, 0.5, 4, 10).ok  # the fused rows under it
    assert not self_check.SelfCheck("fp8", 0.995, 60, 72, 0.5).ok         # no fused rows checked: not trusted
    assert not self_check.SelfCheck("bf16", 0.998, 72, 72, 0.5, 10, 10).ok  # bf16 holds the tighter cosine
    assert not self_check.SelfCheck("bf16", 0.9999, 8, 8, 0.5, 10, 10, "decode step 1").ok  # it stopped there
    x = torch.ones(8, 4)
    assert self_check._cosine(x * float("nan"), x) == -1.0 and self_check._cosine(x, x) == pytest.approx(1.0)
    assert self_check._cosine(torch.zeros(8, 4), x) == pytest.approx(0.0)


def test_the_check_prompt_starts_with_the_calibration_prompt():
    ids = self_check.SELF_CHECK_IDS
    assert len(ids) == 32 and ids[:len(cubin.CALIBRATION_IDS)] == cubin.CALIBRATION_IDS


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
        info: dict = {}

    ckpt = type("C", (), {"dims": None, "backbone": None})()
    monkeypatch.setattr("kernels.runtime.CubinKernels", lambda index: Kernels())
    monkeypatch.setattr("kernels.runtime.cubin_ops", lambda kernels: None)
    monkeypatch.setattr(cubin, "CubinBackend", lambda *a, **k: Backend())
    monkeypatch.setattr(cubin, "run_self_check",
                        lambda backend, checkpoint: self_check.SelfCheck("bf16", 0.9999, 72, 72, 0.3, 10, 10))
    be = cubin.load(ckpt, device="cpu", precision="bf16")
    assert be.info["self_check"].startswith("passed: ")
    assert be.info["kernel_loader"] == "cuda.core (PyCUDA is not installed)"
    monkeypatch.setattr(cubin, "run_self_check",
                        lambda backend, checkpoint: self_check.SelfCheck("bf16", 0.2, 10, 72, 0.3, 10, 10))
    with pytest.raises(self_check.SelfCheckFailed, match="FAILED: bf16 logits vs the torch path, cosine min 0.2000"):
        cubin.load(ckpt, device="cpu", precision="bf16")
