"""The Voices tab over the owner's library (`studio/voices/`), and the clone panel's "Save as voice" into it.

Every event here shows or changes the shared library, so each is the owner's only (`Access.owner_only`): the
queue runs any event by its fn_index, whatever the page shows.
"""

from __future__ import annotations

import re

import gradio as gr

from engine.audio import load_audio
from studio.takes.admission import OWNER
from studio.views import GPU_QUEUE
from studio.views.live import NO_VOICE
from studio.views.toasts import warns

# The short columns first at set widths, the long texts wrapped in the room left, the id last (elem class
# hs-voices). Widths in px or % (Gradio's Dataframe reads no other unit).
HEADERS = ["name", "visitors", "seconds", "style", "transcript", "description", "id"]
WIDTHS = ["170px", "84px", "76px", "120px", "30%", "20%", "180px"]
ID_COLUMN = HEADERS.index("id")


class VoicesView:
    """Builds the library's tab and wires the clone panel's save button to the library."""

    def __init__(self, page):
        self.page = page
        self.service = page.service
        self.access = page.access

    def tab(self, voices_tab: gr.Tab):
        """The tab's components and events, inside the open `voices_tab` (its selection refreshes the table)."""
        gr.Markdown("Saved voices: a prepared reference clip, its transcript, a default style and a consent "
                    "record. Select a row to preview, edit, export or delete it. A voice is private until you "
                    "share it: only shared voices and presets are offered to visitors of a public page.")
        # The table (transcripts, descriptions) is the owner's: with a key it fills when the owner opens the tab,
        # because the page's config, where a starting value would sit, is public on a public page.
        rows = self._voice_rows() if self.access.api_key is None else []
        self.table = gr.Dataframe(rows, headers=HEADERS, interactive=False, wrap=True, column_widths=WIDTHS,
                                  label="Voices", elem_id="voices-table", elem_classes=["hs-voices"])
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
                    confirm = gr.Checkbox(label="Yes, delete the selected voice", value=False,
                                          elem_id="delete-confirm")
                    delete = gr.Button("Delete", variant="stop", elem_id="delete-voice")
        with gr.Row():
            with gr.Column():
                export_all = gr.Button("Export all voices (.zip)")
                export_file = gr.File(label="Voice bundle", interactive=False)
            bundle = gr.File(label="Import voices (.zip): a Higgs Studio bundle, or a Higgs preset folder "
                                   "(config.json and its clips)", file_types=[".zip"], elem_id="import-voices")
        self.status = gr.Markdown("", elem_id="voices-status")

        priv = {"api_visibility": "private"}
        lists = [self.table, self.page.studio.voice]
        owner = self.access.owner_only
        voices_tab.select(owner(self._voice_rows), None, self.table, queue=False, **priv)
        self.table.select(owner(self._pick_voice), None, [current, preview, *fields, export_one], **priv)
        save.click(owner(self._edit_voice), [current, *fields], lists, **priv)
        delete.click(owner(self._delete_voice), [current, confirm],
                     [*lists, current, confirm, self.status, preview, *fields], **priv)
        export_all.click(owner(self._export_all), None, export_file, **priv)
        # The drop zone is emptied after each import, ready for the next file.
        bundle.upload(owner(self._import), bundle, [*lists, self.status, bundle], **priv)

    def wire(self):
        """The clone panel's "Save as voice" (studio tab) saves into the library, in turn with generation."""
        s = self.page.studio
        s.save_voice.click(self.access.owner_only(self._save_voice),
                           [s.clip, s.clip_text, s.voice_name, s.voice_desc, s.style, s.consent],
                           [s.voice, self.table], concurrency_id=GPU_QUEUE, concurrency_limit=1,
                           api_visibility="private")

    # ------------------------------------------------------------------ handlers

    def _voice_rows(self):
        return [[v.name, _visibility(v), f"{v.seconds:.1f}", v.style, v.transcript[:80], v.description, v.id]
                for v in self.service.list_voices(OWNER)]

    def _menu(self, **value) -> dict:
        """The Studio tab's voice menu, refreshed after a change to the library."""
        return gr.update(choices=self.page.voice_choices(OWNER), **value)

    @warns(2)
    def _save_voice(self, clip, transcript, name, description, style, consent):
        if clip is None:
            raise ValueError("Upload or record a reference clip first.")
        samples, rate = load_audio(clip)
        voice = self.service.save_voice(samples, rate, name=name, transcript=transcript,
                                        description=description, style=style or None, consent=consent)
        gr.Info(f"Saved voice {voice.name!r}.")
        return self._menu(value=voice.id), self._voice_rows()

    @warns(8)
    def _pick_voice(self, evt: gr.SelectData):
        voice = self.service.voices.get(evt.row_value[ID_COLUMN])
        return (voice.id, str(voice.audio_path), voice.name, voice.transcript, voice.description, voice.style,
                voice.shared, self._export([voice.id]))

    @warns(2)
    def _edit_voice(self, voice_id, name, transcript, description, style, shared):
        if not voice_id:
            raise ValueError("Select a voice in the table first.")
        self.service.voices.update(voice_id, name=name, transcript=transcript, description=description,
                                   style=self.service.resolve_style(style), shared=bool(shared))
        gr.Info("Saved.")
        return self._voice_rows(), self._menu()

    @warns(11)
    def _delete_voice(self, voice_id, sure):
        if not voice_id:
            raise ValueError("Select a voice in the table first.")
        name = self.service.voices.get(voice_id).name
        if not sure:
            raise ValueError(f"Tick 'Yes, delete the selected voice' to delete {name!r}; nothing was deleted.")
        self.service.voices.delete(voice_id)
        said = f"Deleted the voice {name!r}."
        gr.Info(said)
        return (self._voice_rows(), self._menu(value=NO_VOICE), None, False, said, None, "", "", "", "", False)

    def _export_all(self) -> str:
        return self._export(None)

    def _export(self, ids) -> str:
        name = "voices.zip" if ids is None else f"voice-{ids[0]}.zip"
        path = self.page.out_dir / name
        path.write_bytes(self.service.voices.export_zip(ids))
        return str(path)

    @warns(4)
    def _import(self, path):
        before = {v.id: v.name for v in self.service.list_voices(OWNER)}
        # Its size is checked before it is read; a voice of a name already taken comes in as "Name (2)".
        found = self.service.voices.import_zip(path, keep_both=True)
        said = import_note(found, before)
        gr.Info(said)
        return self._voice_rows(), self._menu(), said, None


def import_note(found, before: dict[str, str]) -> str:
    """What an import did, in words: the voices added (and under which name where theirs was taken) and those
    already in the library, which were left as they are."""
    names = {n.casefold() for n in before.values()}
    added = [v for v in found if v.id not in before]
    kept = [v for v in found if v.id in before]
    parts = []
    if added:
        shown = []
        for voice in added:
            renamed = re.fullmatch(r"(.+) \(\d+\)", voice.name)
            clash = renamed is not None and renamed.group(1).casefold() in names
            shown.append(f"{voice.name!r}" + (f" (a voice called {renamed.group(1)!r} was already there; both are "
                                              "kept)" if clash else ""))
        parts.append(f"Imported {_count(len(added))}: {', '.join(shown)}.")
    if kept:
        parts.append(f"Already in the library, left as {'it is' if len(kept) == 1 else 'they are'} (same clip and "
                     f"transcript): {', '.join(repr(before[v.id]) for v in kept)}.")
    return " ".join(parts) or "The file held no voices."


def _count(n: int) -> str:
    return "1 voice" if n == 1 else f"{n} voices"


def _visibility(voice) -> str:
    return "preset" if voice.preset else "shared" if voice.shared else "private"
