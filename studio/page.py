"""The Gradio page: layout and wiring over `StudioService` (generation, voices, presets, history).

Everything here is policy-free: validation, queueing and recording live in the service, formatting in
`render.py`. Errors the user can act on become `gr.Error` / `gr.Warning` toasts, never tracebacks.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import gradio as gr
import numpy as np

from engine.audio import load_audio
from engine.config import SAMPLE_RATE
from engine.types import (
    DEFAULT_REPEAT_GUARD,
    DEFAULT_TEMPERATURE,
    DEFAULT_TOP_K,
    DEFAULT_TOP_P,
    MAX_FRAMES,
    MAX_SEED,
    MAX_TEMPERATURE,
    MAX_TOP_P,
    TOP_K_SLIDER_MAX,
)
from studio import render
from studio.access import Access
from studio.admission import OWNER, Caller
from studio.asr import Transcriber
from studio.formats import available_formats, ffmpeg_path, to_pcm16, write_audio
from studio.live import CLIP_VOICE, NO_VOICE, LivePlayer, page_request
from studio.longform_view import LongFormView
from studio.private_view import PrivateVoicesView
from studio.service import MAX_TAKES, Queued, ServiceBusy, StudioService, TakeHandle
from studio.voices.private import PrivateVoices

log = logging.getLogger("higgs.studio")

GPU_QUEUE = "gpu"  # concurrency_id shared by the events that use the engine one at a time (voices, long form)
TAKES_QUEUE = "takes"  # Generate: as many at once as the service has batch slots (the engine batches them)
STREAM_SECONDS = 1.0  # after the first chunk, stream in ~1 s pieces (Gradio's advice for smooth HLS playback)


def _warns(n_outputs: int):
    """Turn a handler's ValueError (a mistake the user can fix) into a warning toast that leaves the outputs
    as they were; raising gr.Error instead would paint an error overlay over every output component."""
    def wrap(fn):
        @functools.wraps(fn)
        def handler(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            except ValueError as exc:
                gr.Warning(str(exc))
                return gr.skip() if n_outputs == 1 else (gr.skip(),) * n_outputs
        return handler
    return wrap


class Page:
    """Builds the Blocks and holds per-session live requests (so Stop can cancel the right one)."""

    def __init__(self, service: StudioService, access: Access | None = None, *,
                 private_voices: PrivateVoices | None = None, transcriber: Transcriber | None = None):
        self.service = service
        self.transcriber = transcriber  # fills an empty transcript box when a clip arrives (studio/asr.py)
        self.access = access or Access()  # no key: whoever reaches the page is the owner
        # Voices private to each visitor (a Space, or --private-voices): the Voices tab and "Save as voice"
        # keep them in the visitor's browser; the shared library is the owner's, through the API.
        self.private = PrivateVoicesView(self, private_voices) if private_voices is not None else None
        # Gradio encodes streamed audio with an ffmpeg subprocess; without it the page plays each take once
        # it is complete instead of failing every generation.
        self.streaming = ffmpeg_path() is not None
        self.out_dir = Path(tempfile.mkdtemp(prefix="higgs-studio-"))
        self.player = LivePlayer(service)  # the WebAudio player's route; app.py mounts it after launch
        self._active: dict[str, TakeHandle] = {}
        self._variants: dict[str, list[TakeHandle]] = {}  # the other takes of a session's Generate
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ helpers

    def voice_choices(self, caller: Caller) -> list[tuple[str, str]]:
        """The Voice menu for `caller`: a visitor of a public page sees the shared voices and the presets."""
        voices = self.service.list_voices(caller)
        return [("None (zero-shot)", NO_VOICE), ("Reference clip below (one-off)", CLIP_VOICE)] + \
               [(f"{v.name} (preset)" if v.preset else v.name, v.id) for v in voices]

    def style_choices(self) -> list[tuple[str, str]]:
        styles = self.service.list_styles()
        return ([] if any(not prefix for _, prefix in styles) else [("(none)", "")]) + styles

    def take_file(self, take, fmt: str = "wav") -> str:
        """The take as a file in `fmt`, written once; files of takes the history has dropped are removed."""
        path = self.out_dir / f"take-{take.id}-seed{take.seed}.{fmt}"
        if not path.exists():
            write_audio(path, take.audio, take.sample_rate)
            kept = {f"take-{t.id}-" for t in self.service.history}
            for old in self.out_dir.glob("take-*"):
                if old.name[:old.name.index("-", 5) + 1] not in kept:
                    old.unlink(missing_ok=True)
        return str(path)

    def take_outputs(self, take, takes: list[int]) -> tuple:
        """(take player, download button, history table, takes state, last seed) for a finished take."""
        takes = takes + [take.id] if take.id not in takes else takes
        rows = render.history_rows(t for t in map(self.service.take, takes) if t is not None)
        wav = self.take_file(take)
        return wav, gr.update(value=wav, label="Download WAV"), rows, takes, take.seed

    # ------------------------------------------------------------------ generation

    def generate(self, text, style, voice, clip, clip_text, temperature, top_p, top_k, seed, max_frames,
                 repeat_guard, takes_n, takes, live_id="", request: gr.Request = None):
        """Stream a take into the live player and the metrics panel, then show the full take. With `live_id` the
        browser's own player streams the take (studio/live.py, which applies the public limits) and this handler
        waits for it to end, so the take lands in the history, take player, downloads and recipe the same way.
        With `takes_n` > 1 the other takes (the next seeds, same settings) run beside it in the engine's batch
        and all of them are shown side by side once they end, each with a Keep button."""
        key = request.session_hash if request else "local"
        handle, others = None, []
        try:
            if live_id:
                handle = self.player.claim(live_id)
                if handle is None:  # the take failed before it started; the live player says why
                    return
            else:
                asked = page_request(text=text, style=style, voice=voice, clip=self._clip(clip), clip_text=clip_text,
                                     temperature=temperature, top_p=top_p, top_k=top_k, seed=seed,
                                     max_frames=max_frames, repeat_guard=repeat_guard)
                asked = dataclasses.replace(self.access.limit_public(asked, request),
                                            caller=self.access.page_caller(request))
                handle = self.service.start(asked)
            others = self.service.variants(handle, int(takes_n or 1))
            with self._lock:
                self._active[key], self._variants[key] = handle, others
            running = [self._run_variant(other) for other in others]
            if live_id:
                self.player.wait(live_id)
            else:
                yield from self._stream(handle)
            for thread in running:
                thread.join()
        except ValueError as exc:  # bad request: text, settings, voice, style, reference clip
            raise gr.Error(str(exc)) from None
        except ServiceBusy as exc:
            raise gr.Error(str(exc)) from None
        except Exception as exc:
            log.exception("generation failed")
            raise gr.Error(f"Generation failed: {exc}") from None
        finally:
            if handle is not None and not handle.finished.is_set():
                for h in (handle, *others):
                    h.cancel.set()  # Gradio closed us (Stop, client cancel, tab closed): free the GPU now
            elif handle is not None:
                # A stopped take stays registered: Stop's handler may run after Gradio has closed us (its
                # `cancels=` and the handler race) and still needs the partial take. The next take replaces it.
                with self._lock:
                    if self._active.get(key) is handle:
                        del self._active[key]
                        self._variants.pop(key, None)
        if handle.take is None:
            return
        take = handle.take
        state = "stopped" if take.stop_reason == "cancelled" else "done"
        wav, dl, rows, takes, last_seed = self.take_outputs(take, takes or [])
        yield {self.metrics: render.metrics_html(take.metrics, state=state, seconds=take.seconds,
                                                 warnings=handle.warnings),
               self.take_audio: wav, self.download: dl, self.history: rows, self.takes: takes,
               self.last_seed: last_seed, self.result: render.result_json(take, handle.warnings),
               **self._side_by_side([take] + [h.take for h in others if h.take is not None] if others else [])}

    def _run_variant(self, handle: TakeHandle) -> threading.Thread:
        """Generate one of the other takes to its end in a thread; the service records it (`handle.take`)."""
        def run():
            try:
                for _ in handle.stream():
                    pass
            except Exception:  # the first take, run with the same settings, reports what went wrong
                log.exception("a side-by-side take failed")
        thread = threading.Thread(target=run, name="higgs-take", daemon=True)
        thread.start()
        return thread

    def _side_by_side(self, takes: list) -> dict:
        """The Takes panel's outputs: one column per take (seed, metrics, player, Keep), hidden for one take."""
        out = {self.variants_row: gr.update(visible=len(takes) > 1), self.variant_ids: [t.id for t in takes]}
        for i, (column, audio, info) in enumerate(zip(self.variant_cols, self.variant_audio, self.variant_info)):
            take = takes[i] if i < len(takes) else None
            out[column] = gr.update(visible=take is not None)
            out[audio] = self.take_file(take) if take is not None else None
            out[info] = render.variant_html(take, i) if take is not None else ""
        return out

    @_warns(5)
    def _keep(self, index: int, variant_ids, takes):
        """Put the side-by-side take in place `index` in the session's history and the take player."""
        take = self.service.take(variant_ids[index]) if index < len(variant_ids or []) else None
        if take is None:
            raise ValueError("That take has left the studio's history (it keeps the latest takes only); "
                             "generate again.")
        return self.take_outputs(take, takes or [])

    def _stream(self, handle: TakeHandle) -> Iterator[dict]:
        """Gradio's own player (the fallback): queue positions, then the audio in ~1 s pieces."""
        yield {self.live: None, self.metrics: render.metrics_html(state="waiting", note="waiting for the GPU")}
        buffer, sent = [], 0
        for item in handle.stream(positions=True):
            if isinstance(item, Queued):
                if item.position > 1:  # something is ahead of us (1 = next up: the worker takes it at once)
                    yield {self.metrics: render.metrics_html(state="waiting", note=f"queue position {item.position}")}
                continue
            if len(item.audio):
                buffer.append(item.audio)
            samples = sum(len(b) for b in buffer)
            if buffer and (item.final or sent == 0 or samples >= STREAM_SECONDS * SAMPLE_RATE):
                piece = np.concatenate(buffer)
                buffer, sent = [], sent + len(piece)
                yield {**({self.live: (SAMPLE_RATE, to_pcm16(piece))} if self.streaming else {}),
                       self.metrics: render.metrics_html(item.metrics, state="streaming", seconds=sent / SAMPLE_RATE,
                                                         warnings=handle.warnings)}

    def stop(self, takes, request: gr.Request):
        """Cancel this session's running take; show what was generated before the stop."""
        key = request.session_hash if request else "local"
        with self._lock:
            handle, others = self._active.pop(key, None), self._variants.pop(key, [])
        if handle is None:  # nothing running (the take had already finished on its own)
            return (gr.skip(),) * 6
        for h in (handle, *others):
            h.cancel.set()
        if not handle.finished.wait(5.0) or handle.take is None:  # stopped before the first frame
            return render.metrics_html(state="stopped"), *(gr.skip(),) * 5
        take = handle.take
        return (render.metrics_html(take.metrics, state="stopped", seconds=take.seconds),
                *self.take_outputs(take, takes or []))

    @staticmethod
    def _clip(clip) -> tuple[np.ndarray, int] | None:
        """The clip component's file → (samples, rate), through the bounded decoder (engine/audio.py)."""
        return None if clip is None else load_audio(clip)

    # ------------------------------------------------------------------ building

    def build(self) -> gr.Blocks:
        # delete_cache: Gradio keeps a copy of every served file; drop copies older than an hour, hourly.
        with gr.Blocks(title="Higgs Studio", delete_cache=(3600, 3600)) as demo:
            status = self.service.status()
            gr.HTML(render.header_html(status))
            if status.get("remote_kind"):
                gr.Markdown(f"Takes run on the **{status['remote_kind']}** server at `{status.get('remote')}`.",
                            elem_id="remote-kind")
            self.takes, self.last_seed = gr.State([]), gr.State(None)
            if self.private is not None:
                self.private.state()
            with gr.Tabs():
                with gr.Tab("Studio", id="studio"):
                    self._studio_tab()
                with gr.Tab("Voices", id="voices") as self.voices_tab:
                    if self.private is not None:
                        self.private.tab()
                    else:
                        self._voices_tab()
                with gr.Tab("Long form", id="long"):
                    self.long_form = LongFormView(self.service, self.out_dir, self.access)
                    self.long_form.build(GPU_QUEUE)
            if self.private is not None:
                self.private.wire(demo)  # its page load fills the voice menu with the visitor's own voices too
            else:
                self.save_voice.click(self.access.owner_only(self._save_voice),
                                      [self.clip, self.clip_text, self.voice_name, self.voice_desc, self.style,
                                       self.consent], [self.voice, self.voices_table],
                                      concurrency_id=GPU_QUEUE, concurrency_limit=1, api_visibility="private")
            demo.load(self.refresh_lists, None, [self.voice, self.style, self.status, self.long_form.voice],
                      queue=False, api_visibility="private")
            # An explicit private load event, not a callable value: Gradio would publish that one as an API
            # endpoint and an MCP tool.
            demo.load(lambda: render.live_player_html(self.player.issue_token()), None, self.live_panel,
                      queue=False, api_visibility="private")
        return demo

    def refresh_lists(self, request: gr.Request):
        """The page load's lists, for whoever loaded it: the owner sees every voice, a visitor the shared ones."""
        caller = self.access.page_caller(request)
        voices = gr.skip() if self.private is not None else gr.update(choices=self.voice_choices(caller))
        return (voices, gr.update(choices=self.style_choices()), self.service.status(),
                gr.update(choices=self.long_form.voice_choices(caller)))

    def _studio_tab(self):
        with gr.Row(equal_height=False):
            with gr.Column(scale=3):
                self.text = gr.Textbox(label="Text", lines=6, max_lines=20, elem_id="text", autofocus=True,
                                       placeholder="Type what to say. Put delivery tags at the start of a sentence.")
                self.estimate = gr.HTML(render.estimate_html(""), elem_id="estimate")
                with gr.Accordion("Tags: click to insert at the cursor", open=True):
                    gr.HTML(render.palette_html(), js_on_load=render.PALETTE_JS, elem_id="palette")
                with gr.Row():
                    self.style = gr.Dropdown(self.style_choices(), value="", label="Style preset",
                                             allow_custom_value=True, scale=3, elem_id="style",
                                             info="A tag prefix put before the text; pick one or type tags.")
                    # With a key the config is public: it lists what a visitor may see; the load event fills in
                    # the owner's own voices.
                    self.voice = gr.Dropdown(self.voice_choices(self.access.anyone()), value=NO_VOICE,
                                             label="Voice", scale=3, allow_custom_value=True, elem_id="voice",
                                             info="A saved voice, a one-off clip, or none (zero-shot).")
                with gr.Row():
                    generate = gr.Button("Generate", variant="primary", scale=3, elem_id="generate-btn")
                    stop = gr.Button("Stop", variant="stop", scale=1, elem_id="stop-btn")
                with gr.Accordion("Save the style as a preset", open=False):
                    with gr.Row():
                        preset_name = gr.Textbox(label="Preset name", scale=3)
                        save_preset = gr.Button("Save preset", scale=1)
                with gr.Accordion("Clone a voice", open=False, elem_id="clone"):
                    # A path, decoded by engine.audio under its sample budget: Gradio's own decoding (type="numpy",
                    # or a `format` conversion) would decode a compressed bomb whole first.
                    self.clip = gr.Audio(label="Reference clip (3-15 s of clear speech)", type="filepath",
                                         format=None, sources=["upload", "microphone"], elem_id="clip")
                    self.clip_text = gr.Textbox(label="Transcript of the clip (improves cloning a lot)",
                                                elem_id="clip-text")
                    self.asr_note = gr.Markdown("", elem_id="asr-note")
                    with gr.Row():
                        self.voice_name = gr.Textbox(label="Name", elem_id="voice-name")
                        self.voice_desc = gr.Textbox(label="Description", elem_id="voice-desc")
                    self.consent = gr.Checkbox(
                        label="I am this speaker, or I have their permission to clone this voice.", elem_id="consent")
                    self.save_voice = gr.Button("Save as voice", elem_id="save-voice")
                # A remote server that sets sampling itself would ignore these: shown, but not offered.
                ignored = self.service.status().get("sampling_note")
                with gr.Row():
                    temperature = gr.Slider(0, MAX_TEMPERATURE, value=DEFAULT_TEMPERATURE, step=0.05, label="Temperature",
                                            scale=3,
                                            info=ignored or "0 = greedy (can loop); ~0.8-1.0 is lively and stable",
                                            interactive=not ignored, elem_id="temperature")
                    seed = gr.Number(-1, label="Seed (-1 = random)", precision=0, minimum=-1, maximum=MAX_SEED,
                                     scale=2, elem_id="seed")
                    takes_n = gr.Radio(list(range(1, MAX_TAKES + 1)), value=1, label="Takes", scale=2,
                                       elem_id="takes-n", info="variants with the next seeds, side by side")
                    with gr.Column(scale=1, min_width=110):
                        random_seed = gr.Button("Random", size="sm")
                        reuse_seed = gr.Button("Reuse last", size="sm")
                with gr.Accordion("Advanced", open=False):
                    with gr.Row():
                        top_p = gr.Slider(0.05, MAX_TOP_P, value=DEFAULT_TOP_P, step=0.05, label="top-p", info=ignored,
                                          interactive=not ignored)
                        top_k = gr.Slider(0, TOP_K_SLIDER_MAX, value=DEFAULT_TOP_K, step=1, label="top-k (0 = off)",
                                          info=ignored, interactive=not ignored)
                    with gr.Row():
                        max_frames = gr.Number(0, label=f"Max length, frames (0 = auto; 25 = 1 s; ≤ {MAX_FRAMES})",
                                               precision=0, minimum=0, maximum=MAX_FRAMES, elem_id="max-frames")
                        repeat_guard = gr.Number(DEFAULT_REPEAT_GUARD, label="Repeat guard, frames (0 = off)", precision=0,
                                                 minimum=0, elem_id="repeat-guard")
            with gr.Column(scale=2):
                self.live = gr.Audio(label="Live" if self.streaming else "Live (off: install ffmpeg to stream)",
                                     streaming=self.streaming, autoplay=True, interactive=False, elem_id="live")
                self.metrics = gr.HTML(render.metrics_html(), label="Metrics", elem_id="metrics")
                # The WebAudio player (studio/live.py); its session token is issued at every page load (below).
                self.live_panel = gr.HTML(render.live_player_html(""), js_on_load=render.LIVE_JS,
                                          elem_id="live-player")
                self.live_id = gr.Textbox("", visible=False, elem_id="live-id")  # set by CLICK_JS in WebAudio mode
                self.result = gr.JSON(label="Result", visible=False)  # the take's metrics and recipe, for API clients
                self.take_audio = gr.Audio(label="Take", type="filepath", interactive=False, elem_id="take")
                with gr.Row():
                    fmt = gr.Dropdown([f for f in available_formats() if f != "pcm"], value="wav",
                                      label="Format", scale=1, min_width=90)
                    self.download = gr.DownloadButton("Download WAV", scale=2, elem_id="download")
        with gr.Row(visible=False, elem_id="variants") as self.variants_row:
            self.variant_cols, self.variant_audio, self.variant_info, keep = [], [], [], []
            for i in range(MAX_TAKES):
                with gr.Column(visible=False, min_width=180) as column:
                    self.variant_cols.append(column)
                    self.variant_info.append(gr.HTML("", elem_id=f"variant-info-{i}"))
                    self.variant_audio.append(gr.Audio(label=f"Take {i + 1}", type="filepath", interactive=False,
                                                       elem_id=f"variant-{i}"))
                    keep.append(gr.Button("Keep", size="sm", elem_id=f"keep-{i}"))
        self.variant_ids = gr.State([])
        with gr.Accordion("Engine", open=False):
            self.status = gr.JSON(label="Engine status (refreshed on page load)", elem_id="engine-status")
        with gr.Accordion("History (this session)", open=True):
            self.history = gr.Dataframe(headers=render.HISTORY_HEADERS, interactive=False, wrap=True, label="History",
                                        elem_id="history")
            with gr.Row(visible=False) as detail:  # shown once a take is selected
                with gr.Column(scale=2):
                    hist_audio = gr.Audio(label="Selected take", type="filepath", interactive=False)
                    use_settings = gr.Button("Use these settings", elem_id="use-settings")
                with gr.Column(scale=3):
                    recipe = gr.Code(label="Recipe (settings + seed + voice id)", language="json", lines=4,
                                     max_lines=14, elem_id="recipe")
                    curl = gr.Code(label="Reproduce it over HTTP", language="shell", lines=2, max_lines=6,
                                   wrap_lines=True, elem_id="recipe-curl")
            selected = gr.State(None)

        # The live id stays the last input: CLICK_JS puts the stream's id there.
        inputs = [self.text, self.style, self.voice, self.clip, self.clip_text, temperature, top_p, top_k,
                  seed, max_frames, repeat_guard, takes_n, self.takes, self.live_id]
        side_by_side = [self.variants_row, *self.variant_cols, *self.variant_audio, *self.variant_info, self.variant_ids]
        gen_event = generate.click(self.generate, inputs, [self.live, self.metrics, self.take_audio, self.download,
                                                           self.history, self.takes, self.last_seed, self.result,
                                                           *side_by_side],
                                   api_name="generate", api_visibility="undocumented",  # not an MCP tool
                                   concurrency_id=TAKES_QUEUE, concurrency_limit=self.service.slots,
                                   js=render.CLICK_JS)
        for i, button in enumerate(keep):
            button.click(functools.partial(self._keep, i), [self.variant_ids, self.takes],
                         [self.take_audio, self.download, self.history, self.takes, self.last_seed],
                         api_visibility="private")
        gen_event.success(self._download_as, [fmt, self.takes], self.download, api_visibility="private")
        stop.click(self.stop, [self.takes], [self.metrics, self.take_audio, self.download, self.history,
                                             self.takes, self.last_seed],
                   cancels=[gen_event], queue=False, api_name="stop", api_visibility="undocumented")

        lint_inputs = [self.text, self.voice, max_frames]
        # .change, not .input: it also fires for palette inserts and "use these settings".
        for trigger in (self.text.change, self.voice.change, max_frames.change):
            trigger(lambda t, v, m: render.estimate_html(t, clone=bool(v), max_frames=int(m or 0) or None),
                    lint_inputs, self.estimate, queue=False, show_progress="hidden", trigger_mode="always_last",
                    api_visibility="private")
        self.voice.change(self._voice_style, self.voice, self.style, queue=False, api_visibility="private")
        # Picking a preset (a user action: .input, not .change) also takes its suggested temperature.
        self.style.input(self._style_temperature, self.style, temperature, queue=False, api_visibility="private")
        self.clip.change(lambda c, v: CLIP_VOICE if c is not None and v == NO_VOICE else gr.skip(),
                         [self.clip, self.voice], self.voice, queue=False, api_visibility="private")
        if self.transcriber is not None:
            self.clip.change(self._transcribe, [self.clip, self.clip_text], [self.clip_text, self.asr_note],
                             concurrency_id="asr", concurrency_limit=1, api_visibility="private")
        random_seed.click(lambda: -1, None, seed, queue=False, api_visibility="private")
        reuse_seed.click(self._reuse_seed, self.last_seed, seed, queue=False, api_visibility="private")
        fmt.change(self._download_as, [fmt, self.takes], self.download, api_visibility="private")
        save_preset.click(self.access.owner_only(self._save_preset), [preset_name, self.style], self.style,
                          api_visibility="private")
        self.history.select(self._select_take, self.takes, [selected, hist_audio, recipe, curl, detail],
                            api_visibility="private")
        use_settings.click(self._use_settings, selected, [self.text, self.style, self.voice, temperature, top_p,
                                                          top_k, seed, max_frames, repeat_guard],
                           api_visibility="private")

    # ------------------------------------------------------------------ small handlers

    @staticmethod
    @_warns(1)
    def _reuse_seed(last):
        if last is None:
            raise ValueError("No take yet in this session: generate one first.")
        return last

    @_warns(1)
    def _voice_style(self, voice_id, request: gr.Request):
        if voice_id in (NO_VOICE, CLIP_VOICE):
            return gr.skip()
        voice = self.service.resolve_voice(voice_id, self.access.page_caller(request))
        return voice.style if voice is not None and voice.style else gr.skip()

    def _style_temperature(self, prefix):
        preset = next((p for p in self.service.presets.list() if p.prefix == prefix), None) \
            if self.service.presets is not None else None
        return preset.temperature if preset is not None and preset.temperature is not None else gr.skip()

    @_warns(1)
    def _download_as(self, fmt, takes):
        take = self.service.take(takes[-1]) if takes else None
        if take is None:
            return gr.update(label=f"Download {fmt.upper()}")
        return gr.update(value=self.take_file(take, fmt), label=f"Download {fmt.upper()}")

    @_warns(1)
    def _save_preset(self, name, style):
        preset = self.service.save_style(name, style)
        gr.Info(f"Saved preset {preset.name!r}.")
        return gr.update(choices=self.style_choices(), value=preset.prefix)

    def _transcribe(self, clip, text):
        """A new clip and an empty transcript box: fill the box with the clip's transcript (still editable),
        or say in one line why not."""
        if clip is None or (text or "").strip():
            return gr.skip(), gr.skip()
        try:
            transcript, note = self.transcriber.transcribe(clip)
        except ValueError as exc:  # an unreadable clip: saving or generating will say so too
            return gr.skip(), str(exc)
        return (transcript or gr.skip()), (note or "")

    @_warns(2)
    def _save_voice(self, clip, transcript, name, description, style, consent):
        if clip is None:
            raise ValueError("Upload or record a reference clip first.")
        samples, rate = load_audio(clip)
        voice = self.service.save_voice(samples, rate, name=name, transcript=transcript,
                                        description=description, style=style or None, consent=consent)
        gr.Info(f"Saved voice {voice.name!r}.")
        return gr.update(choices=self.voice_choices(OWNER), value=voice.id), self._voice_rows()

    @_warns(5)
    def _select_take(self, takes, evt: gr.SelectData, request: gr.Request):
        rows = list(reversed(takes or []))
        if evt.index is None or evt.index[0] >= len(rows):
            return (gr.skip(),) * 5
        take = self.service.take(rows[evt.index[0]])
        if take is None:
            raise ValueError("That take has left the history (it keeps the latest takes only).")
        base = f"http://{request.headers.get('host', '127.0.0.1:7860')}" if request else "http://127.0.0.1:7860"
        curl = render.recipe_curl(take.recipe(), base, f"take-{take.id}.wav")
        return take.id, self.take_file(take), render.recipe_json(take), curl, gr.update(visible=True)

    @_warns(9)
    def _use_settings(self, take_id):
        take = self.service.take(take_id) if take_id is not None else None
        if take is None:
            raise ValueError("Select a take in the history first.")
        s = take.settings
        return (take.text, take.style or "", take.voice_id or NO_VOICE, s["temperature"], s["top_p"], s["top_k"],
                take.seed, s["max_frames"] or 0, s["repeat_guard"] or 0)

    # ------------------------------------------------------------------ voices tab

    def _voice_rows(self):
        return [[v.name, v.id, _visibility(v), v.style, f"{v.seconds:.1f}", v.transcript[:80], v.description]
                for v in self.service.list_voices(OWNER)]

    def _voices_tab(self):
        gr.Markdown("Saved voices: a prepared reference clip, its transcript, a default style and a consent "
                    "record. Select a row to preview, edit, export or delete it. A voice is private until you "
                    "share it: only shared voices and presets are offered to visitors of a public page.")
        # The table (transcripts, descriptions) is the owner's: with a key it fills when the owner opens the tab,
        # because the page's config, where a starting value would sit, is public on a public page.
        rows = self._voice_rows() if self.access.api_key is None else []
        self.voices_table = gr.Dataframe(rows, headers=["name", "id", "visitors", "style", "seconds", "transcript",
                                                        "description"],
                                         interactive=False, wrap=True, label="Voices", elem_id="voices-table")
        current = gr.State(None)
        with gr.Row():
            with gr.Column():
                preview = gr.Audio(label="Reference clip", type="filepath", interactive=False)
                export_one = gr.DownloadButton("Export this voice (.zip)", elem_id="export-one")
            with gr.Column():
                fields = [gr.Textbox(label="Name", elem_id="edit-name"),
                          gr.Textbox(label="Transcript", lines=2, elem_id="edit-transcript"),
                          gr.Textbox(label="Description", elem_id="edit-description"),
                          gr.Textbox(label="Default style (tag prefix)", elem_id="edit-style"),
                          gr.Checkbox(label="Shared: visitors of a public page may see and use this voice",
                                      value=False, elem_id="edit-shared")]
                with gr.Row():
                    save = gr.Button("Save changes", variant="primary", elem_id="edit-save")
                    confirm = gr.Checkbox(label="Yes, delete it", value=False, elem_id="delete-confirm")
                    delete = gr.Button("Delete", variant="stop", elem_id="delete-voice")
        with gr.Row():
            with gr.Column():
                export_all = gr.Button("Export all voices (.zip)")
                export_file = gr.File(label="Voice bundle", interactive=False)
            bundle = gr.File(label="Import a voice bundle (.zip)", file_types=[".zip"])

        priv = dict(api_visibility="private")
        lists = [self.voices_table, self.voice]
        owner = self.access.owner_only  # the queue runs any event by fn_index: each of these checks the caller
        self.voices_tab.select(owner(self._voice_rows), None, self.voices_table, queue=False, **priv)
        self.voices_table.select(owner(self._pick_voice), None, [current, preview, *fields, export_one], **priv)
        save.click(owner(self._edit_voice), [current, *fields], lists, **priv)
        delete.click(owner(self._delete_voice), [current, confirm], [*lists, current, confirm], **priv)
        export_all.click(owner(self._export_all), None, export_file, **priv)
        bundle.upload(owner(self._import), bundle, lists, **priv)

    @_warns(8)
    def _pick_voice(self, evt: gr.SelectData):
        voice = self.service.voices.get(evt.row_value[1])
        return (voice.id, str(voice.audio_path), voice.name, voice.transcript, voice.description, voice.style,
                voice.shared, self._export([voice.id]))

    @_warns(2)
    def _edit_voice(self, voice_id, name, transcript, description, style, shared):
        if not voice_id:
            raise ValueError("Select a voice in the table first.")
        self.service.voices.update(voice_id, name=name, transcript=transcript, description=description,
                                   style=self.service.resolve_style(style), shared=bool(shared))
        gr.Info("Saved.")
        return self._voice_rows(), gr.update(choices=self.voice_choices(OWNER))

    @_warns(4)
    def _delete_voice(self, voice_id, sure):
        if not voice_id:
            raise ValueError("Select a voice in the table first.")
        if not sure:
            raise ValueError("Tick 'Yes, delete it' to confirm.")
        self.service.voices.delete(voice_id)
        return self._voice_rows(), gr.update(choices=self.voice_choices(OWNER), value=NO_VOICE), None, False

    def _export_all(self) -> str:
        return self._export(None)

    def _export(self, ids) -> str:
        name = "voices.zip" if ids is None else f"voice-{ids[0]}.zip"
        path = self.out_dir / name
        path.write_bytes(self.service.voices.export_zip(ids))
        return str(path)

    @_warns(2)
    def _import(self, path):
        added = self.service.voices.import_zip(path)  # its size is checked before it is read
        gr.Info(f"Imported {len(added)} voice(s).")
        return self._voice_rows(), gr.update(choices=self.voice_choices(OWNER))


def _visibility(voice) -> str:
    return "preset" if voice.preset else "shared" if voice.shared else "private"


def launch_kwargs() -> dict:
    """Arguments that Gradio 6 takes at launch() rather than Blocks(): theme and CSS."""
    theme = gr.themes.Soft(primary_hue="indigo", secondary_hue="blue", neutral_hue="slate",
                           font=["Inter", "ui-sans-serif", "system-ui", "sans-serif"],
                           font_mono=["ui-monospace", "SFMono-Regular", "monospace"])
    return {"theme": theme, "css": render.CSS}

