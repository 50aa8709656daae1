"""The cached trust in the cubin path cannot go stale, on the CPU: the verdict is keyed by the loader, its
packages and the sources too; only a verdict about the kernels (a self-check, a kernel fault) is cached,
never the environment's failure (out of memory, a timeout, a crash, a missing package); --retrust probes
again; the summary names the cache file or says why there is none. The child runs the production setup
(slots, a bucket-16 replay) too; a kernel fault in the studio's process after the trust marks the kernels
untrusted in the same file and fails with the reason; backend "auto" tries the bf16 cubins after the fp8
ones, then torch-graph, each failure's reason kept."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from engine.backends import trust
from engine.backends.self_check import SelfCheckFailed
from kernels import manifest as mf
from kernels import runtime

H200 = runtime.Probe(True, "", cc=90, name="NVIDIA H200", driver_cuda=12040, driver="550.54.15")
PACKAGES = {"cuda-core": "0.4.1", "cuda-bindings": "12.9.0", "pycuda": None}
PROBE = trust.probe  # the real one; `counting` gives it a child
# A child that writes the verdict it is given (argv[1], JSON) where the probe asks, without loading anything.
WRITER = "import json, sys; json.dump(json.loads(sys.argv[1]), open(sys.argv[sys.argv.index('--out') + 1], 'w'))"


def writes(**verdict) -> list[str]:
    return [sys.executable, "-c", WRITER, json.dumps({"identity": {}, "seconds": 1.0, **verdict})]


@pytest.fixture
def gpu(tmp_path, monkeypatch):
    """An H200 with cuda-core, its bindings and these sources; the cache in a temporary folder."""
    monkeypatch.setenv("HIGGS_STUDIO_CACHE", str(tmp_path / "studio"))
    monkeypatch.setattr(runtime, "probe_driver", lambda device=0: H200)
    monkeypatch.setattr(runtime, "loader_choice", lambda: ("cuda.core", "PyCUDA is not installed"))
    monkeypatch.setattr(runtime, "package_version", lambda name: PACKAGES[name])
    monkeypatch.setattr(trust, "source_sha256", lambda root=trust.REPO: "5e" * 32)
    return SimpleNamespace(root=tmp_path / "checkpoint")


def counting(monkeypatch, command: list[str]) -> list[int]:
    """Every probe of `trusted` runs `command` as its child; the list counts them."""
    calls = []
    monkeypatch.setattr(trust, "probe", lambda *a, **k: calls.append(1) or PROBE(*a, **{**k, "command": command}))
    return calls


# ------------------------------------------------------------------------------------- the identity
def test_the_identity_has_the_loader_its_packages_and_the_sources(gpu, monkeypatch):
    """A verdict is reused only for the same GPU, driver, torch, loader, cuda-core / cuda-bindings /
    PyCUDA, manifest and sources: a change to any of them probes again."""
    manifest = mf.CUBIN_DIR / "sm_90a" / mf.MANIFEST
    assert trust.identity("cuda:0", "fp8", "v2") == {
        "gpu": "NVIDIA H200", "cc": 90, "driver": "550.54.15", "driver_cuda": 12040, "torch": torch.__version__,
        "torch_cuda": torch.version.cuda, "loader": "cuda.core", "cuda-core": "0.4.1", "cuda-bindings": "12.9.0",
        "pycuda": "", "manifest_sha256": mf.sha256(manifest.read_bytes()), "source_sha256": "5e" * 32,
        "precision": "fp8", "variant": "v2"}
    calls = counting(monkeypatch, writes(ok=True, reason="passed", kind="self-check"))
    assert not trust.trusted(gpu, "cuda:0", "fp8", "v2").cached and trust.trusted(gpu, "cuda:0", "fp8", "v2").cached
    changes = [
        (runtime, "probe_driver", lambda device=0: runtime.Probe(True, "", cc=90, name="NVIDIA H200",
                                                                 driver_cuda=12080, driver="570.86.15")),
        (runtime, "loader_choice", lambda: ("pycuda", "PyCUDA is installed")),
        (runtime, "package_version", lambda name: {**PACKAGES, "cuda-bindings": "13.0.1"}[name]),
        (runtime, "package_version", lambda name: {**PACKAGES, "cuda-bindings": "13.0.1", "pycuda": "2025.1"}[name]),
        (trust, "source_sha256", lambda root=trust.REPO: "ed" * 32)]
    for n, (module, name, value) in enumerate(changes, start=2):
        monkeypatch.setattr(module, name, value)
        assert not trust.trusted(gpu, "cuda:0", "fp8", "v2").cached and len(calls) == n, name
        assert trust.trusted(gpu, "cuda:0", "fp8", "v2").cached


def test_the_source_hash_covers_the_backends_and_the_kernels_sources(tmp_path):
    def tree_hash():
        return trust.source_sha256.__wrapped__(tmp_path)

    for path in ("engine/backends/cubin.py", "kernels/gemv.py", "kernels/cubin/sm_90a/manifest.json",
                 "studio/page.py", "engine/generate.py"):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text("x = 1\n")
    before = tree_hash()
    for path in ("kernels/cubin/sm_90a/manifest.json", "studio/page.py", "engine/generate.py"):
        (tmp_path / path).write_text("x = 2\n")
    assert tree_hash() == before  # not a backend's or a kernel module's source
    (tmp_path / "kernels/gemv.py").write_text("x = 2\n")
    edited = tree_hash()
    assert edited != before
    (tmp_path / "engine/backends/cubin.py").rename(tmp_path / "engine/backends/cubin2.py")
    assert tree_hash() != edited  # the path counts, not only the bytes
    assert trust.source_sha256() == trust.source_sha256() and len(trust.source_sha256()) == 64


# ------------------------------------------------------------------------------------- what is cached
@pytest.mark.parametrize("exc,kind", [
    (RuntimeError("CUDA error: an illegal memory access was encountered"), "kernel fault"),
    (RuntimeError("cuLaunchKernel failed: misaligned address"), "kernel fault"),
    (RuntimeError("CUDA_ERROR_ILLEGAL_INSTRUCTION: an illegal instruction was encountered"), "kernel fault"),
    (RuntimeError("CUDA error: unspecified launch failure (cudaErrorLaunchFailure)"), "kernel fault"),
    (RuntimeError("cuCtxSetCurrent failed on CUDA device 0 (CUresult 700)"), "kernel fault"),
    (SelfCheckFailed("the cubin kernels' self-check failed: cosine 0.12 < 0.98"), "self-check"),
    (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"), "environment"),
    (RuntimeError("cuMemAlloc failed: CUDA_ERROR_OUT_OF_MEMORY"), "environment"),
    (ImportError("libcudart.so.13: cannot open shared object file"), "environment"),
    (RuntimeError("no cubin loader could start (cuda.core: CUDAError: CUDA_ERROR_INSUFFICIENT_DRIVER)"),
     "environment"),
    (RuntimeError("the driver refused kernel gemv_bf16 (sm_90a, gemv) with the cuda.core loader: "
                  "CUDA_ERROR_NO_BINARY_FOR_GPU"), "environment"),
    (RuntimeError("CUDA error: the launch timed out and was terminated (CUresult 702)"), "environment"),
    (ValueError("something else"), "environment"),
])
def test_the_child_says_what_decided_its_failure(exc, kind):
    assert trust.classify(exc) == kind


def test_a_fault_behind_a_wrapping_error_is_a_kernel_fault_and_out_of_memory_wins():
    def raised(outer, inner):
        try:
            try:
                raise inner
            except (RuntimeError, MemoryError) as exc:
                raise outer from exc
        except RuntimeError as exc:
            return exc

    fault = RuntimeError("CUDA error: an illegal memory access was encountered")
    assert trust.classify(raised(runtime.CaptureFailed("CUDA graph capture failed"), fault)) == "kernel fault"
    oom = torch.OutOfMemoryError("CUDA out of memory")
    assert trust.classify(raised(RuntimeError("CUDA error: an illegal memory access"), oom)) == "environment"


class Backend:
    """A loaded cubin backend's stand-in: its step methods return "logits" or raise `fault`; it records the
    production setup the trust child runs."""

    dims = SimpleNamespace(codebooks=8, boc=1024)
    device = torch.device("cpu")

    def __init__(self, fault: BaseException | None = None, setup_fault: BaseException | None = None):
        self.info = {"self_check": "passed"}
        self.fault, self.setup_fault, self.setup = fault, setup_fault, []

    def _step(self, *args, **kwargs):
        if self.fault is not None:
            raise self.fault
        return "logits"

    prefill = decode = sample_rows = begin = rows = _step

    def decode_rows(self, rows, slots, positions, *, bucket=None):
        self._step()
        self.setup.append(("decode_rows", tuple(rows.shape), slots, positions, bucket))
        if self.setup_fault is not None:
            raise self.setup_fault
        return torch.zeros(rows.shape[0], 8, 1026)

    def setup_slots(self, slots):
        self.setup.append(("setup_slots", slots))


@pytest.mark.parametrize("error,kind", [
    (RuntimeError("CUDA error: an illegal memory access was encountered"), "kernel fault"),
    (SelfCheckFailed("the cubin kernels' self-check failed: greedy 3/64"), "self-check"),
    (torch.OutOfMemoryError("CUDA out of memory"), "environment"),
    (ImportError("cannot import name 'launch' from 'cuda.core'"), "environment"),
    (None, "self-check"),
])
def test_the_child_writes_the_kind_of_its_verdict(parity_dir, tmp_path, error, kind):
    def load(checkpoint, **kwargs):
        if error is not None:
            raise error
        return Backend()

    out = tmp_path / "verdict.json"
    assert trust.run_child(str(parity_dir / "tiny_checkpoint"), "cuda:0", "fp8", "v2", out, load=load) == (
        0 if error is None else 1)
    assert json.loads(out.read_text())["kind"] == kind


@pytest.mark.parametrize("fault,kind", [
    (None, "self-check"),
    (RuntimeError("CUDA error: an illegal memory access was encountered"), "kernel fault"),
    (RuntimeError("cuGraphLaunch failed: CUDA_ERROR_LAUNCH_FAILED"), "kernel fault"),
    (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 9.00 GiB"), "environment"),
], ids=["passes", "illegal-address", "launch-failed", "out-of-memory"])
def test_the_child_runs_the_production_setup(parity_dir, tmp_path, fault, kind):
    """After the self-check the child sets up the slots of the default max_batch and replays bucket 16, so a
    fault there is the child's verdict, not the studio's crash."""
    backend = Backend(setup_fault=fault)
    out = tmp_path / "verdict.json"
    assert trust.run_child(str(parity_dir / "tiny_checkpoint"), "cuda:0", "fp8", "v2", out,
                           load=lambda checkpoint, **kw: backend) == (0 if fault is None else 1)
    verdict = json.loads(out.read_text())
    assert verdict["kind"] == kind and verdict["ok"] is (fault is None)
    assert backend.setup == [("setup_slots", 16), ("decode_rows", (1, 8), [0], [0], 16)]
    if fault is not None:
        assert str(fault) in verdict["reason"]


@pytest.mark.parametrize("kind", ["self-check", "kernel fault"])
def test_a_verdict_about_the_kernels_is_cached_and_names_its_file(gpu, monkeypatch, kind):
    calls = counting(monkeypatch, writes(ok=False, reason="RuntimeError: CUDA error: misaligned address", kind=kind))
    path = trust.cache_path(trust.identity("cuda:0", "fp8", "v2"))
    first = trust.trusted(gpu, "cuda:0", "fp8", "v2")
    assert first.kind == kind and first.summary.startswith(
        f"not trusted (probed in a separate process in {first.seconds:.0f} s, cached in {path}): RuntimeError")
    again = trust.trusted(gpu, "cuda:0", "fp8", "v2")
    assert calls == [1] and again.cached and again.summary == (
        f"not trusted (cached in {path}; delete it or start with --retrust to probe again): "
        "RuntimeError: CUDA error: misaligned address")


@pytest.mark.parametrize("child", [
    writes(ok=False, reason="OutOfMemoryError: CUDA out of memory", kind="environment"),
    writes(ok=False, reason="ImportError: no cuda.bindings", kind="environment"),
    writes(ok=False, reason="written before kinds were kept"),
    [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"],
    [sys.executable, "-c", "import sys; sys.exit(3)"],
], ids=["out-of-memory", "import", "no-kind", "signal", "exit"])
def test_an_environment_failure_is_not_cached(gpu, monkeypatch, child):
    calls = counting(monkeypatch, child)
    for n in (1, 2):
        verdict = trust.trusted(gpu, "cuda:0", "fp8", "v2")
        assert len(calls) == n and not verdict.ok and not verdict.cached and verdict.kind == "environment"
        assert "(probed in a separate process in" in verdict.summary and f", {trust.NOT_CACHED}): " in verdict.summary
    assert not trust.cache_path(verdict.identity).exists()


def test_a_signal_and_a_timeout_are_said_and_are_the_environments(gpu, tmp_path):
    ident = {"gpu": "NVIDIA H200"}
    killed = trust.probe(gpu.root, "cuda:0", "fp8", "v2", ident,
                         command=[sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"])
    assert killed.kind == "environment" and "was killed by SIGSEGV and no verdict" in killed.reason
    late = trust.probe(gpu.root, "cuda:0", "fp8", "v2", ident, timeout=1,
                       command=[sys.executable, "-c", "import time; time.sleep(30)"])
    assert late.kind == "environment" and "did not finish in 1 s" in late.reason and not late.ok


@pytest.mark.parametrize("old", [
    {"ok": True, "reason": "passed", "seconds": 9.0},             # written before kinds were kept
    {"ok": True, "reason": "passed", "seconds": 9.0, "kind": "environment"},
    {"ok": True, "reason": "passed", "seconds": 9.0, "kind": "guess"},
    [1, 2], "text", None,
], ids=["no-kind", "environment", "unknown-kind", "list", "string", "null"])
def test_a_cache_file_without_a_kind_about_the_kernels_is_probed_again(gpu, monkeypatch, old):
    path = trust.cache_path(trust.identity("cuda:0", "fp8", "v2"))
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({**old, "identity": trust.identity("cuda:0", "fp8", "v2")} if isinstance(old, dict)
                               else old))
    calls = counting(monkeypatch, writes(ok=True, reason="passed: fp8 logits", kind="self-check"))
    verdict = trust.trusted(gpu, "cuda:0", "fp8", "v2")
    assert calls == [1] and verdict.ok and not verdict.cached and verdict.path == str(path)
    assert json.loads(path.read_text())["kind"] == "self-check"  # overwritten with a verdict of today


def test_a_cache_folder_that_cannot_be_written_costs_a_probe_not_the_cubin_path(gpu, tmp_path, monkeypatch):
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("HIGGS_STUDIO_CACHE", str(tmp_path / "file"))
    counting(monkeypatch, writes(ok=True, reason="passed", kind="self-check"))
    verdict = trust.trusted(gpu, "cuda:0", "fp8", "v2")
    assert verdict.ok and not verdict.path and "not cached, " in verdict.summary and "could not be written" in \
        verdict.summary


# ------------------------------------------------------------------------------------- --retrust
def test_retrust_probes_again_and_overwrites_the_verdict(gpu, monkeypatch):
    calls = counting(monkeypatch, writes(ok=False, reason="SelfCheckFailed: cosine 0.2", kind="self-check"))
    path = trust.cache_path(trust.identity("cuda:0", "fp8", "v2"))
    assert not trust.trusted(gpu, "cuda:0", "fp8", "v2").ok and trust.trusted(gpu, "cuda:0", "fp8", "v2").cached
    calls = counting(monkeypatch, writes(ok=True, reason="passed: fp8 logits", kind="self-check"))
    verdict = trust.trusted(gpu, "cuda:0", "fp8", "v2", retrust=True)
    assert calls == [1] and verdict.ok and not verdict.cached
    assert json.loads(path.read_text())["ok"] is True and trust.trusted(gpu, "cuda:0", "fp8", "v2").ok
    counting(monkeypatch, writes(ok=False, reason="OutOfMemoryError: CUDA out of memory", kind="environment"))
    assert not trust.trusted(gpu, "cuda:0", "fp8", "v2", retrust=True).ok
    assert not path.exists()  # the verdict in question is not kept beside a failure that could not confirm it


# ------------------------------------------------------------------------------------------ while serving
def test_a_kernel_fault_while_serving_marks_the_kernels_untrusted(gpu, monkeypatch):
    """A CUDA fault in a step after the trust passed fails the take with the reason and writes the verdict
    untrusted (kind "kernel fault") into the same cache file, once: the next start falls back instead of
    crash-looping. Any other failure passes through as it was."""
    from engine.backends import cubin

    calls = counting(monkeypatch, writes(ok=True, reason="passed: fp8 logits", kind="self-check"))
    monkeypatch.setattr(cubin, "load", lambda checkpoint, **kw: Backend())
    backend = trust.load_trusted(gpu, device="cuda:0")
    path = trust.cache_path(trust.identity("cuda:0", "fp8", "v2"))
    assert backend.prefill(torch.zeros(3)) == "logits" and json.loads(path.read_text())["ok"] is True
    backend.fault = ValueError("sequence of 5000 positions exceeds the cache of 4096")
    with pytest.raises(ValueError, match="exceeds the cache"):
        backend.decode(torch.zeros(8), 3)
    assert json.loads(path.read_text())["ok"] is True  # not a kernel's fault
    written = []
    monkeypatch.setattr(trust, "_write", lambda where, verdict, write=trust._write: written.append(verdict.kind)
                        or write(where, verdict))
    for method in trust.STEP_METHODS:
        backend.fault = RuntimeError("CUDA error: an illegal memory access was encountered")
        with pytest.raises(trust.KernelFault) as raised:
            getattr(backend, method)(torch.zeros(1, 8), [0], [3])
        assert str(raised.value) == (
            "a cubin kernel faulted (RuntimeError: CUDA error: an illegal memory access was encountered); the cubin "
            f"kernels are marked not trusted in {path}: restart the studio, which falls back")
        assert raised.value.__cause__ is backend.fault and trust.classify(raised.value) == "kernel fault"
    assert written == ["kernel fault"]  # once
    data = json.loads(path.read_text())
    assert data["ok"] is False and data["kind"] == "kernel fault" and data["identity"] == trust.identity(
        "cuda:0", "fp8", "v2") and data["reason"].startswith("a kernel fault in the studio's process after the "
                                                             "checks passed (RuntimeError: CUDA error: an illegal")
    with pytest.raises(trust.Untrusted, match="the fp8 cubin kernels are not trusted \\(cached in .*a kernel fault "
                                              "in the studio's process"):
        trust.load_trusted(gpu, device="cuda:0")
    assert calls == [1]  # the next start reads the verdict: no probe, no cubins


def test_a_kernel_fault_in_the_studios_own_load_is_marked_too(gpu, monkeypatch):
    """The studio loads the trusted cubins again (calibration and self-check in its own process): a fault
    there is marked like one while serving, so the next start does not load them again."""
    from engine.backends import cubin

    counting(monkeypatch, writes(ok=True, reason="passed", kind="self-check"))

    def faulting(checkpoint, **kw):
        raise RuntimeError("CUDA error: misaligned address")

    monkeypatch.setattr(cubin, "load", faulting)
    with pytest.raises(trust.KernelFault, match="misaligned address.*marked not trusted in"):
        trust.load_trusted(gpu, device="cuda:0")
    verdict = trust.trusted(gpu, "cuda:0", "fp8", "v2")
    assert verdict.cached and not verdict.ok and verdict.kind == "kernel fault"


def test_a_fault_while_serving_with_a_cache_that_cannot_be_written_still_fails_the_take(gpu, monkeypatch):
    from engine.backends import cubin

    counting(monkeypatch, writes(ok=True, reason="passed", kind="self-check"))
    monkeypatch.setattr(cubin, "load", lambda checkpoint, **kw: Backend())
    backend = trust.load_trusted(gpu, device="cuda:0")

    def refused(path, verdict):
        raise PermissionError(f"[Errno 13] Permission denied: '{path}'")

    monkeypatch.setattr(trust, "_write", refused)
    backend.fault = RuntimeError("CUDA_ERROR_MISALIGNED_ADDRESS")
    with pytest.raises(trust.KernelFault, match="CUDA_ERROR_MISALIGNED_ADDRESS.*the verdict could not be written"):
        backend.rows(4)


# ------------------------------------------------------------------------------------------ fp8 → bf16 → torch-graph
# A child that writes the verdict its --precision is given in argv[1] ({precision: verdict}, JSON).
BY_PRECISION = ("import json, sys; a = sys.argv; v = json.loads(a[1])[a[a.index('--precision') + 1]]; "
                "json.dump(v, open(a[a.index('--out') + 1], 'w'))")


def by_precision(**verdicts) -> list[str]:
    return [sys.executable, "-c", BY_PRECISION, json.dumps({p: {"identity": {}, "seconds": 1.0, **v}
                                                           for p, v in verdicts.items()})]


@pytest.mark.parametrize("bf16_ok", [True, False])
def test_auto_falls_back_from_fp8_to_bf16_cubins_then_torch_graph(gpu, monkeypatch, bf16_ok):
    """Backend "auto" on CUDA: fp8 cubins, then bf16 cubins, then torch-graph, each failure's reason kept."""
    from engine import backends
    from engine.backends import cubin

    calls = counting(monkeypatch, by_precision(
        fp8={"ok": False, "reason": "SelfCheckFailed: FAILED: fp8 logits, cosine min 0.2", "kind": "self-check"},
        bf16={"ok": bf16_ok, "reason": "passed: bf16 logits" if bf16_ok else "RuntimeError: CUDA error: misaligned "
              "address", "kind": "self-check" if bf16_ok else "kernel fault"}))
    loaded = []
    monkeypatch.setattr(cubin, "load", lambda checkpoint, **kw: loaded.append(kw["precision"]) or Backend())
    graph = object()
    monkeypatch.setitem(backends.BACKENDS, "torch-graph", lambda checkpoint, **kw: graph)
    model, name, reason = backends.start(
        "cubin", backends.resolve(backends.BACKENDS["cubin"]), auto=True, reason=None, fallback="torch-graph",
        make=lambda f: f(gpu, device="cuda:0", dtype=torch.bfloat16, max_len=64, precision=None))
    first = ("backend 'cubin' failed to start (Untrusted: the fp8 cubin kernels are not trusted (probed in a "
             "separate process in ")
    assert reason.startswith(first) and "SelfCheckFailed: FAILED: fp8 logits, cosine min 0.2)" in reason
    assert len(calls) == 2  # a verdict for each precision
    if bf16_ok:
        assert name == "cubin" and isinstance(model, Backend) and loaded == ["bf16"]
        assert reason.endswith("; using the bf16 cubins")
        assert model.info["kernel_trust"].startswith("trusted (probed") and "passed: bf16 logits" in \
            model.info["kernel_trust"]
    else:
        assert name == "torch-graph" and model is graph and loaded == []
        assert ("; the bf16 cubins failed to start (Untrusted: the bf16 cubin kernels are not trusted (probed in a "
                "separate process in ") in reason
        assert reason.endswith("RuntimeError: CUDA error: misaligned address); using the torch-graph path")


def test_an_asked_for_precision_is_not_swapped(gpu, monkeypatch):
    """precision "bf16" (or "fp8") asked for by name: a failure goes straight to torch-graph, no second try."""
    from engine import backends
    from engine.backends import cubin

    calls = counting(monkeypatch, writes(ok=False, reason="SelfCheckFailed: FAILED", kind="self-check"))
    monkeypatch.setattr(cubin, "load", lambda checkpoint, **kw: Backend())
    monkeypatch.setitem(backends.BACKENDS, "torch-graph", lambda checkpoint, **kw: "graph")
    for precision in ("bf16", "fp8"):
        model, name, reason = backends.start(
            "cubin", backends.resolve(backends.BACKENDS["cubin"]), auto=True, reason=None, fallback="torch-graph",
            make=lambda f, p=precision: f(gpu, device="cuda:0", dtype=None, max_len=64, precision=p))
        assert model == "graph" and name == "torch-graph" and "bf16 cubins" not in reason and reason.endswith("; using the torch-graph path")
        assert f"the {precision} cubin kernels are not trusted" in reason
    assert len(calls) == 2


def test_the_studios_retrust_reaches_the_auto_backend(gpu, monkeypatch):
    from engine.backends import cubin

    calls = counting(monkeypatch, writes(ok=True, reason="passed: fp8 logits", kind="self-check"))
    monkeypatch.setattr(cubin, "load", lambda checkpoint, **kw: SimpleNamespace(info={}))
    assert trust.load_trusted(gpu, device="cuda:0").info["kernel_trust"].startswith("trusted (probed")
    assert trust.load_trusted(gpu, device="cuda:0").info["kernel_trust"].startswith("trusted (cached in ")
    monkeypatch.setattr(trust, "RETRUST", True)
    assert trust.load_trusted(gpu, device="cuda:0").info["kernel_trust"].startswith("trusted (probed")
    assert calls == [1, 1]


def test_the_retrust_flag(monkeypatch):
    import app
    from engine.generate import Engine

    assert not app.parse_args([]).retrust
    seen = []

    def load(*args, **kwargs):
        seen.append(trust.RETRUST)
        raise ValueError("stop here")

    monkeypatch.setattr(trust, "RETRUST", False)
    monkeypatch.setattr(Engine, "load", load)
    for argv in ([], ["--retrust"]):
        with pytest.raises(SystemExit, match="stop here"):
            app.load_engine(app.parse_args(["--checkpoint", str(Path("nowhere")), *argv]))
    assert seen == [False, True]
