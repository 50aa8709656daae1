"""Pure formatting for the studio page: HTML fragments, the tag palette, CSS. No Gradio, no engine state,
so every piece is unit-testable and the page module stays layout and wiring only."""

from __future__ import annotations

import dataclasses
import html
import json
import shlex
from typing import Any

from engine.config import FRAME_RATE
from engine.delay import default_max_frames
from engine.tokenizer import CONTROL_TAGS, estimate_seconds, lint_tags

PALETTE_GROUPS = (("emotion", "Emotion"), ("style", "Style"), ("sfx", "Sounds"), ("prosody", "Prosody"))


def _esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def header_html(status: dict[str, Any]) -> str:
    """Title, engine chips, and — in demo mode — a banner that says the audio is noise."""
    checkpoint = str(status.get("checkpoint") or "")
    kernels = " · ".join(str(x) for x in (status.get("kernel_arch"), status.get("kernel_loader")) if x)
    chips = [  # (label, shown value, hover text)
        ("checkpoint", checkpoint.rstrip("/").rsplit("/", 1)[-1], checkpoint),
        ("device", status.get("device"), ""),
        ("precision", status.get("precision"), ""),
        ("backend", status.get("backend"), status.get("backend_reason") or ""),
        ("kernels", kernels, status.get("self_check") or ""),  # hover: the self-check figures
    ]
    chip_html = "".join(f'<span class="hs-chip" title="{_esc(hover or k)}"><b>{k}</b> {_esc(v)}</span>'
                        for k, v, hover in chips if v)
    banner = ""
    if status.get("demo"):
        banner = ('<div class="hs-demo" id="demo-banner"><b>Demo mode.</b> The model has tiny random weights, so '
                  'every take is noise. Everything else (streaming, metrics, voices, history, API) is real. '
                  'Start without <code>--demo</code> and with the checkpoint to hear speech.</div>')
    return (f'<div class="hs-head"><div class="hs-title">Higgs Studio'
            f'<span class="hs-sub">Higgs Audio v3 TTS-4B</span></div><div class="hs-chips">{chip_html}</div></div>'
            f'{banner}')


def estimate_html(text: str, *, clone: bool = False, max_frames: int | None = None) -> str:
    """The live line under the text box: duration and frame estimate, then tag-lint findings."""
    text = text or ""
    if not text.strip():
        return '<div class="hs-est muted">Type what to say. Tags like &lt;|emotion:awe|&gt; steer the delivery.</div>'
    seconds = estimate_seconds(text)
    frames = round(seconds * FRAME_RATE)
    budget = max_frames or default_max_frames(text)  # the engine's own cap when none is set
    cap = f" · budget {budget} frames ({budget / FRAME_RATE:.0f} s{'' if max_frames else ', auto'})"
    parts = [f'<div class="hs-est">≈ <b>{seconds:.1f} s</b> of speech · ~{frames} frames{cap} · '
             f'{len(text)} characters</div>']
    for w in lint_tags(text, clone=clone):
        parts.append(f'<div class="hs-lint {w.severity}">{_esc(w.message)}</div>')
    return "".join(parts)


def palette_html() -> str:
    """Buttons for the 43 control tags, grouped; `PALETTE_JS` inserts the clicked tag at the cursor."""
    groups = []
    for category, title in PALETTE_GROUPS:
        tags = [t for t in CONTROL_TAGS.values() if (t.text.split(":")[0][2:] == category)]
        buttons = "".join(f'<button type="button" class="hs-tag hs-{category}" data-tag="{_esc(t.text)}" '
                          f'title="{_esc(t.text)}">{_esc(t.value.replace("_", " "))}</button>' for t in tags)
        groups.append(f'<div class="hs-group"><span class="hs-gtitle">{title}</span>{buttons}</div>')
    return '<div class="hs-palette">' + "".join(groups) + "</div>"


# Runs once when the palette mounts (gr.HTML js_on_load): a click inserts the tag at the text box's cursor
# and fires `input` so Gradio sees the new value. sfx tags get no trailing space (the onomatopoeia must
# follow immediately); the others get one.
PALETTE_JS = """
element.addEventListener('click', (ev) => {
  const btn = ev.target.closest('button[data-tag]');
  if (!btn) return;
  const ta = document.querySelector('#text textarea');
  if (!ta) return;
  const tag = btn.dataset.tag;
  const ins = tag.startsWith('<|sfx:') ? tag : tag + ' ';
  const s = ta.selectionStart ?? ta.value.length, e = ta.selectionEnd ?? s;
  ta.value = ta.value.slice(0, s) + ins + ta.value.slice(e);
  ta.selectionStart = ta.selectionEnd = s + ins.length;
  ta.dispatchEvent(new Event('input', {bubbles: true}));
  ta.focus();
});
"""


# Heard latency (PRODUCT §6, §7.1): server TTFA leaves out the queue, the network and the browser's HLS
# buffering, so the page also times Generate-click → the live player's first "playing" event.
HEARD_HTML = ('<div class="hs-heard">Heard after <b id="m-heard">—</b> '
              '<span>(click to first sound in this browser: queue + network + player buffering)</span></div>')
CLICK_JS = """(...args) => {
  window.__hsClick = performance.now();
  const el = document.querySelector('#m-heard'); if (el) el.innerText = '…';
  return args;
}"""
HEARD_JS = """
document.addEventListener('playing', (ev) => {
  if (!window.__hsClick || !ev.target.closest || !ev.target.closest('#live')) return;
  const ms = performance.now() - window.__hsClick;
  window.__hsClick = null;
  const el = element.querySelector('#m-heard'); if (el) el.innerText = Math.round(ms) + ' ms';
}, true);
"""


def _num(value, fmt: str) -> str:
    return "—" if value is None else format(value, fmt)


def _bytes(n) -> str:
    if not n:
        return "—"
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


def metrics_html(metrics: Any = None, *, state: str = "idle", seconds: float = 0.0,
                 warnings: list[str] | None = None, note: str = "") -> str:
    """The live metrics panel. Each value sits in an element with a stable id (`m-ttfa`, `m-rtf`, …)."""
    g = (lambda name: getattr(metrics, name, None)) if metrics is not None else (lambda name: None)
    mem_kind = (g("mem_kind") or "").upper() or "memory"
    reused, prompt = g("reused_tokens"), g("prompt_tokens")
    tiles = [
        ("ttfa", "TTFA", _num(g("ttfa_ms"), ".0f"), "ms"),
        ("rtf", "RTF", _num(g("rtf"), ".3f"), ""),
        ("frames", "Frames", _num(g("frames"), "d"), f"{seconds:.1f} s"),
        ("msf", "ms / frame", _num(g("ms_per_frame"), ".1f"), ""),
        ("prefill", "Prefill", _num(g("prefill_ms"), ".1f"), "ms"),
        ("reused", "Reused prompt", "—" if prompt is None else f"{reused or 0}/{prompt}", "tokens"),
        ("mem", f"Peak {mem_kind}", _bytes(g("peak_mem_bytes")), ""),
        ("seed", "Seed", _num(g("seed"), "d"), ""),
    ]
    cells = "".join(f'<div class="hs-tile"><div class="k">{k}</div><div class="v" id="m-{i}">{v}</div>'
                    f'<div class="u">{u}</div></div>' for i, k, v, u in tiles)
    engine = " · ".join(str(x) for x in (g("precision"), g("backend"), g("device")) if x)
    stop = g("stop_reason") or ""
    foot = f'<span class="hs-state {state}" id="m-state">{_esc(state)}</span>'
    if stop:
        foot += f' <span class="hs-stop">stop: <b id="m-stop">{_esc(stop)}</b></span>'
    if engine:
        foot += f' <span class="hs-eng">{_esc(engine)}</span>'
    if note:
        foot += f' <span class="hs-note">{_esc(note)}</span>'
    warn = "".join(f'<div class="hs-lint warning">{_esc(w)}</div>' for w in warnings or [])
    return f'<div class="hs-metrics" id="metrics-panel"><div class="hs-tiles">{cells}</div>' \
           f'<div class="hs-foot">{foot}</div>{warn}</div>'


def history_rows(takes) -> list[list[Any]]:
    """Rows for the session history table, newest first."""
    rows = []
    for t in reversed(list(takes)):
        m = t.metrics
        rows.append([t.id, t.text[:60] + ("…" if len(t.text) > 60 else ""), t.voice_name or "zero-shot",
                     t.style or "", t.seed, round(t.seconds, 1), _num(getattr(m, "ttfa_ms", None), ".0f"),
                     _num(getattr(m, "rtf", None), ".3f"), t.stop_reason])
    return rows


HISTORY_HEADERS = ["#", "text", "voice", "style", "seed", "seconds", "TTFA ms", "RTF", "stop"]


def result_json(take, warnings: list[str]) -> dict[str, Any]:
    """What the `generate` endpoint returns to API clients beside the audio: metrics, recipe, warnings."""
    metrics = take.metrics
    values = dataclasses.asdict(metrics) if dataclasses.is_dataclass(metrics) else dict(vars(metrics))
    return {"take_id": take.id, "seconds": round(take.seconds, 3), "metrics": values, "recipe": take.recipe(),
            "warnings": list(warnings)}


def recipe_json(take) -> str:
    return json.dumps(take.recipe(), indent=2, ensure_ascii=False)


def recipe_curl(r: dict[str, Any], base_url: str, out: str = "take.wav") -> str:
    """A curl command that reproduces a take's recipe through the OpenAI-compatible route (PRODUCT §7.7)."""
    body = {"model": "higgs-audio-v3-tts", "input": r["text"], "voice": r["voice_id"] or "default",
            **({"instructions": r["style"]} if r["style"] else {}), "response_format": "wav",
            **{k: r[k] for k in ("seed", "temperature", "top_p", "top_k", "max_frames", "repeat_guard")}}
    return (f"curl -s {base_url.rstrip('/')}/v1/audio/speech -H 'Content-Type: application/json' \\\n"
            f"  -d {shlex.quote(json.dumps(body, ensure_ascii=False))} -o {out}")


CSS = """
.gradio-container {max-width: 1280px !important; margin: auto;}
.hs-head {display:flex; align-items:center; justify-content:space-between; flex-wrap:wrap; gap:8px; padding:6px 2px;}
.hs-title {font-size:1.6rem; font-weight:700; letter-spacing:-.01em;}
.hs-sub {font-size:.85rem; font-weight:500; opacity:.6; margin-left:.6rem;}
.hs-chips {display:flex; gap:6px; flex-wrap:wrap;}
.hs-chip {font-size:.75rem; padding:2px 8px; border-radius:999px; background:var(--block-background-fill);
  border:1px solid var(--border-color-primary);}
.hs-chip b {opacity:.55; font-weight:500; margin-right:3px;}
.hs-demo {margin:4px 0 8px; padding:8px 12px; border-radius:8px; background:#fff4d6; color:#6b4e00;
  border:1px solid #f0d28a; font-size:.9rem;}
.hs-est {font-size:.85rem; opacity:.8; padding:2px 4px;}
.hs-est.muted {opacity:.55;}
.hs-lint {font-size:.8rem; padding:2px 6px; margin:2px 0; border-left:3px solid #e0a100;
  background:rgba(224,161,0,.08);}
.hs-lint.error {border-left-color:#d33; background:rgba(221,51,51,.08);}
.hs-palette {display:flex; flex-direction:column; gap:4px;}
.hs-group {display:flex; flex-wrap:wrap; gap:4px; align-items:center;}
.hs-gtitle {font-size:.68rem; text-transform:uppercase; letter-spacing:.05em; opacity:.6; width:64px;}
.hs-tag {font-size:.74rem; padding:0 7px; line-height:1.5; border-radius:999px; cursor:pointer;
  border:1px solid transparent;}
.hs-tag:hover {border-color:currentColor;}
.hs-emotion {background:#eef0ff; color:#3b3f9e;} .hs-style {background:#e8f6ee; color:#1f6b43;}
.hs-sfx {background:#fdeef0; color:#9b2c3b;} .hs-prosody {background:#eef6fb; color:#1f5a80;}
.hs-metrics {border:1px solid var(--border-color-primary); border-radius:10px; padding:8px;}
.hs-tiles {display:grid; grid-template-columns:repeat(4, 1fr); gap:6px;}
.hs-tile {padding:4px 6px; border-radius:6px; background:var(--background-fill-secondary);}
.hs-tile .k {font-size:.68rem; text-transform:uppercase; letter-spacing:.04em; opacity:.6;}
.hs-tile .v {font-size:1.15rem; font-weight:650; font-variant-numeric:tabular-nums;}
.hs-tile .u {font-size:.68rem; opacity:.55; min-height:.9em;}
.hs-foot {font-size:.8rem; margin-top:6px; display:flex; gap:10px; flex-wrap:wrap; align-items:center;}
.hs-state {padding:1px 8px; border-radius:999px; background:var(--background-fill-secondary);}
.hs-state.streaming {background:#e0ecff; color:#1d4ed8;} .hs-state.done {background:#e3f5e9; color:#166534;}
.hs-state.stopped {background:#fdecec; color:#9b1c1c;} .hs-state.waiting {background:#fff4d6; color:#6b4e00;}
.hs-eng, .hs-note {opacity:.65;}
#generate-btn {font-size:1.05rem;}
.hs-heard {font-size:.8rem; opacity:.8; padding:0 4px;} .hs-heard span {opacity:.6;}
"""
