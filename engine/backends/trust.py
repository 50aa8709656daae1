"""Trust in the cubin path, decided once in a spawned process and cached.

A kernel that faults (an illegal address in calibration or the self-check) leaves a sticky error on the
primary context, which torch shares: every later CUDA call in that process fails, the torch fallbacks
included. So under backend "auto" the cubin load, calibration and self-check first run in a child
process; the serving process loads the cubins only on a pass, and a fault costs the child, not the
studio. The verdict, with the self-check's figures, is cached in the studio's folder
(`engine.demo.cache_dir()`, $HIGGS_STUDIO_CACHE) under a key of everything it depends on: the GPU, the
driver, torch, the manifest's sha256, the precision and variant. A new driver, torch or cubin build
probes again.

    verdict = trusted(checkpoint, device, "fp8", "v2")     # cached, or probed now (seconds to a minute)
    python -m engine.backends.trust CHECKPOINT --device cuda:0 --precision fp8 --out verdict.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# The child loads the checkpoint (4B: ~10 s), calibrates and self-checks (a few s on a GPU).
PROBE_TIMEOUT_S = 600


@dataclass(frozen=True)
class Verdict:
    ok: bool
    reason: str           # the self-check's summary on a pass, what failed otherwise
    identity: dict
    seconds: float
    cached: bool = False

    @property
    def summary(self) -> str:
        how = "cached" if self.cached else f"probed in a separate process in {self.seconds:.0f} s"
        return f"{'trusted' if self.ok else 'not trusted'} ({how}): {self.reason}"


def identity(device, precision: str, variant: str) -> dict:
    """What a verdict depends on, as plain data."""
    import torch

    from kernels import manifest as mf
    from kernels import runtime

    p = runtime.probe_driver(torch.device(device).index or 0)
    target = mf.TARGETS.get(p.cc, "") if p.ok else ""
    path = mf.CUBIN_DIR / target / mf.MANIFEST
    return {"gpu": p.name, "cc": p.cc, "driver": p.driver, "driver_cuda": p.driver_cuda, "torch": torch.__version__,
            "torch_cuda": torch.version.cuda, "manifest_sha256": mf.sha256(path.read_bytes()) if path.is_file() else "",
            "precision": precision, "variant": variant}


def cache_path(ident: dict) -> Path:
    from engine.demo import cache_dir

    key = hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:24]
    return cache_dir() / "cubin-trust" / f"{key}.json"


def _write(path: Path, verdict: Verdict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(asdict(verdict), f)
    os.replace(tmp, path)


def _read(path: Path) -> Verdict | None:
    try:
        data = json.loads(path.read_text())
        return Verdict(bool(data["ok"]), str(data["reason"]), dict(data["identity"]), float(data["seconds"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def probe(checkpoint_root, device, precision: str, variant: str, ident: dict, *, command: list[str] | None = None,
          timeout: float = PROBE_TIMEOUT_S) -> Verdict:
    """Run the cubin load, calibration and self-check in a child process; its verdict, or why it gave
    none (a crash, a timeout)."""
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "verdict.json"
        cmd = (command or [sys.executable, "-m", "engine.backends.trust"]) + [
            str(checkpoint_root), "--device", str(device), "--precision", precision, "--variant", variant,
            "--out", str(out)]
        try:
            done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return Verdict(False, f"the cubin probe process did not finish in {timeout:.0f} s", ident,
                           time.perf_counter() - t0)
        verdict = _read(out)
        if verdict is not None:
            return Verdict(verdict.ok, verdict.reason, ident, time.perf_counter() - t0)
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return Verdict(False, f"the cubin probe process exited with code {done.returncode} and no verdict ({last})",
                       ident, time.perf_counter() - t0)


def trusted(checkpoint, device, precision: str, variant: str, *, command: list[str] | None = None) -> Verdict:
    """The cached verdict for this GPU, driver, torch, manifest, precision and variant, else a fresh probe
    (cached too: a failure is not retried until one of those changes; delete the file to retry)."""
    ident = identity(device, precision, variant)
    path = cache_path(ident)
    cached = _read(path)
    if cached is not None and cached.identity == ident:
        return Verdict(cached.ok, cached.reason, ident, cached.seconds, cached=True)
    verdict = probe(checkpoint.root, device, precision, variant, ident, command=command)
    _write(path, verdict)
    return verdict


class Untrusted(RuntimeError):
    """The cubin probe process failed: the kernels are not loaded here."""


def load_trusted(checkpoint, *, device, dtype=None, max_len: int = 4096, precision: str | None = None,
                 variant: str = "v2"):
    """What backend "auto" runs for cubin: `engine.backends.cubin.load` in this process only after the same
    load, calibration and self-check passed in a separate one (cached per GPU, driver, torch and
    manifest), so a kernel fault costs that process and not the studio's CUDA context."""
    from engine.backends import cubin

    verdict = trusted(checkpoint, device, cubin.resolve_precision(precision, dtype), variant)
    if not verdict.ok:
        raise Untrusted(f"the cubin kernels are {verdict.summary}")
    backend = cubin.load(checkpoint, device=device, dtype=dtype, max_len=max_len, precision=precision, variant=variant)
    backend.info["kernel_trust"] = verdict.summary
    return backend


def run_child(checkpoint_root: str, device: str, precision: str, variant: str, out: Path, load=None) -> int:
    """The child's work: load the checkpoint and the cubin backend (calibration and self-check included)
    and write the verdict. A Python-level failure is written as a verdict; a crash leaves none."""
    t0 = time.perf_counter()
    try:
        from engine.checkpoint import load_checkpoint

        if load is None:
            from engine.backends.cubin import load
        backend = load(load_checkpoint(checkpoint_root, progress=False), device=device, precision=precision,
                       variant=variant)
        verdict = Verdict(True, backend.info.get("self_check", "loaded"), {}, time.perf_counter() - t0)
    except Exception as exc:  # the verdict is the point: every failure is one
        verdict = Verdict(False, f"{type(exc).__name__}: {exc}"[:500], {}, time.perf_counter() - t0)
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
