"""The loaders' first-run hazards, on the CPU with fake drivers: the shared-memory opt-in counts static
shared memory, one refused cubin names itself and the engine falls back, every launching thread gets
the primary context once, streams are non-blocking, captures are thread-local, and a driver older than
the cubins need is one sentence."""

from __future__ import annotations

import json
import sys
import threading
import types

import pytest
import torch

from kernels import loaders, runtime
from kernels import manifest as mf

TOOLCHAIN = mf.Toolchain(ptxas="12.9", elf_abi=8, min_driver_cuda=12080, min_driver="570.26")


def _entry(name="k", shared=0, static_shared=0) -> mf.KernelEntry:
    return mf.KernelEntry(name=name, symbol=f"{name}_kernel", cubin=f"{name}.cubin", sha256=mf.sha256(name.encode()),
                          module="m", num_warps=4, num_stages=3, num_ctas=1, shared=shared,
                          static_shared=static_shared, global_scratch_size=0, global_scratch_align=1,
                          profile_scratch_size=0, profile_scratch_align=1, constexprs={},
                          params=mf.make_params({"X": "*fp32"}))


class FakePyCudaFunction:
    def __init__(self, log):
        self.log = log

    def set_attribute(self, attr, value):
        self.log.append((attr, value))

    def prepare(self, fmt):
        pass


def pycuda_loader_with_fake_driver():
    """A PyCudaLoader whose `drv` records set_attribute calls (no PyCUDA, no GPU)."""
    log = []
    module = types.SimpleNamespace(get_function=lambda symbol: FakePyCudaFunction(log))
    loader = object.__new__(loaders.PyCudaLoader)
    loader.drv = types.SimpleNamespace(module_from_buffer=lambda cubin: module,
                                       function_attribute=types.SimpleNamespace(MAX_DYNAMIC_SHARED_SIZE_BYTES="MAXDYN"))
    return loader, log


@pytest.mark.parametrize("shared,static,opts_in", [
    (49152, 1024, True),     # the sm_90a gemm_bf16 case of the review: 48 KiB dynamic + 1 KiB static
    (49152, 0, False),       # exactly 48 KiB in all needs no opt-in
    (40000, 10000, True),
    (73728, 0, True),
])
def test_opt_in_counts_static_shared_memory(shared, static, opts_in):
    loader, log = pycuda_loader_with_fake_driver()
    loader.load(b"", _entry(shared=shared, static_shared=static))
    assert log == ([("MAXDYN", shared)] if opts_in else [])


def committed_entries():
    out = []
    for cc, target in mf.TARGETS.items():
        if (mf.CUBIN_DIR / target / mf.MANIFEST).exists():
            out += [(target, e) for e in mf.load(cc).kernels.values()]
    return out


@pytest.mark.parametrize("target,entry", committed_entries(), ids=lambda x: getattr(x, "name", x))
def test_every_committed_cubin_over_48k_opts_in(target, entry):
    """Fails for any committed kernel whose static + dynamic shared memory exceeds 48 KiB and that the
    loader would launch without raising the limit."""
    loader, log = pycuda_loader_with_fake_driver()
    loader.load(b"", entry)
    total = entry.shared + entry.static_shared
    if total > mf.SMEM_OPT_IN:
        assert log == [("MAXDYN", entry.shared)], f"{target}/{entry.name} needs {total} B without opting in"
    else:
        assert log == []


def test_cuda_core_loader_opts_in_on_static_plus_dynamic():
    calls = []
    drv = types.SimpleNamespace(
        cuKernelSetAttribute=lambda attr, value, handle, dev: calls.append((attr, value)) or ("OK",),
        CUfunction_attribute=types.SimpleNamespace(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES="MAXDYN"),
        CUresult=types.SimpleNamespace(CUDA_SUCCESS="OK"), CUdevice=int)
    loader = object.__new__(loaders.CudaCoreLoader)
    loader.np, loader.driver, loader.device = __import__("numpy"), drv, 0
    loader.ObjectCode = types.SimpleNamespace(
        from_cubin=lambda cubin: types.SimpleNamespace(get_kernel=lambda s: types.SimpleNamespace(handle=1)))
    loader.load(b"", _entry(shared=49152, static_shared=1024))
    loader.load(b"", _entry(shared=49152, static_shared=0))
    assert calls == [("MAXDYN", 49152)]


# ---------------------------------------------------------------------------------------------
# One refused cubin

def write_manifest(root, names, cc=120):
    d = root / mf.TARGETS[cc]
    d.mkdir(parents=True)
    entries = {}
    for n in names:
        (d / f"{n}.cubin").write_bytes(n.encode())
        entries[n] = _entry(n)
    (d / mf.MANIFEST).write_text(mf.Manifest(cc=cc, target=mf.TARGETS[cc], triton="3.9.0", sources={},
                                             kernels=entries, root=d, toolchain=TOOLCHAIN).to_json())


class RefusingLoader:
    """Loads every cubin but one, which the 'driver' refuses as a real one would."""

    name = "fake"
    device_type = "cpu"
    stream = None
    why = "a test stand-in"

    def __init__(self, refuse: str):
        self.refuse, self.loaded = refuse, []

    def load(self, cubin, entry):
        if entry.name == self.refuse:
            raise RuntimeError("CUDA_ERROR_INVALID_IMAGE: device kernel image is invalid")
        self.loaded.append(entry.name)
        return entry.name


def test_a_refused_cubin_names_the_kernel_and_the_driver_error(tmp_path):
    write_manifest(tmp_path, ["alpha", "beta", "gamma"])
    loader = RefusingLoader("beta")
    with pytest.raises(runtime.CubinLoadError) as exc:
        runtime.CubinKernels(loader=loader, root=tmp_path, cc=120)
    msg = str(exc.value)
    assert "kernel beta (sm_120a, beta_kernel)" in msg and "CUDA_ERROR_INVALID_IMAGE" in msg and "fake" in msg
    assert loader.loaded == ["alpha"]  # loaded one by one, stopped at the refusal


def test_auto_falls_back_to_torch_with_the_kernels_sentence(tmp_path):
    """Under backend="auto" the engine's start policy turns the refusal into the torch path plus the reason;
    asked for by name it raises with the same sentence."""
    from engine import backends

    write_manifest(tmp_path, ["alpha", "beta"])

    def cubin_factory():
        runtime.CubinKernels(loader=RefusingLoader("beta"), root=tmp_path, cc=120)

    torch_model = object()

    def torch_factory():
        return torch_model

    make = {cubin_factory: cubin_factory, torch_factory: torch_factory}
    orig = backends.BACKENDS["torch"]
    backends.BACKENDS["torch"] = torch_factory
    try:
        model, name, reason = backends.start("cubin", cubin_factory, auto=True, reason=None,
                                                      make=lambda f: make[f]())
        assert model is torch_model and name == "torch"
        assert "kernel beta" in reason and "CUDA_ERROR_INVALID_IMAGE" in reason and "torch path" in reason
        with pytest.raises(backends.BackendUnavailable, match="kernel beta"):
            backends.start("cubin", cubin_factory, auto=False, reason=None, make=lambda f: make[f]())
    finally:
        backends.BACKENDS["torch"] = orig


# ---------------------------------------------------------------------------------------------
# Per-thread context

class FakeDriver:
    """libcuda's context calls, recorded per thread; the current context is thread-local as in CUDA."""

    def __init__(self):
        self.calls, self._local, self.lock = [], threading.local(), threading.Lock()

    def _log(self, what):
        with self.lock:
            self.calls.append((what, threading.current_thread().name))  # ids are reused, names are not

    def cuDeviceGet(self, ref, ordinal):
        ref._obj.value = ordinal
        return 0

    def cuDevicePrimaryCtxRetain(self, ref, dev):
        self._log("retain")
        ref._obj.value = 0xC0
        return 0

    def cuCtxSetCurrent(self, ctx):
        self._log("set_current")
        self._local.ctx = ctx.value
        return 0

    def current(self):
        return getattr(self._local, "ctx", None)


def test_context_made_current_once_per_launching_thread():
    drv = FakeDriver()
    ctx = loaders.ThreadContext(0, driver=drv)
    seen = {}

    def worker(i):
        for _ in range(5):  # five launches from one thread
            ctx.ensure()
        seen[i] = drv.current()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ctx.ensure()
    assert seen == {0: 0xC0, 1: 0xC0, 2: 0xC0} and drv.current() == 0xC0
    sets = [tid for what, tid in drv.calls if what == "set_current"]
    assert len(sets) == 4 and len(set(sets)) == 4  # three workers + this thread, once each
    assert [w for w, _ in drv.calls].count("retain") == 1


def test_context_failure_is_a_sentence():
    drv = FakeDriver()
    drv.cuCtxSetCurrent = lambda ctx: 201  # CUDA_ERROR_INVALID_CONTEXT
    with pytest.raises(RuntimeError, match="cuCtxSetCurrent failed on CUDA device 0 .CUresult 201"):
        loaders.ThreadContext(0, driver=drv).ensure()


def test_pycuda_loader_uses_a_non_blocking_stream_and_the_thread_context(monkeypatch):
    made = {}

    class Stream:
        def __init__(self, flags=0):
            made["flags"], self.handle = flags, 1234

    fake_drv = types.SimpleNamespace(Stream=Stream)
    pycuda = types.ModuleType("pycuda")
    pycuda.driver = fake_drv
    monkeypatch.setitem(sys.modules, "pycuda", pycuda)
    monkeypatch.setitem(sys.modules, "pycuda.autoprimaryctx", types.ModuleType("pycuda.autoprimaryctx"))
    monkeypatch.setitem(sys.modules, "pycuda.driver", fake_drv)
    monkeypatch.setattr(torch.cuda, "init", lambda: None)
    monkeypatch.setattr(torch.cuda, "ExternalStream", lambda handle, device=None: ("external", handle))
    drv = FakeDriver()
    monkeypatch.setattr(loaders, "open_driver_api", lambda device: loaders.ThreadContext(device, driver=drv))
    loader = loaders.PyCudaLoader(0)
    assert made["flags"] == loaders.CU_STREAM_NON_BLOCKING == 1
    assert loader.stream == ("external", 1234) and drv.current() == 0xC0


def test_capture_is_thread_local(monkeypatch):
    seen = {}

    class Graph:
        pass

    class Capture:
        def __init__(self, graph, **kw):
            seen.update(kw)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    class Stream:
        def synchronize(self):
            pass

    monkeypatch.setattr(torch.cuda, "CUDAGraph", Graph)
    monkeypatch.setattr(torch.cuda, "graph", Capture)
    monkeypatch.setattr(torch.cuda, "stream", lambda s: Capture(None))
    runs = []
    runtime.capture_graph(lambda: runs.append(1), Stream(), warmup=2)
    assert seen["capture_error_mode"] == "thread_local" and len(runs) == 3


# ---------------------------------------------------------------------------------------------
# Driver older than the cubins need

def test_driver_older_than_the_cubins_is_one_sentence(monkeypatch, tmp_path):
    write_manifest(tmp_path, ["alpha"])
    monkeypatch.setattr(runtime, "probe_driver", lambda device=0: runtime.Probe(
        True, "", cc=120, name="NVIDIA GeForce RTX 5090", driver_cuda=12040, driver="550.54.15"))
    monkeypatch.setattr(runtime, "package_version", lambda name: None)  # the cubins' driver alone, not the bindings'
    runtime._available.cache_clear()
    try:
        ok, why = runtime.available(root=tmp_path)
    finally:
        runtime._available.cache_clear()
    assert not ok
    assert why == ("NVIDIA GeForce RTX 5090 has a driver supporting CUDA 12.4, but the sm_120a cubins need "
                   "driver 570.26 or newer (CUDA 12.8); update the NVIDIA driver, or use backend='torch'")


def test_manifest_toolchain_round_trips(tmp_path):
    write_manifest(tmp_path, ["alpha"])
    doc = json.loads((tmp_path / "sm_120a" / mf.MANIFEST).read_text())
    assert doc["toolchain"] == {"ptxas": "12.9", "elf_abi": 8, "min_driver_cuda": 12080, "min_driver": "570.26"}
    assert mf.load(120, tmp_path).toolchain == TOOLCHAIN
