"""The GPU device check, one command, one table (scripts/gpu_check.sh runs it; docs/GPU_CHECK.md):

  0. the quick pass, first: the driver and packages, the cubins loaded, the copy floor, and the headline,
     decode ms/frame of one take for fp8 and bf16 through the cubin backend (within 3 minutes)
  1. every cubin for this arch against kernels/reference.py (kernels.check.kernel_rows)
  2. a FULL-SIZE random-weight model (engine.config.FULL_SIZE) through the cubin backend, one section per
     precision: teacher-forced logits vs eager torch (cosine, greedy agreement), fused graph replay vs eager
     torch (greedy rows), streamed (several rows(n) calls) vs one-shot rows
  3. benchmark: prefill ms/token at 13 and 300 tokens, TTFA of the backbone, peak VRAM, eager torch, the
     CUDA-graphed torch path, the A/B of every step variant, microbenchmarks, the batched step.

The engine pass (`--engine`) instead runs the studio's engine on a full-size random checkpoint (TTFA with
the codec, 16 takes' audio-seconds per second, 16 streams' gap-free rate) and, with `--checkpoint PATH`,
a real checkpoint's FP8 calibration (bench/gpu_engine.py).

    python -m bench.gpu_check [--quick] [--out DIR]     # rows also go to DIR/rows.jsonl as they come
    python -m bench.gpu_check --engine [--checkpoint PATH] [--out DIR]
    python -m bench.gpu_check --cpu-selftest --out DIR  # no GPU: the plumbing, with deliberate failures

It always leaves figures or a reason: no usable GPU is one row and exit 2; an overrun costs its section;
a SIGTERM or a hung call ends the run with the table (bench/gpu_run.py). This module lists the sections and
runs them; the sections live in bench/gpu_model.py (the model, the torch path, the whole-step A/B) and
bench/gpu_kernels.py (real shapes, microbenchmarks, the batched step), bench/gpu_engine.py (the engine,
a real checkpoint), the run's machinery (budgets, sticky errors, the watchdog, rows.jsonl) in
bench/gpu_run.py.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path

import torch

from bench.gpu_engine import checkpoint_rows, engine_rows
from bench.gpu_kernels import batch_rows, batch_step_rows, microbench_rows, real_shape_rows, thread_row
from bench.gpu_model import (
    STEP_CONFIGS,
    FullModel,
    copy_floor,
    headline_rows,
    model_rows,
    step_ab_rows,
    torch_graph_rows,
    torch_rows,
    variant_rows,
)
from bench.gpu_run import (
    Report,
    Section,
    SectionSkipped,
    Stopped,
    Watchdog,
    cuda_health,
    on_loader_stream,
    run_sections,
)
from engine.config import FULL_SIZE, Dims
from engine.demo import TINY_DIMS
from kernels import manifest as mf
from kernels.check import Row, kernel_rows, timed_ab_rows

QUICK_PASS_S = 180   # the quick pass's rows arrive within 3 minutes of the command
START_UP_S = 30      # the interpreter, torch and the CUDA context, before the first section starts


def preflight_rows() -> Iterable[Row]:
    """Driver, clocks, package versions and the loader choice (ctypes and metadata only: no launch)."""
    from importlib import metadata

    from kernels.runtime import bindings_problem, loader_choice, package_version, probe_driver

    p = probe_driver()
    yield Row("preflight", "driver", f"{p.driver or '?'} (CUDA {p.driver_cuda // 1000}.{p.driver_cuda % 1000 // 10})"
              if p.ok else p.reason, "", "INFO")
    if shutil.which("nvidia-smi"):
        try:
            smi = subprocess.run(["nvidia-smi", "--query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,power.limit",
                                  "--format=csv,noheader"], capture_output=True, text=True, timeout=15)
            said = smi.stdout.strip() or smi.stderr.strip()
        except (OSError, subprocess.TimeoutExpired) as exc:
            said = f"{type(exc).__name__}: {exc}"
        yield Row("preflight", "nvidia-smi name, SM / max SM / mem clock, power", said, "", "INFO")
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
    """The quick pass (preflight, cubins, setup, floor, the headline ms/frame per precision), then, unless
    `args.quick`, the rest; or, with `args.engine`, the engine pass. A section that needs the cubins is one
    SKIP row when they did not load."""
    from kernels.runtime import CubinKernels, cubin_ops, probe_driver

    if getattr(args, "engine", False):
        return engine_sections(args.checkpoint)

    state = {"cubin_ms": {}}    # the loader, its ops, the copy floor and the headline ms/frame, as sections make them
    full = FullModel(FULL_SIZE, args.steps)   # made when the first model section asks

    def load_rows():
        loaded = state["kernels"] = CubinKernels()
        state["ops"] = cubin_ops(loaded)
        yield Row("setup", "loader", f"{loaded.loader_name} ({loaded.loader_reason})", "", "INFO")
        yield Row("setup", "torch / CUDA", f"{torch.__version__} / {torch.version.cuda}", "", "INFO")

    def floor_rows():
        state["floor"] = copy_floor()
        yield Row("setup", f"D2D copy floor on {torch.cuda.get_device_name()}", f"{state['floor'] / 1e9:.0f} GB/s",
                  "", "INFO")

    def kernels():
        if "kernels" not in state:
            raise SectionSkipped("not run: the cubins did not load (the setup section says why)")
        return state["kernels"]

    def ops():
        kernels()
        return state["ops"]

    def stream():
        return state["kernels"].stream if "kernels" in state else None

    # The quick pass's budgets add up to 105 s, START_UP_S under QUICK_PASS_S with margin. The whole run's
    # add up to 470 s, under scripts/gpu_check.sh's 480 s timeout. cubins and floor get 5 s each (a
    # manifest read, one 1 GB copy); a headline loads one full-size backend (fp8: with its calibration) and
    # times 200 rows; the whole-step A/B times 4 steps per precision; the batched step builds two
    # full-size backends and times 5 x 20 steps each.
    cuda, ms = torch.device("cuda"), state["cubin_ms"]
    sections = [Section("preflight", 20, preflight_rows),
                Section("cubins", 5, lambda: manifest_rows(probe_driver().cc)),
                Section("setup", 30, load_rows),
                Section("floor", 5, floor_rows),
                Section("headline fp8", 25, lambda: headline_rows(full, "fp8", state.get("floor"), ms, ops=ops(),
                                                                  stream=stream())),
                Section("headline bf16", 20, lambda: headline_rows(full, "bf16", state.get("floor"), ms, ops=ops(),
                                                                   stream=stream()))]
    if not args.quick:
        sections += [
            Section("kernels", 50, lambda: kernel_rows(kernels(), cuda, health=cuda_health)),
            Section("real shapes", 25, lambda: real_shape_rows(ops(), FULL_SIZE, cuda)),
            Section("thread", 5, lambda: [thread_row(ops(), stream())]),
            # one section per precision: an overrun in one keeps the other's rows
            Section("model fp8", 40, lambda: model_rows(full, "fp8", ops=ops(), stream=stream())),
            Section("model bf16", 30, lambda: model_rows(full, "bf16", ops=ops(), stream=stream())),
            Section("model torch", 5, lambda: torch_rows(full, state.get("floor"), ms)),
            Section("torch-graph", 30, lambda: torch_graph_rows(FULL_SIZE, args.steps, cuda, cubin_ms=ms)),
            Section("A/B step", 65, lambda: variant_rows(FULL_SIZE, args.steps, ops=ops(), stream=stream())),
            # the per-kernel A/B at the real shapes (kernels.check): v1 vs v2 per replaced piece of a layer,
            # v2 vs v3 split-K for o_proj and down, fp8 and bf16, µs and GB/s
            Section("A/B kernels", 20, lambda: timed_ab_rows(kernels())),
            # the sum of kernel times set against the headline's graph step time
            Section("microbench", 30, lambda: microbench_rows(ops(), FULL_SIZE, cuda, stream(), state.get("floor"),
                                                              step_ms=ms)),
            Section("batch", 20, lambda: batch_rows(ops(), FULL_SIZE, cuda, stream())),
            Section("batch step", 45, lambda: batch_step_rows(ops(), FULL_SIZE, cuda, stream()))]
    # everything after the loader runs on its stream
    return [s if s.name in BEFORE_LOADER else replace(s, rows=on_loader_stream(s.rows, stream)) for s in sections]


BEFORE_LOADER = ("preflight", "cubins", "setup")


def engine_sections(checkpoint: Path | None) -> list[Section]:
    """The engine pass: the driver and the cubins' manifest, the studio's engine on a full-size random
    checkpoint, and with `checkpoint` that real checkpoint's FP8 calibration. Both load their cubins as
    the engine does (no loader of the check's own), so neither runs on a loader's stream. The budgets add
    up to 295 s: writing the 8 GB checkpoint and its codec, the load (the cubin probe in a child process,
    then the load here, each with calibration and self-check), then about a minute of takes; a real
    checkpoint is read from its disk, calibrated, self-checked, and compared on three held-out prompts."""
    from kernels.runtime import probe_driver

    sections = [Section("preflight", 20, preflight_rows),
                Section("cubins", 5, lambda: manifest_rows(probe_driver().cc)),
                Section("engine", 150, lambda: engine_rows(FULL_SIZE, "cuda"))]
    if checkpoint is not None:
        sections.append(Section("checkpoint", 120, lambda: checkpoint_rows(checkpoint)))
    return sections


def selftest_sections() -> list[Section]:
    """The plumbing without a GPU: the real preflight and manifest sections, the kernels package's own CPU
    self-test, two stand-ins that fail on purpose (an exception, an overrun) between real sections, and the
    engine section on a tiny checkpoint."""
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
                    lambda: step_ab_rows({(p, c[0]): 1.0 for p in ("fp8", "bf16") for c in STEP_CONFIGS})),
            # the engine on a tiny random checkpoint with the tiny codec: the torch path on the CPU
            Section("engine", 60, lambda: engine_rows(TINY_DIMS, "cpu", codec_size="tiny", frames=12, ttfa_takes=2))]


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
    ap.add_argument("--quick", action="store_true",
                    help="the quick pass only (about 2 minutes): the headline ms/frame for fp8 and bf16 at one take")
    ap.add_argument("--out", type=Path, default=None, help="directory for rows.jsonl (one JSON row per line)")
    ap.add_argument("--append", action="store_true",
                    help="keep the rows already in DIR/rows.jsonl (scripts/gpu_check.sh writes its own first)")
    ap.add_argument("--engine", action="store_true",
                    help="the engine pass: the studio's engine on a full-size random checkpoint (TTFA, throughput, "
                         "gap-free streams)")
    ap.add_argument("--checkpoint", type=Path, default=None,
                    help="with --engine (implied): also this real checkpoint directory's FP8 calibration")
    ap.add_argument("--cpu-selftest", action="store_true",
                    help="no GPU: run the plumbing (sections, isolation, JSON lines) with stand-in sections")
    args = ap.parse_args(argv)
    args.engine = args.engine or args.checkpoint is not None
    report = Report(args.out, append=args.append, xfail=DELIBERATE if args.cpu_selftest else frozenset())
    if args.out is not None:
        report.trace = (args.out / "tracebacks.txt").open("a")   # where a hung or stopped call was
    t0 = time.perf_counter()
    try:
        if threading.current_thread() is threading.main_thread():
            Watchdog(report).start()
        code, budget = selftest(report) if args.cpu_selftest else device_check(args, report)
    except (Stopped, KeyboardInterrupt) as stop:
        report.add(Row("run", "stopped", str(stop) if isinstance(stop, Stopped) else "Ctrl-C", "", "FAIL"))
        code, budget = getattr(stop, "code", 130), None
    if code == 2:   # nothing ran: the reason is the row
        return code
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, signal.SIG_IGN)   # the table is coming: a late SIGTERM must not cut it
    report.add(Row("setup", "wall time", f"{time.perf_counter() - t0:.0f} s",
                   f"sections' budgets {budget} s" if budget else "", "INFO"))
    report.finish()
    return code


def selftest(report: Report) -> tuple[int, int]:
    os.environ.setdefault("TRITON_INTERPRET", "1")
    sections = selftest_sections()
    outcome = run_sections(sections, report)
    contained = {(r.section, r.item) for r in report.rows if r.status == "FAIL"} & DELIBERATE
    after = outcome.get("cubins") == outcome.get("kernels (CPU self-test)") == "done"
    report.add(Row("self-test", "deliberate failures contained, later sections ran",
                   f"{len(contained)}/{len(DELIBERATE)} contained, later sections {'ran' if after else 'MISSING'}",
                   "", "PASS" if contained == DELIBERATE and after else "FAIL"))
    failures = [r for r in report.rows if r.status == "FAIL" and (r.section, r.item) not in DELIBERATE]
    return (1 if failures else 0), sum(s.budget_s for s in sections)


def device_check(args, report: Report) -> tuple[int, int | None]:
    """(2, None) with one row saying why when no GPU or driver is usable; else every section, and 1 on a
    FAIL. A GPU the cubins cannot use (no loader, a driver too old for them) still runs the torch rows."""
    from kernels.runtime import available, probe_driver, torch_cannot_use_gpu

    p = probe_driver()
    why = f"no GPU check possible here: {p.reason}" if not p.ok else torch_cannot_use_gpu()
    ok, reason = available()
    if not why and not torch.cuda.is_available():
        why = f"no GPU check possible here: {reason}"
    if why:
        report.add(Row("setup", "device", why, "", "FAIL"))
        return 2, None
    report.add(Row("setup", "device", reason, "", "INFO" if ok else "FAIL"))
    sections = gpu_sections(args)
    run_sections(sections, report, health=cuda_health)
    return (1 if any(r.status == "FAIL" for r in report.rows) else 0), sum(s.budget_s for s in sections)


if __name__ == "__main__":
    sys.exit(main())
