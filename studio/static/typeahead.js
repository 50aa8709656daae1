// "Type as you go": with the toggle on, the text box is streamed through WS /v1/audio/speech/stream (studio/api/stream.py)
// as it is typed, and each sentence is spoken as soon as it is finished. Runs once when the toggle mounts, as its
// gr.HTML component's js_on_load. It plays through the live player's AudioContext and AudioWorklet (live.js,
// player-worklet.js; `window.__hsLive`), one worklet node per stream, and authenticates with the page's token.
// Only typing at the end of the box is streamed (what was said cannot be unsaid); Enter speaks what is buffered;
// turning the toggle off, or leaving the box, ends the stream once its last sentence is said.

const RATE = 24000, PREBUFFER_S = 0.06, MAX_PREBUFFER_S = 0.48, FADE_S = 0.005, TOKEN_WAIT_S = 30;
const ROUTE = '/v1/audio/speech/stream';
const toggle = element.querySelector('#typeahead-toggle');
const note = (text) => { const e = element.querySelector('#typeahead-state'); if (e) e.innerText = text; };
const box = () => document.querySelector('#text textarea');
const field = (id) => document.querySelector(`#${id} input`)?.value || '';
let stream = null;  // {ws, node, ready, configured, pending, sent}: the open stream
let base = 0;  // where in the box the next stream starts: typing before it was said by an earlier one (or not)

function config() {
  const live = document.querySelector('.hs-live');
  const voice = field('voice').replace(/ \(preset\)$/, '');
  const style = field('style');
  const seed = parseInt(field('seed'), 10);
  return {token: live?.dataset.token || '',
          voice: voice && !voice.startsWith('None') ? voice : null,
          style: style && style !== '(none)' ? style : null,
          seed: Number.isFinite(seed) && seed >= 0 ? seed : null};
}

// The page's session token comes with the page's load event (studio/views/page.py): a stream opened before it
// (a busy machine, a quick typist) waits for it, up to TOKEN_WAIT_S, as live.js's clicks do; sent without it,
// the stream would be refused.
function pageToken() {
  const read = () => document.querySelector('.hs-live')?.dataset.token || '';
  if (read()) return Promise.resolve(read());
  note('waiting for the page to load');
  const since = Date.now();
  return new Promise((resolve) => {
    const poll = setInterval(() => {
      if (!read() && Date.now() - since < TOKEN_WAIT_S * 1000) return;
      clearInterval(poll);
      resolve(read());
    }, 50);
  });
}

function open() {
  const hs = window.__hsLive;
  if (!hs || !hs.supported || !hs.ctx) {
    note('needs the WebAudio player (AudioWorklet)'); toggle.checked = false; return null;
  }
  if (field('voice').startsWith('Reference clip')) note('a one-off clip cannot stream; the stream is zero-shot');
  const scheme = location.protocol === 'https:' ? 'wss:' : 'ws:';
  const s = {ws: new WebSocket(`${scheme}//${location.host}${ROUTE}`), node: null, configured: false, pending: [],
             sent: ''};
  s.ws.binaryType = 'arraybuffer';
  hs.ctx.resume();
  s.ready = hs.ready.then(() => {
    s.node = new AudioWorkletNode(hs.ctx, 'hs-player', {numberOfInputs: 0, outputChannelCount: [1], processorOptions:
      {prebuffer: Math.round(PREBUFFER_S * RATE), maxPrebuffer: Math.round(MAX_PREBUFFER_S * RATE),
       fade: Math.round(FADE_S * RATE)}});
    s.node.connect(hs.ctx.destination);
  });
  s.ws.onopen = async () => {
    const c = config();
    if (field('voice').startsWith('Reference clip')) c.voice = null;
    c.token = await pageToken();
    if (s.ws.readyState !== WebSocket.OPEN) return;  // closed while it waited
    s.ws.send(JSON.stringify(c));
    s.configured = true;
    s.pending.splice(0).forEach((m) => s.ws.send(JSON.stringify(m)));
    note('listening');
  };
  s.ws.onmessage = async (ev) => {
    await s.ready;
    if (typeof ev.data !== 'string') { s.node.port.postMessage({pcm: new Int16Array(ev.data)}); return; }
    const m = JSON.parse(ev.data);
    if (m.type === 'sentence') note(`speaking: ${m.text}`);
    else if (m.type === 'done') {
      note(`said ${m.sentences} sentence(s), ${m.seconds} s`); s.node.port.postMessage({end: true});
    } else if (m.type === 'error') note(m.message);
  };
  s.ws.onclose = () => { if (stream === s) { stream = null; base += s.sent.length; } };
  return s;
}

function send(message) {
  if (stream.configured) stream.ws.send(JSON.stringify(message)); else stream.pending.push(message);
}

function typed() {
  if (!toggle.checked) return;
  if (stream && stream.ended) { base += stream.sent.length; stream = null; }  // that one is finishing its speech
  const text = box().value.slice(base);
  if (!stream) { stream = open(); if (!stream) return; }
  if (!text.startsWith(stream.sent)) { note('earlier text changed: only new text at the end is spoken'); return; }
  const added = text.slice(stream.sent.length);
  if (!added) return;
  stream.sent = text;
  send({text: added});
  if (added.includes('\n')) send({flush: true});  // Enter: say what is buffered now
}

function end() {
  if (stream && !stream.ended) { stream.ended = true; send({end: true}); }
}

toggle.addEventListener('change', () => {
  if (toggle.checked) {
    base = box()?.value.length || 0;  // what is already in the box is not said; what is typed from now on is
    note('type at the end of the text box');
    window.__hsLive?.ctx?.resume();
  } else end();
});
document.addEventListener('input', (ev) => { if (ev.target === box()) typed(); }, true);
document.addEventListener('focusout', (ev) => { if (ev.target === box() && toggle.checked) end(); }, true);
