"""`scripts/gpu_check.sh --cpu-selftest`: the device check's plumbing without a GPU — every row printed as it
comes and appended to rows.jsonl, a section that raises or overruns its budget costs one row, and the
sections after it still run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from bench import gpu_check, gpu_model, gpu_run
from kernels.check import Row

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
    v2/v3 split-K) and the whole-step A/B; --quick keeps the per-kernel rows. Listing them launches nothing."""
    from argparse import Namespace

    full = [s.name for s in gpu_check.gpu_sections(Namespace(quick=False, steps=200))]
    quick = [s.name for s in gpu_check.gpu_sections(Namespace(quick=True, steps=200))]
    assert {"A/B kernels", "A/B step", "microbench"} <= set(full)
    assert "A/B kernels" in quick and "A/B step" not in quick
    assert sum(s.budget_s for s in gpu_check.gpu_sections(Namespace(quick=False, steps=200))) <= 470


def test_grid_sampler_row_fails_on_the_first_different_row():
    import torch

    a = torch.arange(24).view(3, 8)
    assert gpu_model.grid_sampler_row("fp8", a, a.clone()).status == "PASS"
    b = a.clone()
    b[1, 7] = 1024
    row = gpu_model.grid_sampler_row("bf16", a, b)
    assert row.status == "FAIL" and row.value == "1/3 identical before the first difference"
