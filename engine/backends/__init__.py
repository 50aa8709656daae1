"""The step backends and the choice between them.

Each backend is named by a `"module:factory"` string, imported on first use, so choosing one never
imports the others (the cubin backend needs a GPU driver, torch-graph CUDA). A factory is
`factory(checkpoint, *, device, dtype, max_len, precision) -> backend` with the step interface of
`engine/backends/base.py`; `precision` is the user's choice (None for "auto": the backend picks), `dtype`
its torch dtype (None for "auto" or fp8).

    eager.py        the torch reference path (`HiggsModel`), every device, the last resort
    torch_graph.py  `HiggsModel`'s decode step as CUDA graphs, sampling on the device
    cubin.py        the committed Triton cubins (FP8 W8A8 / BF16), trusted after a self-check
"""

from __future__ import annotations

import gc
import importlib
from collections.abc import Callable

import torch

BACKENDS: dict[str, str | Callable] = {
    "torch": "engine.backends.eager:load",
    "torch-graph": "engine.backends.torch_graph:load",
    "cubin": "engine.backends.cubin:load",
}
# What "auto" builds instead of BACKENDS[name] where that differs (cubin: after a probe in a child process).
AUTO_BACKENDS: dict[str, str | Callable] = {"cubin": "engine.backends.trust:load_trusted"}
# `probe(device) -> str | None`: why a backend cannot run on `device`, asked before any weight is read.
PROBES: dict[str, str | Callable] = {"cubin": "engine.backends.cubin:probe"}
# What "auto" tries on a CUDA device, fastest first; the eager torch path is the last resort.
AUTO_ON_CUDA = ("cubin", "torch-graph")
# What "auto" tries after a backend failed to start, before the next one: (what it is called in the reason,
# its factory). The cubin path at bf16 after fp8: fp8 cubins → bf16 cubins → torch-graph → torch.
AUTO_RETRIES: dict[str, tuple[str, str | Callable]] = {
    "cubin": ("the bf16 cubins", "engine.backends.trust:load_trusted_bf16")}


class BackendUnavailable(ValueError):
    """A requested backend cannot run here; the message says why."""


class NoRetry(Exception):
    """An AUTO_RETRIES factory declines: its try would repeat the one that failed, or override the user's choice."""


def resolve(spec: str | Callable) -> Callable:
    """`"module:attribute"` → that attribute, imported now; a callable is its own resolution."""
    if callable(spec):
        return spec
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)


def factory(name: str, device: torch.device) -> Callable:
    """The factory of backend `name`, after its probe on `device`; BackendUnavailable says why not."""
    if name == "cubin" and device.type != "cuda":
        raise BackendUnavailable("backend 'cubin' needs an NVIDIA GPU (device='cuda'); "
                                 "use backend='torch' on this machine")
    if name not in BACKENDS:
        raise BackendUnavailable(f"unknown backend {name!r}; choose one of {sorted({*BACKENDS, 'auto'})}")
    try:
        make = resolve(BACKENDS[name])
        probe = resolve(PROBES[name]) if name in PROBES else None
    except ImportError as exc:
        raise BackendUnavailable(f"backend {name!r} is not available: {exc}") from None
    reason = probe(device) if probe is not None else None
    if reason:
        raise BackendUnavailable(f"backend {name!r} cannot run: {reason}")
    return make


def auto_choice(dev: torch.device) -> tuple[str, str, str | None]:
    """What "auto" runs on `dev`: (backend, its fallback if it fails to start, why faster ones were
    skipped). On CUDA the first usable of AUTO_ON_CUDA, then eager torch; on the CPU eager torch."""
    if dev.type != "cuda":
        return "torch", "torch", "no CUDA GPU: the torch reference path runs on the CPU"
    usable, skipped = [], []
    for candidate in AUTO_ON_CUDA:
        try:
            factory(candidate, dev)
            usable.append(candidate)
        except BackendUnavailable as exc:
            skipped.append(str(exc))
    usable.append("torch")
    reason = f"{'; '.join(skipped)}; using the {usable[0]} path" if skipped else None
    return usable[0], usable[1] if len(usable) > 1 else "torch", reason


def start(name: str, make_backend: Callable, *, auto: bool, reason: str | None, make: Callable,
          fallback: str = "torch"):
    """Build the chosen backend with `make(factory)`; returns (backend, its name, the reason for the
    choice). A fast backend that fails while starting (a GPU loader that cannot initialise, a cubin the
    driver refuses, a probe process that failed) falls back to `fallback` (which falls back to the torch
    path in turn) when the user asked for "auto", with the reason kept; asked for by name, it fails with
    one clear sentence (a kernel fault may have left this process's CUDA context unusable, so trying
    another backend here would only cascade). Under "auto" a backend of AUTO_RETRIES is tried its other
    way (the cubin path at bf16 after fp8) before `fallback`, unless the caller gave its own factory; every
    failure's sentence is kept. The fallback is built outside the handler, after the failed backend is
    freed: the handler's traceback holds its frames, and with them gigabytes of weights on the GPU."""
    standard = name in BACKENDS and make_backend is resolve(BACKENDS[name])
    if auto and name in AUTO_BACKENDS and standard:
        make_backend = resolve(AUTO_BACKENDS[name])
    try:
        return make(make_backend), name, reason
    except BackendUnavailable:
        raise
    except Exception as exc:
        if name == "torch":
            raise
        why = f"backend {name!r} failed to start ({type(exc).__name__}: {exc})"
        if not auto:
            raise BackendUnavailable(f"{why}; restart with backend='torch'") from exc
    why = f"{reason}; {why}" if reason else why  # what was skipped or failed before stays said
    free_device_memory()
    if standard and name in AUTO_RETRIES:
        what, spec = AUTO_RETRIES[name]
        backend, failed = _retry(make, resolve(spec))
        if backend is not None:
            return backend, name, f"{why}; using {what}"
        if failed:
            why = f"{why}; {what} failed to start ({failed})"
            free_device_memory()
    if fallback == "torch":
        return make(resolve(BACKENDS["torch"])), "torch", f"{why}; using the torch path"
    return start(fallback, resolve(BACKENDS[fallback]), auto=True, reason=f"{why}; using the {fallback} path",
                 make=make)


def _retry(make: Callable, make_backend: Callable):
    """(backend, None) when `make(make_backend)` starts; (None, why not) when it fails; (None, None) when it
    declines (NoRetry). Only the sentence leaves the handler, so a failed try's frames are freed with it."""
    try:
        return make(make_backend), None
    except NoRetry:
        return None, None
    except Exception as exc:  # noqa: BLE001 — whatever stops the retry, the next backend is tried with its sentence
        return None, f"{type(exc).__name__}: {exc}"


def free_device_memory() -> None:
    """Collect what a failed backend left (reference cycles included) and return its blocks to the driver."""
    gc.collect()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()
