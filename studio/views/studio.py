"""The Studio tab: what to say (text, tag palette, style preset, voice), a one-off clip or a new voice (the
clone panel), the sampling settings, and the events that tie them to the session's takes (`takes.py`)."""

from __future__ import annotations

import inspect

import gradio as gr

from engine.audio import prepare_reference
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
from studio.takes.service import MAX_TAKES
from studio.views import TAKES_QUEUE, assets, render
from studio.views.live import CLIP_VOICE, NO_VOICE
from studio.views.takes import TakesView
from studio.views.toasts import warns

# Generate's `js=`: in WebAudio mode the browser's player (static/live.js) starts the stream and puts its
# live id in the event's last input, so the page's handler follows the same take.
CLICK_JS = "(...args) => window.__hsLive ? window.__hsLive.start(args) : args"
# Stop's `js=`: the live id of the take the browser's player has just stopped (live.js's capturing click listener
# runs first) and the samples it played before falling silent, so Stop's handler finds that take even when the
# page's event has not reached its handler yet, and keeps it as heard.
STOP_JS = "(takes, id, heard) => window.__hsLive?.stopped ? window.__hsLive.stopped(takes) : [takes, '', 0]"
# After Generate's event (and Stop's) the page takes the next click again (live.js holds one take at a time).
IDLE_JS = "() => { window.__hsLive?.idle(); }"
ACTIONS_RULE = ("One take at a time: while a take runs, Generate waits and Stop ends it (the take is kept as far as "
                "you heard it).<span class=\"hs-keys\"> Ctrl+Enter (⌘+Enter) in the text box generates.</span>")
# The live player's state and position (live.js mirrors them here), so the bar says what the take is doing.
ACTIONS_HTML = ('<div class="hs-actions-live" id="actions-live" aria-live="polite"><span class="hs-state idle" '
                f'id="actions-state">idle</span> <span id="actions-pos"></span></div>'
                f'<div class="hs-rule" id="actions-rule">{ACTIONS_RULE}</div>')
# The reference clip's limits, as engine/audio.py's prepare_reference applies them to every clip.
CLIP_LIMITS = inspect.signature(prepare_reference).parameters
CLIP_LABEL = (f"Reference clip ({CLIP_LIMITS['min_seconds'].default:g}-{CLIP_LIMITS['max_seconds'].default:g} s; "
              "3-15 s of clear speech works best)")


class StudioView:
    """Builds the Studio tab and wires its events; `takes` shows what they generate."""

    def __init__(self, page, takes: TakesView):
        self.page = page
        self.service = page.service
        self.access = page.access
        self.transcriber = page.transcriber  # fills an empty transcript box when a clip arrives (studio/audio/asr.py)
        self.takes = takes

    # ------------------------------------------------------------------ layout

    def build(self):
        """The tab's components and events, inside an open `gr.Tab`."""
        with gr.Row(equal_height=False):
            with gr.Column(scale=3):
                self._text_panel()
                self._style_and_voice()
                # The action bar stays in view while the column scrolls (static/actions.css).
                with gr.Column(elem_id="actions", elem_classes="hs-actions"):
                    with gr.Row():
                        self.generate_btn = gr.Button("Generate", variant="primary", scale=3, elem_id="generate-btn")
                        self.stop_btn = gr.Button("Stop", variant="stop", scale=1, elem_id="stop-btn")
                    gr.HTML(ACTIONS_HTML, elem_id="actions-note")
                with gr.Accordion("Save the style as a preset", open=False), gr.Row():
                    self.preset_name = gr.Textbox(label="Preset name", scale=3)
                    self.save_preset = gr.Button("Save preset", scale=1)
                self._clone_panel()
                self._sampling()
            with gr.Column(scale=2, elem_id="output-column"):
                self.takes.output_column()
        self.takes.side_by_side_row()
        with gr.Accordion("Voice names for chat clients", open=False):
            # Filled at page load for whoever loaded it (a visitor sees the aliases they may use).
            self.aliases = gr.Markdown("", elem_id="voice-aliases")
        with gr.Accordion("Engine", open=False):
            self.status = gr.JSON(label="Engine status (refreshed on page load)", elem_id="engine-status")
        self.takes.history_panel()
        self._wire_generation()
        self._wire_editing()

    def _text_panel(self):
        self.text = gr.Textbox(label="Text", lines=6, max_lines=20, elem_id="text", autofocus=True,
                               placeholder="Type what to say. Put delivery tags at the start of a sentence.")
        self.plan = gr.HTML("", elem_id="plan")  # what Generate will do (TakesView.plan)
        with gr.Row():
            # Off by default: the text box is said as typed. On, text pasted from a chat is said as a person
            # would read it aloud (studio/text/clean.py); the take records the cleaned text.
            self.clean = gr.Checkbox(False, label="Clean chat text", scale=2, elem_id="clean",
                                     info="Skip markdown marks, code, links' addresses and emoji; tags are kept")
            self.clean_actions = gr.Radio([("Speak *actions*", "speak"), ("Skip *actions*", "skip")], value="speak",
                                          label="*Actions*", scale=2, elem_id="clean-actions")
        # Streams the box through WS /v1/audio/speech/stream while typing (static/typeahead.js, with the live
        # player's worklet): the voice of an assistant, tried on the page.
        gr.HTML(render.typeahead_html(), js_on_load=assets.script("typeahead.js"), elem_id="typeahead")
        with gr.Accordion("Tags: click to insert at the cursor", open=True):
            gr.HTML(render.palette_html(), js_on_load=assets.script("palette.js"), elem_id="palette")

    def _style_and_voice(self):
        with gr.Row():
            self.style = gr.Dropdown(self.page.style_choices(), value="", label="Style preset",
                                     allow_custom_value=True, scale=3, elem_id="style",
                                     info="A tag prefix put before the text; pick one or type tags.")
            # With a key the config is public: it lists what a visitor may see; the load event fills in the
            # owner's own voices.
            self.voice = gr.Dropdown(self.page.voice_choices(self.access.anyone()), value=NO_VOICE,
                                     label="Voice", scale=3, allow_custom_value=True, elem_id="voice",
                                     info="A saved voice, a one-off clip, or none (zero-shot).")

    def _clone_panel(self):
        """A reference clip for one take, or saved as a voice (the Voices tab's view wires the save button)."""
        with gr.Accordion("Clone a voice", open=False, elem_id="clone"):
            # A path, decoded by engine.audio under its sample budget: Gradio's own decoding (type="numpy", or a
            # `format` conversion) would decode a compressed bomb whole first.
            self.clip = gr.Audio(label=CLIP_LABEL, type="filepath",
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

    def _sampling(self):
        """The sampling settings, the seed and the number of takes."""
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
                self.random_seed = gr.Button("Random", size="sm")
                self.reuse_seed = gr.Button("Reuse last", size="sm")
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
        self.temperature, self.top_p, self.top_k, self.seed = temperature, top_p, top_k, seed
        self.max_frames, self.repeat_guard, self.takes_n = max_frames, repeat_guard, takes_n

    @property
    def settings(self) -> list:
        """The components a take's recipe fills ("Use these settings"), in `TakesView._use_settings`' order."""
        return [self.text, self.style, self.voice, self.temperature, self.top_p, self.top_k, self.seed,
                self.max_frames, self.repeat_guard]

    # ------------------------------------------------------------------ events

    def _wire_generation(self):
        t = self.takes
        # The live id stays the last input: CLICK_JS puts the stream's id there.
        inputs = [self.text, self.style, self.voice, self.clip, self.clip_text, self.temperature, self.top_p,
                  self.top_k, self.seed, self.max_frames, self.repeat_guard, self.takes_n, self.clean,
                  self.clean_actions, t.takes, t.live_id]
        gen_event = self.generate_btn.click(t.generate, inputs, t.outputs,
                                            api_name="generate", api_visibility="undocumented",  # not an MCP tool
                                            concurrency_id=TAKES_QUEUE, concurrency_limit=self.service.slots,
                                            js=CLICK_JS)
        gen_event.then(None, js=IDLE_JS)
        stop_event = self.stop_btn.click(t.stop, [t.takes, t.live_id, t.heard], t.shown,
                                         cancels=[gen_event], queue=False, api_name="stop",
                                         api_visibility="undocumented", js=STOP_JS)
        stop_event.then(None, js=IDLE_JS)
        t.wire(stop_event)
        t.use_settings.click(t._use_settings, t.selected, self.settings, api_visibility="private")

    def _wire_editing(self):
        """The events that help fill in the form: the plan line, a voice's style, a preset's temperature, the
        clip's transcript, the seed buttons, saving a preset."""
        form = [self.text, self.style, self.voice, self.clip, self.clip_text, self.temperature, self.top_p,
                self.top_k, self.seed, self.max_frames, self.repeat_guard, self.clean, self.clean_actions]
        # .change, not .input: it also follows palette inserts and "use these settings". One event for all of
        # them, so "always_last" keeps one plan in flight per page and then plans the latest form: a 100,000-
        # character text takes ~50 ms to plan (prose) to ~200 ms (numbers in every sentence, written out as words).
        gr.on([c.change for c in (self.text, self.style, self.voice, self.clip, self.max_frames, self.clean,
                                  self.clean_actions)],
              self.takes.plan, form, self.plan, queue=False, show_progress="hidden", trigger_mode="always_last",
              api_visibility="private")
        self.voice.change(self._voice_style, self.voice, self.style, queue=False, api_visibility="private")
        # Picking a preset (a user action: .input, not .change) also takes its suggested temperature.
        self.style.input(self._style_temperature, self.style, self.temperature, queue=False,
                         api_visibility="private")
        self.clip.change(lambda c, v: CLIP_VOICE if c is not None and v == NO_VOICE else gr.skip(),
                         [self.clip, self.voice], self.voice, queue=False, api_visibility="private")
        self.clip.upload(self._check_clip, self.clip, self.asr_note, api_visibility="private")
        if self.transcriber is not None:
            self.clip.change(self._transcribe, [self.clip, self.clip_text], [self.clip_text, self.asr_note],
                             concurrency_id="asr", concurrency_limit=1, api_visibility="private")
        self.random_seed.click(lambda: -1, None, self.seed, queue=False, api_visibility="private")
        self.reuse_seed.click(self._reuse_seed, self.takes.last_seed, self.seed, queue=False, api_visibility="private")
        self.save_preset.click(self.access.owner_only(self._save_preset), [self.preset_name, self.style], self.style,
                               api_visibility="private")

    # ------------------------------------------------------------------ handlers

    @staticmethod
    @warns(1)
    def _reuse_seed(last):
        if last is None:
            raise ValueError("No take yet in this session: generate one first.")
        return last

    @warns(1)
    def _voice_style(self, voice_id, request: gr.Request):
        if voice_id in (NO_VOICE, CLIP_VOICE):
            return gr.skip()
        voice = self.service.resolve_voice(voice_id, self.access.page_caller(request))
        return voice.style if voice is not None and voice.style else gr.skip()

    def _style_temperature(self, prefix):
        preset = next((p for p in self.service.presets.list() if p.prefix == prefix), None) \
            if self.service.presets is not None else None
        return preset.temperature if preset is not None and preset.temperature is not None else gr.skip()

    @warns(1)
    def _save_preset(self, name, style):
        preset = self.service.save_style(name, style)
        gr.Info(f"Saved preset {preset.name!r}.")
        return gr.update(choices=self.page.style_choices(), value=preset.prefix)

    @staticmethod
    def _clip_problem(clip) -> str | None:
        """What a take would refuse the clip for (its length, silence, an unreadable file), or None."""
        try:
            prepare_reference(clip)
        except ValueError as exc:
            return str(exc)
        return None

    def _check_clip(self, clip):
        """A clip checked as it is uploaded: a toast and the line under it now, rather than a failed take later."""
        problem = self._clip_problem(clip) if clip is not None else None
        if problem is None:
            return gr.skip()
        gr.Warning(problem)
        return problem

    def _transcribe(self, clip, text, request: gr.Request = None):
        """A new clip and an empty transcript box: fill the box with the clip's transcript (still editable),
        or say in one line why not. The transcription takes the visitor's turn in the GPU line."""
        if clip is None or (text or "").strip():
            return gr.skip(), gr.skip()
        problem = self._clip_problem(clip)
        if problem is not None:  # the line says why the clip will not do (as the upload's check does), not ASR's
            return gr.skip(), problem
        transcriber = self.service.transcriber_for(self.transcriber, self.access.page_caller(request))
        try:
            transcript, note = transcriber.transcribe(clip)
        except TimeoutError:  # the line's ServiceBusy
            return gr.skip(), "The engine is busy: type the transcript, or upload the clip again in a moment."
        except ValueError as exc:  # an unreadable clip: saving or generating will say so too
            return gr.skip(), str(exc)
        return (transcript or gr.skip()), (note or "")
