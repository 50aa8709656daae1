"""Shared fixtures. `../shared/parity` sits beside the clone in CI, not in a user's fresh clone: tests
that read it skip with the reason when it is absent."""

from __future__ import annotations

import os
from pathlib import Path

# Kernel tests run Triton's CPU interpreter. Triton decides when a module is imported whether its
# @triton.jit functions are interpreted, so the variable must be set before any test imports kernels/;
# the ahead-of-time cubin build runs in subprocesses with it switched off (kernels/build.py).
os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("HIGGS_SHARED", REPO.parent / "shared"))
PARITY = SHARED / "parity"
ARTIFACTS = REPO / "artifacts"


def pytest_report_header(config):
    """The CPU the suite ran on: float kernels differ between CPU kinds (AVX-512 with or without bf16,
    AVX2), so every equality claim in this suite must hold on each, and a failure report names which."""
    from engine.cpu import cpu_facts

    facts = cpu_facts()
    return (f"cpu: {facts['cpu']} ({', '.join(facts['isa']) or 'no AVX'}), torch kernels {facts['kernels']}, "
            f"native bf16 {facts['native_bf16']}, {os.cpu_count()} cores")


# CI sets HIGGS_REQUIRE_PARITY=1 (.ci/run): there a missing fixture fails the run instead of skipping
# the parity tier silently. A user's fresh clone still skips, with the reason.
REQUIRE_PARITY = os.environ.get("HIGGS_REQUIRE_PARITY") == "1"


def parity_missing(what: str) -> None:
    """Skip (fresh clone) or fail (CI) because the parity fixture `what` is absent."""
    message = f"parity fixture not found at {what} (it ships beside the repo in CI, not in a fresh clone)"
    if REQUIRE_PARITY:
        pytest.fail(f"{message}; HIGGS_REQUIRE_PARITY=1 makes this a failure")
    pytest.skip(message)


@pytest.fixture(scope="session")
def parity_dir() -> Path:
    if not (PARITY / "tiny_checkpoint" / "model.safetensors").exists():
        parity_missing(str(PARITY))
    return PARITY


@pytest.fixture(scope="session")
def artifacts_dir() -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    return ARTIFACTS


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory) -> Path:
    """A tiny random checkpoint with its codec in the real layout (engine.demo, so no parity fixture is
    needed), written once per session for the tests that build engines of their own on it."""
    from engine.demo import write_tiny_checkpoint

    return write_tiny_checkpoint(tmp_path_factory.mktemp("tiny") / "ckpt", seed=5)


@pytest.fixture(scope="session")
def interp_take(parity_dir) -> dict:
    """The cubin backend's greedy take under the interpreter beside the torch reference (tests/interp_step.py):
    minutes of interpreter time, built once for tests/test_kernels_step.py and tests/test_kernels_v2_step.py."""
    from tests.interp_step import greedy_take

    return greedy_take(parity_dir)
