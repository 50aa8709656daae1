"""Pure formatting for the studio page: HTML fragments, the tag palette, history rows, recipes. No Gradio, no
engine state, so every piece is unit-testable and the views stay layout and wiring only. The page's CSS and
JavaScript are files in `static/`."""

from __future__ import annotations

import dataclasses
import html
import json
import shlex
from typing import Any

from engine.config import FRAME_RATE
from engine.delay import default_max_frames
from engine.tokenizer import CONTROL_TAGS
from engine.types import DRAWN_SEED_BITS

PLAN_NOTES = 3  # a long take's notes past these are counted, not listed: the line stays a line
PALETTE_GROUPS = (("emotion", "Emotion"), ("style", "Style"), ("sfx", "Sounds"), ("prosody", "Prosody"))
MODEL_NAME = "Higgs TTS 3"  # Boson AI's name for Higgs Audio v3 TTS-4B since its rename


def _esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def header_html(status: dict[str, Any]) -> str:
    """Title, engine chips, and — in demo mode — a banner that says the audio is noise."""
    checkpoint = str(status.get("checkpoint") or "")
    kernels = " · ".join(str(x) for x in (status.get("kernel_arch"), status.get("kernel_loader")) if x)
    chips = [  # (label, shown value, hover text)
        ("checkpoint", checkpoint.rstrip("/").rsplit("/", 1)[-1], checkpoint),
        ("device", status.get("device"), ""),
        ("precision", status.get("precision"), status.get("precision_reason") or ""),
        ("backend", status.get("backend"), status.get("backend_reason") or ""),
        ("kernels", kernels, status.get("self_check") or ""),  # hover: the self-check figures
        ("memory", (status.get("memory_plan") or "").split(" = ")[0], status.get("memory_plan") or ""),
    ]
    chip_html = "".join(f'<span class="hs-chip" title="{_esc(hover or k)}"><b>{k}</b> {_esc(v)}</span>'
                        for k, v, hover in chips if v)
    banner = ""
    if status.get("demo"):
        banner = ('<div class="hs-demo" id="demo-banner"><b>Demo mode.</b> The model has tiny random weights, so '
                  'every take is noise. Everything else (streaming, metrics, voices, history, API) is real. '
                  'Start without <code>--demo</code> and with the checkpoint to hear speech.</div>')
    # The skip link is the page's first stop for the keyboard; the page's script (static/page.js) moves the focus
    # into the text box it names. The model goes by one name on the page: its current one (SPEC.md).
    return (f'<a class="hs-skip" href="#text">Skip to the text box</a>'
            f'<header class="hs-head"><h1 class="hs-title">Higgs Studio <span class="hs-sub">for {MODEL_NAME}</span>'
            f'</h1><div class="hs-chips">{chip_html}</div></header>{banner}')


def plan_html(plan=None, *, error: str = "") -> str:
    """The line under the text box: what Generate will do (`plan`, studio/takes/prepare.py `Plan`: its summary,
    a one-prompt take's frame budget, the characters sent, then its notes), or `error`, the sentence Generate
    would fail with; nothing without either (an empty box)."""
    if error:
        return f'<div class="hs-lint error">{_esc(error)}</div>'
    if plan is None:
        return ""
    parts = [f"<b>{_esc(plan.summary())}</b>"]
    if not plan.long:  # a long take's segments each get their own length cap
        budget = plan.params.max_frames or default_max_frames(plan.prompt)  # the engine's own cap when none is set
        auto = "" if plan.order.params.max_frames else ", auto"
        parts.append(f"budget {budget} frames ({budget / FRAME_RATE:.0f} s{auto})")
    parts.append(f"{len(plan.order.text)} characters")
    notes = [f'<div class="hs-lint">{_esc(w)}</div>' for w in plan.warnings[:PLAN_NOTES]]
    if len(plan.warnings) > PLAN_NOTES:
        notes.append(f'<div class="hs-lint">… and {len(plan.warnings) - PLAN_NOTES} more notes</div>')
    return f'<div class="hs-est">{" · ".join(parts)}</div>' + "".join(notes)


def palette_html() -> str:
    """Buttons for the 43 control tags, grouped; `static/palette.js` inserts the clicked tag at the cursor.
    The palette is one stop for the Tab key (a toolbar with a roving tabindex: only its first button is in the
    tab order), and the arrow keys move inside it."""
    groups, first = [], True
    for category, title in PALETTE_GROUPS:
        tags = [t for t in CONTROL_TAGS.values() if (t.text.split(":")[0][2:] == category)]
        buttons = []
        for t in tags:
            words = t.value.replace("_", " ")
            buttons.append(f'<button type="button" class="hs-tag hs-{category}" data-tag="{_esc(t.text)}" '
                           f'tabindex="{0 if first else -1}" '
                           f'title="{_esc(t.text)}">{_esc(words)}</button>')
            first = False
        groups.append(f'<div class="hs-group" role="group" aria-label="{title}">'
                      f'<span class="hs-gtitle" aria-hidden="true">{title}</span>{"".join(buttons)}</div>')
    return ('<div class="hs-palette" role="toolbar" aria-label="Tags: the arrow keys move, Enter inserts">'
            + "".join(groups) + "</div>")


def typeahead_html() -> str:
    """The "type as you go" toggle; `static/typeahead.js` streams the text box through the speech WebSocket."""
    return ('<div class="hs-typeahead"><label><input type="checkbox" id="typeahead-toggle"> Type as you go: '
            'each sentence is spoken as soon as you finish it</label> <span id="typeahead-state"></span></div>')


def live_player_html(token: str) -> str:
    """The live player panel: state, playhead, elapsed time and the browser-side numbers. `token` is the page
    session token the live route checks (studio/views/live.py), read by `static/live.js`; a fresh one is issued at
    every page load. `data-seed-bits` is how many bits a seed the browser draws has (engine.types)."""
    # Only what the browser alone knows: the engine's numbers are the metrics panel's (views/panel.py).
    tiles = [("m-heard", "Heard", "ms"), ("live-net", "Heard − TTFA", "ms"), ("live-underruns", "Underruns", "")]
    cells = "".join(f'<div class="hs-tile"><div class="k">{k}</div><div class="v" id="{i}">—</div>'
                    f'<div class="u">{u}</div></div>' for i, k, u in tiles)
    return (f'<div class="hs-live" data-token="{_esc(token)}" data-seed-bits="{DRAWN_SEED_BITS}">'
            '<div class="hs-live-bar"><span class="hs-state" id="live-state">idle</span>'
            '<div class="hs-playhead"><div id="live-playhead"></div></div>'
            '<span id="live-pos">0.0 / 0.0 s</span><span id="live-elapsed">0.0 s</span></div>'
            f'<div class="hs-tiles hs-live-tiles">{cells}</div>'
            '<div class="hs-note" id="live-note">Heard: click to first sound in this browser (queue + network + '
            'buffering); Heard − TTFA is the share outside the engine.</div></div>')


def _num(value, fmt: str) -> str:
    return "—" if value is None else format(value, fmt)


def variant_html(take, index: int) -> str:
    """One side-by-side take's caption: its place, seed and numbers (the seed in `variant-seed-<index>`)."""
    m = take.metrics
    return (f'<div class="hs-variant"><b>Take {index + 1}</b> · seed <b id="variant-seed-{index}">{take.seed}</b>'
            f'<br>{take.seconds:.1f} s · RTF {_num(m.rtf if m else None, ".3f")} · '
            f'stop {_esc(take.stop_reason or "—")} · batch {_num(m.batch if m else None, "d")}</div>')


def result_json(take, warnings: list[str]) -> dict[str, Any]:
    """What the `generate` endpoint returns to API clients beside the audio: metrics, recipe, warnings."""
    metrics = take.metrics
    values = dataclasses.asdict(metrics) if dataclasses.is_dataclass(metrics) else dict(vars(metrics))
    return {"take_id": take.id, "seconds": round(take.seconds, 3), "metrics": values, "recipe": take.recipe(),
            "loudness": take.loudness.as_dict() if take.loudness is not None else None, "warnings": list(warnings)}


def recipe_json(take) -> str:
    return json.dumps(take.recipe(), indent=2, ensure_ascii=False)


def recipe_curl(r: dict[str, Any], base_url: str, out: str = "take.wav") -> str:
    """A curl command that reproduces a take's recipe through the OpenAI-compatible route (PRODUCT §7.7)."""
    body = {"model": "higgs-audio-v3-tts", "input": r["text"], "voice": r["voice_id"] or "default",
            **({"instructions": r["style"]} if r["style"] else {}), "response_format": "wav",
            **{k: r[k] for k in ("seed", "temperature", "top_p", "top_k", "max_frames", "repeat_guard")},
            **({"dictionary": r["dictionary"]} if "dictionary" in r else {})}  # the rules that fired, pinned
    return (f"curl -s {base_url.rstrip('/')}/v1/audio/speech -H 'Content-Type: application/json' \\\n"
            f"  -d {shlex.quote(json.dumps(body, ensure_ascii=False))} -o {out}")


def levels_line(loudness, report) -> str:
    """A take's levels in one line of markdown: loudness, true peak and the ACX verdict."""
    verdict = "passes" if report.passed else "fails " + ", ".join(n.replace("_", " ") for n in report.failed)
    return (f"{_num(loudness.lufs, '.1f')} LUFS, true peak {_num(loudness.true_peak_db, '.1f')} dBTP, "
            f"ACX {verdict}")


def acx_html(report) -> str:
    """An ACX report (studio/audio/loudness.py) as a small table: each rule, what was measured, pass or fail
    (rows `acx-<name>` with class `pass` / `fail`)."""
    rows = "".join(
        f'<tr id="acx-{_esc(c.name)}" class="{"pass" if c.passed else "fail"}"><td>{"✓" if c.passed else "✗"}</td>'
        f'<td>{_esc(c.name.replace("_", " "))}</td><td>{_num(c.value, ".2f")} {_esc(c.unit)}</td>'
        f'<td>{_esc(c.rule)}</td></tr>' for c in report.checks)
    verdict = "passes" if report.passed else "fails: " + ", ".join(n.replace("_", " ") for n in report.failed)
    return (f'<div class="hs-acx"><b id="acx-verdict">ACX {_esc(verdict)}</b>'
            f'<table>{rows}</table></div>')


def aliases_md(aliases) -> str:
    """The voice names chat clients send (`studio.voices.aliases.Alias`es) and what each speaks with, as a table."""
    if not aliases:
        return "No voice names are set up for chat clients."
    intro = ("Chat clients (Open WebUI, SillyTavern, the OpenAI SDK) send OpenAI's voice names to "
             "`/v1/audio/speech`; each speaks with this. Set your own with `--voice-alias alloy=Narrator`.")
    lines = [intro, "", "| name | speaks with | set by |", "|---|---|---|"]
    for a in aliases:
        kind = "voice" if a.voice_id is not None else "style"
        target = a.shown.replace("|", "\\|")
        lines.append(f"| `{a.name}` | {kind} {target} | {'you' if a.configured else 'built in'} |")
    return "\n".join(lines)
