"""The GPU path hardened before its first run, on the CPU: trust decided in a probe process, the failed
backend freed before the fallback is built, the KV cache planned from the card and grown without losing
the old one, the launcher's stream discipline, the device check's sticky-error rows, one host transfer
per batched step."""

from __future__ import annotations

import contextlib
import json
import sys
import threading
import time
import weakref
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from bench import gpu_check, gpu_run
from engine import backends
from engine import device as engine_device
from engine.backends import memory, trust
from engine.config import FULL_SIZE
from kernels import manifest as mf
from kernels import runtime
from kernels.check import Row
from tests.helpers import kernel_entry, one_kernel_root

REPO = Path(__file__).resolve().parents[1]
GB = 1e9


# ------------------------------------------------------------------------------------- memory plan
@pytest.mark.parametrize("card_gb,weights_gb", [(16, 5.0), (16, 8.5), (24, 5.0), (24, 8.5), (80, 5.0), (141, 8.5)])
def test_memory_plan_fits_the_card_with_its_headroom(card_gb, weights_gb):
    """Fake cards (FP8 cubin weights ~5 GB, bf16 ~8.5 GB, 0.6 GB of context): the plan's cache plus its
    headroom fits in what is free, and uses it: one more slot would not fit."""
    total = int(card_gb * GB)
    free = total - int((weights_gb + 0.6) * GB)
    plan = memory.plan_kv(FULL_SIZE, free_bytes=free, total_bytes=total, max_batch=16, max_len=4096)
    per_slot = memory.kv_bytes_per_position(FULL_SIZE) * plan.positions
    assert 1 <= plan.slots <= 16 and plan.positions == 4096
    assert plan.kv_bytes == plan.slots * per_slot
    assert plan.kv_bytes + plan.headroom_bytes <= free
    assert plan.slots == 16 or plan.kv_bytes + per_slot + plan.headroom_bytes > free
    assert plan.headroom_bytes >= memory.HEADROOM_MIN_BYTES and plan.headroom_bytes >= 0.05 * total
    assert f"{plan.slots} slots × 4096 positions" in plan.summary
    if card_gb >= 80:
        assert plan.slots == 16 and "cut from" not in plan.summary
    if card_gb == 16:  # 16 × 4096 × 144 KiB = 9.7 GB does not fit beside the weights
        assert plan.slots < 16 and "cut from 16 × 4096" in plan.summary


def test_memory_plan_cuts_positions_only_when_one_slot_does_not_fit_and_refuses_below_that():
    per = memory.kv_bytes_per_position(FULL_SIZE)
    assert per == 36 * 2 * 8 * 128 * 2  # 144 KiB per position in bf16
    total = int(16 * GB)
    free = memory.HEADROOM_MIN_BYTES + 1000 * per
    plan = memory.plan_kv(FULL_SIZE, free_bytes=free, total_bytes=total, max_batch=4, max_len=4096)
    assert (plan.slots, plan.positions) == (1, 768)  # whole multiples of 256 below 1000
    with pytest.raises(memory.NotEnoughMemory, match="not enough for a KV cache of 256 positions"):
        memory.plan_kv(FULL_SIZE, free_bytes=memory.HEADROOM_MIN_BYTES + 100 * per, total_bytes=total,
                       max_batch=4, max_len=4096)


def test_engine_applies_the_plan_to_max_batch_and_the_cache(monkeypatch):
    """`_plan_memory` on a fake CUDA card: the slots become the engine's max_batch, and a cache longer
    than the plan's positions is cut to them."""
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (int(5.0 * GB), int(16 * GB)))
    model = SimpleNamespace(max_len=4096, setup_cache=lambda n: setattr(model, "max_len", n))
    slots, summary = engine_device.plan_memory(model, FULL_SIZE, torch.device("cuda"), 16, itemsize=2)
    assert slots == 4 and model.max_len == 4096 and summary.startswith("4 slots × 4096 positions")  # 3 GB / 0.6
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (int(2.4 * GB), int(16 * GB)))
    slots, summary = engine_device.plan_memory(model, FULL_SIZE, torch.device("cuda"), 16, itemsize=2)
    assert slots == 1 and model.max_len == 2560 and summary.startswith("1 slots × 2560 positions")
    assert engine_device.plan_memory(model, FULL_SIZE, torch.device("cpu"), 16, itemsize=2) == (16, None)


def test_torch_cache_growth_that_runs_out_of_memory_keeps_the_old_cache(parity_dir, monkeypatch):
    """HiggsModel.setup_cache: an out-of-memory after every layer's new cache is allocated (the RoPE
    table, last) leaves max_len, the caches and their contents as they were, with a sentence."""
    from engine import model as model_module
    from engine.checkpoint import load_checkpoint
    from engine.model import HiggsModel

    ckpt = load_checkpoint(parity_dir / "tiny_checkpoint", progress=False)
    m = HiggsModel.from_state_dict(ckpt.dims, ckpt.backbone, dtype=torch.float32, max_len=64)
    ids = torch.tensor(json.loads((parity_dir / "zero_shot.json").read_text())["prompt_ids"])
    want = m.prefill(ids)
    caches = [layer.self_attn.cache for layer in m.layers]
    keys = caches[0].k.clone()

    def oom(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory (injected)")

    real = model_module.rope_table
    monkeypatch.setattr(model_module, "rope_table", oom)
    with pytest.raises(ValueError, match="not enough memory to grow the KV cache to 128 positions \\(it keeps 64\\)"):
        m.setup_cache(128)
    assert m.max_len == 64 and [layer.self_attn.cache for layer in m.layers] == caches
    assert torch.equal(caches[0].k, keys) and m.cos.shape[0] == 64
    monkeypatch.setattr(model_module, "rope_table", real)
    m.setup_cache(128)  # the retry really grows (max_len was not set before the failure)
    assert m.max_len == 128 and m.layers[0].self_attn.cache.k.shape[1] == 128
    assert torch.equal(m.layers[0].self_attn.cache.k[:, :64], keys)
    assert torch.equal(m.prefill(ids), want)  # same op, same shapes, same cache contents


# ------------------------------------------------------------------------------------- start policy
class Held:
    """A stand-in backend of which the test keeps only a weak reference."""


def test_the_fallback_is_built_after_the_failed_backend_is_freed(monkeypatch):
    """The failed backend's frames (held by the handler's traceback) are gone before the fallback
    factory runs: no second backend is built while the first is referenced."""
    refs, seen = [], []

    def cubin_factory():
        backend = Held()
        backend.cycle = backend  # only the garbage collector frees a cycle
        refs.append(weakref.ref(backend))
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    def torch_graph_factory():
        seen.append(refs[0]() is None)
        return "torch-graph model"

    monkeypatch.setitem(backends.BACKENDS, "torch-graph", torch_graph_factory)
    model, name, reason = backends.start("cubin", cubin_factory, auto=True, reason=None,
                                                  fallback="torch-graph", make=lambda f: f())
    assert (model, name) == ("torch-graph model", "torch-graph") and seen == [True]
    assert "illegal memory access" in reason and reason.endswith("using the torch-graph path")
    with pytest.raises(backends.BackendUnavailable, match="illegal memory access.*restart with backend='torch'$"):
        backends.start("cubin", cubin_factory, auto=False, reason=None, make=lambda f: f())


STICKY_CHILD = """
import sys
from engine.backends import trust

def load(checkpoint, **kwargs):  # the cubin load whose calibration faults: a sticky error
    raise RuntimeError("CUDA error: an illegal memory access was encountered (cudaErrorIllegalAddress)")

sys.exit(trust.main(sys.argv[1:], load=load))
"""

CRASH_CHILD = "import os; os._exit(134)"


@pytest.fixture
def probe_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HIGGS_STUDIO_CACHE", str(tmp_path / "studio"))
    ident = {"gpu": "NVIDIA H200", "cc": 90, "driver": "550.54.15", "driver_cuda": 12040, "torch": "2.13.0+cu126",
             "torch_cuda": "12.6", "manifest_sha256": "ab" * 32, "precision": "fp8", "variant": "v2"}
    monkeypatch.setattr(trust, "identity", lambda device, precision, variant: dict(ident))
    return ident


def test_a_sticky_fault_in_the_probe_process_falls_back_with_the_reason(parity_dir, probe_cache, monkeypatch):
    """backend "auto": the cubin probe process whose kernel raises a sticky error fails; the studio's
    process never builds the cubin backend, loads torch-graph with the probe's reason, and caches the
    verdict so the next start does not probe again."""
    from engine.backends import cubin
    from engine.checkpoint import load_checkpoint

    child = [sys.executable, "-c", STICKY_CHILD]
    calls = []
    real_probe = trust.probe
    monkeypatch.setattr(trust, "probe", lambda *a, **k: calls.append(1) or real_probe(*a, **{**k, "command": child}))
    monkeypatch.setattr(cubin, "load", lambda *a, **k: pytest.fail("the cubin backend was built in the studio"))
    monkeypatch.setitem(backends.BACKENDS, "torch-graph", lambda checkpoint, **kw: "torch-graph model")
    ckpt = load_checkpoint(parity_dir / "tiny_checkpoint", progress=False)

    def make(factory):
        return factory(ckpt, device="cpu", dtype=torch.bfloat16, max_len=64, precision=None)

    for _ in range(2):
        model, name, reason = backends.start("cubin", backends.resolve(backends.BACKENDS["cubin"]), auto=True,
                                             reason=None, fallback="torch-graph", make=make)
        assert (model, name) == ("torch-graph model", "torch-graph")
        assert "not trusted" in reason and "illegal memory access" in reason and "using the torch-graph path" in reason
    assert calls == [1] and f"(cached in {trust.cache_path(probe_cache)}; " in reason  # the second start read it
    cached = json.loads(trust.cache_path(probe_cache).read_text())
    assert cached["ok"] is False and cached["kind"] == "kernel fault" and cached["identity"] == probe_cache


def test_a_crashed_probe_process_is_a_failed_verdict(parity_dir, probe_cache):
    ckpt = SimpleNamespace(root=parity_dir / "tiny_checkpoint")
    verdict = trust.probe(ckpt.root, "cuda:0", "fp8", "v2", probe_cache, command=[sys.executable, "-c", CRASH_CHILD])
    assert not verdict.ok and "exited with code 134 and no verdict" in verdict.reason


def test_a_passing_probe_lets_auto_load_the_cubins_with_the_verdict(parity_dir, probe_cache, monkeypatch):
    from engine.backends import cubin

    built = SimpleNamespace(info={"self_check": "passed: ..."})
    monkeypatch.setattr(trust, "probe", lambda root, device, precision, variant, ident, **k: trust.Verdict(
        True, "passed: fp8 logits vs the torch path", ident, 12.0))
    monkeypatch.setattr(cubin, "load", lambda checkpoint, **kw: built)
    be = trust.load_trusted(SimpleNamespace(root=parity_dir), device="cuda:0")
    assert be is built and be.info["kernel_trust"].startswith(
        f"trusted (probed in a separate process in 12 s, cached in {trust.cache_path(probe_cache)})")


# ------------------------------------------------------------------------------------- the launcher
class StandInStream:
    """A CPU stand-in for a torch stream: what the launcher compares is the handle."""

    def __init__(self, handle: int):
        self.cuda_stream = handle


class RecordingLoader:
    name, device_type = "recording", "cpu"

    def __init__(self):
        self.stream, self.launches = StandInStream(0x5000), []

    def load(self, cubin, entry):
        return entry.name

    def launch(self, handle, grid, block, shared, packed):
        self.launches.append(handle)


def test_the_launcher_refuses_a_launch_on_a_foreign_stream(tmp_path):
    e = kernel_entry({"X": "*fp32", "n": "i32"}, name="scale", symbol="scale_kernel", cubin="scale.cubin",
               sha256=mf.sha256(b"ELF"))
    one_kernel_root(tmp_path, e)
    loader = RecordingLoader()
    current = [loader.stream]
    k = runtime.CubinKernels(loader=loader, root=tmp_path, cc=120, current_stream=lambda: current[0])
    x = torch.ones(4)
    k.launch("scale", 1, x, 4)
    current[0] = StandInStream(0x0)  # torch's default stream, say: inputs made there would race the launch
    with pytest.raises(runtime.ForeignStream, match="launch of scale while torch's current stream is 0x0, not "
                                                    "the kernels' stream 0x5000"):
        k.launch("scale", 1, x, 4)
    with pytest.raises(runtime.ForeignStream):
        k["scale"](1, x, 4)  # the kernel handle itself checks too
    assert loader.launches == ["scale"]


def test_capture_reports_the_first_error_not_the_invalidated_capture(monkeypatch):
    """A launch that fails inside a capture is what the error says, though ending the capture raises too."""
    class Graph:
        def __init__(self, *a, **k):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            raise RuntimeError("CUDA error: operation failed due to a previous error during capture")

    stream = SimpleNamespace(synchronize=lambda: None)
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "CUDAGraph", lambda: object())
    monkeypatch.setattr(torch.cuda, "graph", Graph)
    calls = []

    def step():
        calls.append(1)
        if len(calls) == 3:  # the captured call (after two warm-ups)
            raise runtime.CubinLoadError("gemv launch failed: CUDA_ERROR_INVALID_VALUE")

    with pytest.raises(runtime.CaptureFailed, match="first error: CubinLoadError: gemv launch failed: "
                                                    "CUDA_ERROR_INVALID_VALUE \\(then: RuntimeError"):
        runtime.capture_graph(step, stream)


def test_the_cubin_backend_on_cuda_needs_the_kernels_stream():
    from engine.backends.cubin import CubinBackend

    with pytest.raises(ValueError, match="needs the kernels' stream"):
        CubinBackend(FULL_SIZE, {}, ops=None, device="cuda", stream=None)


@pytest.mark.parametrize("driver_cuda,bindings,fits", [(12040, "13.4.4", False), (12080, "12.9.7", True),
                                                        (13000, "13.4.4", True), (12020, None, True)])
def test_cuda_bindings_follow_the_driver(driver_cuda, bindings, fits):
    why = runtime.bindings_problem(driver_cuda, bindings)
    assert (why is None) == fits
    if not fits:
        assert why == ("cuda-bindings 13.4.4 is built for CUDA 13, but this driver supports CUDA 12.4, so the "
                       'cuda-core loader cannot start: pip install "cuda-core[cu12]>=1.2,<2" "cuda-bindings>=12.8,<13"')


def test_readme_installs_bindings_per_driver():
    readme = (REPO / "README.md").read_text()
    for line in runtime.BINDINGS_INSTALL.values():
        assert line in readme


# ------------------------------------------------------------------------------------- device check
def test_after_a_sticky_error_later_sections_are_invalid_not_failed(tmp_path):
    report = gpu_run.Report(tmp_path)
    ran = []

    def fine(name):
        def rows():
            ran.append(name)
            yield Row(name, "fine", "1", "", "PASS")
        return rows

    def faulting():
        yield Row("faulting", "first case", "ok", "", "PASS")
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    def ordinary():
        yield Row("ordinary", "first case", "ok", "", "PASS")
        raise ValueError("an ordinary failure")

    health = iter([None, "AcceleratorError: CUDA error: an illegal memory access was encountered"])
    sections = [gpu_run.Section("ordinary", 5, ordinary), gpu_run.Section("a", 5, fine("a")),
                gpu_run.Section("faulting", 5, faulting),
                gpu_run.Section("b", 5, fine("b")), gpu_run.Section("c", 5, fine("c"))]
    outcome = gpu_run.run_sections(sections, report, health=lambda: next(health))
    # an ordinary failure with a healthy device: the next section runs; after the fault none does
    assert outcome == {"ordinary": "failed", "a": "done", "faulting": "failed", "b": "invalid", "c": "invalid"}
    assert ran == ["a"]
    later = [r for r in report.rows if r.section in ("b", "c")]
    assert [r.status for r in later] == ["INVALID", "INVALID"]
    assert "sticky error since section 'faulting'" in later[0].value and "illegal memory access" in later[0].value
    assert sum(r.status == "FAIL" for r in report.rows) == 2  # the two sections that failed, nothing after


def test_device_check_sections_fit_the_budget_and_are_documented():
    from argparse import Namespace

    sections = gpu_check.gpu_sections(Namespace(quick=False, steps=200))
    assert sum(s.budget_s for s in sections) <= 470  # under scripts/gpu_check.sh's 480 s timeout
    doc = (REPO / "docs" / "GPU_CHECK.md").read_text()
    for s in sections:
        assert f"`{s.name}` ({s.budget_s} s)" in doc, s.name
    for row in ("cuda-core / cuda-bindings for this driver", "INVALID", "loader's stream"):
        assert row in doc
    # every section after the loader is wrapped onto its stream
    assert [s.name for s in sections if s.rows.__qualname__.startswith("on_loader_stream")] == \
        [s.name for s in sections if s.name not in gpu_check.BEFORE_LOADER]


# ------------------------------------------------------------------------------------- cubin growth, bucket graphs
@pytest.fixture
def interp_backend(parity_dir):
    """A bf16 cubin backend on the tiny checkpoint, its kernels under the interpreter (larger tiles)."""
    pytest.importorskip("triton", reason="Triton is not installed (pip install -r requirements-dev.txt)")
    from engine.backends.cubin import CubinBackend
    from engine.checkpoint import load_checkpoint
    from kernels import ops
    from tests import interp_rounding
    from tests.interp_step import FAST_TILES

    interp_rounding.install()
    saved = {name: dict(getattr(ops, name)) for name in FAST_TILES}
    for name, tiles in FAST_TILES.items():
        getattr(ops, name).update(tiles)
    ckpt = load_checkpoint(parity_dir / "tiny_checkpoint", progress=False)
    ids = torch.tensor(json.loads((parity_dir / "zero_shot.json").read_text())["prompt_ids"])
    yield CubinBackend(ckpt.dims, ckpt.backbone, ops=ops, device="cpu", precision="bf16", max_len=48), ids
    for name, tiles in saved.items():
        getattr(ops, name).update(tiles)


def test_bucket_graphs_precaptured_and_an_oom_midway_through_growth_keeps_the_old_cache(interp_backend, monkeypatch):
    from engine.backends import cubin

    be, ids = interp_backend
    assert be.row_graphs == {}
    be.setup_slots(2)
    assert sorted(be.row_graphs) == list(cubin.ROW_BUCKETS)  # every bucket, before any take
    n = len(ids)
    for slot in (0, 1):
        be.prefill(ids, None, 0, slot=slot)
    rows = torch.tensor([[3] * 8, [5] * 8])
    want = be.decode_rows(rows, [0, 1], [n, n])
    caches = [(L.kc, L.vc) for L in be.layers]
    contents = caches[0][0].clone()
    before = dict(be.row_graphs)
    calls, real = [], cubin.cache_tensor

    def runs_out(shape, device):  # the third of 2 layers × (keys, values): midway
        calls.append(shape)
        if len(calls) == 3:
            raise torch.OutOfMemoryError("CUDA out of memory (injected)")
        return real(shape, device)

    monkeypatch.setattr(cubin, "cache_tensor", runs_out)
    with pytest.raises(memory.NotEnoughMemory, match="the cache keeps 2 slots × 48 positions: shorten the text"):
        be.setup_cache(96)
    assert len(calls) == 3 and be.max_len == 48 and be.slots == 2
    assert all(L.kc is k and L.vc is v for L, (k, v) in zip(be.layers, caches)) and torch.equal(caches[0][0], contents)
    assert sorted(be.row_graphs) == list(cubin.ROW_BUCKETS)  # recaptured over the kept cache
    assert all(be.row_graphs[p] is not before[p] for p in before)
    assert torch.equal(be.decode_rows(rows, [0, 1], [n, n]), want)  # same op, shapes, inputs and KV
    monkeypatch.setattr(cubin, "cache_tensor", real)
    be.setup_cache(96)  # a retry that fits grows, contents kept, graphs captured again
    assert be.max_len == 96 and be.layers[0].kc.shape[2] == 96
    assert torch.equal(be.layers[0].kc[:, :, :48], contents) and sorted(be.row_graphs) == list(cubin.ROW_BUCKETS)


# ------------------------------------------------------------------------------------- one host copy per step
class OnDevice(torch.Tensor):
    """Stands for a tensor in device memory: every way its values reach the host is counted."""

    reads = 0
    HOST_READS = {"tolist", "item", "numpy", "cpu", "__bool__", "__int__", "__float__", "__index__", "__array__"}

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in cls.HOST_READS or (name == "copy_" and not isinstance(args[0], OnDevice)
                                      and isinstance(args[1], OnDevice)):
            OnDevice.reads += 1
        return super().__torch_function__(func, types, args, kwargs or {})


def test_the_scheduler_reads_the_device_once_per_step_at_8_takes(parity_dir):
    """8 takes decoded together: one host transfer per batched step (and one per prefill chunk), and the
    codes of each take equal to the take alone."""
    from engine.generate import Engine
    from engine.prompt import Prompt
    from engine.types import SamplingParams

    engine = Engine.load(parity_dir / "tiny_checkpoint", device="cpu", precision="fp32", max_batch=8)
    ids = json.loads((parity_dir / "zero_shot.json").read_text())["prompt_ids"]
    prompt = Prompt(ids=ids)
    params = [SamplingParams(temperature=0.8, seed=40 + i, max_frames=12 + i, repeat_guard=None) for i in range(8)]
    alone = [engine.predict(prompt=prompt, params=p) for p in params]
    model, calls = engine.model, {"decode_rows": 0, "prefill": 0}
    real = {name: getattr(model, name) for name in calls}

    def on_device(name):
        def call(*args, **kwargs):
            calls[name] += 1
            return real[name](*args, **kwargs).as_subclass(OnDevice)
        return call

    OnDevice.reads = 0
    for name in calls:
        setattr(model, name, on_device(name))
    got = []
    try:
        with engine.scheduler.held():  # the 8 takes start as one batch
            worker = threading.Thread(target=lambda: got.extend(engine.generate_batch([prompt] * 8, params)))
            worker.start()
            while len(engine.scheduler.waiting) < 8:
                time.sleep(0.01)
        worker.join()
    finally:
        for name in calls:
            delattr(model, name)
    assert engine.scheduler.largest == 8
    assert calls["decode_rows"] > 8 and OnDevice.reads == calls["decode_rows"] + calls["prefill"]
    assert all(torch.equal(chunk.codes, want) for chunk, want in zip(got, alone))


# ------------------------------------------------------------------------------------- reporting
def test_kernels_runtime_says_which_loader_started_or_why_not(monkeypatch, capsys):
    monkeypatch.setattr(runtime, "available", lambda: (False, "no NVIDIA driver: libcuda.so.1 is not installed"))
    assert runtime.main() == 2
    out = capsys.readouterr().out
    assert "packages: cuda-core " in out and "cubin path: unavailable: no NVIDIA driver" in out and "loaded:" not in out

    def refuses(device):
        raise RuntimeError("no cubin loader could start (cuda.core: CUDAError: CUDA_ERROR_UNSUPPORTED_PTX_VERSION)")

    monkeypatch.setattr(runtime, "available", lambda: (True, "NVIDIA H200 (CC 9.0): 40 sm_90a cubins"))
    monkeypatch.setattr(runtime, "open_loader", refuses)
    monkeypatch.setattr(runtime, "torch_cannot_use_gpu", lambda: None)
    assert runtime.main() == 2
    assert "loaded: none: no cubin loader could start (cuda.core: CUDAError" in capsys.readouterr().out


def test_the_status_panel_shows_the_memory_plan():
    from studio.views import render

    plan = "14 slots × 4096 positions = 8.5 GB KV of 10.5 GB free after the weights, 2.0 GB kept as headroom"
    html = render.header_html({"checkpoint": "bosonai/higgs-tts-3-4b", "memory_plan": plan})
    assert "<b>memory</b> 14 slots × 4096 positions<" in html and f'title="{plan}"' in html
    assert "<b>memory</b>" not in render.header_html({"checkpoint": "x"})  # the CPU: no plan, no chip


def test_a_take_whose_cache_growth_does_not_fit_is_refused_and_the_engine_keeps_serving(parity_dir, monkeypatch):
    """Through the scheduler: the take that needs a longer cache gets the sentence, the cache stays what it
    was, and the next take gives the same codes as before the refusal."""
    from engine import model as model_module
    from engine.generate import Engine
    from engine.prompt import Prompt
    from engine.types import SamplingParams

    engine = Engine.load(parity_dir / "tiny_checkpoint", device="cpu", precision="fp32", max_batch=2)
    engine.model.setup_cache(64)
    prompt = Prompt(ids=json.loads((parity_dir / "zero_shot.json").read_text())["prompt_ids"])
    short = SamplingParams(temperature=0.8, seed=3, max_frames=10, repeat_guard=None)
    before = engine.predict(prompt=prompt, params=short)

    def oom(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory (injected)")

    monkeypatch.setattr(model_module, "rope_table", oom)
    with pytest.raises(ValueError, match="not enough memory to grow the KV cache to 128 positions \\(it keeps 64\\); "
                                         "shorten the text"):
        engine.predict(prompt=prompt, params=SamplingParams(temperature=0.8, seed=4, max_frames=60, repeat_guard=None))
    assert engine.model.max_len == 64
    assert torch.equal(engine.predict(prompt=prompt, params=short), before)


def test_the_batched_step_runs_with_the_backends_stream_current(parity_dir, monkeypatch):
    """A backend with its own stream (the cubin kernels'): every prefill chunk and step of the scheduler
    runs with that stream current (a stand-in here), not behind torch's default stream."""
    from engine.generate import Engine
    from engine.prompt import Prompt

    engine = Engine.load(parity_dir / "tiny_checkpoint", device="cpu", precision="fp32", max_batch=2)
    kernels_stream, current, seen = object(), [None], []

    @contextlib.contextmanager
    def stream(s):
        before, current[0] = current[0], s
        try:
            yield
        finally:
            current[0] = before

    model, real = engine.model, {name: getattr(engine.model, name) for name in ("decode_rows", "prefill")}
    for name, fn in real.items():
        setattr(model, name, lambda *a, _fn=fn, _name=name, **k: seen.append((_name, current[0])) or _fn(*a, **k))
    monkeypatch.setattr(torch.cuda, "stream", stream)
    engine.scheduler.stream = kernels_stream
    engine.predict(prompt=Prompt(ids=json.loads((parity_dir / "zero_shot.json").read_text())["prompt_ids"]),
                   temperature=0.8, seed=1, max_frames=4)
    assert {name for name, _ in seen} == {"decode_rows", "prefill"}
    assert all(s is kernels_stream for _, s in seen)


def test_a_sticky_error_in_one_kernel_case_marks_the_later_cases_invalid(monkeypatch):
    from kernels import check

    def faults(ops, device, gen):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    def fine(ops, device, gen):
        return [("", 0.0, 1e-3)]

    monkeypatch.setattr(check, "CASES", [("first", None, fine), ("faulting", None, faults), ("later", None, fine)])
    kernels = SimpleNamespace(manifest=SimpleNamespace(kernels={}, target="sm_90a"), stream=None)
    healthy = check.kernel_rows(kernels, "cpu", health=lambda: None)
    assert [r.status for r in healthy] == ["PASS", "FAIL", "PASS", "PASS"]  # an ordinary failure: the rest run
    rows = list(check.kernel_rows(kernels, "cpu", health=lambda: "AcceleratorError: illegal memory access"))
    assert [(r.item, r.status) for r in rows] == [("first ", "PASS"), ("faulting", "FAIL"), ("later", "INVALID")]
    assert "sticky CUDA error since case 'faulting'" in rows[-1].value
