"""Load the committed cubins for this GPU and launch them on a stream torch shares.

    ok, reason = runtime.available()          # safe anywhere: never hangs, never raises
    k = runtime.CubinKernels()                # manifest + cubins for the device's arch
    with torch.cuda.stream(k.stream):
        k.launch("gemv_bf16", (160,), x, w, None, None, None, y, 2560, 2560, 2560)
    g = runtime.capture_graph(step, k.stream) # whole decode step as one CUDA graph; g.replay()

Loaders. PyCUDA is the product's loader: `pycuda.autoprimaryctx` (not `autoinit`, whose private context
would make torch's pointers invalid) shares the primary context with torch, and torch adopts PyCUDA's
stream through `torch.cuda.ExternalStream(stream.handle)` — PyCUDA cannot wrap a foreign stream, so the
sharing has to go that way round. Where PyCUDA is not installed or fails to initialise, `cuda.core`
loads the same cubins and launches on a torch stream (wrapped once as cuda-core's `Stream`). Graphs are
captured with torch on that shared stream: capture happens in the driver, so it records either loader's
cuLaunchKernel calls.

Every launching thread makes the primary context current once (`kernels.loaders.ThreadContext`), since
the studio launches from worker threads; kernels run on a non-blocking stream, and graphs are captured in
"thread_local" error mode, so other threads' CUDA calls neither serialise with nor invalidate them.

    python -m kernels.runtime                 # which loader, whether the cubin path can run here, and
                                              # one kernel launched against torch (PASS / FAIL)

Probe first. With no driver, `cuda.core`'s `ObjectCode.from_cubin` fails in a way that leaves a lock
held and the next driver call hangs (KERNELS.md §4), so `available()` asks libcuda itself through
ctypes before anything imports PyCUDA or cuda.core.

This module is the probe (ctypes, the manifest, torch) and the launch front: `CubinKernels`, `capture_graph`.
Beside it: `kernels/loaders.py` (PyCUDA and cuda-core, and the cuda-bindings that fit a driver),
`kernels/packing.py` (arguments as the driver sees them) and `kernels/binding.py` (`cubin_ops`: kernels/ops.py
launched from cubins, or from the interpreter).
"""

from __future__ import annotations

import ctypes
import functools
import importlib.util
from dataclasses import dataclass
from pathlib import Path

from kernels import compat
from kernels import manifest as mf
from kernels.binding import InterpretedKernels, cubin_ops
from kernels.loaders import (
    BINDINGS_INSTALL,
    BINDINGS_REQUIREMENTS,
    LOADERS,
    bindings_problem,
    bindings_requirements,
    package_version,
)
from kernels.packing import grid3, pack_args

__all__ = ["BINDINGS_INSTALL", "BINDINGS_REQUIREMENTS", "CaptureFailed", "CubinKernels", "CubinLoadError",
           "ForeignStream", "InterpretedKernels", "Probe", "available", "bindings_problem", "bindings_requirements",
           "capture_graph", "cubin_ops", "loader_choice", "open_loader", "package_version", "probe_driver",
           "torch_cannot_use_gpu"]


# ---------------------------------------------------------------------------------------------
# Driver probe (ctypes only)

@dataclass(frozen=True)
class Probe:
    ok: bool
    reason: str
    cc: int | None = None
    name: str = ""
    driver_cuda: int = 0     # cuDriverGetVersion: the newest CUDA the driver supports, e.g. 12080
    driver: str = ""         # the driver's release, e.g. "570.86.15" (NVML), "" when NVML is absent


def _cc_text(cc: int) -> str:
    return f"{cc // 10}.{cc % 10}"


def probe_driver(device: int = 0) -> Probe:
    """Ask libcuda for the device's compute capability; one clear sentence when that is impossible."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return Probe(False, "no NVIDIA driver: libcuda.so.1 is not installed on this machine")

    def err_name(code: int) -> str:
        s = ctypes.c_char_p()
        if hasattr(cuda, "cuGetErrorName") and cuda.cuGetErrorName(code, ctypes.byref(s)) == 0 and s.value:
            return s.value.decode()
        return f"CUresult {code}"

    version = ctypes.c_int()
    get_version = getattr(cuda, "cuDriverGetVersion", None)  # absent from some stub libraries
    driver_cuda = version.value if get_version is not None and get_version(ctypes.byref(version)) == 0 else 0
    rc = cuda.cuInit(0)
    if rc == 34:   # CUDA_ERROR_STUB_LIBRARY
        return Probe(False, "libcuda.so.1 is a stub library: no NVIDIA driver is installed")
    if rc == 100:  # CUDA_ERROR_NO_DEVICE
        return Probe(False, "the NVIDIA driver reports no CUDA-capable device")
    if rc:
        return Probe(False, f"cuInit failed ({err_name(rc)})")
    count = ctypes.c_int()
    rc = cuda.cuDeviceGetCount(ctypes.byref(count))
    if rc or count.value <= device:
        return Probe(False, f"no CUDA device {device} (driver sees {count.value})")
    dev = ctypes.c_int()
    major, minor = ctypes.c_int(), ctypes.c_int()
    name = ctypes.create_string_buffer(256)
    if (cuda.cuDeviceGet(ctypes.byref(dev), device)
            or cuda.cuDeviceGetAttribute(ctypes.byref(major), 75, dev)    # COMPUTE_CAPABILITY_MAJOR
            or cuda.cuDeviceGetAttribute(ctypes.byref(minor), 76, dev)):  # COMPUTE_CAPABILITY_MINOR
        return Probe(False, f"could not read the compute capability of CUDA device {device}")
    cuda.cuDeviceGetName(name, 256, dev)
    return Probe(True, "", cc=major.value * 10 + minor.value, name=name.value.decode(errors="replace"),
                 driver_cuda=driver_cuda, driver=_driver_release())


def _driver_release() -> str:
    """The driver's release number (what `nvidia-smi` prints) through NVML; "" when NVML is absent."""
    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
        buf = ctypes.create_string_buffer(96)
        if nvml.nvmlInit_v2() == 0 and nvml.nvmlSystemGetDriverVersion(buf, 96) == 0:
            return buf.value.decode(errors="replace")
    except (OSError, AttributeError):
        pass
    return ""


def torch_cannot_use_gpu(device: int = 0) -> str | None:
    """One paragraph when an NVIDIA GPU is present but this torch cannot use it (CPU-only build, driver
    too old for torch's CUDA, compute capability missing from the build); None otherwise."""
    import torch

    return compat.torch_mismatch(probe_driver(device), torch)


def loader_candidates() -> list[str]:
    """Loaders whose package is installed, in preference order (found without importing them)."""
    out = []
    if importlib.util.find_spec("pycuda") is not None:
        out.append("pycuda")
    try:
        if importlib.util.find_spec("cuda.core") is not None:
            out.append("cuda.core")
    except ModuleNotFoundError:
        pass
    return out


def loader_choice() -> tuple[str | None, str]:
    """(loader the cubin path would use, why): PyCUDA where it is installed, else cuda-core."""
    found = loader_candidates()
    if not found:
        return None, "neither PyCUDA nor cuda-core is installed (pip install -r requirements.txt)"
    if found[0] == "pycuda":
        return "pycuda", "PyCUDA is installed, the preferred loader"
    return "cuda.core", "PyCUDA is not installed; cuda-core loads the same cubins"


@functools.cache
def _available(device: int, root: str) -> tuple[bool, str]:
    p = probe_driver(device)
    if not p.ok:
        return False, p.reason
    loader, why = loader_choice()
    # cuda-bindings newer than the driver stop the cuda-core loader whatever else fits; said first, as its pip
    # line is the first fix (where PyPI's CUDA 13 wheels meet an R5xx driver, torch's CUDA 13 follows it)
    bindings = bindings_problem(p.driver_cuda, package_version("cuda-bindings")) if loader == "cuda.core" else None
    ok, reason = _cubin_path(p, Path(root), loader, why)
    if bindings:
        return False, bindings if ok else f"{bindings}; also {reason}"
    return ok, reason


def _cubin_path(p: Probe, root: Path, loader: str | None, why: str) -> tuple[bool, str]:
    try:
        m = mf.load(p.cc, root)
    except mf.ManifestError as exc:
        return False, f"{p.name}: {exc}"
    too_old = compat.cubin_driver_problem(p.name, p.driver_cuda or None, m.toolchain.min_driver_cuda,
                                          m.toolchain.min_driver, m.target)
    if too_old:
        return False, too_old
    try:
        import torch
    except ImportError:
        return False, "torch is not installed"
    if not torch.cuda.is_available():
        return False, _torch_cuda_problem(p, torch)
    if loader is None:
        return False, f"{p.name}: {why}"
    return True, f"{p.name} (CC {_cc_text(p.cc)}): {len(m.kernels)} {m.target} cubins, loader {loader} ({why})"


def _torch_cuda_problem(p: Probe, torch) -> str:
    """Why torch cannot initialise CUDA on the GPU the probe found, in one sentence: a CPU-only build, or a
    driver older than the CUDA torch was built for (PyPI's CUDA 13 torch on an R5xx driver), both named."""
    built, driver = compat.cuda_version(torch.version.cuda), compat.cuda_version(p.driver_cuda)
    if built is None:
        return f"{p.name} is present but this torch build has no CUDA (torch {torch.__version__})"
    if driver is None or driver >= built:
        return (f"{p.name} is present but torch {torch.__version__} (CUDA {built[0]}.{built[1]}) could not "
                "initialise CUDA on it (is CUDA_VISIBLE_DEVICES hiding it?)")
    build = compat.torch_build_for(driver)
    fix = f"`{compat.install_line(build)}`, or update the NVIDIA driver" if build else "update the NVIDIA driver"
    return (f"{p.name}'s driver{' ' + p.driver if p.driver else ''} supports CUDA {driver[0]}.{driver[1]}, too old "
            f"for this torch's CUDA {built[0]}.{built[1]} (torch {torch.__version__} needs driver "
            f"{compat.min_driver(built)} or newer): {fix}")


def available(device: int = 0, root: Path = mf.CUBIN_DIR) -> tuple[bool, str]:
    """(True, description) when the cubin path can run on `device`, else (False, one-sentence reason).
    Cached; touches only ctypes, the manifest and torch — never PyCUDA or cuda.core."""
    return _available(device, str(root))


def open_loader(device: int, preference: str = "auto"):
    """First loader that initialises, with `.why` saying why it was chosen; RuntimeError listing why
    each failed."""
    if preference == "auto":
        _, why = loader_choice()
        names = loader_candidates()
    else:
        names, why = [preference], "asked for by name"
    failures = []
    for name in names:
        try:
            loader = LOADERS[name](device)
        except Exception as exc:  # ImportError, pycuda.driver.Error, cuda errors: try the next one
            failures.append(f"{name}: {type(exc).__name__}: {exc}")
            continue
        loader.why = why if not failures else f"{'; '.join(failures)}; {name} loads the same cubins"
        return loader
    raise RuntimeError("no cubin loader could start (" + ("; ".join(failures) or "none installed") + ")")

# ---------------------------------------------------------------------------------------------
# Kernels

class _Kernel:
    __slots__ = ("entry", "handle", "runtime", "scratch", "scratch_grid")

    def __init__(self, entry, handle, runtime):
        self.entry, self.handle, self.runtime = entry, handle, runtime
        self.scratch, self.scratch_grid = [], 0

    def _scratch(self, grid) -> tuple[int, int]:
        e = self.entry
        if not (e.global_scratch_size or e.profile_scratch_size):
            return (0, 0)
        n = grid[0] * grid[1] * grid[2] * e.num_ctas
        if n > self.scratch_grid:  # grow once per larger grid; warm-up before capture does this
            import torch

            self.scratch = [torch.empty(max(size * n, 1), dtype=torch.uint8, device=self.runtime.device) if size
                            else None for size in (e.global_scratch_size, e.profile_scratch_size)]
            self.scratch_grid = n
        return tuple(t.data_ptr() if t is not None else 0 for t in self.scratch)

    def __call__(self, grid, *args, strict_dtypes: bool = True) -> None:
        self.runtime.check_stream(self.entry.name)
        g = grid3(grid)
        packed = pack_args(self.entry, args, self._scratch(g), self.runtime.loader.device_type, strict_dtypes)
        self.runtime.loader.launch(self.handle, g, self.entry.block, self.entry.shared, packed)


class CubinLoadError(RuntimeError):
    """A cubin the driver would not load; the message names the kernel and the driver's error."""


class ForeignStream(RuntimeError):
    """A launch while torch's current stream is not the kernels' stream: the launch would race the torch
    work that made its inputs (torch orders work per stream; a launch on another stream waits for none)."""


def _torch_current_stream(device: str):
    import torch

    return torch.cuda.current_stream(torch.device(device))


def _handle(stream) -> int:
    return int(getattr(stream, "cuda_stream", 0) or 0)


class CubinKernels:
    """The committed cubins for one device, by KernelSpec name: `k.launch(name, grid, *args)` or
    `k[name](grid, *args)`. Launches go to `k.stream` (a torch stream); run torch work on it too."""

    def __init__(self, device: int = 0, *, loader="auto", root: Path = mf.CUBIN_DIR, cc: int | None = None,
                 current_stream=None):
        if isinstance(loader, str):
            ok, reason = available(device, root)
            if not ok:
                raise RuntimeError(f"cubin kernels unavailable: {reason}")
            cc = probe_driver(device).cc
            loader = open_loader(device, loader)
        self.loader = loader
        self.device = f"cuda:{device}" if loader.device_type == "cuda" else loader.device_type
        self.manifest = mf.load(cc, root)
        self.stream = loader.stream
        # torch's current stream on the launching thread; a loader without CUDA has no torch stream to
        # compare (the CPU tests pass a stand-in)
        self.current_stream = current_stream or (functools.partial(_torch_current_stream, self.device)
                                                 if loader.device_type == "cuda" else lambda: self.stream)
        self._kernels = {}
        for name, e in self.manifest.kernels.items():  # one by one: a refusal names its kernel
            try:
                handle = loader.load(self.manifest.cubin_bytes(name), e)
            except Exception as exc:  # the driver's error type depends on the loader
                raise CubinLoadError(f"the driver refused kernel {name} ({self.manifest.target}, {e.symbol}) "
                                     f"with the {loader.name} loader: {type(exc).__name__}: {exc}") from exc
            self._kernels[name] = _Kernel(e, handle, self)

    @property
    def loader_name(self) -> str:
        return self.loader.name

    @property
    def loader_reason(self) -> str:
        return getattr(self.loader, "why", "")

    def __contains__(self, name: str) -> bool:
        return name in self._kernels

    def __getitem__(self, name: str) -> _Kernel:
        try:
            return self._kernels[name]
        except KeyError:
            raise KeyError(f"no cubin named {name!r} for {self.manifest.target}") from None

    def launch(self, name: str, grid, *args, strict_dtypes: bool = True) -> None:
        self[name](grid, *args, strict_dtypes=strict_dtypes)

    def check_stream(self, name: str) -> None:
        """Refuse a launch unless the caller runs torch on `self.stream` (`with torch.cuda.stream(k.stream)`,
        after `k.stream.wait_stream(...)` for inputs made elsewhere): the cubins launch on that stream
        whatever torch's current one is, so any other current stream would race them."""
        current = self.current_stream()
        if _handle(current) != _handle(self.stream):
            raise ForeignStream(f"launch of {name} while torch's current stream is {_handle(current):#x}, not the "
                                f"kernels' stream {_handle(self.stream):#x}: run it inside "
                                "`with torch.cuda.stream(kernels.stream)` (after a wait_stream for its inputs)")


class CaptureFailed(RuntimeError):
    """A CUDA graph capture failed; the message carries the first error, not the driver's later
    "operation not permitted when stream is capturing" / "capture invalidated" that follows it."""


def capture_graph(fn, stream, *, warmup: int = 2, pool=None):
    """Run `fn` `warmup` times on `stream` (lazy allocations, scratch, cuBLAS handles), then capture
    one call into a torch CUDA graph. `fn` must read positions and inputs from device buffers so that
    `graph.replay()` after updating those buffers in place does the next step."""
    import torch

    with torch.cuda.stream(stream):
        for _ in range(warmup):
            fn()
    stream.synchronize()
    graph = torch.cuda.CUDAGraph()
    first: list[BaseException] = []

    def body():
        try:
            fn()
        except BaseException as exc:
            first.append(exc)
            raise

    # thread_local: another thread's CUDA call (the studio serves requests from several) cannot
    # invalidate this capture, while this thread's own unsafe calls still fail it.
    try:
        with torch.cuda.graph(graph, stream=stream, pool=pool, capture_error_mode="thread_local"):
            body()
    except Exception as exc:
        if first and exc is not first[0]:  # ending the capture raised over the launch that broke it
            raise CaptureFailed(f"CUDA graph capture failed at its first error: {type(first[0]).__name__}: "
                                f"{first[0]} (then: {type(exc).__name__}: {exc})") from first[0]
        raise
    return graph


CHECK_KERNEL, CHECK_N, CHECK_K = "gemv_bf16", 16, 256  # in every manifest, plain arguments, one small launch


def launch_check(kernels, device) -> tuple[bool, str]:
    """Launch one small kernel and compare it with torch: gemv_bf16 (y = W·x, bf16) on a 16 × 256 weight.
    (passed, one line with the error); `kernels` is a CubinKernels, or InterpretedKernels in the tests."""
    import torch

    gen = torch.Generator().manual_seed(0)
    x = torch.randn(CHECK_K, generator=gen).to(torch.bfloat16)
    w = torch.randn(CHECK_N, CHECK_K, generator=gen).to(torch.bfloat16)
    want = w.float() @ x.float()
    grid = -(-CHECK_N // kernels.manifest.kernels[CHECK_KERNEL].constexprs["BLOCK_N"])
    with torch.cuda.stream(kernels.stream):
        y = torch.zeros(CHECK_N, dtype=torch.bfloat16, device=device)
        kernels.launch(CHECK_KERNEL, grid, x.to(device), w.to(device), None, None, None, y, CHECK_N, CHECK_K,
                       CHECK_K)
        err = float((y.float().cpu() - want).abs().max() / want.abs().max())
    return err < 1e-2, f"{CHECK_KERNEL} ({CHECK_N} × {CHECK_K}) against torch: rel err {err:.1e} (< 1e-2)"


def main() -> int:
    """Report the loader that would run and why, whether the cubin path can run here, which loader really
    started (or each one's error) with the cuda-core / cuda-bindings versions; then load this GPU's manifest
    and launch one kernel against torch: PASS exits 0, FAIL 1, and 2 where nothing could be launched. Never
    hangs: nothing imports PyCUDA or cuda-core before the ctypes probe has found a driver."""
    name, why = loader_choice()
    print(f"loader: {name or 'none'} ({why})")
    versions = {pkg: package_version(pkg) for pkg in ("cuda-core", "cuda-bindings", "pycuda")}
    print("packages: " + ", ".join(f"{pkg} {v or '-'}" for pkg, v in versions.items()))
    p = probe_driver()
    mismatch = bindings_problem(p.driver_cuda, versions["cuda-bindings"]) if p.ok else None
    ok, reason = available()
    if mismatch and mismatch not in reason:  # PyCUDA is the loader: the mismatch is only a note
        print(mismatch)
    print(f"cubin path: {'available' if ok else 'unavailable'}: {reason}")
    unusable = torch_cannot_use_gpu()
    if unusable:
        print(unusable)
    if not ok:
        return 2
    try:
        kernels = CubinKernels(loader=open_loader(0), cc=p.cc)
    except RuntimeError as exc:  # no loader started, or the driver refused a cubin (CubinLoadError)
        print(f"loaded: none: {exc}")
        return 2
    m = kernels.manifest
    print(f"loaded: {kernels.loader_name} ({kernels.loader_reason}): {len(m.kernels)} {m.target} cubins")
    try:
        passed, line = launch_check(kernels, kernels.device)
    except Exception as exc:  # noqa: BLE001  (the driver's error type depends on the loader)
        passed, line = False, f"{CHECK_KERNEL} launch failed: {type(exc).__name__}: {exc}"
    print(f"{'PASS' if passed else 'FAIL'}: {line} (loader {kernels.loader_name})")
    return 0 if passed else 1


if __name__ == "__main__":
    raise SystemExit(main())
