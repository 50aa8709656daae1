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
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from bench.common import random_backbone
from engine.backends.cubin import CubinBackend
from engine.config import FRAME_RATE, FULL_SIZE, Dims
from engine.model import HiggsModel
from kernels import manifest as mf
from kernels.check import Row, format_table, kernel_rows

FIRST_CHUNK_FRAMES = 2  # engine.generate.FIRST_PUSH_FRAMES: the first streamed chunk


def cuda_ms(fn, repeat: int = 5, warmup: int = 1) -> float:
    """Median milliseconds of fn() measured with CUDA events (device time, after warm-up)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return sorted(times)[len(times) // 2]


def copy_floor(nbytes: int = 1 << 30) -> float:
    """Device-to-device copy bandwidth (read + write), bytes/s: the floor for a weight-streaming step."""
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda").fill_(1)
    dst = torch.empty_like(src)
    ms = cuda_ms(lambda: dst.copy_(src), repeat=7)
    del src, dst
    return 2 * nbytes / (ms / 1e3)


def step_weight_bytes(dims: Dims, precision: str) -> float:
    """Bytes of weights one decode step streams: the layer matrices (1 B fp8 / 2 B bf16) and the bf16
    audio head (the sampler's 8 embedding rows are negligible)."""
    q, kv = dims.heads * dims.head_dim, dims.kv_heads * dims.head_dim
    layer = dims.hidden * (2 * q + 2 * kv) + 3 * dims.hidden * dims.intermediate
    return (1 if precision == "fp8" else 2) * dims.layers * layer + 2 * dims.audio_rows * dims.hidden


def greedy(logits: torch.Tensor, step: int, boc: int) -> torch.Tensor:
    row = logits.argmax(-1)
    row[step + 1:] = boc
    return row


def cosine(a, b) -> float:
    return float(torch.nn.functional.cosine_similarity(a.double().flatten(), b.double().flatten(), dim=0))


def model_rows(dims: Dims, steps: int, floor: float) -> list[Row]:
    rows = []
    gen = torch.Generator().manual_seed(1)
    ids13 = torch.randint(0, 150000, (13,), generator=gen)
    ids300 = torch.randint(0, 150000, (300,), generator=gen)
    sd = random_backbone(dims, torch.bfloat16, device="cuda")
    ref = HiggsModel.from_state_dict(dims, sd, dtype=torch.bfloat16, device="cuda", max_len=1024)

    # Eager torch greedy trajectory: the reference rows and logits for teacher forcing.
    logits = ref.prefill(ids13, None, 0)
    want_logits, want_rows = [logits], []
    for step in range(steps):
        row = greedy(logits, step, dims.boc)
        want_rows.append(row)
        logits = ref.decode(row, 13 + step)
        want_logits.append(logits)
    torch.cuda.synchronize()
    torch_ms = cuda_ms(lambda: ref.decode(want_rows[0], 13), repeat=9)
    torch_prefill = {n: cuda_ms(lambda ids=ids: ref.prefill(ids, None, 0), repeat=3) / len(ids)
                     for n, ids in ((13, ids13), (300, ids300))}

    results = {}
    for precision in ("bf16", "fp8"):
        torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        be = CubinBackend(dims, sd, ops=OPS, device="cuda", precision=precision, max_len=1024, stream=KERNELS.stream)
        load_s = time.perf_counter() - t0
        # Teacher-forced: the same rows as torch, compare logits step by step.
        got = be.prefill(ids13, None, 0)
        cos, agree = [cosine(got, want_logits[0])], [float((got.argmax(-1) == want_logits[0].argmax(-1)).float().mean())]
        for step, row in enumerate(want_rows):
            got = be.decode(row, 13 + step)
            cos.append(cosine(got, want_logits[step + 1]))
            agree.append(float((got.argmax(-1) == want_logits[step + 1].argmax(-1)).float().mean()))
        floor_cos = 0.999 if precision == "bf16" else 0.98
        rows.append(Row(f"model {precision}", f"teacher-forced logits vs torch, {steps + 1} steps",
                        f"min cosine {min(cos):.5f}, greedy agree {sum(agree) / len(agree):.1%}", f"> {floor_cos}",
                        "PASS" if min(cos) > floor_cos else "FAIL"))
        # Fused graph replay (device sampling, greedy) vs eager torch greedy rows.
        first = be.prefill(ids13, None, 0)
        be.begin(first, 13, seed=0, temperature=0.0, top_k=0, top_p=1.0, max_rows=steps)
        one_shot, _ = be.rows(steps)
        ref_rows = torch.stack(want_rows).cpu()
        same = (one_shot == ref_rows).all(-1)
        prefix = int(same.long().cumprod(0).sum())
        rows.append(Row(f"model {precision}", "graph replay greedy rows vs eager torch",
                        f"{prefix}/{steps} rows identical before first divergence, {same.float().mean():.1%} overall",
                        "info (random weights: near-ties)", "INFO" if precision == "fp8" else
                        ("PASS" if prefix >= min(8, steps) else "FAIL")))
        # Streamed (chunks of 2, 4, 8, ...) vs one-shot: the same graph, so bit-identical rows.
        be.prefill(ids13, None, 0)
        be.begin(first, 13, seed=0, temperature=0.0, top_k=0, top_p=1.0, max_rows=steps)
        parts, n = [], 2
        while sum(len(p) for p in parts) < steps:
            part, _ = be.rows(n)
            parts.append(part)
            n *= 2
        streamed = torch.cat(parts)[:steps]
        rows.append(Row(f"model {precision}", "streamed rows(2,4,8..) vs one-shot rows(n)",
                        "identical" if torch.equal(streamed, one_shot) else "DIFFERENT", "identical",
                        "PASS" if torch.equal(streamed, one_shot) else "FAIL"))
        # Benchmark: graph replay per step (one sync per 50 rows, as per streamed chunk), prefill per token.
        be.prefill(ids13, None, 0)
        be.begin(first, 13, seed=0, temperature=0.8, top_k=30, top_p=0.8, max_rows=steps)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        done = 0
        while done + 50 <= steps:
            be.rows(50)
            done += 50
        ms_frame = 1e3 * (time.perf_counter() - t0) / max(done, 1)
        prefill = {n: cuda_ms(lambda ids=ids: be.prefill(ids, None, 0), repeat=3) / len(ids)
                   for n, ids in ((13, ids13), (300, ids300))}
        ttfa = prefill[13] * 13 + ms_frame * (FIRST_CHUNK_FRAMES + dims.delay)
        bw = step_weight_bytes(dims, precision) / (ms_frame / 1e3)
        results[precision] = ms_frame
        rows += [
            Row(f"bench {precision}", "decode ms/frame (graph replay, sync per 50)", f"{ms_frame:.2f} ms",
                "", "INFO"),
            Row(f"bench {precision}", "weight bandwidth / D2D copy floor",
                f"{bw / 1e9:.0f} GB/s = {bw / floor:.0%} of {floor / 1e9:.0f} GB/s", "", "INFO"),
            Row(f"bench {precision}", "prefill ms/token at 13 / 300 tokens",
                f"{prefill[13]:.3f} / {prefill[300]:.3f} ms", "", "INFO"),
            Row(f"bench {precision}", "TTFA backbone (prefill 13 + first 9 rows)", f"{ttfa:.1f} ms",
                "codec not included", "INFO"),
            Row(f"bench {precision}", "RTF backbone (ms/frame / 40 ms)", f"{ms_frame / (1e3 / FRAME_RATE):.3f}", "",
                "INFO"),
            Row(f"bench {precision}", "peak VRAM (load + take)", f"{torch.cuda.max_memory_allocated() / 2**30:.1f} GiB "
                f"(load {load_s:.1f} s)", "", "INFO"),
        ]
        del be
        torch.cuda.empty_cache()
    bw = step_weight_bytes(dims, "bf16") / (torch_ms / 1e3)
    rows += [Row("bench torch", "eager decode ms/frame (HiggsModel bf16)", f"{torch_ms:.2f} ms", "", "INFO"),
             Row("bench torch", "weight bandwidth / D2D copy floor", f"{bw / 1e9:.0f} GB/s = {bw / floor:.0%}", "",
                 "INFO"),
             Row("bench torch", "prefill ms/token at 13 / 300 tokens",
                 f"{torch_prefill[13]:.3f} / {torch_prefill[300]:.3f} ms", "", "INFO"),
             Row("bench", "speed-up fp8 / bf16 cubin vs torch eager",
                 f"{torch_ms / results['fp8']:.2f}x / {torch_ms / results['bf16']:.2f}x", "", "INFO")]
    return rows


def variant_rows(dims: Dims, steps: int) -> list[Row]:
    """Issue 16's A/B: the v1 and v2 decode steps of the cubin backend on the same GPU in one run, graph
    replay with device sampling (sync per 50 rows, the first 50 rows are capture and warm-up)."""
    sd = random_backbone(dims, torch.bfloat16, device="cuda")
    ids = torch.randint(0, 150000, (13,), generator=torch.Generator().manual_seed(3))
    ms = {}
    for precision in ("fp8", "bf16"):
        for variant in ("v1", "v2"):
            be = CubinBackend(dims, sd, ops=OPS, device="cuda", precision=precision, max_len=1024,
                              stream=KERNELS.stream, variant=variant)
            be.begin(be.prefill(ids, None, 0), 13, seed=0, temperature=0.8, top_k=30, top_p=0.8, max_rows=steps)
            be.rows(50)
            torch.cuda.synchronize()
            t0, done = time.perf_counter(), 0
            while done + 100 <= steps:
                be.rows(50)
                done += 50
            ms[precision, variant] = 1e3 * (time.perf_counter() - t0) / max(done, 1)
            del be
            torch.cuda.empty_cache()
    return step_ab_rows(ms)


def step_ab_rows(ms: dict[tuple[str, str], float]) -> list[Row]:
    """Whole-step ms/frame per precision, v1 and v2, and the ratio (an improvement counts only as a ratio
    measured in one run)."""
    return [Row(f"A/B step {p}", "decode ms/frame v1 | v2 | v1/v2", f"{ms[p, 'v1']:.3f} | {ms[p, 'v2']:.3f} | "
                f"{ms[p, 'v1'] / ms[p, 'v2']:.2f}x", "", "INFO") for p in ("fp8", "bf16")]


OPS = KERNELS = None


def thread_row() -> Row:
    """The studio launches from a worker thread: PyCUDA's context was pushed on the main thread only,
    so check that a launch from another thread runs on torch's primary context and gives the same result."""
    import threading

    x = torch.randn(HIDDEN_CHECK, dtype=torch.bfloat16, device="cuda")
    w = torch.randn(1024, HIDDEN_CHECK, dtype=torch.bfloat16, device="cuda")
    with torch.cuda.stream(KERNELS.stream):
        main = OPS.gemv(x, w)
    out, err = {}, []

    def work():
        try:
            with torch.cuda.stream(KERNELS.stream):
                out["y"] = OPS.gemv(x, w)
            KERNELS.stream.synchronize()
        except Exception as exc:
            err.append(f"{type(exc).__name__}: {exc}")

    t = threading.Thread(target=work)
    t.start()
    t.join()
    same = not err and torch.equal(out["y"], main)
    return Row("setup", "launch from a worker thread", err[0][:100] if err else ("same result" if same else "DIFFERENT"),
               "same result", "PASS" if same else "FAIL")


HIDDEN_CHECK = 2560


# ---------------------------------------------------------------------------------------------
# Sections: each has its own try and time budget, so one failure costs one row, not the table. Rows are
# printed as they come and appended to <out>/rows.jsonl, so a run cut short still returns what it had.

class SectionTimeout(Exception):
    pass


@dataclass
class Section:
    name: str
    budget_s: int
    rows: Callable[[], Iterable[Row]]   # a generator: each row is reported as soon as it is made


class Report:
    """Prints each row as one line and appends it as JSON to `<out>/rows.jsonl`."""

    def __init__(self, out: Path | None):
        self.rows: list[Row] = []
        self.path = None
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)
            self.path = out / "rows.jsonl"
            self.path.write_text("")

    def add(self, row: Row) -> None:
        self.rows.append(row)
        print(f"[{row.status or '-':4s}] {row.section} | {row.item} | {row.value}"
              + (f" | limit {row.limit}" if row.limit else ""), flush=True)
        if self.path is not None:
            with self.path.open("a") as f:
                f.write(json.dumps(asdict(row)) + "\n")


def run_sections(sections: list[Section], report: Report) -> dict[str, str]:
    """Run each section under its budget (SIGALRM, main thread: it interrupts Python between device calls);
    an exception or an overrun ends that section with one FAIL row and the next section starts.
    Returns each section's outcome: "done", "failed" or "over budget"."""
    def on_alarm(signum, frame):
        raise SectionTimeout()

    use_alarm = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGALRM, on_alarm) if use_alarm else None
    outcome = {}
    try:
        for sec in sections:
            t0 = time.perf_counter()
            if use_alarm:
                signal.alarm(sec.budget_s)
            try:
                for row in sec.rows():
                    report.add(row)
                outcome[sec.name] = "done"
            except SectionTimeout:
                outcome[sec.name] = "over budget"
                report.add(Row(sec.name, "time budget", f"stopped after {time.perf_counter() - t0:.0f} s",
                               f"<= {sec.budget_s} s", "FAIL"))
            except Exception as exc:  # one row, then the next section
                outcome[sec.name] = "failed"
                report.add(Row(sec.name, "section failed", f"{type(exc).__name__}: {exc}"[:200], "", "FAIL"))
            finally:
                if use_alarm:
                    signal.alarm(0)
    finally:
        if use_alarm:
            signal.signal(signal.SIGALRM, previous)
    return outcome


def preflight_rows() -> Iterable[Row]:
    """Driver, clocks, package versions and the loader choice (ctypes and metadata only: no launch)."""
    from importlib import metadata

    from kernels.runtime import loader_choice, probe_driver

    p = probe_driver()
    yield Row("preflight", "driver", f"{p.driver or '?'} (CUDA {p.driver_cuda // 1000}.{p.driver_cuda % 1000 // 10})"
              if p.ok else p.reason, "", "INFO")
    if shutil.which("nvidia-smi"):
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,power.limit",
                              "--format=csv,noheader"], capture_output=True, text=True, timeout=15)
        yield Row("preflight", "nvidia-smi name, SM / max SM / mem clock, power", smi.stdout.strip() or smi.stderr.strip(),
                  "", "INFO")
    versions = []
    for pkg in ("torch", "triton", "cuda-core", "cuda-bindings", "pycuda", "numpy"):
        try:
            versions.append(f"{pkg} {metadata.version(pkg)}")
        except metadata.PackageNotFoundError:
            versions.append(f"{pkg} -")
    yield Row("preflight", "packages", ", ".join(versions), "", "INFO")
    name, why = loader_choice()
    yield Row("preflight", "loader", f"{name or 'none'} ({why})", "", "INFO")


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
    global OPS, KERNELS
    from kernels.runtime import CubinKernels, cubin_ops, probe_driver

    state = {}

    def load_rows():
        global OPS, KERNELS
        KERNELS = CubinKernels()
        OPS = cubin_ops(KERNELS)
        yield Row("setup", "loader", f"{KERNELS.loader_name} ({KERNELS.loader_reason})", "", "INFO")
        yield Row("setup", "torch / CUDA", f"{torch.__version__} / {torch.version.cuda}", "", "INFO")

    def floor_rows():
        state["floor"] = copy_floor()
        yield Row("setup", f"D2D copy floor on {torch.cuda.get_device_name()}", f"{state['floor'] / 1e9:.0f} GB/s",
                  "", "INFO")

    # budgets add up to 410 s: the whole run fits 7 minutes, so a 15-minute device session holds a rerun
    sections = [Section("preflight", 20, preflight_rows),
                Section("cubins", 10, lambda: manifest_rows(probe_driver().cc)),
                Section("setup", 40, load_rows),
                Section("kernels", 90, lambda: kernel_rows(KERNELS, torch.device("cuda"))),
                Section("thread", 20, lambda: [thread_row()])]
    if not args.quick:
        sections += [Section("floor", 20, floor_rows),
                     Section("model", 150, lambda: model_rows(FULL_SIZE, args.steps, state["floor"])),
                     Section("A/B step", 60, lambda: variant_rows(FULL_SIZE, args.steps))]
    return sections


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

    return [Section("preflight", 20, preflight_rows),
            Section("stand-in", 10, broken),
            Section("cubins", 10, lambda: (r for cc in mf.TARGETS for r in manifest_rows(cc))),
            Section("stand-in-slow", 1, slow),
            Section("kernels (CPU self-test)", 120, selftest_rows),
            Section("A/B step (stand-in figures)", 5,
                    lambda: step_ab_rows({(p, v): 1.0 for p in ("fp8", "bf16") for v in ("v1", "v2")}))]


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
        run_sections(gpu_sections(args), report)
        failures = [r for r in report.rows if r.status == "FAIL"]
    report.add(Row("setup", "wall time", f"{time.perf_counter() - t0:.0f} s", "< 360 s", "INFO"))
    # the self-test's deliberate failures show as XFAIL in the table (rows.jsonl keeps what each section said)
    print(format_table([replace(r, status="XFAIL") if args.cpu_selftest and (r.section, r.item) in DELIBERATE
                        else r for r in report.rows]))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
