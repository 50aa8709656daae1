"""The device check's run: sections, each with its own try and time budget, so one failure costs one row,
not the table. Rows are printed as they come and appended to <out>/rows.jsonl, so a run cut short still
returns what it had. A kernel fault is a sticky error on the CUDA context: the sections after it are
INVALID rows, not failures.

A run always ends with its table: an overrun ends its section (SIGALRM), a SIGTERM or Ctrl-C ends the run
(`Stopped`), and a call that never returns (a hung CUDA call keeps the main thread in C, where no Python
signal handler runs) is caught by the `Watchdog` thread, which dumps every thread's traceback, prints the
table and ends the process.
"""

from __future__ import annotations

import faulthandler
import json
import os
import select
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from kernels.check import Row, format_table

HUNG_AFTER_S = 20     # a section still in one call this long after its budget ran out is hung: the run ends
SIGTERM_GRACE_S = 3   # after a SIGTERM, the main thread's time to print the table itself (`timeout -k` gives 10 s)


class SectionTimeout(Exception):
    pass


class SectionSkipped(Exception):
    """A section that cannot run here (say, the cubins did not load): one SKIP row with the reason."""


class Stopped(BaseException):
    """The run is told to end (SIGTERM, Ctrl-C). A BaseException, so no section's `except Exception`
    swallows it; `code` is the exit status (128 + the signal)."""

    def __init__(self, why: str, code: int):
        super().__init__(why)
        self.code = code


@dataclass
class Section:
    name: str
    budget_s: int
    rows: Callable[[], Iterable[Row]]   # a generator: each row is reported as soon as it is made


class Report:
    """Prints each row as one line and appends it as JSON to `<out>/rows.jsonl` at once, so whatever ends
    the run, the rows made so far are on disk. `append` keeps the rows already in the file (what
    scripts/gpu_check.sh wrote before the check started) and counts them in the table. Rows in `xfail`
    (section, item) show as XFAIL in the table; rows.jsonl keeps what each section said."""

    def __init__(self, out: Path | None, append: bool = False, xfail: frozenset = frozenset()):
        self.rows: list[Row] = []
        self.path = None
        self.xfail = xfail
        self.section: tuple[str, float, float] | None = None   # (name, budget, monotonic deadline) running now
        self.trace = sys.__stderr__                            # where faulthandler writes tracebacks
        self.finished = False
        self._lock = threading.RLock()
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)
            self.path = out / "rows.jsonl"
            if append and self.path.exists():
                for line in self.path.read_text().splitlines():
                    try:
                        self.rows.append(Row(**json.loads(line)))
                    except (ValueError, TypeError):   # not a row: the file keeps it, the table leaves it out
                        pass
            else:
                self.path.write_text("")

    def add(self, row: Row) -> None:
        with self._lock:
            self.rows.append(row)
            print(f"[{row.status or '-':4s}] {row.section} | {row.item} | {row.value}"
                  + (f" | limit {row.limit}" if row.limit else ""), flush=True)
            if self.path is not None:
                with self.path.open("a") as f:
                    f.write(json.dumps(asdict(row)) + "\n")

    def finish(self) -> bool:
        """Print the table, once (the main thread and the watchdog may both try); False if already printed."""
        with self._lock:
            if self.finished:
                return False
            self.finished = True
            print(format_table([replace(r, status="XFAIL") if (r.section, r.item) in self.xfail else r
                                for r in self.rows]), flush=True)
            return True

    def end_with(self, row: Row) -> bool:
        """Add `row` and print the table, unless the table is out already (then neither): the watchdog's end."""
        with self._lock:
            if self.finished:
                return False
            self.add(row)
            return self.finish()


def run_sections(sections: list[Section], report: Report, health: Callable[[], str | None] | None = None,
                 hung_after_s: float = HUNG_AFTER_S) -> dict[str, str]:
    """Run each section under its budget (SIGALRM, main thread: it interrupts Python between device calls);
    an exception or an overrun ends that section with one FAIL row and the next section starts. A section
    that raises `SectionSkipped` gets one SKIP row. While a section runs, faulthandler is armed to dump
    every thread's traceback `hung_after_s` after its budget (to `report.trace`; the `Watchdog` ends the run
    a second later): a call that does not return leaves where it hung. `Stopped` (SIGTERM) passes through: the run ends.

    After a section fails, `health()` says whether the device is still usable (None) or why not: a kernel
    fault is a sticky error on the CUDA context, after which every later call fails whatever it tests.
    Then each later section gets one INVALID row naming the fault instead of running (its FAILs would
    say nothing about it). Returns each section's outcome: "done", "failed", "over budget", "skipped" or
    "invalid"."""
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
            report.section = (sec.name, sec.budget_s, time.monotonic() + sec.budget_s)
            if use_alarm:
                signal.alarm(sec.budget_s)
                _arm_traceback_dump(sec.budget_s + hung_after_s, report.trace)
            try:
                for row in sec.rows():
                    report.add(row)
                outcome[sec.name] = "done"
            except SectionSkipped as exc:
                outcome[sec.name] = "skipped"
                report.add(Row(sec.name, "not run", str(exc), "", "SKIP"))
            except Exception as exc:  # one row, then the next section
                if _caused_by(exc, SectionTimeout):   # the alarm, maybe re-raised by what it interrupted
                    outcome[sec.name] = "over budget"
                    report.add(Row(sec.name, "time budget", f"stopped after {time.perf_counter() - t0:.0f} s",
                                   f"<= {sec.budget_s} s", "FAIL"))
                else:
                    outcome[sec.name] = "failed"
                    report.add(Row(sec.name, "section failed", f"{type(exc).__name__}: {exc}"[:200], "", "FAIL"))
            finally:
                if use_alarm:
                    signal.alarm(0)
                    faulthandler.cancel_dump_traceback_later()
                report.section = None
            if outcome[sec.name] in ("failed", "over budget") and health is not None:
                why = health()
                if why:
                    sticky = (sec.name, why)
    finally:
        if use_alarm:
            signal.signal(signal.SIGALRM, previous)
    return outcome


def _caused_by(exc: BaseException | None, kind: type) -> bool:
    """Whether `exc` or an exception it was raised from is a `kind` (Triton's interpreter re-raises whatever
    interrupts a kernel as an InterpreterError from it)."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, kind):
            return True
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return False


def _arm_traceback_dump(after_s: float, file) -> None:
    try:
        faulthandler.dump_traceback_later(after_s, file=file)
    except (AttributeError, ValueError, OSError):  # a stream with no file descriptor (a captured sys.stderr)
        pass


class Watchdog:
    """Ends the run with its table when the main thread cannot. A hung CUDA call keeps the main thread in
    C, where neither the section's alarm nor the SIGTERM handler (Python code, run between bytecodes) gets
    to run. This daemon thread hears of signals through `signal.set_wakeup_fd` and watches the running
    section's deadline: HUNG_AFTER_S past a budget, or SIGTERM_GRACE_S after a SIGTERM, with the main thread
    still silent, it adds the row saying so, prints the table and ends the process (a call that never
    returns cannot be given back). faulthandler has then dumped the hung thread's traceback.

    `start()` also installs the SIGTERM handler (raises `Stopped` in the main thread) and has faulthandler
    dump every thread's traceback when a SIGTERM comes, before that handler runs."""

    def __init__(self, report: Report, hung_after_s: float = HUNG_AFTER_S, grace_s: float = SIGTERM_GRACE_S):
        self.report, self.hung_after_s, self.grace_s = report, hung_after_s, grace_s
        self.t0 = time.monotonic()

    def start(self) -> None:
        def on_term(signum, frame):
            signal.signal(signal.SIGTERM, signal.SIG_IGN)   # `timeout` and a process-group kill may both send one
            running = self.report.section
            raise Stopped(f"SIGTERM after {time.monotonic() - self.t0:.0f} s"
                          + (f", in section {running[0]!r}" if running else ""), 128 + signal.SIGTERM)

        signal.signal(signal.SIGTERM, on_term)
        try:
            faulthandler.register(signal.SIGTERM, file=self.report.trace, all_threads=True, chain=True)
        except (AttributeError, ValueError, OSError):
            pass
        read, write = os.pipe()
        os.set_blocking(write, False)
        signal.set_wakeup_fd(write, warn_on_full_buffer=False)
        threading.Thread(target=self._watch, args=(read,), name="gpu-check watchdog", daemon=True).start()

    def _watch(self, read: int) -> None:
        term_at = None
        while True:
            if select.select([read], [], [], 0.25)[0] and signal.SIGTERM in os.read(read, 64) and term_at is None:
                term_at = time.monotonic()
            now = time.monotonic()
            running = self.report.section
            if term_at is not None and now - term_at > self.grace_s:
                where = f", in section {running[0]!r}" if running else ""
                return self._end(Row("run", "stopped", f"SIGTERM after {term_at - self.t0:.0f} s{where}; the main "
                                     f"thread did not answer in {self.grace_s:g} s (a call that does not return)", "",
                                     "FAIL"), 128 + signal.SIGTERM)
            if running is not None and now > running[2] + self.hung_after_s + 1:
                return self._end(Row(running[0], "hung call", f"still in one call {self.hung_after_s:g} s after its "
                                     f"{running[1]} s budget; the run ends here (tracebacks: "
                                     f"{_name(self.report.trace)})", f"<= {running[1]} s", "FAIL"), 1)

    def _end(self, row: Row, code: int) -> None:
        """faulthandler has dumped the tracebacks by now (armed by run_sections, registered for SIGTERM). If
        the main thread printed the table meanwhile, it is on its way out: leave the exit to it."""
        if self.report.end_with(row):
            os._exit(code)


def _name(file) -> str:
    return getattr(file, "name", "stderr")


def cuda_health() -> str | None:
    """None while the CUDA context works; else the error a trivial call now gets (a sticky fault)."""
    try:
        torch.cuda.synchronize()
        torch.ones(1, device="cuda").add_(1).cpu()
    except Exception as exc:  # whatever the fault, it is the reason
        return f"{type(exc).__name__}: {exc}"[:160]
    return None


def on_loader_stream(rows: Callable[[], Iterable[Row]], stream: Callable[[], torch.cuda.Stream | None]
                     ) -> Callable[[], Iterable[Row]]:
    """A section whose torch work and cubin launches all run on the loader's stream, after a wait for what
    was queued before on torch's current one: inputs made on one stream and launched on another would
    race (the launcher refuses a launch on any stream but its own). `stream()` gives the loader's stream
    once the setup section has started it, None when the cubins did not load (then the section runs on
    torch's stream: a section that needs the cubins says so with `SectionSkipped`)."""
    def run():
        loader = stream()
        if loader is None:
            yield from rows()
            return
        loader.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(loader):
            yield from rows()
    return run
