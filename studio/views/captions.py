"""Captions under a take's player: the player shows the current cue (gr.Audio's `subtitles`), the list below
marks it (studio/static/captions.js), and SRT / WebVTT downloads. Used by the Studio tab's take and the Long
form tab's take; the cues themselves come from studio/audio/captions.py."""

from __future__ import annotations

from pathlib import Path

import gradio as gr

from studio.audio.captions import Captions, captions_html, take_captions
from studio.takes.admission import OWNER, Caller
from studio.views import assets


class CaptionsPanel:
    """Build it right after the player it captions (`player_id` is that player's elem_id)."""

    def __init__(self, out_dir: Path, player_id: str, *, transcriber=None, level: str = "sentence", service=None):
        self.out_dir, self.player_id, self.transcriber, self.level = Path(out_dir), player_id, transcriber, level
        self.service = service  # its GPU line runs the transcriptions, in the asking caller's turn

    def build(self) -> None:
        self.html = gr.HTML(captions_html(None, self.player_id), js_on_load=assets.script("captions.js"),
                            elem_id=f"{self.player_id}-captions")
        with gr.Row():
            self.srt = gr.DownloadButton("Captions SRT", visible=False, elem_id=f"{self.player_id}-srt")
            self.vtt = gr.DownloadButton("Captions VTT", visible=False, elem_id=f"{self.player_id}-vtt")

    def outputs(self, player) -> list:
        """What `show` updates: the player (its subtitles), the cue list, the two downloads."""
        return [player, self.html, self.srt, self.vtt]

    def show(self, take, audio_path: str | None, name: str, caller: Caller = OWNER) -> tuple:
        """The updates for `take` (a studio Take or a LongTake) playing from `audio_path`; files `name`.srt/.vtt.
        `caller` is whose turn in the GPU line the transcription takes."""
        if take is None or audio_path is None:
            return gr.skip(), captions_html(None, self.player_id), gr.update(visible=False), gr.update(visible=False)
        transcriber = self.transcriber
        if self.service is not None:
            transcriber = self.service.transcriber_for(transcriber, caller)
        found: Captions = take_captions(take, level=self.level, transcriber=transcriber)
        srt_path, vtt_path = self.out_dir / f"{name}.srt", self.out_dir / f"{name}.vtt"
        srt_path.write_text(found.srt(), encoding="utf-8")
        vtt_path.write_text(found.vtt(), encoding="utf-8")
        subtitles = [{"timestamp": [c.start, c.end], "text": c.text} for c in found.cues] or None
        return (gr.Audio(value=audio_path, subtitles=subtitles), captions_html(found, self.player_id),
                gr.update(value=str(srt_path), visible=True), gr.update(value=str(vtt_path), visible=True))


__all__ = ["CaptionsPanel"]
