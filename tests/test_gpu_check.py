"""`scripts/gpu_check.sh --cpu-selftest`: the device check's plumbing without a GPU — every row printed as it
comes and appended to rows.jsonl, a section that raises or overruns its budget costs one row, and the
sections after it still run."""

from __future__ import annotations

import inspect
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench import gpu_check, gpu_model, gpu_run
from kernels.check import Row
from kernels.runtime import available as runtime_available

REPO = Path(__file__).resolve().parents[1]


def test_cpu_selftest_contains_deliberate_failures_and_writes_json_lines(tmp_path):
    # the script's own python (PYTHON), with the test process's interpreter speed-up and nothing else
    env = {**os.environ, "PYTHON": f"{sys.executable} -m tests.interp_python"}
    out = subprocess.run(["bash", "scripts/gpu_check.sh", "--cpu-selftest", "--out", str(tmp_path)], cwd=REPO,
                         capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    rows = [json.loads(line) for line in (tmp_path / "rows.jsonl").read_text().splitlines()]
    assert all(set(r) == {"section", "item", "value", "limit", "status"} for r in rows)
    sections = [r["section"] for r in rows]
    # order: preflight, the failing stand-in (its row before the failure, then one FAIL row), cubins, ...
    failed = sections.index("stand-in") + 1
    assert rows[failed] == {"section": "stand-in", "item": "section failed", "limit": "", "status": "FAIL",
                            "value": "RuntimeError: deliberate failure (the self-test's stand-in)"}
    assert "cubins" in sections[failed:] and "reference" in sections[failed:]
    assert {"section": "stand-in-slow", "item": "time budget", "value": "stopped after 1 s", "limit": "<= 1 s",
            "status": "FAIL"} in rows
    assert not any(r["item"] == "never reached" for r in rows)
    assert any(r["section"] == "cubins" and "opts in" in r["value"] for r in rows)
    # the torch-graph, real-shape and microbenchmark sections run on the CPU (tiny model, interpreter)
    assert {"torch-graph", "real shapes", "microbench"} <= set(sections)
    assert any(r["section"] == "torch-graph" and r["item"].startswith("device sampling") and r["status"] == "PASS"
               for r in rows)
    # the sampler A/B (one program vs the grid) and the whole-step A/B of every variant
    assert sum(r["section"] == "microbench" and r["item"].startswith("A/B sampler") for r in rows) == 2
    assert any(r["item"].startswith("decode ms/frame v1 | v2 | v3 | v2+grid") for r in rows)
    assert "deliberate failures contained, later sections ran" in out.stdout and "XFAIL" in out.stdout
    # the engine as the studio loads it, on a tiny random checkpoint (the torch path on the CPU)
    engine = {r["item"]: r for r in rows if r["section"] == "engine"}
    assert engine["Engine.load(backend='auto'): backend, precision, load time"]["status"] == "PASS", engine
    assert any(i.startswith("TTFA at c=1 through the scheduler") for i in engine)
    assert "audio-s/s" in engine["generate_batch of 16 takes (sampling, codec): audio-seconds per second"]["value"]
    gap_free = [r for i, r in engine.items() if i.startswith("gap-free streams at c=16")]
    assert len(gap_free) == 1 and gap_free[0]["status"] == "INFO" and "/16)" in gap_free[0]["value"]
    # rows are printed as they are produced, before the final table
    assert out.stdout.index("[FAIL] stand-in | section failed") < out.stdout.index("+---")


def test_a_real_failure_still_fails_the_run(tmp_path, capsys):
    report = gpu_run.Report(tmp_path)

    def ok():
        yield Row("a", "fine", "1", "", "PASS")

    def bad():
        yield Row("b", "wrong", "2", "", "FAIL")

    outcome = gpu_run.run_sections([gpu_run.Section("a", 5, ok), gpu_run.Section("b", 5, bad)], report)
    assert outcome == {"a": "done", "b": "done"} and [r.status for r in report.rows] == ["PASS", "FAIL"]
    assert len((tmp_path / "rows.jsonl").read_text().splitlines()) == 2


def test_step_ab_covers_every_variant_and_both_samplers():
    """The whole-step A/B times every backend variant, and v2 with v3's sampler alone."""
    from engine.backends.cubin import VARIANT_SAMPLER, VARIANTS

    configs = gpu_model.STEP_CONFIGS
    assert {variant for _, variant, _ in configs} == set(VARIANTS)
    assert ("v2", "grid") in {(variant, sampler or VARIANT_SAMPLER[variant]) for _, variant, sampler in configs}
    assert len({label for label, _, _ in configs}) == len(configs)


def test_step_ab_rows_give_each_steps_time_over_v2s():
    ms = {(p, label): t for p in ("fp8", "bf16")
          for label, t in zip(("v1", "v2", "v3", "v2+grid"), (2.0, 1.0, 0.8, 0.9))}
    rows = gpu_model.step_ab_rows(ms)
    assert [r.section for r in rows] == ["A/B step fp8", "A/B step bf16"]
    assert rows[0].item == "decode ms/frame v1 | v2 | v3 | v2+grid (time / v2's)"
    assert rows[0].value == "2.000 (2.00x) | 1.000 (1.00x) | 0.800 (0.80x) | 0.900 (0.90x)"


def test_device_check_runs_the_ab_sections():
    """The device run (not --quick) times the per-kernel A/B (kernels.check.timed_ab_rows: v1/v2 pieces and
    v2/v3 split-K) and the whole-step A/B; --quick is the headline pass alone, neither. Listing them
    launches nothing."""
    from argparse import Namespace

    full = [s.name for s in gpu_check.gpu_sections(Namespace(quick=False, steps=200))]
    quick = [s.name for s in gpu_check.gpu_sections(Namespace(quick=True, steps=200))]
    assert {"A/B kernels", "A/B step", "microbench"} <= set(full)
    assert "A/B kernels" not in quick and "A/B step" not in quick
    assert sum(s.budget_s for s in gpu_check.gpu_sections(Namespace(quick=False, steps=200))) <= 470


def test_grid_sampler_row_fails_on_the_first_different_row():
    import torch

    a = torch.arange(24).view(3, 8)
    assert gpu_model.grid_sampler_row("fp8", a, a.clone()).status == "PASS"
    b = a.clone()
    b[1, 7] = 1024
    row = gpu_model.grid_sampler_row("bf16", a, b)
    assert row.status == "FAIL" and row.value == "1/3 identical before the first difference"


# ------------------------------------------------------------------------------- it always leaves figures or a reason
def _bin_with(tmp_path: Path, python3: str | None, tools=("dirname", "mkdir", "readlink", "timeout", "tee")) -> Path:
    """A PATH directory holding `python3` (a link, or a script given as text) and the few tools the script
    uses, and nothing else: no `python`, as on the GPU image we are lent."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in tools:
        (bin_dir / tool).symlink_to(shutil.which(tool))
    if python3 is not None and python3.startswith("#!"):
        (bin_dir / "python3").write_text(python3)
        (bin_dir / "python3").chmod(0o755)
    elif python3 is not None:
        (bin_dir / "python3").symlink_to(python3)
    return bin_dir


def _rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "rows.jsonl").read_text().splitlines()]


def test_with_only_python3_on_path_no_gpu_exits_2_with_the_reason_in_rows_jsonl(tmp_path):
    ok, _ = runtime_available()
    if ok:
        pytest.skip("a usable GPU is present")
    bin_dir = _bin_with(tmp_path, os.path.realpath(sys.executable))
    out = tmp_path / "out"
    run = subprocess.run([shutil.which("bash"), "scripts/gpu_check.sh", "--out", str(out)], cwd=REPO, timeout=120,
                         capture_output=True, text=True, env={"PATH": str(bin_dir), "HOME": str(tmp_path)})
    assert run.returncode == 2, run.stdout + run.stderr
    rows = _rows(out)
    assert len(rows) == 1 and rows[0]["section"] == "setup" and rows[0]["status"] == "FAIL"
    assert rows[0]["value"].startswith("no GPU check possible here: no NVIDIA driver"), rows
    # without any python3 the script still leaves its reason
    (bin_dir / "python3").unlink()
    run = subprocess.run([shutil.which("bash"), "scripts/gpu_check.sh", "--out", str(out)], cwd=REPO, timeout=60,
                         capture_output=True, text=True, env={"PATH": str(bin_dir), "HOME": str(tmp_path)})
    assert run.returncode == 2
    assert _rows(out) == [{"section": "setup", "item": "python", "limit": "", "status": "FAIL",
                           "value": "'python3' cannot run here (exit 127); set PYTHON to a Python 3 with torch"}]


def test_nothing_is_installed_without_install_and_a_failed_pip_is_a_row_not_an_exit(tmp_path):
    log = tmp_path / "python3.log"
    # python3 logs its arguments and fails every pip install (offline); nvcc exists, so PyCUDA is a candidate
    fake = (f'#!/bin/sh\necho "$*" >> {log}\nif [ "$1 $2" = "-m pip" ]; then\n'
            f'  echo "ERROR: Could not find a version that satisfies the requirement pycuda" >&2; exit 1\nfi\n'
            f'exec {os.path.realpath(sys.executable)} "$@"\n')
    bin_dir = _bin_with(tmp_path, fake)
    (bin_dir / "nvcc").write_text("#!/bin/sh\nexit 0\n")
    (bin_dir / "nvcc").chmod(0o755)
    env = {"PATH": str(bin_dir), "HOME": str(tmp_path)}
    out = tmp_path / "out"
    run = subprocess.run([shutil.which("bash"), "scripts/gpu_check.sh", "--out", str(out)], cwd=REPO, timeout=120,
                         capture_output=True, text=True, env=env)
    assert "-m pip" not in log.read_text(), log.read_text()
    assert not any(r["section"] == "install" for r in _rows(out))
    log.write_text("")
    run = subprocess.run([shutil.which("bash"), "scripts/gpu_check.sh", "--install", "--out", str(out)], cwd=REPO,
                         timeout=120, capture_output=True, text=True, env=env)
    pips = [line for line in log.read_text().splitlines() if line.startswith("-m pip")]
    assert pips and all("--timeout 5 --retries 0" in line for line in pips), pips
    rows = _rows(out)
    assert rows[0] == {"section": "install", "item": "pycuda", "limit": "", "status": "FAIL",
                       "value": "pip install pycuda failed (exit 1): ERROR: Could not find a version that satisfies "
                                "the requirement pycuda"}
    # the check still ran after the failed install, and said why it could not go on
    if not runtime_available()[0]:
        assert run.returncode == 2 and rows[1]["value"].startswith("no GPU check possible here"), rows


def test_the_checkpoint_path_is_the_callers_and_reaches_the_check(tmp_path):
    """The script runs the check from the repository's root: a relative --checkpoint is made absolute from
    the caller's directory first, as --out is."""
    log = tmp_path / "python3.log"
    bin_dir = _bin_with(tmp_path, f'#!/bin/sh\necho "$*" >> {log}\nexit 2\n')
    subprocess.run([shutil.which("bash"), str(REPO / "scripts" / "gpu_check.sh"), "--engine", "--checkpoint", "ckpt"],
                   cwd=tmp_path, timeout=60, capture_output=True, text=True, check=False,
                   env={"PATH": str(bin_dir), "HOME": str(tmp_path)})
    assert f"-m bench.gpu_check --engine --checkpoint {tmp_path}/ckpt" in log.read_text(), log.read_text()


def test_a_sigterm_mid_run_still_prints_the_table_and_keeps_the_rows(tmp_path):
    """`timeout` (or the device runner) sends SIGTERM: the rows so far stay in rows.jsonl, a row says when
    and in which section it came, and the table is printed."""
    env = {**os.environ, "PYTHON": sys.executable}
    proc = subprocess.Popen([shutil.which("bash"), "scripts/gpu_check.sh", "--cpu-selftest", "--out", str(tmp_path)],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and not any(r["section"] == "torch-graph" for r in _rows_so_far(tmp_path)):
        time.sleep(0.2)
    before = _rows_so_far(tmp_path)
    os.killpg(proc.pid, signal.SIGTERM)   # the whole group, as a runner's timeout does
    t0 = time.monotonic()
    stdout, stderr = proc.communicate(timeout=60)
    assert time.monotonic() - t0 < SIGTERM_TABLE_S, stdout[-2000:]
    rows = _rows(tmp_path)
    assert rows[:len(before)] == before and len(before) >= 4
    stop = [r for r in rows if r["section"] == "run" and r["item"] == "stopped"]
    assert len(stop) == 1 and stop[0]["value"].startswith("SIGTERM after ") and stop[0]["status"] == "FAIL", rows
    assert stdout.index("[FAIL] run | stopped") < stdout.index("+---") and " FAIL (" in stdout, stdout[-3000:]


SIGTERM_TABLE_S = 15  # from the SIGTERM to the table: the section's Python gets interrupted at once


def _rows_so_far(out: Path) -> list[dict]:
    path = out / "rows.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


# A section stuck in a C call that never returns and ignores signals (a zeroed glibc mutex, locked twice by its
# owner; ctypes releases the GIL), as a hung CUDA call is: neither the alarm nor SIGTERM's handler can run.
HUNG = """
import ctypes, sys
from pathlib import Path
from bench.gpu_run import Report, Section, Watchdog, run_sections
from kernels.check import Row

out = Path(sys.argv[1])
report = Report(out)
report.trace = (out / "tracebacks.txt").open("a")
Watchdog(report, hung_after_s=1).start()

def hung_in_c():
    yield Row("hang", "row before the hung call", "made", "", "PASS")
    mutex, libc = ctypes.create_string_buffer(64), ctypes.CDLL(None)
    libc.pthread_mutex_lock(mutex)
    libc.pthread_mutex_lock(mutex)

run_sections([Section("hang", int(sys.argv[2]), hung_in_c)], report, hung_after_s=1)
print("not reached")
"""


def _run_hung(tmp_path: Path, budget_s: int, sigterm: bool):
    proc = subprocess.Popen([sys.executable, "-c", HUNG, str(tmp_path), str(budget_s)], cwd=REPO, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    first = proc.stdout.readline()
    assert first.startswith("[PASS] hang | row before the hung call"), first + proc.stderr.read()
    t0 = time.monotonic()
    if sigterm:
        time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
    rest, _ = proc.communicate(timeout=60)
    return proc.returncode, first + rest, time.monotonic() - t0


def test_a_hung_call_past_its_budget_ends_the_run_with_its_traceback_and_the_table(tmp_path):
    code, stdout, took = _run_hung(tmp_path, budget_s=1, sigterm=False)
    assert code == 1 and "not reached" not in stdout and took < 10, stdout
    assert stdout.index("[FAIL] hang | hung call | still in one call 1 s after its 1 s budget") < stdout.index("+---")
    assert [r["item"] for r in _rows(tmp_path)] == ["row before the hung call", "hung call"]
    assert "in hung_in_c" in (tmp_path / "tracebacks.txt").read_text()


def test_a_sigterm_during_a_hung_call_still_prints_the_table(tmp_path):
    code, stdout, took = _run_hung(tmp_path, budget_s=60, sigterm=True)
    assert code == 128 + signal.SIGTERM and took < 10, stdout
    assert re.search(r"\[FAIL\] run \| stopped \| SIGTERM after \d+ s, in section 'hang'; the main thread did not "
                     r"answer in 3 s \(a call that does not return\)", stdout), stdout
    assert stdout.index("| stopped |") < stdout.index("+---")
    assert "in hung_in_c" in (tmp_path / "tracebacks.txt").read_text()   # faulthandler, at the SIGTERM


def test_the_quick_pass_comes_first_fits_three_minutes_and_the_model_is_one_section_per_precision():
    from argparse import Namespace

    full = gpu_check.gpu_sections(Namespace(quick=False, steps=200))
    quick = gpu_check.gpu_sections(Namespace(quick=True, steps=200))
    names = [s.name for s in full]
    assert [s.name for s in quick] == names[:len(quick)]
    assert [s.name for s in quick][-2:] == ["headline fp8", "headline bf16"]
    assert sum(s.budget_s for s in quick) + gpu_check.START_UP_S <= gpu_check.QUICK_PASS_S == 180
    assert {"model fp8", "model bf16", "model torch"} <= set(names[len(quick):]) and "model" not in names
    script = (REPO / "scripts" / "gpu_check.sh").read_text()
    timeout_s = int(re.search(r"^RUN_TIMEOUT_S=(\d+)", script, re.M).group(1))
    assert sum(s.budget_s for s in full) <= timeout_s - 10


def test_every_section_yields_its_rows_as_it_makes_them():
    """A section that built a list would lose every row to an overrun; these are generators."""
    from bench import gpu_kernels

    makers = [gpu_check.preflight_rows, gpu_check.manifest_rows, gpu_model.headline_rows, gpu_model.model_rows,
              gpu_model.torch_rows, gpu_model.torch_graph_rows, gpu_model.variant_rows, gpu_kernels.microbench_rows,
              gpu_kernels.batch_rows, gpu_kernels.batch_step_rows, gpu_kernels.real_shape_rows]
    assert [f.__name__ for f in makers if not inspect.isgeneratorfunction(f)] == []


def test_a_section_that_cannot_run_is_one_skip_row_and_the_next_runs(tmp_path):
    report = gpu_run.Report(tmp_path)

    def needs_cubins():
        raise gpu_run.SectionSkipped("not run: the cubins did not load (the setup section says why)")
        yield

    def torch_only():
        yield Row("torch", "figure", "1 ms", "", "INFO")

    outcome = gpu_run.run_sections([gpu_run.Section("kernels", 5, needs_cubins),
                                    gpu_run.Section("torch", 5, torch_only)], report,
                                   health=lambda: pytest.fail("a skip is no failure: health is not asked"))
    assert outcome == {"kernels": "skipped", "torch": "done"}
    assert [(r.section, r.item, r.status) for r in report.rows] == [("kernels", "not run", "SKIP"),
                                                                    ("torch", "figure", "INFO")]


def test_the_scripts_own_rows_are_kept_and_counted_in_the_table(tmp_path, capsys):
    (tmp_path / "rows.jsonl").write_text(json.dumps({"section": "install", "item": "pycuda", "value": "pip failed",
                                                     "limit": "", "status": "FAIL"}) + "\n")
    report = gpu_run.Report(tmp_path, append=True)
    report.add(Row("setup", "device", "H200", "", "INFO"))
    assert report.finish() and not report.finish()   # printed once
    assert len(_rows(tmp_path)) == 2
    printed = capsys.readouterr().out
    assert printed.count("pip failed") == 1 and "1 FAIL (0 pass, 1 info, 0 skip)" in printed   # in the table only


def test_an_overrun_that_the_interpreter_reraises_is_still_an_overrun(tmp_path):
    """Triton's interpreter re-raises whatever interrupts a kernel as an InterpreterError from it: the
    alarm's SectionTimeout must still read as the section's time budget, not as a failure of the code."""
    report = gpu_run.Report(tmp_path)

    def interrupted():
        yield Row("slow", "row before the overrun", "made", "", "PASS")
        try:
            raise gpu_run.SectionTimeout()
        except Exception as exc:
            raise RuntimeError(repr(exc)) from exc

    assert gpu_run.run_sections([gpu_run.Section("slow", 5, interrupted)], report) == {"slow": "over budget"}
    assert [(r.item, r.status) for r in report.rows] == [("row before the overrun", "PASS"), ("time budget", "FAIL")]
