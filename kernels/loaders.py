"""The two cubin loaders, each on the device's primary context (the one torch uses) with a stream torch
shares: PyCUDA (the product's; torch adopts its stream) and cuda-core (binary wheels; launches on a torch
stream). Both load a cubin from bytes and launch packed arguments; `kernels.runtime.open_loader` picks one.
Also which cuda-bindings (built per CUDA major) a driver can run, for the cuda-core loader.
"""

from __future__ import annotations

import ctypes
import os
import threading

from kernels import manifest as mf
from kernels.packing import Packed

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
    """cuda-core (binary wheels, no build); launches on a torch stream, wrapped once as cuda-core's `Stream`
    (`launch` taking a torch stream through `__cuda_stream__` is deprecated in cuda-core)."""

    name = "cuda.core"
    device_type = "cuda"
    _NUMPY = {"P": "uint64", "i": "int32", "I": "uint32", "q": "int64", "Q": "uint64", "f": "float32", "d": "float64"}

    def __init__(self, device: int):
        import numpy as np
        import torch

        try:
            from cuda.core import Device, LaunchConfig, ObjectCode, Stream, launch
        except ImportError:  # cuda-core < 0.4 kept the API under .experimental
            from cuda.core.experimental import Device, LaunchConfig, ObjectCode, Stream, launch
        from cuda.bindings import driver

        self.np, self.driver = np, driver
        self.ObjectCode, self.LaunchConfig, self._launch = ObjectCode, LaunchConfig, launch
        self.Stream, self.core_streams = Stream, {}  # raw stream handle -> cuda-core's Stream over it
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
        self._launch(self.core_stream(self.stream), self.LaunchConfig(grid=grid, block=block, shmem_size=shared),
                     kernel, *args)

    def core_stream(self, stream):
        """cuda-core's `Stream` over a torch stream, made at its first launch and kept by the raw handle, so
        later launches (and graph captures) on that stream reuse it. The wrapper does not own the stream:
        torch keeps it alive, as the loader holds `self.stream` for its life."""
        handle = int(stream.cuda_stream)
        core = self.core_streams.get(handle)
        if core is None:
            core = self.core_streams[handle] = self.Stream.from_handle(handle)
        return core


# cuda-bindings is built per CUDA major and needs a driver for that major: 12.x runs on R525+, 13.x on
# R580.65+ only (cuda-core's install notes). cuda-core works over either; its [cu12] / [cu13] extra picks.
BINDINGS_REQUIREMENTS = {12: ("cuda-core[cu12]>=1.2,<2", "cuda-bindings>=12.8,<13"),
                         13: ("cuda-core[cu13]>=1.2,<2", "cuda-bindings>=13,<14")}
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


LOADERS = {"pycuda": PyCudaLoader, "cuda.core": CudaCoreLoader}
