"""The "Long form" tab: a chapter or a script → its segment table (text, speaker, seed, seconds, status, and
the word error rate of what the studio's ASR heard when listen and retry is on, studio/audio/listen.py),
generated as one take through the GPU queue, any row generated again (new seed or edited text) and the
whole take re-assembled for download. Thin over studio/takes/longform.py.
"""

from __future__ import annotations

import functools
import itertools
import math
import time
from pathlib import Path

import gradio as gr

from engine.config import SAMPLE_RATE
from engine.types import SamplingParams
from studio.api.access import OWNER_ONLY_LONG, Access
from studio.audio.acx import acx_check
from studio.audio.formats import write_audio
from studio.audio.loudness import measure
from studio.takes.longform import regenerate_segment, segment_rows
from studio.takes.order import Order
from studio.takes.service import ServiceBusy
from studio.views import render
from studio.views.captions import CaptionsPanel
from studio.views.toasts import warns

# Key columns first and narrow, the text wrapped in the room left, the long seed last (elem class hs-segments).
HEADERS = ["#", "speaker", "status", "seconds", "pause after", "WER", "text", "seed"]
WIDTHS = ["44px", "84px", "150px", "76px", "88px", "56px", "45%", "104px"]


def table_rows(rows: list[list], pauses: list[float]) -> list[list]:
    """studio/takes/longform.py's segment rows (#, speaker, text, seed, seconds, status, WER) in the page's
    column order (HEADERS), with each segment's pause after it."""
    return [[n, speaker, status, seconds, f"{pause:.2f} s" if pause else "", wer, text, str(seed)]
            for (n, speaker, text, seed, seconds, status, wer), pause in zip(rows, pauses)]


def take_rows(take) -> list[list]:
    return table_rows(segment_rows(take), [s.pause_after for s in take.segments])


def sentences(notes) -> str:
    """Notes as one line of sentences, each starting with a capital and ending in one full stop."""
    said = (n.strip().rstrip(".;") for n in notes)
    return " ".join(f"{n[0].upper()}{n[1:]}." for n in said if n)


def parse_voices_map(text: str) -> dict[str, str | None] | None:
    """`Alice = Narrator` lines → {"Alice": "Narrator"}; an empty voice means zero-shot; no lines → None
    (the text is not a script)."""
    voices: dict[str, str | None] = {}
    for number, line in enumerate((text or "").splitlines(), start=1):
        if not line.strip():
            continue
        speaker, sep, voice = line.partition("=")
        if not sep or not speaker.strip():
            raise ValueError(f"line {number} of the voices map should read `Speaker = voice name` "
                             f"(or `Speaker =` for no voice); got {line.strip()!r}")
        voices[speaker.strip()] = voice.strip() or None
    return voices or None


class LongFormView:
    """Builds the tab and handles its events; the LongTake of each session lives in a gr.State."""

    _files = itertools.count(1)

    def __init__(self, service, out_dir: str | Path, access: Access | None = None, transcriber=None,
                 listener=None):
        self.service = service
        self.listener = listener  # listen and retry (studio/audio/listen.py); None: segments are not checked
        self.out_dir = Path(out_dir)
        self.access = access or Access()  # long takes are beyond the public page's limits: the owner's
        self.captions = CaptionsPanel(self.out_dir, "long-take", transcriber=transcriber, service=service)

    def voice_choices(self, caller) -> list[tuple[str, str]]:
        return [("None (zero-shot)", "")] + [(v.name, v.id) for v in self.service.list_voices(caller)]

    # ------------------------------------------------------------------ handlers (plain functions)

    def _order(self, text, voice, style, voices_map, normalize, seed=None) -> Order:
        return Order(text=text or "", voice=voice or None, style=style or None, voices=parse_voices_map(voices_map),
                     normalize=bool(normalize), long=True, listen=True, door="ui",
                     params=SamplingParams.of(seed=None if seed is None or seed < 0 else int(seed)))

    def preview(self, text, style, voices_map, normalize):
        """The plan before generating: the segment table, the text as it will be spoken, the duration."""
        if not (text or "").strip():
            return [], "", ""
        segments = self.service.plan(self._order(text, None, style, voices_map, normalize)).segments
        rows = table_rows([[s.index + 1, s.speaker or "", s.text, "", round(s.seconds, 1), "planned", ""]
                           for s in segments], [s.pause_after for s in segments])
        seconds = sum(s.seconds + s.pause_after for s in segments)
        return rows, spoken_text(segments), f"{len(segments)} segments, about {seconds:.0f} s of speech"

    def generate(self, text, voice, style, voices_map, normalize, seed):
        """Generate the take; yields (take, rows, progress, file, spoken text) as segments finish, the file at the
        end. A take that cannot start leaves the table, the player and the text as they were, and says why."""
        try:
            handle = self.service.start(self._order(text, voice, style, voices_map, normalize, seed), pieces=True,
                                        listener=self.listener)
        except ValueError as exc:
            yield failed(exc, 5, progress_at=2)
            return
        take, started = None, time.perf_counter()
        try:
            for take, piece in handle.stream():
                if piece.done > piece.segment:
                    yield (take, take_rows(take), self._progress(take, piece.done, started), gr.skip(),
                           spoken_text(take.segments))
        except (ServiceBusy, ValueError) as exc:
            yield failed(exc, 5, progress_at=2)
            return
        if take is None:
            return
        path, levels = self._write(take)
        done = f"Done: {len(take.segments)} segments · {levels}."
        yield take, take_rows(take), f"{done} {sentences(handle.warnings)}".strip(), path, spoken_text(take.segments)

    def regenerate(self, take, row, seed, text):
        """Generate one row again (a new seed when `seed` is empty or negative, or edited `text`)."""
        try:
            if take is None:
                raise ValueError("Generate a take first; then pick a row to generate again.")
            index = int(row or 0) - 1
            if not 0 <= index < len(take.segments):
                raise ValueError(f"Pick a row between 1 and {len(take.segments)}.")
            regenerate_segment(self.service, take, index, seed=None if seed is None or seed < 0 else int(seed),
                               text=(text or "").strip() or None)
        except (ServiceBusy, ValueError) as exc:
            return failed(exc, 4, progress_at=2)
        path, levels = self._write(take)
        return take, take_rows(take), f"Row {index + 1} generated again (seed {take.seeds[index]}) · {levels}.", path

    def pick(self, take, evt: gr.SelectData):
        """A row clicked: its number and text in the regenerate fields, and its audio in the segment player."""
        index = evt.index[0] if isinstance(evt.index, (list, tuple)) else evt.index
        if take is None or not 0 <= index < len(take.segments):
            return gr.skip(), gr.skip(), gr.skip()
        shaped = take.shaped[index] if take.keep_audio else None
        audio = gr.skip() if shaped is None else write_audio(
            self.out_dir / f"long-segment-{next(self._files)}.wav", shaped, SAMPLE_RATE)
        return index + 1, take.segments[index].text, audio

    @staticmethod
    def _progress(take, done: int, started: float) -> str:
        """Segments done of total, and the time left at the pace so far (by estimated seconds of speech)."""
        spoken = sum(s.seconds for s in take.segments[:done])
        left = sum(s.seconds for s in take.segments[done:])
        eta = (time.perf_counter() - started) / max(spoken, 1e-9) * left
        return f"{done} of {len(take.segments)} segments done, about {eta:.0f} s left"

    def _write(self, take) -> tuple[str, str]:
        """The assembled take's file, and a line of its levels (loudness, true peak, the ACX check)."""
        audio = take.assemble()
        path = self.out_dir / f"long-take-{next(self._files)}-seed{take.base_seed}.wav"
        levels = measure(audio, SAMPLE_RATE)
        peak = -math.inf if levels.true_peak_db is None else levels.true_peak_db  # None: digital silence
        return write_audio(path, audio, SAMPLE_RATE), render.levels_line(
            levels, acx_check(audio, SAMPLE_RATE, peak_db=peak))

    def show_captions(self, take, audio_path):
        """The take's captions under its player, from its exact segment spans (studio/views/captions.py); the
        tab is the owner's, and so is the transcription's turn in the line."""
        if take is None or not audio_path:
            return self.captions.show(None, None, "")
        return self.captions.show(take, audio_path, Path(audio_path).stem)

    # ------------------------------------------------------------------ layout

    def build(self, concurrency_id: str) -> None:
        """The tab's components and events, inside an open `gr.Tab`."""
        take = gr.State(None)
        with gr.Row():
            with gr.Column(scale=3):
                text = gr.Textbox(label="Text or script", lines=14, elem_id="long-text",
                                  placeholder="Paste a chapter, or a script with lines like `Alice: Hello.`")
                spoken = gr.Textbox(label="As it will be spoken", lines=4, interactive=False, elem_id="long-spoken")
            with gr.Column(scale=2):
                # The config is public on a public page: the owner's own voices arrive with the page's load event.
                self.voice = gr.Dropdown(self.voice_choices(self.access.anyone()), value="",
                                         label="Voice (plain text)")
                voice = self.voice
                style = gr.Textbox(label="Style (preset name or tags)")
                voices_map = gr.Textbox(label="Script voices, one `Speaker = voice name` per line", lines=3,
                                        elem_id="long-voices")
                normalize = gr.Checkbox(True, label="Write numbers, dates and units as words (English)")
                seed = gr.Number(-1, label="Seed (-1: random)", precision=0)
                with gr.Row():
                    preview = gr.Button("Plan")
                    go = gr.Button("Generate", variant="primary", elem_id="long-generate")
        progress = gr.Markdown(elem_id="long-progress")
        table = gr.Dataframe(headers=HEADERS, interactive=False, wrap=True, column_widths=WIDTHS,
                             label="Segments: click a row to hear it and to edit or generate it again",
                             elem_id="long-table", elem_classes=["hs-segments"])
        with gr.Row():
            row = gr.Number(1, label="Row", precision=0, elem_id="long-row")
            row_seed = gr.Number(-1, label="New seed (-1: one no row has)", precision=0, elem_id="long-row-seed")
            row_text = gr.Textbox(label="Edited text (empty: keep)", elem_id="long-row-text")
            redo = gr.Button("Regenerate row", elem_id="long-regenerate")
        segment = gr.Audio(label="The picked row", type="filepath", interactive=False, autoplay=True,
                           elem_id="long-segment")
        audio = gr.Audio(label="Long take", type="filepath", interactive=False, elem_id="long-take")
        self.captions.build()
        captioned = self.captions.outputs(audio)

        preview.click(warns(3)(self.preview), [text, style, voices_map, normalize], [table, spoken, progress],
                      api_visibility="private")
        owner = functools.partial(self.access.owner_only, message=OWNER_ONLY_LONG)
        # Undocumented: callable by gradio_client (by position) but no MCP tool, like the Studio tab's generate.
        go.click(owner(warns(5)(self.generate)), [text, voice, style, voices_map, normalize, seed],
                 [take, table, progress, audio, spoken], concurrency_id=concurrency_id, concurrency_limit=1,
                 api_name="long_generate", api_visibility="undocumented"
                 ).success(warns(4)(self.show_captions), [take, audio], captioned, api_visibility="private")
        redo.click(owner(warns(4)(self.regenerate)), [take, row, row_seed, row_text], [take, table, progress, audio],
                   concurrency_id=concurrency_id, concurrency_limit=1, api_name="long_regenerate",
                   api_visibility="undocumented"
                   ).success(warns(4)(self.show_captions), [take, audio], captioned, api_visibility="private")
        table.select(self.pick, take, [row, row_text, segment], api_visibility="private")


def spoken_text(segments) -> str:
    return "\n\n".join(s.text for s in segments)


def failed(exc: Exception, n_outputs: int, *, progress_at: int) -> tuple:
    """Outputs for a take that failed: every one kept as it was, but the progress line, which says why (and a
    toast does)."""
    gr.Warning(str(exc))
    return tuple(f"Not generated: {exc}" if i == progress_at else gr.skip() for i in range(n_outputs))


__all__ = ["LongFormView", "parse_voices_map"]
