"""Device check of the committed cubins: every cubin for this GPU's arch, launched through the same ops
the engine uses (`runtime.cubin_ops`), against `kernels/reference.py` on random inputs.

    python -m kernels.check                 # on an NVIDIA GPU: one table, exit 1 on any FAIL
    python -m kernels.check --cpu-selftest  # anywhere: everything except launches (CI runs this)

The model-level half of the device check (full-size graph replay, streaming, benchmark) is
`bench/gpu_check.py`, which calls `kernel_rows()` from here and prints one combined table;
`scripts/gpu_check.sh` runs it. This module stays a leaf of `kernels/` (no engine imports).

Beside it: kernels/check_rows.py (the table, shapes and tolerances), kernels/check_cases.py (one case per
group of cubins) and kernels/check_ab.py (the v1/v2/v3 timing rows).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import sys
import time
from collections.abc import Iterator

import torch

from kernels import manifest as mf
from kernels import reference as ref
from kernels.check_ab import ab_rows, splitk_ab_rows, timed_ab_rows
from kernels.check_cases import CASES
from kernels.check_rows import BF16, EPS, FP8, Row, format_table, randn


class Recording:
    """Forwards launches to a CubinKernels and remembers which cubins ran."""

    def __init__(self, kernels):
        self.kernels, self.manifest, self.launched = kernels, kernels.manifest, set()

    def launch(self, name, grid, *args, **kw):
        self.launched.add(name)
        self.kernels.launch(name, grid, *args, **kw)


def kernel_rows(kernels, device, health=None) -> Iterator[Row]:
    """Run every case through cubin-backed ops; one row per comparison, yielded as it is made, plus coverage. After a case fails,
    `health()` (None: the device still works) can name a sticky error on the CUDA context: the cases after
    it are then INVALID rows instead of failures that would say nothing about their kernels."""
    from kernels.runtime import cubin_ops

    rec = Recording(kernels)
    ops = cubin_ops(rec)
    gen = torch.Generator().manual_seed(0)
    for i, (name, _, fn) in enumerate(CASES):
        try:
            with torch.cuda.stream(kernels.stream) if kernels.stream is not None else contextlib.nullcontext():
                results = fn(ops, device, gen)
            if torch.device(device).type == "cuda":
                torch.cuda.synchronize()
        except Exception as exc:  # a launch or lookup failure is a FAIL row, not the end of the check
            yield Row("kernels", name, f"{type(exc).__name__}: {exc}"[:120], "", "FAIL")
            sticky = health() if health is not None else None
            if sticky:
                yield from (Row("kernels", later, f"not run: sticky CUDA error since case {name!r} ({sticky})"[:160],
                                "", "INVALID") for later, _, _ in CASES[i + 1:])
                return
            continue
        for label, err, tol in results:
            yield Row("kernels", f"{name} {label}", f"rel err {err:.2e}", f"< {tol:.0e}",
                      "PASS" if err < tol and math.isfinite(err) else "FAIL")
    missing = sorted(set(kernels.manifest.kernels) - rec.launched)
    yield Row("kernels", f"coverage ({kernels.manifest.target})",
              f"{len(rec.launched)}/{len(kernels.manifest.kernels)} cubins launched"
              + (f"; never: {', '.join(missing)}" if missing else ""), "all", "FAIL" if missing else "PASS")


# ---------------------------------------------------------------------------------------------
# CPU self-test: everything but launches

def selftest_rows() -> Iterator[Row]:
    """Everything but launches, each row yielded as it is made."""
    from kernels.packing import pack_args
    from kernels.runtime import available

    ok, reason = available()
    yield Row("setup", "runtime.available()", f"{ok}: {reason}", "", "INFO")
    claimed = set().union(*(c[1] for c in CASES))
    dtypes = {"*bf16": BF16, "*fp32": torch.float32, "*fp8e4nv": FP8, "*i32": torch.int32, "*i64": torch.int64}
    for cc, target in mf.TARGETS.items():
        t0 = time.perf_counter()
        try:
            m = mf.load(cc)
        except mf.ManifestError as exc:
            yield Row("manifest", target, str(exc)[:120], "", "FAIL")
            continue
        bad = []
        for e in m.kernels.values():
            args = [torch.empty(16, dtype=dtypes[p.type]) if p.type.startswith("*") else
                    (0.5 if p.type.startswith("fp") else 16) for p in e.user_params]
            packed = pack_args(e, args, device_type="cpu")
            if len(packed.buffer()) != e.params[-1].offset + e.params[-1].size:
                bad.append(e.name)
        unclaimed = sorted(set(m.kernels) - claimed)
        yield Row("manifest", f"{target}: load, sha256, pack args", f"{len(m.kernels)} kernels, "
                  f"{time.perf_counter() - t0:.2f} s" + (f"; bad packing: {bad}" if bad else ""), "",
                  "FAIL" if bad else "PASS")
        yield Row("manifest", f"{target}: every cubin has a device case", "all claimed" if not unclaimed else
                  f"unclaimed: {', '.join(unclaimed)}", "", "FAIL" if unclaimed else "PASS")
    gen = torch.Generator().manual_seed(0)
    x, w = randn(gen, 2, 64), 1 + randn(gen, 64, scale=0.1)
    y, _ = ref.rmsnorm_ref(x, w, EPS)
    q = randn(gen, 3, 4, 16)
    kc, vc = randn(gen, 2, 8, 16), randn(gen, 2, 8, 16)
    a = ref.attention_ref(q, kc, vc, torch.tensor([2, 3, 4]))
    row = ref.sample_row_ref(torch.randn(8, 1026, generator=gen), step=3, seed=5, temperature=0.8, top_k=30, top_p=0.8)
    finite = bool(torch.isfinite(y).all() and torch.isfinite(a).all()) and len(row) == 8 and row[4:] == [1024] * 4
    yield Row("reference", "rmsnorm / attention / sampler refs on CPU", "finite, delay window ok" if finite
              else "BROKEN", "", "PASS" if finite else "FAIL")
    # The A/B rows' plumbing (inputs, pairs, row text) with a stand-in timer that launches nothing.
    from kernels import ops

    tiny = dict(hidden=64, inter=128, heads=4, kv_heads=2, head_dim=16, positions=20)
    ab = list(ab_rows(ops, "cpu", gen, timer=lambda fn: 1e-5, shapes=tiny))
    yield Row("A/B kernels", "rows with a stand-in timer (no launches)", f"{len(ab)} rows", "10",
              "PASS" if len(ab) == 10 and all("v1/v2 1.00x" in r.value for r in ab) else "FAIL")
    sk = list(splitk_ab_rows(ops, "cpu", gen, timer=lambda fn: 1e-5))
    yield Row("A/B kernels", "split-K rows with a stand-in timer (no launches)", f"{len(sk)} rows", "4",
              "PASS" if len(sk) == 4 and all("v2/v3 1.00x" in r.value for r in sk) else "FAIL")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kernels.check", description=__doc__.split("\n\n")[0])
    ap.add_argument("--cpu-selftest", action="store_true", help="manifests, packing, references, table; no launches")
    args = ap.parse_args(argv)
    if args.cpu_selftest:
        rows = list(selftest_rows())
    else:
        from kernels.runtime import CubinKernels, available

        ok, reason = available()
        if not ok:
            print(f"no device check possible: {reason}")
            return 2
        kernels = CubinKernels()
        rows = [Row("setup", "device", reason, "", "INFO"), Row("setup", "loader", kernels.loader_name, "", "INFO")]
        rows += [*kernel_rows(kernels, torch.device("cuda")), *timed_ab_rows(kernels)]
    print(format_table(rows))
    return 1 if any(r.status == "FAIL" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
