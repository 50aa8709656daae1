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
loads the same cubins and launches on a torch stream directly. Graphs are captured with torch on that
shared stream: capture happens in the driver, so it records either loader's cuLaunchKernel calls.

Every launching thread makes the primary context current once (`ThreadContext`), since the studio
launches from worker threads; kernels run on a non-blocking stream, and graphs are captured in
"thread_local" error mode, so other threads' CUDA calls neither serialise with nor invalidate them.

    python -m kernels.runtime                 # which loader, and whether the cubin path can run here

Probe first. With no driver, `cuda.core`'s `ObjectCode.from_cubin` fails in a way that leaves a lock
held and the next driver call hangs (KERNELS.md §4), so `available()` asks libcuda itself through
ctypes before anything imports PyCUDA or cuda.core.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.util
import os
import struct
import threading
from dataclasses import dataclass
from pathlib import Path

from kernels import compat
from kernels import manifest as mf


# Triton pointer type -> torch dtype name, to refuse a tensor of the wrong dtype before it reaches a kernel.
_POINTER_DTYPES = {"*bf16": "bfloat16", "*fp16": "float16", "*fp32": "float32", "*fp8e4nv": "float8_e4m3fn",
                   "*i64": "int64", "*i32": "int32", "*i16": "int16", "*i8": "int8", "*u8": "uint8", "*i1": "bool"}
_INT_RANGES = {"i32": (-2**31, 2**31), "u32": (0, 2**32), "i64": (-2**63, 2**63), "u64": (0, 2**64)}


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


# cuda-bindings is built per CUDA major and needs a driver for that major: 12.x runs on R525+, 13.x on
# R580.65+ only (cuda-core's install notes). cuda-core works over either; its [cu12] / [cu13] extra picks.
BINDINGS_REQUIREMENTS = {12: ("cuda-core[cu12]", "cuda-bindings>=12.8,<13"),
                         13: ("cuda-core[cu13]", "cuda-bindings>=13,<14")}
BINDINGS_INSTALL = {major: "pip install " + " ".join(f'"{r}"' for r in reqs)
                    for major, reqs in BINDINGS_REQUIREMENTS.items()}


def bindings_requirements(driver_cuda: int) -> tuple[str, ...]:
    """The cuda-core / cuda-bindings requirements for a driver (cuDriverGetVersion's number)."""
    return BINDINGS_REQUIREMENTS[12 if driver_cuda < 13000 else 13]


def bindings_problem(driver_cuda: int, bindings: str | None) -> str | None:
    """One sentence when the installed cuda-bindings (version string, None when absent) needs a newer
    driver than this one (`driver_cuda` as cuDriverGetVersion gives it, e.g. 12040), with the pip line
    that fits; None when they match or either is unknown."""
    if not bindings or not driver_cuda:
        return None
    major, driver_major = int(bindings.split(".")[0]), driver_cuda // 1000
    if major <= driver_major:
        return None
    fix = BINDINGS_INSTALL.get(driver_major, f"install cuda-bindings {driver_major}.x")
    return (f"cuda-bindings {bindings} is built for CUDA {major}, but this driver supports CUDA "
            f"{driver_major}.{driver_cuda % 1000 // 10}, so the cuda-core loader cannot start: {fix}")


def package_version(name: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


@functools.cache
def _available(device: int, root: str) -> tuple[bool, str]:
    p = probe_driver(device)
    if not p.ok:
        return False, p.reason
    try:
        m = mf.load(p.cc, Path(root))
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
        return False, f"{p.name} is present but this torch build has no CUDA (torch {torch.__version__})"
    loader, why = loader_choice()
    if loader is None:
        return False, f"{p.name}: {why}"
    return True, f"{p.name} (CC {_cc_text(p.cc)}): {len(m.kernels)} {m.target} cubins, loader {loader} ({why})"


def available(device: int = 0, root: Path = mf.CUBIN_DIR) -> tuple[bool, str]:
    """(True, description) when the cubin path can run on `device`, else (False, one-sentence reason).
    Cached; touches only ctypes, the manifest and torch — never PyCUDA or cuda.core."""
    return _available(device, str(root))


# ---------------------------------------------------------------------------------------------
# Argument packing (pure: tested on the CPU against the manifests)

@dataclass
class Packed:
    values: list            # Python ints / floats in parameter order, scratch pointers last
    format: str             # struct codes, one per value (what PyCUDA's prepare() takes)

    def buffer(self) -> bytes:
        """The argument buffer as the driver receives it from PyCUDA (native alignment)."""
        return struct.pack("@" + self.format, *self.values)


def pack_args(entry: mf.KernelEntry, args, scratch=(0, 0), device_type: str = "cuda",
              strict_dtypes: bool = True) -> Packed:
    """Typed launch arguments for `entry`: tensors -> device pointers, None -> null pointer, ints ->
    range-checked integers, floats -> fp32; then Triton's two hidden scratch pointers.

    Checks what would otherwise corrupt memory silently: the argument count, a tensor's device, the
    16-divisibility the cubin was compiled to assume, and (strict_dtypes) each tensor's dtype. Triton's
    own launcher does not check dtypes either; `ops.py` passes placeholder tensors for pointers a
    variant never reads, so the ops shim resolves variants by dtype and packs with strict_dtypes=False."""
    params = entry.user_params
    if len(args) != len(params):
        raise TypeError(f"{entry.name} takes {len(params)} arguments ({', '.join(p.name for p in params)}), "
                        f"got {len(args)}")
    values = []
    for p, a in zip(params, args):
        if p.type.startswith("*"):
            if a is None:
                values.append(0)
                continue
            dtype = getattr(a, "dtype", None)
            if dtype is None or not hasattr(a, "data_ptr"):
                raise TypeError(f"{entry.name}.{p.name} ({p.type}) needs a tensor, got {type(a).__name__}")
            want = _POINTER_DTYPES.get(p.type)
            if strict_dtypes and want and str(dtype).removeprefix("torch.") != want:
                raise TypeError(f"{entry.name}.{p.name} expects {want}, got {dtype}")
            if a.device.type != device_type:
                raise TypeError(f"{entry.name}.{p.name} is on {a.device}, expected a {device_type} tensor")
            if p.name in entry.divisibility_16 and a.data_ptr() % 16:
                raise ValueError(f"{entry.name}.{p.name} must be 16-byte aligned (the cubin assumes it)")
            values.append(a.data_ptr())
        elif p.type in _INT_RANGES:
            if isinstance(a, bool) or not isinstance(a, int):
                raise TypeError(f"{entry.name}.{p.name} ({p.type}) needs an int, got {type(a).__name__}")
            lo, hi = _INT_RANGES[p.type]
            if not lo <= a < hi:
                raise OverflowError(f"{entry.name}.{p.name}={a} does not fit {p.type}")
            if p.name in entry.divisibility_16 and a % 16:
                raise ValueError(f"{entry.name}.{p.name}={a} must be a multiple of 16 (the cubin assumes it)")
            values.append(a)
        elif p.type in ("fp32", "fp64"):
            values.append(float(a))
        else:
            raise TypeError(f"{entry.name}.{p.name}: unsupported parameter type {p.type}")
    values += list(scratch)
    return Packed(values, entry.struct_format)


def grid3(grid) -> tuple[int, int, int]:
    g = (grid,) if isinstance(grid, int) else tuple(grid)
    if not 1 <= len(g) <= 3 or any(int(x) < 1 for x in g):
        raise ValueError(f"grid must be 1-3 positive ints, got {grid}")
    return tuple(int(x) for x in g) + (1,) * (3 - len(g))


# ---------------------------------------------------------------------------------------------
# Loaders

CU_STREAM_NON_BLOCKING = 1  # no implicit sync with the legacy default stream (cuStreamCreate flags)


class ThreadContext:
    """Makes the device's primary context (the one torch uses) current once per launching thread.

    A driver-API launch runs in the calling thread's current context. PyCUDA makes the primary context
    current only on the thread that imported `pycuda.autoprimaryctx`, and the studio launches from its
    worker threads; so each thread sets it once (a thread-local flag), never per launch. `driver` is
    libcuda through ctypes, or a fake in the CPU tests."""

    def __init__(self, device: int, driver=None):
        self.driver = driver if driver is not None else ctypes.CDLL("libcuda.so.1")
        self.device = device
        self._local = threading.local()
        self._ctx = None

    def _check(self, rc: int, what: str) -> None:
        if rc:
            raise RuntimeError(f"{what} failed on CUDA device {self.device} (CUresult {rc})")

    def ensure(self) -> None:
        if getattr(self._local, "current", False):
            return
        d = self.driver
        if self._ctx is None:
            dev, ctx = ctypes.c_int(), ctypes.c_void_p()
            self._check(d.cuDeviceGet(ctypes.byref(dev), self.device), "cuDeviceGet")
            self._check(d.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
            self._ctx = ctx
        self._check(d.cuCtxSetCurrent(self._ctx), "cuCtxSetCurrent")
        self._local.current = True


def open_driver_api(device: int) -> ThreadContext:
    return ThreadContext(device)


class PyCudaLoader:
    """PyCUDA on the primary context; torch adopts PyCUDA's (non-blocking) stream."""

    name = "pycuda"
    device_type = "cuda"

    def __init__(self, device: int):
        import torch

        torch.cuda.init()
        os.environ.setdefault("CUDA_DEVICE", str(device))  # autoprimaryctx picks its device from this
        import pycuda.autoprimaryctx  # noqa: F401  (retains + pushes the primary context torch uses)
        import pycuda.driver as drv

        self.drv = drv
        self.context = open_driver_api(device)
        self.context.ensure()
        self.pycuda_stream = drv.Stream(CU_STREAM_NON_BLOCKING)
        self.stream = torch.cuda.ExternalStream(self.pycuda_stream.handle, device=torch.device("cuda", device))

    def load(self, cubin: bytes, entry: mf.KernelEntry):
        module = self.drv.module_from_buffer(cubin)
        fn = module.get_function(entry.symbol)
        if entry.needs_smem_opt_in:
            fn.set_attribute(self.drv.function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES, entry.shared)
        fn.prepare(entry.struct_format)
        return module, fn

    def launch(self, handle, grid, block, shared: int, packed: Packed) -> None:
        self.context.ensure()
        handle[1].prepared_async_call(grid, block, self.pycuda_stream, *packed.values, shared_size=shared)


class CudaCoreLoader:
    """cuda-core (binary wheels, no build); launches on a torch stream directly."""

    name = "cuda.core"
    device_type = "cuda"
    _NUMPY = {"P": "uint64", "i": "int32", "I": "uint32", "q": "int64", "Q": "uint64", "f": "float32", "d": "float64"}

    def __init__(self, device: int):
        import numpy as np
        import torch

        try:
            from cuda.core import Device, LaunchConfig, ObjectCode, launch
        except ImportError:  # cuda-core < 0.4 kept the API under .experimental
            from cuda.core.experimental import Device, LaunchConfig, ObjectCode, launch
        from cuda.bindings import driver

        self.np, self.driver = np, driver
        self.ObjectCode, self.LaunchConfig, self._launch = ObjectCode, LaunchConfig, launch
        self.device = device
        Device(device).set_current()  # the primary context, as torch uses
        self.context = open_driver_api(device)
        # torch creates its pool streams with cudaStreamNonBlocking: no implicit sync with stream 0
        self.stream = torch.cuda.Stream(device=torch.device("cuda", device))

    def load(self, cubin: bytes, entry: mf.KernelEntry):
        obj = self.ObjectCode.from_cubin(cubin)
        kernel = obj.get_kernel(entry.symbol)
        if entry.needs_smem_opt_in:
            (err,) = self.driver.cuKernelSetAttribute(
                self.driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, entry.shared,
                kernel.handle, self.driver.CUdevice(self.device))
            if err != self.driver.CUresult.CUDA_SUCCESS:
                raise RuntimeError(f"{entry.name}: cannot allow {entry.shared} B of shared memory ({err})")
        types = [getattr(self.np, self._NUMPY[c]) for c in entry.struct_format]
        return obj, kernel, types

    def launch(self, handle, grid, block, shared: int, packed: Packed) -> None:
        self.context.ensure()
        _, kernel, types = handle
        args = [t(v) for t, v in zip(types, packed.values)]
        self._launch(self.stream, self.LaunchConfig(grid=grid, block=block, shmem_size=shared), kernel, *args)


LOADERS = {"pycuda": PyCudaLoader, "cuda.core": CudaCoreLoader}


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


# ---------------------------------------------------------------------------------------------
# The typed ops of kernels/ops.py, launched from cubins

_LAUNCH_OPTIONS = ("num_warps", "num_stages", "num_ctas")


class _JitShim:
    """Stands in for one `@triton.jit` function inside a copy of `kernels/ops.py`: `shim[grid](...)`
    takes exactly the call Triton's launcher would, picks the manifest entry compiled for those
    constexprs (and pointer dtypes, where variants differ only by dtype), and launches its cubin.
    A call no cubin was built for is an error, never a silent JIT compile."""

    def __init__(self, fn, kernels, entries: list[mf.KernelEntry]):
        import inspect

        self.fn, self.kernels, self.entries = fn, kernels, entries
        sig = inspect.signature(getattr(fn, "fn", fn))
        self.names = list(sig.parameters)
        self.defaults = {n: p.default for n, p in sig.parameters.items() if p.default is not inspect.Parameter.empty}
        self._cache: dict = {}

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self._launch(grid, args, kwargs)

    def _resolve(self, bound: dict, options: dict) -> mf.KernelEntry:
        def dtype(v):
            return str(getattr(v, "dtype", "")).removeprefix("torch.")

        matches = []
        for e in self.entries:
            if any(bound.get(k, self.defaults.get(k)) != v for k, v in e.constexprs.items()):
                continue
            if any(options.get(o, getattr(e, o)) != getattr(e, o) for o in ("num_warps", "num_stages")):
                continue
            score = sum(dtype(bound[p.name]) == _POINTER_DTYPES.get(p.type)
                        for p in e.user_params if p.type.startswith("*") and bound.get(p.name) is not None)
            matches.append((score, e))
        matches.sort(key=lambda m: -m[0])
        if not matches or (len(matches) > 1 and matches[0][0] == matches[1][0]):
            given = {k: bound.get(k) for k in sorted({k for e in self.entries for k in e.constexprs})}
            raise LookupError(f"{getattr(self.fn, '__name__', self.fn)}: "
                              f"{'no' if not matches else 'more than one'} cubin matches constexprs {given}, "
                              f"options {options} (built: {[e.name for e in self.entries]}); "
                              "add a KernelSpec for this call and rebuild")
        return matches[0][1]

    def _launch(self, grid, args, kwargs):
        options = {k: kwargs.pop(k) for k in _LAUNCH_OPTIONS if k in kwargs}
        bound = dict(zip(self.names, args))
        bound.update(kwargs)
        key = tuple((k, v if isinstance(v, (bool, int, float, str, type(None))) else str(getattr(v, "dtype", "")))
                    for k, v in sorted(bound.items())) + tuple(sorted(options.items()))
        entry = self._cache.get(key)
        if entry is None:
            entry = self._cache[key] = self._resolve(bound, options)
        self.kernels.launch(entry.name, grid, *[bound[p.name] for p in entry.user_params], strict_dtypes=False)


def cubin_ops(kernels, ops_module=None):
    """A private copy of `kernels/ops.py` whose Triton kernels launch from `kernels` (a CubinKernels,
    or InterpretedKernels in CPU tests) — the same op names, arguments, grids and strides, one source
    of truth. Requires `triton` importable (ops.py uses triton.cdiv); torch's CUDA wheels bring it."""
    import importlib

    ops = ops_module or importlib.import_module("kernels.ops")
    spec = importlib.util.spec_from_file_location(f"{ops.__name__}_cubin_{id(kernels):x}", ops.__file__)
    copy = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(copy)
    by_fn: dict[tuple[str, str], list[mf.KernelEntry]] = {}
    for e in kernels.manifest.kernels.values():
        by_fn.setdefault((e.module, e.symbol), []).append(e)
    replaced = []
    for attr, value in vars(copy).items():
        fn = getattr(value, "fn", None)
        if fn is None or not callable(fn):
            continue
        entries = by_fn.get((fn.__module__, fn.__name__))
        if entries:
            setattr(copy, attr, _JitShim(value, kernels, entries))
            replaced.append(attr)
    copy.CUBIN_KERNELS = tuple(replaced)
    return copy


class InterpretedKernels:
    """CubinKernels' launch interface backed by the Triton sources themselves, run exactly as the
    manifest says (its constexprs and warps, its parameter order, after `pack_args` validation).
    Under TRITON_INTERPRET=1 this runs on the CPU, so CI executes the cubin path's whole composition
    — variant resolution, argument lists, alignment — without a GPU; only the machine code differs."""

    loader_name = "interpreter"

    def __init__(self, manifest: mf.Manifest, device_type: str = "cpu"):
        import importlib

        self.manifest, self.device_type = manifest, device_type
        self.stream = None
        self._fns = {n: getattr(importlib.import_module(e.module), e.symbol) for n, e in manifest.kernels.items()}
        self.launches: list[str] = []

    def __contains__(self, name: str) -> bool:
        return name in self._fns

    def launch(self, name: str, grid, *args, strict_dtypes: bool = True) -> None:
        e = self.manifest.kernels[name]
        pack_args(e, args, device_type=self.device_type, strict_dtypes=strict_dtypes)
        named = {p.name: a for p, a in zip(e.user_params, args)}
        self._fns[name][grid3(grid)](**named, **e.constexprs, num_warps=e.num_warps, num_stages=e.num_stages)
        self.launches.append(name)


def main() -> int:
    """Report the loader that would run and why, whether the cubin path can run here, and then which loader
    really started (or each one's error) with the cuda-core / cuda-bindings versions. Never hangs: nothing
    imports PyCUDA or cuda-core before the ctypes probe has found a driver."""
    name, why = loader_choice()
    print(f"loader: {name or 'none'} ({why})")
    versions = {pkg: package_version(pkg) for pkg in ("cuda-core", "cuda-bindings", "pycuda")}
    print("packages: " + ", ".join(f"{pkg} {v or '-'}" for pkg, v in versions.items()))
    p = probe_driver()
    mismatch = bindings_problem(p.driver_cuda, versions["cuda-bindings"]) if p.ok else None
    if mismatch:
        print(mismatch)
    ok, reason = available()
    print(f"cubin path: {'available' if ok else 'unavailable'}: {reason}")
    unusable = torch_cannot_use_gpu()
    if unusable:
        print(unusable)
    if ok:
        try:
            loader = open_loader(0)
            print(f"loaded: {loader.name} ({loader.why})")
        except RuntimeError as exc:
            print(f"loaded: none: {exc}")
            return 2
    return 0 if ok else 2


if __name__ == "__main__":
    raise SystemExit(main())
