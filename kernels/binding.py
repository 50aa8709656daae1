"""The typed ops of `kernels/ops.py` launched from cubins: `cubin_ops(kernels)` is a private copy of ops.py
whose Triton kernels launch through a CubinKernels (on a GPU) or an InterpretedKernels (the same launch
interface over the Triton sources, for the CPU tests).
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect

from kernels import manifest as mf
from kernels.packing import POINTER_DTYPES, grid3, pack_args

_LAUNCH_OPTIONS = ("num_warps", "num_stages", "num_ctas")


class _JitShim:
    """Stands in for one `@triton.jit` function inside a copy of `kernels/ops.py`: `shim[grid](...)`
    takes exactly the call Triton's launcher would, picks the manifest entry compiled for those
    constexprs (and pointer dtypes, where variants differ only by dtype), and launches its cubin.
    A call no cubin was built for is an error, never a silent JIT compile."""

    def __init__(self, fn, kernels, entries: list[mf.KernelEntry]):
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
            score = sum(dtype(bound[p.name]) == POINTER_DTYPES.get(p.type)
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
