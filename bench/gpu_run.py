"""The device check's run: sections, each with its own try and time budget, so one failure costs one row,
not the table. Rows are printed as they come and appended to <out>/rows.jsonl, so a run cut short still
returns what it had. A kernel fault is a sticky error on the CUDA context: the sections after it are
INVALID rows, not failures.
"""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from kernels.check import Row


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


def run_sections(sections: list[Section], report: Report, health: Callable[[], str | None] | None = None
                 ) -> dict[str, str]:
    """Run each section under its budget (SIGALRM, main thread: it interrupts Python between device calls);
    an exception or an overrun ends that section with one FAIL row and the next section starts.

    After a section fails, `health()` says whether the device is still usable (None) or why not: a kernel
    fault is a sticky error on the CUDA context, after which every later call fails whatever it tests.
    Then each later section gets one INVALID row naming the fault instead of running (its FAILs would
    say nothing about it). Returns each section's outcome: "done", "failed", "over budget" or "invalid"."""
    def on_alarm(signum, frame):
        raise SectionTimeout()

    use_alarm = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGALRM, on_alarm) if use_alarm else None
    outcome, sticky = {}, None
    try:
        for sec in sections:
            if sticky is not None:
                outcome[sec.name] = "invalid"
                report.add(Row(sec.name, "not run", f"invalid: the CUDA context has a sticky error since section "
                               f"{sticky[0]!r} ({sticky[1]})"[:200], "", "INVALID"))
                continue
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
            if outcome[sec.name] != "done" and health is not None:
                why = health()
                if why:
                    sticky = (sec.name, why)
    finally:
        if use_alarm:
            signal.signal(signal.SIGALRM, previous)
    return outcome


def cuda_health() -> str | None:
    """None while the CUDA context works; else the error a trivial call now gets (a sticky fault)."""
    try:
        torch.cuda.synchronize()
        torch.ones(1, device="cuda").add_(1).cpu()
    except Exception as exc:  # whatever the fault, it is the reason
        return f"{type(exc).__name__}: {exc}"[:160]
    return None


def on_loader_stream(rows: Callable[[], Iterable[Row]], stream: Callable[[], torch.cuda.Stream]
                     ) -> Callable[[], Iterable[Row]]:
    """A section whose torch work and cubin launches all run on the loader's stream, after a wait for what
    was queued before on torch's current one: inputs made on one stream and launched on another would
    race (the launcher refuses a launch on any stream but its own). `stream()` gives the loader's stream
    once the setup section has started it."""
    def run():
        loader = stream()
        loader.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(loader):
            yield from rows()
    return run
