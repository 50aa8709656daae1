"""The Studio tab's output panel as text: the one metrics panel (its status line included) and the History
table's rows. Pure formatting, like render.py: no Gradio state, no engine."""

from __future__ import annotations

import dataclasses
import html
import re
import time
from typing import Any

from engine.types import Metrics
from studio.takes.longform import CUT_SHORT_WORDS

# Key columns first: on a narrow screen the table is cut from the right, where the text and the numbers sit.
HISTORY_HEADERS = ["#", "time", "voice", "seconds", "seed", "state", "text", "style", "TTFA ms", "RTF"]
STATES = {"eoc": "done", "cancelled": "stopped", "max_frames": "cut at Max length",
          "repeat_guard": CUT_SHORT_WORDS["repeat_guard"]}
TAG = re.compile(r"<\|[a-z_]+:([^|>]*)\|>")
TEXT_CHARS, STYLE_CHARS = 60, 40


def _esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _num(value, fmt: str) -> str:
    return "—" if value is None else format(value, fmt)


def _bytes(n) -> str:
    if not n:
        return "—"
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


def metrics_html(metrics: Metrics | None = None, *, state: str = "idle", seconds: float = 0.0,
                 warnings: list[str] | None = None, note: str = "", loudness=None, take: int | None = None,
                 kept: bool = False) -> str:
    """The metrics panel: each value in an element with a stable id (`m-ttfa`, `m-rtf`, …), the state
    (`m-state`) and a line that says what is going on or what went wrong (`metrics-note`). `loudness`
    (studio/audio/loudness.py) once the take is complete; `take`: the number of the take it shows, with the
    player under it (`m-take`); `kept`: that take was picked with Keep."""
    g = (dataclasses.asdict(metrics) if metrics is not None else {}).get  # None: nothing measured yet
    reused, prompt = g("reused_tokens"), g("prompt_tokens")
    tiles = [
        ("ttfa", "TTFA", _num(g("ttfa_ms"), ".0f"), "ms"),
        ("rtf", "RTF", _num(g("rtf"), ".3f"), ""),
        ("frames", "Frames", _num(g("frames"), "d"), f"{seconds:.1f} s"),
        ("msf", "ms / frame", _num(g("ms_per_frame"), ".1f"), ""),
        ("prefill", "Prefill", _num(g("prefill_ms"), ".1f"), "ms"),
        ("reused", "Reused prompt", "—" if prompt is None else f"{reused or 0}/{prompt}", "tokens"),
        # One label whatever was measured: the kind (the process's RSS, the GPU's) goes under the value.
        ("mem", "Peak memory", _bytes(g("peak_mem_bytes")), (g("mem_kind") or "").upper()),
        ("seed", "Seed", _num(g("seed"), "d"), "kept" if kept else ""),
        ("lufs", "Loudness", _num(loudness.lufs if loudness else None, ".1f"), "LUFS"),
        ("tp", "True peak", _num(loudness.true_peak_db if loudness else None, ".1f"), "dBTP"),
    ]
    cells = "".join(f'<div class="hs-tile"><div class="k">{k}</div><div class="v" id="m-{i}">{v}</div>'
                    f'<div class="u">{u}</div></div>' for i, k, v, u in tiles)
    engine = " · ".join(str(x) for x in (g("precision"), g("backend"), g("device")) if x)
    stop = g("stop_reason") or ""
    foot = f'<span class="hs-state {_esc(state)}" id="m-state">{_esc(state)}</span>'
    if take is not None:
        foot += f' <b id="m-take">take #{take}{" · kept" if kept else ""}</b>'
    if stop:
        foot += f' <span class="hs-stop">stop: <b id="m-stop">{_esc(stop)}</b></span>'
    if engine:
        foot += f' <span class="hs-eng">{_esc(engine)}</span>'
    role = ' role="alert"' if state == "error" else ""
    foot += f' <span class="hs-note{" error" if state == "error" else ""}" id="metrics-note"{role}>{_esc(note)}</span>'
    warn = "".join(f'<div class="hs-lint warning">{_esc(w)}</div>' for w in warnings or [])
    return f'<div class="hs-metrics" id="metrics-panel"><div class="hs-tiles">{cells}</div>' \
           f'<div class="hs-foot">{foot}</div>{warn}</div>'


def short_style(style: str | None) -> str:
    """A style as the History shows it: a tag prefix as its values ("happy, whisper"), a preset by its name."""
    values = [v.replace("_", " ") for v in TAG.findall(style or "")]
    shown = ", ".join(values) if values else (style or "")
    return shown if len(shown) <= STYLE_CHARS else shown[:STYLE_CHARS - 1] + "…"


def take_state(take, kept: int | None = None) -> str:
    """A take's state in words: done, stopped, cut at Max length…; "kept" for the one picked with Keep."""
    state = STATES.get(take.stop_reason, take.stop_reason or "done")
    if take.id != kept:
        return state
    return "kept" if state == "done" else f"kept ({state})"


def history_rows(takes, kept: int | None = None) -> list[list[Any]]:
    """Rows for the session's History table, newest first, in HISTORY_HEADERS' order."""
    rows = []
    for t in reversed(list(takes)):
        m = t.metrics
        text = t.text[:TEXT_CHARS] + ("…" if len(t.text) > TEXT_CHARS else "")
        rows.append([t.id, time.strftime("%H:%M:%S", time.localtime(t.created)), t.voice_name or "zero-shot",
                     round(t.seconds, 1), t.seed, take_state(t, kept), text, short_style(t.style),
                     _num(m.ttfa_ms if m else None, ".0f"), _num(m.rtf if m else None, ".3f")])
    return rows
