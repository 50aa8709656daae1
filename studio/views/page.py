"""The Gradio page: the views of `studio/views/` assembled into one Blocks over `StudioService`.

Everything here is policy-free: validation, queueing and recording live in the service, formatting in
`render.py`, the CSS and JavaScript in `static/`. Errors the user can act on become `gr.Error` /
`gr.Warning` toasts, never tracebacks.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import gradio as gr

from studio.api.access import Access
from studio.audio.asr import Transcriber
from studio.audio.formats import ffmpeg_path
from studio.takes.admission import Caller
from studio.takes.service import StudioService
from studio.views import GPU_QUEUE, assets, render
from studio.views.dictionary import DictionaryView
from studio.views.live import CLIP_VOICE, NO_VOICE, LivePlayer
from studio.views.longform import LongFormView
from studio.views.private import PrivateVoicesView
from studio.views.projects import ProjectsView
from studio.views.studio import StudioView
from studio.views.takes import TakesView
from studio.views.voices import VoicesView
from studio.voices.private import PrivateVoices


class Page:
    """Builds the Blocks from its views and holds what they share: the service, the access rule, the folder of
    served take files and the live player's route."""

    def __init__(self, service: StudioService, access: Access | None = None, *,
                 private_voices: PrivateVoices | None = None, transcriber: Transcriber | None = None,
                 projects=None, runner=None, listener=None):
        self.service = service
        self.transcriber = transcriber  # fills an empty transcript box when a clip arrives (studio/audio/asr.py)
        self.access = access or Access()  # no key: whoever reaches the page is the owner
        # Gradio encodes streamed audio with an ffmpeg subprocess; without it the page plays each take once
        # it is complete instead of failing every generation.
        self.streaming = ffmpeg_path() is not None
        self.out_dir = Path(tempfile.mkdtemp(prefix="higgs-studio-"))
        self.player = LivePlayer(service)  # the WebAudio player's route; app.py mounts it after launch
        self.takes = TakesView(self)
        self.studio = StudioView(self, self.takes)
        # Voices private to each visitor (a Space, or --private-voices): the Voices tab and "Save as voice"
        # keep them in the visitor's browser; the shared library is the owner's, through the API.
        self.private = PrivateVoicesView(self, private_voices) if private_voices is not None else None
        self.voices = VoicesView(self) if private_voices is None else None
        self.long_form = LongFormView(service, self.out_dir, self.access, transcriber=transcriber, listener=listener)
        # Projects (a library and its job runner, app.py's start_projects) are the owner's: no tab on a public page.
        self.projects = ProjectsView(projects, runner, self.out_dir, self.access,
                                     transcriber=service.transcriber_for(transcriber)) \
            if projects is not None and not self.access.public_page else None
        self.dictionary = DictionaryView(service, self.access, self.out_dir)

    def voice_choices(self, caller: Caller) -> list[tuple[str, str]]:
        """The Voice menu for `caller`: a visitor of a public page sees the shared voices and the presets."""
        voices = self.service.list_voices(caller)
        return [("None (zero-shot)", NO_VOICE), ("Reference clip below (one-off)", CLIP_VOICE)] + \
               [(f"{v.name} (preset)" if v.preset else v.name, v.id) for v in voices]

    def style_choices(self) -> list[tuple[str, str]]:
        styles = self.service.list_styles()
        return ([] if any(not prefix for _, prefix in styles) else [("(none)", "")]) + styles

    def build(self) -> gr.Blocks:
        # delete_cache: Gradio keeps a copy of every served file; drop copies older than an hour, hourly.
        with gr.Blocks(title="Higgs Studio", delete_cache=(3600, 3600)) as demo:
            status = self.service.status()
            gr.HTML(render.header_html(status))
            if status.get("remote_kind"):
                gr.Markdown(f"Takes run on the **{status['remote_kind']}** server at `{status.get('remote')}`.",
                            elem_id="remote-kind")
            self.takes.state()
            if self.private is not None:
                self.private.state()
            with gr.Tabs(overflow_behavior="wrap"):  # on a phone no tab hides behind a "…" menu
                with gr.Tab("Studio", id="studio"):
                    self.studio.build()
                    self.dictionary.build()
                with gr.Tab("Voices", id="voices") as voices_tab:
                    if self.private is not None:
                        self.private.tab()
                    else:
                        self.voices.tab(voices_tab)
                with gr.Tab("Long form", id="long"):
                    self.long_form.build(GPU_QUEUE)
                if self.projects is not None:
                    with gr.Tab("Projects", id="projects"):
                        self.projects.build()
            if self.private is not None:
                self.private.wire(demo)  # its page load fills the voice menu with the visitor's own voices too
            else:
                self.voices.wire()
            demo.load(self.refresh_lists, None, [self.studio.voice, self.studio.style, self.studio.status,
                                                 self.long_form.voice], queue=False, api_visibility="private")
            if self.projects is not None:
                # The open project, as the server has it: a read of the database, outside the queue (a queued
                # answer that lands after the visitor picked a project would open the old one again).
                demo.load(*self.projects.load, queue=False, api_visibility="private")
            demo.load(self.alias_table, None, self.studio.aliases, queue=False, api_visibility="private")
            demo.load(self.dictionary.load, None, [self.dictionary.table, self.dictionary.export,
                                                   self.dictionary.status], queue=False, api_visibility="private")
            # An explicit private load event, not a callable value: Gradio would publish that one as an API
            # endpoint and an MCP tool.
            demo.load(lambda: render.live_player_html(self.player.issue_token()), None, self.takes.live_panel,
                      queue=False, api_visibility="private")
        return demo

    def alias_table(self, request: gr.Request):
        """The voice names chat clients send (`alloy`, …) and what each speaks with, for whoever loaded the page."""
        caller = self.access.page_caller(request)
        rows = []
        for alias in self.service.aliases.list():
            try:
                if self.service.resolve_alias(alias.name, caller) is not None:
                    rows.append(alias)
            except ValueError:  # a voice this caller may not use, or one deleted since start-up
                continue
        return render.aliases_md(rows)

    def refresh_lists(self, request: gr.Request):
        """The page load's lists, for whoever loaded it: the owner sees every voice, a visitor the shared ones."""
        caller = self.access.page_caller(request)
        voices = gr.skip() if self.private is not None else gr.update(choices=self.voice_choices(caller))
        return (voices, gr.update(choices=self.style_choices()), self.service.status(),
                gr.update(choices=self.long_form.voice_choices(caller)))


def theme() -> gr.themes.Base:
    """The page's theme. Where the Soft theme's colours read below WCAG AA's 4.5:1 against their background (the label
    chips, help lines, grey text, primary buttons) they are a shade further from it: axe-core checks the page, light
    and dark (tests/test_page_a11y.py)."""
    return gr.themes.Soft(primary_hue="indigo", secondary_hue="blue", neutral_hue="slate",
                          font=["Inter", "ui-sans-serif", "system-ui", "sans-serif"],
                          font_mono=["ui-monospace", "SFMono-Regular", "monospace"]).set(
        block_label_text_color="*primary_700", block_title_text_color="*primary_700",
        body_text_color_subdued="*neutral_600", input_placeholder_color="*neutral_500",
        button_primary_background_fill="*primary_600", button_primary_background_fill_hover="*primary_700",
        checkbox_label_background_fill_selected="*primary_600", color_accent="*primary_600",
        # Dark: white on the primary buttons' hover colour, and the grey text on the inputs' slate, read too faintly.
        button_primary_background_fill_dark="*primary_600", button_primary_background_fill_hover_dark="*primary_700",
        body_text_color_subdued_dark="*neutral_300")


def launch_kwargs() -> dict:
    """Arguments that Gradio 6 takes at launch() rather than Blocks(): the theme, the stylesheet and the page's
    own script (static/page.js), which runs from the page's head."""
    return {"theme": theme(), "css_paths": [assets.STYLESHEET, assets.STATIC_DIR / "actions.css"], "head": f"<script>{assets.script('page.js')}</script>"}
