"""Shared fixtures. `../shared/parity` sits beside the clone in CI, not in a user's fresh clone: tests
that read it skip with the reason when it is absent."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("HIGGS_SHARED", REPO.parent / "shared"))
PARITY = SHARED / "parity"
ARTIFACTS = REPO / "artifacts"


@pytest.fixture(scope="session")
def parity_dir() -> Path:
    if not (PARITY / "tiny_checkpoint" / "model.safetensors").exists():
        pytest.skip(f"parity fixture not found at {PARITY} (it ships beside the repo in CI, not in a fresh clone)")
    return PARITY


@pytest.fixture(scope="session")
def artifacts_dir() -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    return ARTIFACTS
