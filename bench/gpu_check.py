"""The GPU device check, one command, one table (scripts/gpu_check.sh runs it; docs/GPU_CHECK.md):

  1. every cubin for this arch against kernels/reference.py (kernels.check.kernel_rows)
  2. a FULL-SIZE random-weight model (engine.config.FULL_SIZE) through the cubin backend: teacher-forced
     logits vs eager torch (cosine, greedy agreement), fused graph replay vs eager torch (greedy rows),
     streamed (several rows(n) calls) vs one-shot rows
  3. benchmark: ms/frame FP8 / BF16 / torch eager, prefill ms/token at 13 and 300 tokens, TTFA and RTF
     of the backbone, peak VRAM, achieved weight bandwidth and its % of a device-to-device copy floor
     measured in the same run.

    python -m bench.gpu_check [--quick] [--out DIR]     # rows also go to DIR/rows.jsonl as they come
    python -m bench.gpu_check --cpu-selftest --out DIR  # no GPU: the plumbing, with deliberate failures

This module lists the sections and runs them; the sections live in bench/gpu_model.py (the model, the torch
path, the whole-step A/B) and bench/gpu_kernels.py (real shapes, microbenchmarks, the batched step), the
run's machinery (budgets, sticky errors, rows.jsonl) in bench/gpu_run.py.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path

import torch

from bench.gpu_kernels import batch_rows, batch_step_rows, microbench_rows, real_shape_rows, thread_row
from bench.gpu_model import STEP_CONFIGS, copy_floor, model_rows, step_ab_rows, torch_graph_rows, variant_rows
from bench.gpu_run import Report, Section, cuda_health, on_loader_stream, run_sections
from engine.config import FULL_SIZE, Dims
from kernels import manifest as mf
from kernels.check import Row, format_table, kernel_rows, timed_ab_rows


def preflight_rows() -> Iterable[Row]:
    """Driver, clocks, package versions and the loader choice (ctypes and metadata only: no launch)."""
    from importlib import metadata

    from kernels.runtime import bindings_problem, loader_choice, package_version, probe_driver

    p = probe_driver()
    yield Row("preflight", "driver", f"{p.driver or '?'} (CUDA {p.driver_cuda // 1000}.{p.driver_cuda % 1000 // 10})"
              if p.ok else p.reason, "", "INFO")
    if shutil.which("nvidia-smi"):
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,power.limit",
                              "--format=csv,noheader"], capture_output=True, text=True, timeout=15)
        yield Row("preflight", "nvidia-smi name, SM / max SM / mem clock, power",
                  smi.stdout.strip() or smi.stderr.strip(), "", "INFO")
    versions = []
    for pkg in ("torch", "triton", "cuda-core", "cuda-bindings", "pycuda", "numpy"):
        try:
            versions.append(f"{pkg} {metadata.version(pkg)}")
        except metadata.PackageNotFoundError:
            versions.append(f"{pkg} -")
    yield Row("preflight", "packages", ", ".join(versions), "", "INFO")
    name, why = loader_choice()
    yield Row("preflight", "loader", f"{name or 'none'} ({why})", "", "INFO")
    core, bindings = package_version("cuda-core"), package_version("cuda-bindings")
    mismatch = bindings_problem(p.driver_cuda, bindings) if p.ok else None
    yield Row("preflight", "cuda-core / cuda-bindings for this driver",
              f"cuda-core {core or '-'}, cuda-bindings {bindings or '-'}: "
              + (mismatch or ("no driver" if not p.ok else "the bindings' CUDA major fits the driver")),
              "bindings major <= the driver's CUDA major", "FAIL" if mismatch and name == "cuda.core" else "INFO")


def manifest_rows(cc: int) -> Iterable[Row]:
    """Per cubin: static + dynamic shared memory and the opt-in the loader applies (from the manifest)."""
    m = mf.load(cc)
    t = m.toolchain
    yield Row("cubins", f"{m.target} toolchain", f"ptxas {t.ptxas}, ELF ABI {t.elf_abi}, driver {t.min_driver}+",
              "", "INFO")
    for e in m.kernels.values():
        total = e.shared + e.static_shared
        yield Row("cubins", e.name, f"{e.static_shared} B static + {e.shared} B dynamic"
                  + (" (opts in)" if e.needs_smem_opt_in else ""), f"<= {mf.SMEM_OPT_IN} B or opt in",
                  "PASS" if total <= mf.SMEM_OPT_IN or e.needs_smem_opt_in else "FAIL")


def gpu_sections(args) -> list[Section]:
    from kernels.runtime import CubinKernels, cubin_ops, probe_driver

    state = {}

    def load_rows():
        kernels = state["kernels"] = CubinKernels()
        state["ops"] = cubin_ops(kernels)
        yield Row("setup", "loader", f"{kernels.loader_name} ({kernels.loader_reason})", "", "INFO")
        yield Row("setup", "torch / CUDA", f"{torch.__version__} / {torch.version.cuda}", "", "INFO")

    def floor_rows():
        state["floor"] = copy_floor()
        yield Row("setup", f"D2D copy floor on {torch.cuda.get_device_name()}", f"{state['floor'] / 1e9:.0f} GB/s",
                  "", "INFO")

    def ops():
        return state["ops"]

    def stream():
        return state["kernels"].stream

    # The budgets add up to 455 s: the whole run fits 8 minutes, under scripts/gpu_check.sh's 480 s timeout.
    # cubins, thread and floor get 5 s each (a manifest read, one launch, one 1 GB copy); the whole-step A/B
    # times 4 steps per precision; the batched step builds two full-size backends (fp8 calibration included)
    # and times 5 x 20 steps each.
    cuda = torch.device("cuda")
    sections = [Section("preflight", 20, preflight_rows),
                Section("cubins", 5, lambda: manifest_rows(probe_driver().cc)),
                Section("setup", 30, load_rows),
                Section("kernels", 50, lambda: kernel_rows(state["kernels"], cuda, health=cuda_health)),
                Section("real shapes", 25, lambda: real_shape_rows(ops(), FULL_SIZE, cuda)),
                Section("thread", 5, lambda: [thread_row(ops(), stream())]),
                Section("floor", 5, floor_rows)]
    if not args.quick:
        sections += [Section("model", 95, lambda: model_rows(FULL_SIZE, args.steps, state["floor"],
                                                             state.setdefault("cubin_ms", {}), ops=ops(),
                                                             stream=stream())),
                     Section("torch-graph", 30, lambda: torch_graph_rows(FULL_SIZE, args.steps, cuda,
                                                                         cubin_ms=state.get("cubin_ms"))),
                     Section("A/B step", 75, lambda: variant_rows(FULL_SIZE, args.steps, ops=ops(), stream=stream()))]
    # the per-kernel A/B at the real shapes (kernels.check): v1 vs v2 per replaced piece of a layer, v2 vs v3
    # split-K for o_proj and down, fp8 and bf16, µs and GB/s
    sections.append(Section("A/B kernels", 20, lambda: timed_ab_rows(state["kernels"])))
    # after the model section, so the sum of kernel times can be set against its graph step time
    sections.append(Section("microbench", 30, lambda: microbench_rows(
        ops(), FULL_SIZE, cuda, stream(), state.get("floor"), step_ms=state.get("cubin_ms"))))
    sections.append(Section("batch", 20, lambda: batch_rows(ops(), FULL_SIZE, cuda, stream())))
    sections.append(Section("batch step", 45, lambda: batch_step_rows(ops(), FULL_SIZE, cuda, stream())))
    # everything after the loader runs on its stream
    return [s if s.name in BEFORE_LOADER else replace(s, rows=on_loader_stream(s.rows, stream)) for s in sections]


BEFORE_LOADER = ("preflight", "cubins", "setup")


def selftest_sections() -> list[Section]:
    """The plumbing without a GPU: the real preflight and manifest sections, the kernels package's own CPU
    self-test, and two stand-ins that fail on purpose (an exception, an overrun) between real sections."""
    from kernels.check import selftest_rows

    def broken():
        yield Row("stand-in", "row before the failure", "made", "", "PASS")
        raise RuntimeError("deliberate failure (the self-test's stand-in)")

    def slow():
        yield Row("stand-in-slow", "row before the overrun", "made", "", "PASS")
        time.sleep(30)
        yield Row("stand-in-slow", "never reached", "", "", "FAIL")

    cpu = torch.device("cpu")
    return [Section("preflight", 20, preflight_rows),
            Section("torch-graph", 50, lambda: torch_graph_rows(SELFTEST_DIMS, 16, cpu,
                                                                contexts=(8, 16, 32))),
            Section("stand-in", 10, broken),
            Section("cubins", 10, lambda: (r for cc in mf.TARGETS for r in manifest_rows(cc))),
            Section("stand-in-slow", 1, slow),
            Section("kernels (CPU self-test)", 120, selftest_rows),
            Section("real shapes", 30, lambda: real_shape_rows(interpreted_ops(), SELFTEST_DIMS, cpu, gemm_rows=0)),
            Section("microbench", 60, lambda: microbench_rows(interpreted_ops(), SELFTEST_DIMS, cpu,
                                                              contexts=(16, 32, 64))),
            Section("batch", 60, lambda: batch_rows(interpreted_ops(), SELFTEST_DIMS, cpu, buckets=(1, 2), context=16)),
            Section("batch step", 60, lambda: batch_step_rows(interpreted_ops(), SELFTEST_DIMS, cpu, takes=(1, 2),
                                                              precisions=("bf16",), context=8, steps=1)),
            Section("A/B step (stand-in figures)", 5,
                    lambda: step_ab_rows({(p, c[0]): 1.0 for p in ("fp8", "bf16") for c in STEP_CONFIGS}))]


def interpreted_ops():
    """`kernels.ops` on Triton's CPU interpreter: main() sets TRITON_INTERPRET for the self-test before any
    kernel module is imported (Triton decides at import whether a kernel is interpreted)."""
    from kernels import ops

    return ops


# A tiny random model for the self-test's torch-graph section (the real run uses FULL_SIZE).
SELFTEST_DIMS = Dims(hidden=64, intermediate=128, layers=2, heads=4, kv_heads=2, head_dim=16, vocab=1000,
                     rms_eps=1e-6, rope_theta=1e6, max_positions=4096)
DELIBERATE = {("stand-in", "section failed"), ("stand-in-slow", "time budget")}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.gpu_check", description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=200, help="decode rows per correctness/benchmark run")
    ap.add_argument("--quick", action="store_true", help="kernels only (no full-size model)")
    ap.add_argument("--out", type=Path, default=None, help="directory for rows.jsonl (one JSON row per line)")
    ap.add_argument("--cpu-selftest", action="store_true",
                    help="no GPU: run the plumbing (sections, isolation, JSON lines) with stand-in sections")
    args = ap.parse_args(argv)
    report = Report(args.out)
    t0 = time.perf_counter()
    if args.cpu_selftest:
        os.environ.setdefault("TRITON_INTERPRET", "1")
        outcome = run_sections(selftest_sections(), report)
        contained = {(r.section, r.item) for r in report.rows if r.status == "FAIL"} & DELIBERATE
        after = outcome.get("cubins") == outcome.get("kernels (CPU self-test)") == "done"
        report.add(Row("self-test", "deliberate failures contained, later sections ran",
                       f"{len(contained)}/{len(DELIBERATE)} contained, later sections {'ran' if after else 'MISSING'}",
                       "", "PASS" if contained == DELIBERATE and after else "FAIL"))
        failures = [r for r in report.rows if r.status == "FAIL" and (r.section, r.item) not in DELIBERATE]
    else:
        from kernels.runtime import available

        ok, reason = available()
        if not ok:
            print(f"no GPU check possible here: {reason}")
            return 2
        report.add(Row("setup", "device", reason, "", "INFO"))
        run_sections(gpu_sections(args), report, health=cuda_health)
        failures = [r for r in report.rows if r.status == "FAIL"]
    report.add(Row("setup", "wall time", f"{time.perf_counter() - t0:.0f} s", "< 410 s", "INFO"))
    # the self-test's deliberate failures show as XFAIL in the table (rows.jsonl keeps what each section said)
    print(format_table([replace(r, status="XFAIL") if args.cpu_selftest and (r.section, r.item) in DELIBERATE
                        else r for r in report.rows]))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
