"""Trust in the cubin path, decided once in a spawned process and cached.

A kernel that faults (an illegal address in calibration or the self-check) leaves a sticky error on the
primary context, which torch shares: every later CUDA call in that process fails, the torch fallbacks
included. So under backend "auto" the cubin load, calibration and self-check first run in a child
process; the serving process loads the cubins only on a pass, and a fault costs the child, not the
studio. The verdict, with the self-check's figures, is cached in the studio's folder
(`engine.demo.cache_dir()`, $HIGGS_STUDIO_CACHE) under a key of everything it depends on: the GPU, the
driver, torch, the loader and its packages (cuda-core, cuda-bindings, PyCUDA), the manifest's sha256, the
sha256 of the backends' and kernels' sources, the precision and variant. A change to any of them probes
again, and so does the studio's --retrust (`trusted(..., retrust=True)`), which overwrites the file.

Only a verdict about the kernels is cached: a self-check that ran to its end (passed or failed) or a
kernel fault (an illegal address, a misaligned address, an illegal instruction, a launch failure). A
failure of the environment (out of memory, the probe's timeout, a crash or signal without a verdict, a
missing or mismatched package) says nothing about them, and the next start probes again.

The child runs what the engine runs after load too: the KV slots of the default max_batch, every bucket's
graph captured, and a replay of bucket 16, so a fault there costs the child as well. A kernel fault that
still comes in the studio's process (its own load of the trusted cubins, or a take: `guard`) writes the
verdict untrusted, kind "kernel fault", into the same cache file and fails with the reason: the next start
falls back instead of crash-looping on the same kernels. Under backend "auto" the BF16 cubins are tried after the FP8 ones fail (`load_trusted_bf16`,
engine/backends/__init__.py `AUTO_RETRIES`), each with its own verdict.

    verdict = trusted(checkpoint, device, "fp8", "v2")     # cached, or probed now (seconds to a minute)
    python -m engine.backends.trust CHECKPOINT --device cuda:0 --precision fp8 --out verdict.json
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# The child loads the checkpoint (4B: ~10 s), calibrates and self-checks (a few s on a GPU).
PROBE_TIMEOUT_S = 600
# The sources whose change could change a verdict (the identity's source_sha256).
SOURCES = ("engine/backends/*.py", "kernels/*.py")
# The studio's --retrust: this process probes again, ignoring the cached verdict, and overwrites it.
RETRUST = False

# What decided a verdict; only the first two say something about the kernels, so only they are cached.
SELF_CHECK, KERNEL_FAULT, ENVIRONMENT = "self-check", "kernel fault", "environment"
CACHED_KINDS = (SELF_CHECK, KERNEL_FAULT)
# CUDA's names for a kernel that faulted: the driver's and the runtime's error names, their messages
# (torch's "CUDA error: ...", PyCUDA's "cuLaunchKernel failed: ...") and kernels/loaders.py's "CUresult N".
FAULTS = re.compile(
    r"CUDA_ERROR_(ILLEGAL_ADDRESS|MISALIGNED_ADDRESS|ILLEGAL_INSTRUCTION|LAUNCH_FAILED|INVALID_ADDRESS_SPACE"
    r"|INVALID_PC|HARDWARE_STACK_ERROR)\b"
    r"|cudaError(IllegalAddress|MisalignedAddress|IllegalInstruction|LaunchFailure|InvalidAddressSpace|InvalidPc"
    r"|HardwareStackError)\b"
    r"|an illegal memory access was encountered|an illegal instruction was encountered|misaligned address"
    r"|unspecified launch failure|invalid program counter|hardware stack error"
    r"|CUresult 7(00|1[4-9])\b")
# Out of memory, under any of its names: the card was busy, not the kernels wrong.
OUT_OF_MEMORY = re.compile(r"out of memory|CUDA_ERROR_OUT_OF_MEMORY|cudaErrorMemoryAllocation|OutOfMemoryError",
                           re.IGNORECASE)
NOT_CACHED = "not cached: a failure of the environment, not of the kernels, is probed again at the next start"
# The trusted backend's methods that launch kernels for a take: a kernel fault in one marks the kernels untrusted.
STEP_METHODS = ("prefill", "decode", "decode_rows", "sample_rows", "begin", "rows")


@dataclass(frozen=True)
class Verdict:
    ok: bool
    reason: str           # the self-check's summary on a pass, what failed otherwise
    identity: dict
    seconds: float
    cached: bool = False  # read from the cache file, not probed now
    kind: str = SELF_CHECK  # what decided it: SELF_CHECK, KERNEL_FAULT or ENVIRONMENT
    path: str = ""        # the cache file it is kept in; "" when it is not kept
    uncached: str = ""    # why it is not kept, when that was decided

    @property
    def summary(self) -> str:
        if self.cached:
            how = f"cached in {self.path}; delete it or start with --retrust to probe again"
        else:
            how = f"probed in a separate process in {self.seconds:.0f} s"
            how += f", cached in {self.path}" if self.path else f", {self.uncached}" if self.uncached else ""
        return f"{'trusted' if self.ok else 'not trusted'} ({how}): {self.reason}"


@functools.cache
def source_sha256(root: Path = REPO) -> str:
    """sha256 over the sources in SOURCES under `root` (each file's path and bytes, sorted by path): an
    edited kernel or backend probes again. Once per process: the studio does not edit its own code."""
    h = hashlib.sha256()
    for path in sorted((p for pattern in SOURCES for p in root.glob(pattern)), key=lambda p: p.relative_to(root)):
        data = path.read_bytes()
        h.update(f"{path.relative_to(root).as_posix()}\0{len(data)}\0".encode())
        h.update(data)
    return h.hexdigest()


def identity(device, precision: str, variant: str) -> dict:
    """What a verdict depends on, as plain data."""
    import torch

    from kernels import manifest as mf
    from kernels import runtime

    p = runtime.probe_driver(torch.device(device).index or 0)
    target = mf.TARGETS.get(p.cc, "") if p.ok else ""
    path = mf.CUBIN_DIR / target / mf.MANIFEST
    return {"gpu": p.name, "cc": p.cc, "driver": p.driver, "driver_cuda": p.driver_cuda, "torch": torch.__version__,
            "torch_cuda": torch.version.cuda, "loader": runtime.loader_choice()[0] or "",
            **{pkg: runtime.package_version(pkg) or "" for pkg in ("cuda-core", "cuda-bindings", "pycuda")},
            "manifest_sha256": mf.sha256(path.read_bytes()) if path.is_file() else "",
            "source_sha256": source_sha256(), "precision": precision, "variant": variant}


def cache_path(ident: dict) -> Path:
    from engine.demo import cache_dir

    key = hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:24]
    return cache_dir() / "cubin-trust" / f"{key}.json"


def _write(path: Path, verdict: Verdict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    data = {k: v for k, v in asdict(verdict).items() if k not in ("cached", "path", "uncached")}
    with os.fdopen(fd, "w") as f:
        json.dump(data, f)
    os.replace(tmp, path)


def _read(path: Path) -> Verdict | None:
    """The verdict in `path`; its kind is "" when the file has none (written before kinds were kept)."""
    try:
        data = json.loads(path.read_text())
        return Verdict(bool(data["ok"]), str(data["reason"]), dict(data["identity"]), float(data["seconds"]),
                       kind=str(data.get("kind", "")))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def classify(exc: BaseException) -> str:
    """What a failure in the child says: KERNEL_FAULT for a CUDA fault (the same kernels on the same GPU
    fault again), SELF_CHECK for a self-check that ran to its end and failed, ENVIRONMENT for the rest (out
    of memory, a missing or mismatched package, a loader or driver that refused): that may pass next time.
    Out of memory wins over a fault named beside it; a failure that names no fault is the environment's."""
    chain, seen = [], exc
    while seen is not None and seen not in chain:
        chain.append(seen)
        seen = seen.__cause__ or seen.__context__
    text = " | ".join(f"{type(e).__name__}: {e}" for e in chain)
    if any(isinstance(e, (MemoryError, ImportError)) for e in chain) or OUT_OF_MEMORY.search(text):
        return ENVIRONMENT
    if FAULTS.search(text):
        return KERNEL_FAULT
    from engine.backends.self_check import SelfCheckFailed

    return SELF_CHECK if isinstance(exc, SelfCheckFailed) else ENVIRONMENT


def _no_verdict(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"was killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"was killed by signal {-returncode}"
    return f"exited with code {returncode}"


def probe(checkpoint_root, device, precision: str, variant: str, ident: dict, *, command: list[str] | None = None,
          timeout: float = PROBE_TIMEOUT_S) -> Verdict:
    """Run the cubin load, calibration and self-check in a child process; its verdict, or why it gave
    none (a crash, a timeout: the environment's, as far as the cache is concerned)."""
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "verdict.json"
        cmd = (command or [sys.executable, "-m", "engine.backends.trust"]) + [
            str(checkpoint_root), "--device", str(device), "--precision", precision, "--variant", variant,
            "--out", str(out)]
        try:
            done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout, check=False)
        except subprocess.TimeoutExpired:
            return Verdict(False, f"the cubin probe process did not finish in {timeout:.0f} s", ident,
                           time.perf_counter() - t0, kind=ENVIRONMENT)
        verdict = _read(out)
        if verdict is not None:
            kind = verdict.kind if verdict.kind in (*CACHED_KINDS, ENVIRONMENT) else ENVIRONMENT
            return Verdict(verdict.ok, verdict.reason, ident, time.perf_counter() - t0, kind=kind)
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return Verdict(False, f"the cubin probe process {_no_verdict(done.returncode)} and no verdict ({last})",
                       ident, time.perf_counter() - t0, kind=ENVIRONMENT)


def trusted(checkpoint, device, precision: str, variant: str, *, command: list[str] | None = None,
            retrust: bool = False) -> Verdict:
    """The cached verdict for this identity (GPU, driver, torch, loader and its packages, manifest,
    sources, precision and variant), else a fresh probe, cached when it is about the kernels: such a
    verdict is not retried until the identity changes, `retrust` asks for it, or its file is deleted. An
    environment's failure is not kept, and removes the file it would have replaced."""
    ident = identity(device, precision, variant)
    path = cache_path(ident)
    cached = None if retrust else _read(path)
    if cached is not None and cached.kind in CACHED_KINDS and cached.identity == ident:
        return replace(cached, identity=ident, cached=True, path=str(path))
    verdict = probe(checkpoint.root, device, precision, variant, ident, command=command)
    if verdict.kind not in CACHED_KINDS:
        with contextlib.suppress(OSError):
            path.unlink(missing_ok=True)
        return replace(verdict, uncached=NOT_CACHED)
    try:
        _write(path, verdict)
    except OSError as exc:  # a read-only cache folder costs a probe per start, not the cubin path
        return replace(verdict, uncached=f"not cached, {path.parent} could not be written ({exc})")
    return replace(verdict, path=str(path))


class Untrusted(RuntimeError):
    """The cubin probe process failed: the kernels are not loaded here."""


class KernelFault(RuntimeError):
    """A trusted cubin kernel faulted while serving: the take fails with this, and the kernels are marked untrusted."""


def load_trusted(checkpoint, *, device, dtype=None, max_len: int = 4096, precision: str | None = None,
                 variant: str = "v2", retrust: bool = False):
    """What backend "auto" runs for cubin: `engine.backends.cubin.load` in this process only after the same
    load, calibration, self-check and slot setup passed in a separate one (cached per GPU, driver, torch,
    loader, manifest and sources), so a kernel fault costs that process and not the studio's CUDA context;
    its step methods are guarded (`guard`). `retrust` (or RETRUST, the studio's --retrust) probes again
    whatever is cached."""
    from engine.backends import cubin

    resolved = cubin.resolve_precision(precision, dtype)
    verdict = trusted(checkpoint, device, resolved, variant, retrust=retrust or RETRUST)
    if not verdict.ok:
        raise Untrusted(f"the {resolved} cubin kernels are {verdict.summary}")
    mark = marker(verdict.identity)  # a kernel fault here, in the load's own self-check or later, is marked too
    backend = _guarded(cubin.load, mark)(checkpoint, device=device, dtype=dtype, max_len=max_len, precision=precision,
                                         variant=variant)
    backend.info["kernel_trust"] = verdict.summary
    guard(backend, mark)
    return backend


def load_trusted_bf16(checkpoint, *, precision: str | None = None, **kwargs):
    """Backend "auto"'s second try at the cubin path after the FP8 kernels failed to start: the BF16 ones,
    with their own verdict (they are neither calibrated nor quantised, so they may pass where FP8 did not,
    and still beat torch-graph). Declines with `NoRetry` when the precision was the user's choice, so a
    failed bf16 is not tried twice and an asked-for fp8 is not swapped."""
    from engine.backends import NoRetry

    if precision not in (None, "auto"):
        raise NoRetry(f"precision {precision!r} was asked for")
    return load_trusted(checkpoint, precision="bf16", **kwargs)


def marker(ident: dict) -> Callable[[BaseException], str]:
    """What a kernel fault in this process calls once the kernels were trusted: the first call writes the
    verdict untrusted (KERNEL_FAULT) into this identity's cache file; every call returns the sentence that
    says so. The fault has lost this process's CUDA context, so only a restart recovers, and that restart
    must not trust the same kernels again."""
    path, marked = cache_path(ident), []

    def mark(exc: BaseException) -> str:
        if not marked:
            marked.append(path)
            reason = f"a kernel fault in the studio's process after the checks passed ({type(exc).__name__}: {exc})"
            try:
                _write(path, Verdict(False, reason[:500], ident, 0.0, kind=KERNEL_FAULT))
            except OSError as err:
                return f"the verdict could not be written to {path} ({err})"
        return f"the cubin kernels are marked not trusted in {path}: restart the studio, which falls back"

    return mark


def guard(backend, mark: Callable[[BaseException], str]) -> None:
    """Wrap `backend`'s STEP_METHODS so that a failure `classify` calls a kernel fault is marked (`marker`)
    and fails the take with KernelFault naming the fault and the cache file; any other failure is raised
    as it was."""
    for name in STEP_METHODS:
        method = getattr(backend, name, None)
        if method is not None:
            setattr(backend, name, _guarded(method, mark))


def _guarded(method: Callable, mark: Callable[[BaseException], str]) -> Callable:
    @functools.wraps(method)
    def step(*args, **kwargs):
        try:
            return method(*args, **kwargs)
        except Exception as exc:
            if classify(exc) != KERNEL_FAULT:
                raise
            raise KernelFault(f"a cubin kernel faulted ({type(exc).__name__}: {exc}); {mark(exc)}") from exc
    return step


def production_setup(backend) -> None:
    """What the engine does with a loaded backend before its first take, run in the child so a fault there
    costs the child: the KV slots of the default max_batch as the memory plan cuts them (every bucket's
    graph captured when there are two or more), then one take replayed in bucket 16 beside 15 padding rows,
    whose logits must be finite."""
    import torch

    from engine.backends.cubin_steps import ROW_BUCKETS
    from engine.backends.self_check import SelfCheckFailed
    from engine.device import plan_memory
    from engine.generate import DEFAULT_MAX_BATCH

    dims = backend.dims
    slots, _ = plan_memory(backend, dims, torch.device(backend.device), DEFAULT_MAX_BATCH, itemsize=2)
    backend.setup_slots(slots)
    row = torch.full((1, dims.codebooks), dims.boc, dtype=torch.long)
    logits = backend.decode_rows(row, [0], [0], bucket=ROW_BUCKETS[-1])
    if not torch.isfinite(logits).all():
        raise SelfCheckFailed(f"bucket {ROW_BUCKETS[-1]} gave non-finite logits after setup_slots({slots})")


def run_child(checkpoint_root: str, device: str, precision: str, variant: str, out: Path, load=None) -> int:
    """The child's work: load the checkpoint and the cubin backend (calibration and self-check included),
    run `production_setup`, and write the verdict, with its kind (`classify`) decided here, where the
    failure's type is known. A Python-level failure is written as a verdict; a crash leaves none."""
    t0 = time.perf_counter()
    try:
        from engine.checkpoint import load_checkpoint

        if load is None:
            from engine.backends.cubin import load
        backend = load(load_checkpoint(checkpoint_root, progress=False), device=device, precision=precision,
                       variant=variant)
        production_setup(backend)
        verdict = Verdict(True, backend.info.get("self_check", "loaded"), {}, time.perf_counter() - t0)
    except Exception as exc:  # noqa: BLE001 — the verdict is the point: every failure is one
        verdict = Verdict(False, f"{type(exc).__name__}: {exc}"[:500], {}, time.perf_counter() - t0,
                          kind=classify(exc))
    _write(out, verdict)
    return 0 if verdict.ok else 1


def main(argv=None, load=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m engine.backends.trust", description=__doc__.split("\n\n")[0])
    ap.add_argument("checkpoint")
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--precision", default="fp8")
    ap.add_argument("--variant", default="v2")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    return run_child(args.checkpoint, args.device, args.precision, args.variant, args.out, load=load)


if __name__ == "__main__":
    sys.exit(main())
