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


def live_player_html(token: str) -> str:
    """The live player panel: state, playhead, elapsed time and the browser-side numbers. `token` is the page
    session token the live route checks (studio/live.py); a fresh one is issued at every page load."""
    tiles = [("m-heard", "Heard", "ms"), ("live-ttfa", "TTFA", "ms"), ("live-net", "Heard − TTFA", "ms"),
             ("live-rtf", "RTF", ""), ("live-mem", "Peak memory", ""), ("live-underruns", "Underruns", "")]
    cells = "".join(f'<div class="hs-tile"><div class="k">{k}</div><div class="v" id="{i}">—</div>'
                    f'<div class="u">{u}</div></div>' for i, k, u in tiles)
    return (f'<div class="hs-live" data-token="{_esc(token)}">'
            '<div class="hs-live-bar"><span class="hs-state" id="live-state">idle</span>'
            '<div class="hs-playhead"><div id="live-playhead"></div></div>'
            '<span id="live-pos">0.0 / 0.0 s</span><span id="live-elapsed">0.0 s</span></div>'
            f'<div class="hs-tiles hs-live-tiles">{cells}</div>'
            '<div class="hs-note" id="live-note">Heard: click to first sound in this browser (queue + network + '
            'buffering); Heard − TTFA is the share outside the engine.</div></div>')


# The player's sample clock runs in an AudioWorklet (a ring of the chunks the page hands it), so playback is
# sample-exact however the main thread is loaded. Prebuffer: the engine's first push is 2 frames (80 ms) and
# later ones arrive well ahead of real time, so 60 ms starts playing on the first push; after an underrun the
# link has proved slower than the take, so the prebuffer doubles (up to 480 ms) before it fades back in.
# An underrun or Stop changes only the gain of the samples (a 5 ms ramp, no click), never which samples play.
LIVE_WORKLET = """
class HsPlayer extends AudioWorkletProcessor {
  constructor(options) {
    super();
    const o = options.processorOptions;
    this.prebuffer = o.prebuffer; this.maxPrebuffer = o.maxPrebuffer; this.fade = o.fade;
    this.chunks = []; this.offset = 0; this.buffered = 0; this.played = 0; this.quanta = 0;
    this.playing = false; this.started = false; this.ended = false; this.stopping = false;
    this.gain = 0; this.underruns = 0;
    this.port.onmessage = (e) => {
      const m = e.data;
      if (m.pcm) { this.chunks.push(m.pcm); this.buffered += m.pcm.length; }
      if (m.end) this.ended = true;
      if (m.stop) this.stopping = true;
    };
  }
  next() {
    const chunk = this.chunks[0], v = chunk[this.offset++] / 32768;
    if (this.offset === chunk.length) { this.chunks.shift(); this.offset = 0; }
    this.buffered--; this.played++;
    return v;
  }
  process(inputs, outputs) {
    const out = outputs[0][0], n = out.length;
    if (this.stopping) {
      for (let i = 0; i < n; i++) {
        this.gain = Math.max(0, this.gain - 1 / this.fade);
        out[i] = this.gain > 0 && this.buffered > 0 ? this.next() * this.gain : 0;
      }
      if (this.gain > 0) return true;
      this.port.postMessage({type: 'silent', played: this.played});
      return false;
    }
    if (!this.playing && (this.buffered >= this.prebuffer || (this.ended && this.buffered > 0))) {
      this.playing = true;
      if (!this.started) { this.started = true; this.port.postMessage({type: 'started'}); }
    }
    if (this.playing) {
      const short = !this.ended && this.buffered < n, left = this.buffered;
      for (let i = 0; i < n; i++) {
        if (this.buffered === 0) { out[i] = 0; continue; }
        const g = short ? this.gain * (1 - (i + 1) / left) : (this.gain = Math.min(1, this.gain + 1 / this.fade));
        out[i] = this.next() * g;
      }
      if (short) {
        this.playing = false; this.gain = 0; this.underruns++;
        this.prebuffer = Math.min(this.maxPrebuffer, this.prebuffer * 2);
        this.port.postMessage({type: 'underrun', played: this.played, underruns: this.underruns});
      }
    } else {
      out.fill(0);
    }
    if (++this.quanta % 8 === 0) this.port.postMessage({type: 'progress', played: this.played});
    if (this.ended && this.buffered === 0) {
      this.port.postMessage({type: 'drained', played: this.played, underruns: this.underruns});
      return false;
    }
    return true;
  }
}
registerProcessor('hs-player', HsPlayer);
"""

# Runs once when the player panel mounts (gr.HTML js_on_load). Generate's `js=` (CLICK_JS) hands the event's
# inputs to `__hsLive.start`, which opens the stream and returns the inputs with the stream's live id in the
# last slot, so the Gradio event follows the same take. Without AudioWorklet (an old browser, or plain http
# off localhost, where browsers hide it) or with ?player=gradio in the address, `start` leaves the inputs as
# they are and the Gradio streaming player plays the take as before; Heard is then its first `playing` event.
LIVE_JS = """
const RATE = 24000, PREBUFFER_S = 0.06, MAX_PREBUFFER_S = 0.48, FADE_S = 0.005;
const WORKLET = __WORKLET__;
const forced = new URLSearchParams(location.search).get('player') === 'gradio';
const supported = !forced && typeof AudioWorkletNode === 'function' && typeof AudioContext === 'function'
  && typeof ReadableStream === 'function';
const S = window.__hsLive = {supported, click: null, ctx: null, ready: null, take: null};
const el = (id) => document.getElementById(id);
const put = (id, text) => { const e = el(id); if (e) e.innerText = text; };
const state = (name, note) => {
  const e = el('live-state'); if (e) { e.innerText = name; e.className = 'hs-state ' + name; }
  if (note !== undefined) put('live-note', note);
};
if (supported) document.body.classList.add('hs-webaudio');

function context() {
  if (!S.ctx) {  // made at load, suspended until the click resumes it, so the worklet is compiled by then
    S.ctx = new AudioContext({sampleRate: RATE, latencyHint: 'interactive'});
    S.ready = S.ctx.audioWorklet.addModule(URL.createObjectURL(new Blob([WORKLET], {type: 'text/javascript'})));
  }
  return S.ctx;
}
if (supported) context();

document.addEventListener('click', (ev) => {
  if (!ev.target.closest) return;
  if (ev.target.closest('#generate-btn')) {
    S.click = performance.now();
    put('m-heard', '…'); put('live-net', '—');
    if (supported) context().resume();  // inside the gesture: browsers only let a click start audio
  } else if (ev.target.closest('#stop-btn')) {
    S.stop();
  }
}, true);

document.addEventListener('playing', (ev) => {  // the Gradio player (fallback mode)
  if (S.supported || !S.click || !ev.target.closest || !ev.target.closest('#live')) return;
  put('m-heard', Math.round(performance.now() - S.click) + ' ms');
  S.click = null;
}, true);

function pcm16(b64) {
  const s = atob(b64), bytes = new Uint8Array(s.length);
  for (let i = 0; i < s.length; i++) bytes[i] = s.charCodeAt(i);
  return new Int16Array(bytes.buffer);
}

function showMetrics(t, m) {
  if (m.ttfa_ms != null) { t.ttfa = m.ttfa_ms; put('live-ttfa', Math.round(m.ttfa_ms)); }
  if (m.rtf != null) put('live-rtf', m.rtf.toFixed(3));
  if (m.peak_mem_bytes) {
    put('live-mem', (m.peak_mem_bytes / 2 ** 20).toFixed(0) + ' MiB ' + (m.mem_kind || '').toUpperCase());
  }
  if (t.heard != null && t.ttfa != null) put('live-net', Math.round(t.heard - t.ttfa));
}

function onMessage(t, m) {
  if (m.type === 'queued') {
    if (m.position > 1) state('waiting', 'queue position ' + m.position);
  } else if (m.type === 'audio') {
    const pcm = pcm16(m.pcm);
    t.marks.audio ??= performance.now();
    t.received += pcm.length;
    if (!t.stopped) t.node.port.postMessage({pcm}, [pcm.buffer]);
    if (t.state !== 'streaming') { t.state = 'streaming'; state('streaming', ''); }
    showMetrics(t, m.metrics);
  } else if (m.type === 'done') {
    t.takeId = m.take_id; t.stopReason = m.stop_reason; t.doneAt = performance.now();
    showMetrics(t, m.metrics);
  } else if (m.type === 'error') {
    fail(t, m.message);
  }
}

function onWorklet(t, m) {
  if (m.played !== undefined) t.played = m.played;
  if (m.type === 'started') {
    t.startedAt = performance.now();
    t.heard = t.startedAt - t.click;
    put('m-heard', Math.round(t.heard) + ' ms');
    if (t.ttfa != null) put('live-net', Math.round(t.heard - t.ttfa));
  } else if (m.type === 'underrun') {
    put('live-underruns', m.underruns);
  } else if (m.type === 'silent') {
    t.silentMs = performance.now() - t.stopClick;
    finish(t, 'stopped');
  } else if (m.type === 'drained') {
    finish(t, t.stopReason === 'cancelled' ? 'stopped' : 'done');
  }
}

function finish(t, name) {
  if (t.ended) return;
  t.ended = true; t.state = name;
  clearInterval(t.timer); tick(t);
  if (S.take === t) state(name);
  if (t.node) t.node.disconnect();
}

function fail(t, message) {
  if (t.stopped) return;
  t.error = message;
  state('error', message);
  finish(t, 'error');
}

function tick(t) {
  const played = t.played / RATE, got = t.received / RATE;
  put('live-pos', played.toFixed(1) + ' / ' + got.toFixed(1) + ' s');
  put('live-elapsed', ((performance.now() - t.click) / 1000).toFixed(1) + ' s');
  const bar = el('live-playhead'); if (bar) bar.style.width = (got ? 100 * played / got : 0) + '%';
}

async function play(t, fields, clip) {
  const ctx = context();
  await S.ready;
  t.node = new AudioWorkletNode(ctx, 'hs-player', {numberOfInputs: 0, outputChannelCount: [1], processorOptions:
    {prebuffer: Math.round(PREBUFFER_S * RATE), maxPrebuffer: Math.round(MAX_PREBUFFER_S * RATE),
     fade: Math.round(FADE_S * RATE)}});
  t.node.port.onmessage = (e) => onWorklet(t, e.data);
  t.node.connect(ctx.destination);
  const form = new FormData();
  form.append('request', JSON.stringify({...fields, live_id: t.id}));
  try {
    if (fields.voice === '__clip__' && clip && clip.url) {
      form.append('clip', await (await fetch(clip.url)).blob(), 'clip');
    }
    const token = document.querySelector('.hs-live')?.dataset.token || '';
    t.marks.fetch = performance.now();
    const res = await fetch('/studio/live', {method: 'POST', body: form, headers: {'X-Studio-Token': token},
                                             signal: t.abort.signal});
    t.marks.response = performance.now();
    if (!res.ok) {
      const why = (await res.json().catch(() => ({}))).error;
      return fail(t, why || 'The live stream was refused (' + res.status + ').');
    }
    const reader = res.body.getReader(), text = new TextDecoder();
    let buf = '';
    for (;;) {
      const {value, done} = await reader.read();
      if (done) break;
      buf += text.decode(value, {stream: true});
      for (let nl = buf.indexOf('\\n'); nl >= 0; nl = buf.indexOf('\\n')) {
        const line = buf.slice(0, nl); buf = buf.slice(nl + 1);
        if (line) onMessage(t, JSON.parse(line));
      }
    }
  } catch (e) {
    return fail(t, 'The live stream broke off: ' + e.message);
  }
  t.node.port.postMessage({end: true});
}

S.start = (args) => {
  if (!S.supported) return args;
  if (S.take) S.stop();  // one take plays at a time in a tab
  const [text, style, voice, clip, clip_text, temperature, top_p, top_k, , max_frames, repeat_guard, takes] = args;
  // Several takes are consecutive seeds from the first one's: a random first seed is drawn here, so the
  // stream and the page's event (which starts the other takes) share it.
  let seed = args[8];
  if (Number(takes) > 1 && !(Number(seed) >= 0)) seed = Math.floor(Math.random() * 2 ** 31);
  const id = Array.from(crypto.getRandomValues(new Uint8Array(12)), (b) => b.toString(16).padStart(2, '0')).join('');
  // marks: when the stream was sent, answered and first carried audio (the Heard − TTFA breakdown).
  const t = S.take = {id, click: S.click ?? performance.now(), marks: {start: performance.now()},
                      abort: new AbortController(), received: 0, played: 0,
                      heard: null, ttfa: null, state: 'waiting'};
  state('waiting', 'waiting for the GPU');
  put('live-underruns', 0);
  t.timer = setInterval(() => tick(t), 100);
  play(t, {text, style, voice, clip_text, temperature, top_p, top_k, seed, max_frames, repeat_guard}, clip)
    .catch((e) => fail(t, 'The live player failed: ' + e.message));
  const out = args.slice(); out[8] = seed; out[out.length - 1] = id;
  return out;
};

S.stop = () => {
  const t = S.take;
  if (!t || t.stopped || t.ended) return;
  t.stopped = true; t.stopClick = performance.now();
  if (t.node) t.node.port.postMessage({stop: true}); else { t.silentMs = 0; finish(t, 'stopped'); }
  t.abort.abort();
  state('stopped');
};
""".replace("__WORKLET__", json.dumps(LIVE_WORKLET))
CLICK_JS = "(...args) => window.__hsLive ? window.__hsLive.start(args) : args"


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


def variant_html(take, index: int) -> str:
    """One side-by-side take's caption: its place, seed and numbers (the seed in `variant-seed-<index>`)."""
    m = take.metrics
    return (f'<div class="hs-variant"><b>Take {index + 1}</b> · seed <b id="variant-seed-{index}">{take.seed}</b>'
            f'<br>{take.seconds:.1f} s · RTF {_num(getattr(m, "rtf", None), ".3f")} · '
            f'stop {_esc(take.stop_reason or "—")} · batch {_num(getattr(m, "batch", None), "d")}</div>')


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
.hs-live {border:1px solid var(--border-color-primary); border-radius:10px; padding:8px;}
.hs-live-bar {display:flex; gap:10px; align-items:center; font-size:.8rem; font-variant-numeric:tabular-nums;}
.hs-playhead {flex:1; height:6px; border-radius:3px; background:var(--background-fill-secondary); overflow:hidden;}
#live-playhead {height:100%; width:0; background:#4f46e5;}
.hs-live-tiles {grid-template-columns:repeat(3, 1fr); margin-top:6px;}
.hs-live .hs-note {font-size:.75rem; margin-top:4px;}
.hs-state.error {background:#fdecec; color:#9b1c1c;}
body.hs-webaudio #live {display:none;}
"""
