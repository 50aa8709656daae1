"""Why the cubin path does not run, said the same everywhere: an R5xx driver beside cuda-bindings built for
CUDA 13 (the cuda-core loader cannot start) is `kernels.runtime.available`'s sentence, backend "auto"'s
reason for torch-graph, and what `/health` and the page's backend chip say."""

from __future__ import annotations

import html
from dataclasses import dataclass

import pytest
import torch

from engine import backends
from kernels import runtime
from tests.fakes import FakeEngine, fake_info

R570 = runtime.Probe(True, "", cc=90, name="NVIDIA H200", driver_cuda=12080, driver="570.86.15")


@pytest.fixture
def r5xx_with_cuda13_bindings(monkeypatch):
    """An H200 on an R570 driver (CUDA 12.8) that torch can use; cuda-core is the loader, over cuda-bindings 13."""
    monkeypatch.setattr(runtime, "probe_driver", lambda device=0: R570)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(runtime, "loader_choice", lambda: ("cuda.core", "PyCUDA is not installed"))
    monkeypatch.setattr(runtime, "package_version", lambda name: "13.0.1" if name == "cuda-bindings" else "1.2.2")
    runtime._available.cache_clear()
    yield runtime.bindings_problem(12080, "13.0.1")
    runtime._available.cache_clear()


@dataclass
class ChosenEngine(FakeEngine):
    """A fake engine whose backend was chosen with `reason`."""

    backend: str = "torch-graph"
    reason: str = ""

    @property
    def info(self):
        return fake_info(device="cuda:0", backend=self.backend, backend_reason=self.reason, demo=False)


def test_the_bindings_mismatch_is_the_reason_on_health_and_the_page(r5xx_with_cuda13_bindings):
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from studio import api
    from studio.takes.service import StudioService
    from studio.views.render import header_html

    bindings = r5xx_with_cuda13_bindings
    assert bindings.startswith("cuda-bindings 13.0.1 is built for CUDA 13, but this driver supports CUDA 12.8")
    assert runtime.available() == (False, bindings)
    name, fallback, reason = backends.auto_choice(torch.device("cuda"))
    assert (name, fallback) == ("torch-graph", "torch")
    assert reason == f"backend 'cubin' cannot run: {bindings}; using the torch-graph path"

    service = StudioService(ChosenEngine(reason=reason))
    try:
        assert f'title="{html.escape(reason, quote=True)}"><b>backend</b> torch-graph' in header_html(service.status())
        app = FastAPI()
        api.register(app, service)
        with TestClient(app) as client:
            health = client.get("/health").json()
        assert health["backend"] == "torch-graph" and health["backend_reason"] == reason
    finally:
        service.close()
