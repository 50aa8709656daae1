// The live player (studio/views/live.py streams the take): runs once when the player panel mounts, as the gr.HTML
// component's js_on_load. Generate's `js=` (CLICK_JS in studio/views/studio.py) hands the event's inputs to
// `__hsLive.start`, which opens the stream and returns (a promise of) the inputs with the stream's live id in
// the last slot, so the Gradio event follows the same take; Gradio awaits it, so the event is sent once the
// first sound has started. Without AudioWorklet (an old browser, or plain http off
// localhost, where browsers hide it) or with ?player=gradio in the address, `start` leaves the inputs as they
// are and the Gradio streaming player plays the take; Heard is then its first `playing` event.

const RATE = 24000, PREBUFFER_S = 0.06, MAX_PREBUFFER_S = 0.48, FADE_S = 0.005, RELEASE_S = 2, TOKEN_WAIT_S = 30;
// Put before the live id sent to the page's event when the route refused the stream (REFUSED_PREFIX in
// studio/views/live.py): the event fails at once rather than waiting for a stream that will never come.
const REFUSED_PREFIX = 'refused:';
const WORKLET_URL = '/studio/static/player-worklet.js';  // studio/views/assets.py serves this folder
const forced = new URLSearchParams(location.search).get('player') === 'gradio';
const supported = !forced && typeof AudioWorkletNode === 'function' && typeof AudioContext === 'function'
  && typeof ReadableStream === 'function';
const S = window.__hsLive = {supported, click: null, ctx: null, ready: null, take: null};
const el = (id) => document.getElementById(id);
const put = (id, text) => { const e = el(id); if (e) e.innerText = text; };
const state = (name, note) => {
  for (const id of ['live-state', 'actions-state']) {  // the player and its copy in the action bar
    const e = el(id); if (e) { e.innerText = name; e.className = 'hs-state ' + name; }
  }
  if (note !== undefined) put('live-note', note);
};
if (supported) document.body.classList.add('hs-webaudio');

// One take at a time: from the Generate click until the page's event has shown the take (or Stop's has), the
// button is disabled and a second click goes nowhere (a double click used to start two takes and break the
// panel). The page's events call `idle` when they end (IDLE_JS in studio/views/studio.py).
const generateButton = () => document.querySelector('#generate-btn');
function busy(on) {
  S.busy = on;
  setTimeout(() => {  // after the click that set it has reached Gradio's own handler on the button
    const b = generateButton();
    if (b) { b.disabled = S.busy; b.setAttribute('aria-disabled', String(S.busy)); }
    document.body.classList.toggle('hs-busy', S.busy);
  }, 0);
}
S.idle = () => busy(false);

function context() {
  if (!S.ctx) {  // made at load, suspended until the click resumes it, so the worklet is compiled by then
    S.ctx = new AudioContext({sampleRate: RATE, latencyHint: 'interactive'});
    S.ready = S.ctx.audioWorklet.addModule(WORKLET_URL);
  }
  return S.ctx;
}
if (supported) context();

document.addEventListener('click', (ev) => {
  if (!ev.target.closest) return;
  if (ev.target.closest('#generate-btn')) {
    if (S.busy) { ev.preventDefault(); ev.stopImmediatePropagation(); return; }
    busy(true);
    S.click = performance.now();
    put('m-heard', '…'); put('live-net', '—');
    if (supported) context().resume();  // inside the gesture: browsers only let a click start audio
  } else if (ev.target.closest('#stop-btn')) {
    S.stop();
  }
}, true);

// Ctrl+Enter (⌘+Enter on a Mac) in the text box generates, as the Generate button would.
document.addEventListener('keydown', (ev) => {
  if (ev.key !== 'Enter' || !(ev.ctrlKey || ev.metaKey) || !ev.target.closest?.('#text')) return;
  ev.preventDefault();
  const b = generateButton();
  if (b && !S.busy) b.click();
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

// The engine's numbers go into the one metrics panel (studio/views/panel.py) as they stream; the page's event
// fills the rest when the take ends.
function showMetrics(t, m) {
  if (m.ttfa_ms != null) { t.ttfa = m.ttfa_ms; put('m-ttfa', Math.round(m.ttfa_ms)); }
  if (m.rtf != null) put('m-rtf', m.rtf.toFixed(3));
  if (m.peak_mem_bytes) put('m-mem', (m.peak_mem_bytes / 2 ** 20).toFixed(0) + ' MiB');
  if (t.heard != null && t.ttfa != null) put('live-net', Math.round(t.heard - t.ttfa));
}

// Where Heard went, in ms: the page's marks (t.marks, performance.now()) around the server's timeline (ms since
// it got the request, studio/views/live.py `Timeline`) and the engine's TTFA. The server's share ends when its first
// audio line is handed to the connection; `network` is what the fetch waited beyond that: both directions of
// the connection, the server's HTTP layers and the browser's.
function breakdown(t) {
  const k = t.marks, s = t.server || {}, m = t.firstMetrics || {};
  const engine = s.chunk - m.ttfa_ms;  // when the engine started the take, on the server's clock
  const b = {page: k.start - k.click, setup: k.fetch - k.start, parse: s.parsed, resolve: s.ready - s.parsed,
             handoff: engine - s.ready, queue: m.queued_ms, prefill: m.prefill_ms,
             first_push: m.ttfa_ms - m.queued_ms - m.prefill_ms, ttfa: m.ttfa_ms, back: s.line - s.chunk,
             server: s.line, network: k.byte - k.fetch - s.line, browser: k.posted - k.byte,
             worklet: k.started - k.posted, heard: k.started - k.click};
  for (const key in b) b[key] = Number.isFinite(b[key]) ? Math.round(10 * b[key]) / 10 : null;
  return b;
}

function showBreakdown(t) {
  const b = t.breakdown = breakdown(t), ms = (v) => (v == null ? '?' : Math.round(v));
  put('live-note', 'click → request ' + ms(b.page + b.setup) + ' · server ' + ms(b.server) + ' (engine TTFA '
      + ms(b.ttfa) + ') · network ' + ms(b.network) + ' · browser ' + ms(b.browser) + ' · player '
      + ms(b.worklet) + ' ms');
}

function onMessage(t, m) {
  if (m.type === 'queued') {
    if (m.position > 1) state('waiting', 'queue position ' + m.position);
  } else if (m.type === 'audio') {
    const pcm = pcm16(m.pcm);
    if (m.timeline) { t.server = m.timeline; t.firstMetrics = m.metrics; }
    t.marks.audio ??= performance.now();
    t.received += pcm.length;
    if (!t.stopped) t.node.port.postMessage({pcm}, [pcm.buffer]);
    t.marks.posted ??= performance.now();
    if (t.state !== 'streaming') { t.state = 'streaming'; state('streaming', ''); }
    showMetrics(t, m.metrics);
  } else if (m.type === 'done') {
    t.takeId = m.take_id; t.stopReason = m.stop_reason; t.doneAt = performance.now();
    if (m.timeline) t.server = m.timeline;
    if (t.startedAt != null) showBreakdown(t);
    showMetrics(t, m.metrics);
  } else if (m.type === 'error') {
    fail(t, m.message);
  }
}

function onWorklet(t, m) {
  if (m.played !== undefined) t.played = m.played;
  if (m.type === 'started') {
    t.startedAt = t.marks.started = performance.now();
    t.release();
    t.heard = t.startedAt - t.click;
    put('m-heard', Math.round(t.heard) + ' ms');
    if (t.ttfa != null) put('live-net', Math.round(t.heard - t.ttfa));
    showBreakdown(t);
  } else if (m.type === 'underrun') {
    put('live-underruns', m.underruns);
  } else if (m.type === 'silent') {
    t.silentMs = performance.now() - t.stopClick;
    finish(t, 'stopped');
    t.silenced();
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
  put('actions-pos', played.toFixed(1) + ' / ' + got.toFixed(1) + ' s');
  put('live-elapsed', ((performance.now() - t.click) / 1000).toFixed(1) + ' s');
  const bar = el('live-playhead'); if (bar) bar.style.width = (got ? 100 * played / got : 0) + '%';
}

// The page's session token comes with the page's load event (studio/views/page.py). A click before it (a busy
// machine, a quick user) waits for it, up to TOKEN_WAIT_S; sent without it, the stream would be refused.
function sessionToken(t) {
  const read = () => document.querySelector('.hs-live')?.dataset.token || '';
  if (read()) return Promise.resolve(read());
  state('waiting', 'waiting for the page to load');
  return new Promise((resolve) => {
    const done = () => {
      clearInterval(poll); clearTimeout(limit);
      if (read() && !t.stopped) state('waiting', 'waiting for the engine');
      resolve(t.stopped ? '' : read());
    };
    const poll = setInterval(() => { if (read() || t.stopped) done(); }, 50);
    const limit = setTimeout(done, TOKEN_WAIT_S * 1000);
  });
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
    const token = await sessionToken(t);
    if (!token) {
      if (t.stopped) return;
      t.refused = true;
      return fail(t, 'The page has not finished loading; reload it.');
    }
    t.marks.fetch = performance.now();
    const res = await fetch('/studio/live', {method: 'POST', body: form, headers: {'X-Studio-Token': token},
                                             signal: t.abort.signal});
    t.marks.response = performance.now();
    if (!res.ok) {
      t.refused = true;
      const why = (await res.json().catch(() => ({}))).error;
      return fail(t, why || 'The live stream was refused (' + res.status + ').');
    }
    setTimeout(t.release, RELEASE_S * 1000);  // the route has the take: the page's event can follow it now
    const reader = res.body.getReader(), text = new TextDecoder();
    let buf = '';
    for (;;) {
      const {value, done} = await reader.read();
      if (done) break;
      t.marks.byte ??= performance.now();
      buf += text.decode(value, {stream: true});
      for (let nl = buf.indexOf('\n'); nl >= 0; nl = buf.indexOf('\n')) {
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
  const [text, style, voice, clip, clip_text, temperature, top_p, top_k, , max_frames, repeat_guard, takes,
         clean, clean_actions] = args;
  // Several takes are consecutive seeds from the first one's: a random first seed is drawn here, so the
  // stream and the page's event (which starts the other takes) share it.
  let seed = args[8];
  const bits = Number(document.querySelector('.hs-live')?.dataset.seedBits);
  if (Number(takes) > 1 && !(Number(seed) >= 0)) seed = Math.floor(Math.random() * 2 ** bits);
  const id = Array.from(crypto.getRandomValues(new Uint8Array(12)), (b) => b.toString(16).padStart(2, '0')).join('');
  // marks: the click, this call, the stream sent, answered, its first bytes and audio, the audio posted to
  // the worklet and its first sound (the breakdown of Heard).
  const now = performance.now(), click = S.click ?? now;
  const t = S.take = {id, click, marks: {click, start: now},
                      abort: new AbortController(), received: 0, played: 0,
                      heard: null, ttfa: null, state: 'waiting'};
  state('waiting', 'waiting for the engine');
  put('live-underruns', 0);
  t.timer = setInterval(() => tick(t), 100);
  const out = args.slice(); out[8] = seed; out[out.length - 1] = id;
  // Gradio sends the page's event (which records the take) once this promise resolves: at the first sound, when
  // the stream ends or fails, or RELEASE_S after the route took the stream (a take waiting for the GPU). Its
  // request, queue messages and page updates used to run on the same cores as the take's first frames and
  // delay the first sound by tens of ms (docs/PERFORMANCE.md, "Where Heard goes").
  const released = new Promise((resolve) => {
    t.release = () => { if (t.refused) out[out.length - 1] = REFUSED_PREFIX + t.id; resolve(out); };
  });
  play(t, {text, style, voice, clip_text, temperature, top_p, top_k, seed, max_frames, repeat_guard, clean,
           clean_actions}, clip)
    .catch((e) => fail(t, 'The live player failed: ' + e.message))
    .finally(t.release);
  return released;
};

S.stop = () => {
  const t = S.take;
  if (!t || t.stopped || t.ended) return;
  t.stopped = true; t.stopClick = performance.now();
  // Stop's handler keeps the take as far as it was heard: it waits for the player to fall silent (a 5 ms
  // fade), or a second at most.
  t.heardAll = new Promise((resolve) => { t.silenced = resolve; setTimeout(resolve, 1000); });
  // Inside the click, before Stop's Gradio handler runs: the page's event goes out now (also when the stream has
  // not been sent yet), so that handler cancels it as it cancels a running one.
  t.release();
  if (t.node) t.node.port.postMessage({stop: true}); else { t.silentMs = 0; finish(t, 'stopped'); t.silenced(); }
  t.abort.abort();
  state('stopped');
};

// Stop's `js=` (STOP_JS in studio/views/studio.py): the stopped take's live id and the samples it played.
S.stopped = async (takes) => {
  const t = S.take;
  if (!t || !t.stopped) return [takes, '', 0];
  await t.heardAll;
  return [takes, t.id, t.played];
};
