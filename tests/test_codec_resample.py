"""The 24 → 16 kHz resampler of the codec's semantic branch (engine/resample.py) against the formula it
implements, evaluated independently in float64, and (when a torchaudio copy is at hand) against torchaudio.

The parity encode tests check it end to end as well: a different resampler flips voice-clone codes."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from engine.resample import LOWPASS_FILTER_WIDTH, ROLLOFF, resample


def direct_float64(x: np.ndarray, orig: int, new: int) -> np.ndarray:
    """y[j] = Σ_i x[i] · (b/o) · sinc(b (i/o − j/n)) · cos²(π b (i/o − j/n) / 2W), b = min(o, n)·rolloff,
    zero where |b (i/o − j/n)| > W — straight from the definition, one output sample at a time."""
    g = math.gcd(orig, new)
    o, n = orig // g, new // g
    b = min(o, n) * ROLLOFF
    i = np.arange(len(x), dtype=np.float64)
    out = np.empty(math.ceil(len(x) * n / o))
    for j in range(len(out)):
        t = b * (i / o - j / n)
        h = np.where(np.abs(t) <= LOWPASS_FILTER_WIDTH,
                     np.sinc(t) * np.cos(np.pi * t / LOWPASS_FILTER_WIDTH / 2) ** 2, 0.0) * b / o
        out[j] = h @ x
    return out


@pytest.mark.parametrize("length", [1000, 1001, 1002, 4801])
def test_matches_float64_formula(length):
    x = np.random.default_rng(length).standard_normal(length).astype(np.float32)
    got = resample(torch.from_numpy(x), 24_000, 16_000).numpy()
    want = direct_float64(x.astype(np.float64), 24_000, 16_000)
    assert got.shape == want.shape == (math.ceil(length * 2 / 3),)
    assert np.abs(got - want).max() < 1e-5 * np.abs(x).max()  # fp32 kernel and sums vs exact


def test_other_ratio_and_batch_shape():
    x = torch.from_numpy(np.random.default_rng(0).standard_normal((2, 3, 700)).astype(np.float32))
    got = resample(x, 44_100, 24_000)
    assert got.shape == (2, 3, math.ceil(700 * 24_000 / 44_100))
    want = direct_float64(x[1, 2].double().numpy(), 44_100, 24_000)
    assert np.abs(got[1, 2].numpy() - want).max() < 1e-5 * float(x.abs().max())
    assert resample(x, 24_000, 24_000) is x


def test_passband_kept_and_stopband_removed():
    t = np.arange(24_000) / 24_000
    low = resample(torch.from_numpy(np.sin(2 * np.pi * 1000 * t).astype(np.float32)), 24_000, 16_000).numpy()
    high = resample(torch.from_numpy(np.sin(2 * np.pi * 10_000 * t).astype(np.float32)), 24_000, 16_000).numpy()
    mid = slice(1000, -1000)  # away from the zero-padded edges
    assert abs(low[mid].std() * math.sqrt(2) - 1) < 0.01
    # 10 kHz is above the new Nyquist (8 kHz): without the low-pass it would alias to 6 kHz at full
    # amplitude (std 0.71); the width-6 Hann sinc leaves about -45 dB (measured std 0.0038).
    assert high[mid].std() < 0.01


def _torchaudio_path() -> str | None:
    """A torchaudio to compare with, never a project dependency: HIGGS_TORCHAUDIO_PATH may point at an
    unpacked wheel whose lib/*.so were deleted (its functional.resample is pure Python)."""
    path = os.environ.get("HIGGS_TORCHAUDIO_PATH")
    if path and (Path(path) / "torchaudio" / "__init__.py").exists():
        return path
    probe = subprocess.run([sys.executable, "-c", "import torchaudio"], capture_output=True)
    return "" if probe.returncode == 0 else None


def test_bit_equal_to_torchaudio(tmp_path):
    path = _torchaudio_path()
    if path is None:
        pytest.skip("torchaudio not available (set HIGGS_TORCHAUDIO_PATH to an unpacked torchaudio wheel)")
    x = torch.from_numpy(np.random.default_rng(7).standard_normal((1, 1, 36_001)).astype(np.float32) * 0.3)
    torch.save(x, tmp_path / "x.pt")
    script = textwrap.dedent(f"""
        import sys, torch
        sys.path.insert(0, {path!r})
        import torchaudio
        x = torch.load({str(tmp_path / 'x.pt')!r})
        torch.save(torchaudio.functional.resample(x, 24000, 16000), {str(tmp_path / 'y.pt')!r})
    """)
    # A separate process so torchaudio never becomes importable inside the test session.
    subprocess.run([sys.executable, "-c", script], check=True, timeout=120)
    want = torch.load(tmp_path / "y.pt")
    got = resample(x, 24_000, 16_000)
    assert got.shape == want.shape and torch.equal(got, want)
