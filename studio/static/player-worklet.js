// The live player's sample clock: an AudioWorklet playing a ring of the chunks the page hands it (live.js), so
// playback is sample-exact however the main thread is loaded. Prebuffer: the engine's first push is 2 frames
// (80 ms) and later ones arrive well ahead of real time, so 60 ms starts playing on the first push; after an
// underrun the link has proved slower than the take, so the prebuffer doubles (up to 480 ms) before it fades
// back in. An underrun or Stop changes only the gain of the samples (a 5 ms ramp, no click), never which
// samples play.
/* global AudioWorkletProcessor, registerProcessor */

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
