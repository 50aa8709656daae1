"""The page's Voices tab and "Save as voice" when voices are private to each visitor (docs/SPACES.md).

A visitor's voices live in their browser (`gr.BrowserState`, `studio.voices.private`); each event takes
the stored list in and gives the new list back, and the server keeps only the codes of open pages, in
memory, under handles that the voice menu offers. An export is the one file written: served from Gradio's
cache, within the visitor's budget, and removed within minutes (`studio/voices/exports.py`). The owner's
library and preset voices are listed too, read-only; the library is managed with the key over the HTTP API.
"""

from __future__ import annotations

import logging
import os

import gradio as gr
import numpy as np
from gradio.utils import get_upload_folder

from engine.audio import load_audio
from studio.api.access import visitor
from studio.views import GPU_QUEUE
from studio.views.toasts import warns
from studio.voices import Consent, VoiceError
from studio.voices.bundles import stage_zip
from studio.voices.exports import EXPORT_TTL_S, ExportShelf
from studio.voices.model import check_codes, stage_audio
from studio.voices.private import BROWSER_KEY, MAX_PRIVATE_VOICES, PrivateVoices, add_entries, export_bundle

log = logging.getLogger("higgs.studio")

# The browser encrypts its store with this (Gradio's BrowserState, AES in the page). The secret travels in
# the page's config, so it only keeps the entry unreadable at a glance; it must stay the same across
# restarts, or every visitor's voices become unreadable.
BROWSER_SECRET = os.environ.get("HIGGS_BROWSER_SECRET", "higgs-studio-private-voices")
BUNDLES_QUEUE = "voice-bundles"  # a visitor's bundle imports: checked one at a time, apart from the GPU queue


class PrivateVoicesView:
    """Builds the private Voices tab and wires the clone panel's save button to the visitor's browser."""

    def __init__(self, page, registry: PrivateVoices):
        self.page = page
        self.service = page.service
        self.registry = registry
        self.exports = ExportShelf(get_upload_folder())  # where Gradio serves files from: written once, not copied

    def state(self):
        """The browser's store: built outside the tabs, since a component in a tab not yet shown is not mounted
        and would never read or write the browser's storage."""
        self.store = gr.BrowserState([], storage_key=BROWSER_KEY, secret=BROWSER_SECRET)

    def tab(self):
        gr.Markdown("**Your voices live in this browser only**: nobody else sees them, and this studio keeps "
                    "nothing of them on disk but an export you ask for, until you close the page or for "
                    f"{EXPORT_TTL_S // 60} minutes. Save one from the Studio tab's *Clone a voice*. Export them to "
                    "keep a copy or to use them elsewhere; clearing the browser's site data deletes them. Preset "
                    "voices are the studio's own, for everyone.")
        self.table = gr.Dataframe([], headers=["name", "seconds", "transcript", "description"], interactive=False,
                                  wrap=True, label="Your voices (this browser)", elem_id="private-table")
        self.presets_table = gr.Dataframe(self._preset_rows(), headers=["name", "seconds", "transcript"],
                                          interactive=False, wrap=True, label="Preset voices (read-only)",
                                          elem_id="preset-table")
        current = gr.State(None)
        with gr.Row():
            confirm = gr.Checkbox(label="Yes, delete it", value=False, elem_id="private-delete-confirm")
            delete = gr.Button("Delete the selected voice", variant="stop", elem_id="private-delete")
        with gr.Row():
            with gr.Column():
                export = gr.Button("Export my voices (.zip)", elem_id="private-export")
                self.export_file = gr.File(label="Voice bundle", interactive=False, elem_id="private-export-file")
            bundle = gr.File(label="Import a voice bundle (.zip)", file_types=[".zip"], elem_id="private-import")
        priv = {"api_visibility": "private"}
        outputs = [self.store, self.table, self.page.studio.voice]
        self.table.select(self._pick, None, current, queue=False, **priv)
        delete.click(self._delete, [current, confirm, self.store], [*outputs, current, confirm], **priv)
        export.click(self._export, self.store, self.export_file, **priv)
        self.export_file.download(self._downloaded, None, None, queue=False, show_progress="hidden", **priv)
        # Checking a bundle holds no GPU: it runs in its own lane, one at a time, and only an encode (a bundle
        # without codes) takes its turn with generation (`_encode`).
        bundle.upload(self._import, [bundle, self.store], outputs, concurrency_id=BUNDLES_QUEUE, concurrency_limit=1,
                      **priv)

    def wire(self, demo: gr.Blocks):
        s = self.page.studio
        s.save_voice.click(self._save, [s.clip, s.clip_text, s.voice_name, s.voice_desc, s.style, s.consent,
                                        self.store], [self.store, self.table, s.voice],
                           concurrency_id=GPU_QUEUE, concurrency_limit=1, api_visibility="private")
        demo.load(self._load, self.store, [self.store, self.table, s.voice], queue=False, api_visibility="private")
        demo.unload(self._unload)

    # ------------------------------------------------------------------ handlers

    def _preset_rows(self):
        presets = self.service.voices.presets if self.service.voices is not None else None
        return [[v.name, f"{v.seconds:.1f}", v.transcript[:80]] for v in (presets.list() if presets else [])]

    def _outputs(self, stored, request: gr.Request, value=None):
        kept, voices = self.registry.register(_session(request), stored)
        rows = [[v.name, f"{v.seconds:.1f}", v.transcript[:80], v.description] for v in voices]
        choices = self.page.voice_choices(self.page.access.page_caller(request)) + \
            [(f"{v.name} (yours)", v.id) for v in voices]
        if value is not None:
            value = next((v.id for v in voices if v.voice_id == value), None)
        voice = gr.update(choices=choices, value=value) if value else gr.update(choices=choices)
        return kept, rows, voice

    def _load(self, stored, request: gr.Request):
        return self._outputs(stored, request)

    def _unload(self, request: gr.Request):
        self.registry.drop(_session(request))
        self.exports.drop_page(_session(request))

    @staticmethod
    def _pick(evt: gr.SelectData):
        return evt.index[0] if evt.index else None

    def _encode(self, wav24k: np.ndarray):
        if self.service.engine.is_remote:
            raise VoiceError("Private voices need this studio's own engine to encode them; with --remote, save "
                             "voices to the owner's library over the API.")
        return self.service.run_exclusive(self.service.engine.encode_codes, wav24k)

    def _encoded(self, staged):
        if staged.codes is None:
            staged.codes = check_codes(self._encode(staged.pcm.astype(np.float32) / 32768.0), staged.record["frames"])
        return staged

    @warns(3)
    def _save(self, clip, transcript, name, description, style, consent, stored, request: gr.Request):
        if clip is None:
            raise ValueError("Upload or record a reference clip first.")
        if consent is not True:
            raise ValueError("Confirm that you have the speaker's permission (tick the consent box) to save a voice.")
        samples, rate = load_audio(clip)
        staged = stage_audio((int(rate), np.asarray(samples, dtype=np.float32)), name=name,
                             transcript=transcript or None, description=description or "",
                             style=self.service.resolve_style(style or None),
                             consent=Consent(asserted_by="a visitor of this studio"))
        entries, added = add_entries(stored, [self._encoded(staged)])
        gr.Info(f"Saved voice {staged.record['name']!r} in this browser." if added else "You already have this voice.")
        return self._outputs(entries, request, value=f"v_{staged.content_hash[:16]}")

    @warns(5)
    def _delete(self, row, sure, stored, request: gr.Request):
        stored = list(stored or [])
        if row is None or not 0 <= row < len(stored):
            raise ValueError("Select one of your voices in the table first.")
        if not sure:
            raise ValueError("Tick 'Yes, delete it' to confirm.")
        del stored[row]
        return *self._outputs(stored, request), None, False

    @warns(1)
    def _export(self, stored, request: gr.Request):
        if not stored:
            raise ValueError("You have no voices to export yet.")
        client = getattr(request, "client", None)
        who = visitor(getattr(request, "headers", None) or {}, getattr(client, "host", None),
                      fallback=_session(request))
        return self.exports.put(who.key, _session(request), "my-voices.zip", export_bundle(stored))

    def _downloaded(self, request: gr.Request):
        self.exports.fetched(_session(request))

    @warns(3)
    def _import(self, path, stored, request: gr.Request):
        if path is None:
            raise ValueError("Choose a voice bundle (.zip) to import.")
        staged = stage_zip(path, max_voices=MAX_PRIVATE_VOICES)  # nothing inflated past the caps
        entries, added = add_entries(stored, [self._encoded(s) for s in staged])
        gr.Info(f"Imported {len(added)} voice(s) into this browser.")
        return self._outputs(entries, request)


def _session(request: gr.Request | None) -> str:
    return getattr(request, "session_hash", None) or "local"
