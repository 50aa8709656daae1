"""The session's takes: the output column (live audio, metrics, the WebAudio player, the take and its
download), the side-by-side takes with their Keep buttons, and the history with each take's recipe.

Generate streams a take here (or waits for the browser's own player to stream it) and shows it when it ends;
Stop cancels the session's running take. Validation, queueing and recording live in the service.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import threading
from collections.abc import Iterator

import gradio as gr
import numpy as np

from engine.audio import load_audio
from engine.config import SAMPLE_RATE
from studio.audio.acx import acx_check
from studio.audio.formats import available_formats, to_pcm16, write_audio
from studio.audio.loudness import DEFAULT_CEILING, TARGETS, normalize
from studio.takes.failure import Failure
from studio.takes.service import MAX_TAKES, Queued
from studio.takes.take import TakeHandle
from studio.views import assets, panel, render
from studio.views.captions import CaptionsPanel
from studio.views.live import NO_VOICE, page_order
from studio.views.toasts import warns

log = logging.getLogger("higgs.studio")

LOUDNESS_CHOICES = [("As made", "off")] + [(f"{name.capitalize()} ({lufs:g} LUFS)", name)
                                           for name, lufs in TARGETS.items()]
RECENT_SESSIONS = 64  # sessions whose latest live take Stop can still find once the page's event let it go
STREAM_SECONDS = 1.0  # after the first chunk, stream in ~1 s pieces (Gradio's advice for smooth HLS playback)


class TakesView:
    """Shows a session's takes and holds its live requests (so Stop can cancel the right one)."""

    def __init__(self, page):
        self.page = page
        self.service = page.service
        self.access = page.access
        self.player = page.player
        self.streaming = page.streaming
        self._active: dict[str, TakeHandle] = {}
        self._variants: dict[str, list[TakeHandle]] = {}  # the other takes of a session's Generate
        self._recent: dict[str, tuple[str, TakeHandle]] = {}  # a session's latest live take, kept for Stop
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ layout

    def state(self):
        """The session's take ids and last seed: built outside the tabs, beside the page's other states."""
        self.takes, self.last_seed = gr.State([]), gr.State(None)
        self.kept = gr.State(None)  # the take picked with Keep: the History marks it

    def output_column(self):
        """The live audio, metrics, the WebAudio player, the finished take and its download."""
        self.live = gr.Audio(label="Live" if self.streaming else "Live (off: install ffmpeg to stream)",
                             streaming=self.streaming, autoplay=True, interactive=False, elem_id="live")
        # The WebAudio player (studio/views/live.py); its session token is issued at every page load (studio/views/page.py).
        self.live_panel = gr.HTML(render.live_player_html(""), js_on_load=assets.script("live.js"),
                                  elem_id="live-player")
        self.metrics = gr.HTML(panel.metrics_html(), label="Metrics", elem_id="metrics")
        self.live_id = gr.Textbox("", visible=False, elem_id="live-id")  # set by CLICK_JS in WebAudio mode
        self.heard = gr.Number(0, visible=False, precision=0, elem_id="heard")  # set by STOP_JS: samples played
        self.result = gr.JSON(label="Result", visible=False)  # the take's metrics and recipe, for API clients
        self.take_audio = gr.Audio(label="Take", type="filepath", interactive=False, elem_id="take")
        self.captions = CaptionsPanel(self.page.out_dir, "take", transcriber=self.page.transcriber,
                                      service=self.service)
        self.captions.build()
        with gr.Row():
            self.fmt = gr.Dropdown([f for f in available_formats() if f != "pcm"], value="wav",
                                   label="Format", scale=1, min_width=90)
            self.loudness = gr.Dropdown(LOUDNESS_CHOICES, value="off", label="Loudness", scale=1, min_width=120,
                                        elem_id="loudness")
            self.download = gr.DownloadButton("Download WAV", scale=2, elem_id="download")
        self.acx_button = gr.Button("ACX check", size="sm", elem_id="acx-check")
        self.acx = gr.HTML("", elem_id="acx-report")

    def side_by_side_row(self):
        """One hidden column per possible take of a Generate: seed and numbers, player, Keep."""
        with gr.Row(visible=False, elem_id="variants") as self.variants_row:
            self.variant_cols, self.variant_audio, self.variant_info, self.keep = [], [], [], []
            for i in range(MAX_TAKES):
                with gr.Column(visible=False, min_width=180) as column:
                    self.variant_cols.append(column)
                    self.variant_info.append(gr.HTML("", elem_id=f"variant-info-{i}"))
                    self.variant_audio.append(gr.Audio(label=f"Take {i + 1}", type="filepath", interactive=False,
                                                       elem_id=f"variant-{i}"))
                    self.keep.append(gr.Button("Keep", size="sm", elem_id=f"keep-{i}"))
        self.variant_ids = gr.State([])

    def history_panel(self):
        """The session's history table; a selected take shows its player, recipe and curl command."""
        with gr.Accordion("History (this session)", open=True):
            self.history = gr.Dataframe(headers=panel.HISTORY_HEADERS, interactive=False, wrap=True, label="History",
                                        elem_id="history")
            with gr.Row(visible=False) as self.detail:  # shown once a take is selected
                with gr.Column(scale=2):
                    self.hist_audio = gr.Audio(label="Selected take", type="filepath", interactive=False)
                    self.use_settings = gr.Button("Use these settings", elem_id="use-settings")
                with gr.Column(scale=3):
                    self.recipe = gr.Code(label="Recipe (settings + seed + voice id)", language="json", lines=4,
                                          max_lines=14, elem_id="recipe")
                    self.curl = gr.Code(label="Reproduce it over HTTP", language="shell", lines=2, max_lines=6,
                                        wrap_lines=True, elem_id="recipe-curl")
            self.selected = gr.State(None)

    @property
    def outputs(self) -> list:
        """Generate's outputs, in the order its handler's updates name them."""
        side_by_side = [self.variants_row, *self.variant_cols, *self.variant_audio, *self.variant_info,
                        self.variant_ids]
        return [self.live, self.metrics, self.take_audio, self.download, self.history, self.takes, self.last_seed,
                self.result, *side_by_side]

    @property
    def shown(self) -> list:
        """What a take shown in the panel fills (`take_outputs` and the metrics panel before them)."""
        return [self.metrics, self.take_audio, self.download, self.history, self.takes, self.last_seed]

    def wire(self, stop_event) -> None:
        """The events inside the panel: Keep, the download format, picking a take in the history, and what follows
        a take shown in the panel (by Generate or Keep: the session's takes change; by Stop: its event) — its
        download in the chosen format and its captions. Chained to Generate's event instead, a Generate whose take
        Stop shows would caption the take shown before it, over the stopped one."""
        captioned = self.captions.outputs(self.take_audio)
        for i, button in enumerate(self.keep):
            button.click(functools.partial(self._keep, i), [self.variant_ids, self.takes], [*self.shown, self.kept],
                         api_visibility="private")
        for shown in (self.takes.change, stop_event.success):  # Stop's runs outside the queue: no change event
            shown(self._download_as, [self.fmt, self.takes, self.loudness], self.download, api_visibility="private")
            shown(self._captions, self.takes, captioned, api_visibility="private")
        for choice in (self.fmt, self.loudness):
            choice.change(self._download_as, [self.fmt, self.takes, self.loudness], self.download,
                          api_visibility="private")
        self.acx_button.click(self._acx_check, [self.takes, self.loudness], self.acx, api_visibility="private")
        self.history.select(self._select_take, self.takes,
                            [self.selected, self.hist_audio, self.recipe, self.curl, self.detail],
                            api_visibility="private")

    # ------------------------------------------------------------------ files

    def take_file(self, take, fmt: str = "wav", loudness: str = "off") -> str:
        """The take as a file in `fmt` at the `loudness` target (studio/audio/loudness.py), written once; files of takes
        the history has dropped are removed."""
        out_dir = self.page.out_dir
        level = "" if loudness in (None, "", "off") else f"-{loudness}"
        path = out_dir / f"take-{take.id}-seed{take.seed}{level}.{fmt}"
        if not path.exists():
            write_audio(path, self._leveled(take, loudness), take.sample_rate)
            kept = {f"take-{t.id}-" for t in self.service.history}
            for old in out_dir.glob("take-*"):
                if old.name[:old.name.index("-", 5) + 1] not in kept:
                    old.unlink(missing_ok=True)
        return str(path)

    def take_outputs(self, take, takes: list[int], kept: int | None = None) -> tuple:
        """(metrics panel, take player, download button, history table, takes state, last seed) for a take
        shown in the panel; the take shown is the last one of `takes` (the History lists it first)."""
        takes = [i for i in takes if i != take.id] + [take.id]
        wav = self.take_file(take)
        state = "stopped" if take.stop_reason == "cancelled" else "done"
        metrics = panel.metrics_html(take.metrics, state=state, seconds=take.seconds, warnings=take.warnings,
                                     loudness=take.loudness, take=take.id, kept=take.id == kept)
        return (metrics, wav, gr.update(value=wav, label="Download WAV"), self.history_rows(takes, kept), takes,
                take.seed)

    @staticmethod
    def _from_page(request: gr.Request | None, live_id: str) -> bool:
        """The page's own Generate, not a script's call of the event: the live player's take (only the page's
        CLICK_JS sends a live id), or a browser's request, which carries its page's origin (gradio_client
        says it is one with `x-gradio-user: api`)."""
        if live_id:
            return True
        headers = request.headers if request is not None else {}
        return bool(headers.get("origin")) and headers.get("x-gradio-user") != "api"

    def _drop_files(self, take_id: int) -> None:
        for old in self.page.out_dir.glob(f"take-{take_id}-*"):
            old.unlink(missing_ok=True)

    def history_rows(self, takes: list[int], kept: int | None = None) -> list[list]:
        """The History table's rows (newest first), the take picked with Keep marked."""
        return panel.history_rows((t for t in map(self.service.take, takes) if t is not None), kept)

    def _failed(self, message: str, takes, state: str = "error") -> dict:
        """A take that failed (or was stopped before any sound): a toast and the panel's own line; the panel
        keeps the last take it showed, numbers and all."""
        if state == "error":
            gr.Warning(message)
        last = self.service.take(takes[-1]) if takes else None
        return {self.metrics: panel.metrics_html(last.metrics if last else None, state=state, note=message,
                                                 seconds=last.seconds if last else 0.0,
                                                 loudness=last.loudness if last else None)}

    # ------------------------------------------------------------------ generation

    def generate(self, text, style, voice, clip, clip_text, temperature, top_p, top_k, seed, max_frames,
                 repeat_guard, takes_n, clean=False, clean_actions="speak", takes=None, live_id="",
                 request: gr.Request = None):
        """Stream a take into the live player and the metrics panel, then show the full take. With `live_id` the
        browser's own player streams the take (studio/views/live.py, which applies the public limits) and this handler
        waits for it to end, so the take lands in the history, take player, downloads and recipe the same way.
        With `takes_n` > 1 the other takes (the next seeds, same settings) run beside it in the engine's batch
        and all of them are shown side by side once they end, each with a Keep button."""
        key = request.session_hash if request else "local"
        handle, others, failure = None, [], None
        try:
            if live_id:
                handle = self.player.claim(live_id)
            else:
                order = page_order(text=text, style=style, voice=voice, clip=self._clip(clip), clip_text=clip_text,
                                   temperature=temperature, top_p=top_p, top_k=top_k, seed=seed,
                                   max_frames=max_frames, repeat_guard=repeat_guard, clean=clean,
                                   clean_actions=clean_actions)
                order = dataclasses.replace(order, caller=self.access.page_caller(request))
                handle = self.service.start(order, record=True)
            others = self.service.variants(handle, int(takes_n or 1))
            with self._lock:
                self._active[key], self._variants[key] = handle, others
                if live_id:
                    self._recent.pop(key, None)
                    self._recent[key] = (live_id, handle)
                    while len(self._recent) > RECENT_SESSIONS:
                        del self._recent[next(iter(self._recent))]
            running = [self._run_variant(other) for other in others]
            if live_id:
                failure = self.player.wait(live_id)
            else:
                yield from self._stream(handle)
            for thread in running:
                thread.join()
        except Exception as exc:  # a bad request, a busy line or a fault: the one sentence for it
            failure = Failure.of(exc, "page take").message
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
        take = self.service.take(handle.take.id) if handle is not None and handle.take is not None else None
        if failure is not None and not self._from_page(request, live_id):
            raise gr.Error(failure)  # a script gets the sentence as its error; it has no panel to keep
        if take is None:  # a toast and the panel's own line; the panel keeps the last take it showed
            stopped = failure is None and handle is not None and handle.cancel.is_set()
            yield self._failed("Stopped before any sound: nothing to keep." if stopped
                               else failure or "The take did not start; try again.", takes or [],
                               "stopped" if stopped else "error")
            return
        if live_id and take.stop_reason == "cancelled":
            return  # Stop's handler shows it, as far as it was heard: shown from here too, the two would race
        shown = dict(zip(self.shown, self.take_outputs(take, takes or [])))
        yield {**shown, self.result: render.result_json(take, handle.warnings),
               **self._side_by_side([take] + [h.take for h in others if h.take is not None] if others else [])}

    def plan(self, text, style, voice, clip, clip_text, temperature, top_p, top_k, seed, max_frames, repeat_guard,
             clean=False, clean_actions="speak", request: gr.Request = None) -> str:
        """The line under the text box (render.plan_html): what Generate will do with the form as it stands, with
        the caller's limits, or the sentence it would fail with (never a toast for typing); nothing for an empty
        box. Planning reads SSML, cleans, resolves the voice, segments and respells, and touches no GPU."""
        if not (text or "").strip():
            return ""
        # A plan only checks that a clip is there; decoding the file at every keystroke would cost more than the
        # plan itself. Generate decodes the real one (and says so if it cannot).
        present = (np.zeros(1, np.float32), SAMPLE_RATE) if clip is not None else None
        try:
            order = page_order(text=text, style=style, voice=voice, clip=present, clip_text=clip_text,
                               temperature=temperature, top_p=top_p, top_k=top_k, seed=seed, max_frames=max_frames,
                               repeat_guard=repeat_guard, clean=clean, clean_actions=clean_actions)
            plan = self.service.plan(dataclasses.replace(order, caller=self.access.page_caller(request)))
        except Exception as exc:  # the sentence Generate would show
            return render.plan_html(error=Failure.of(exc, "page plan").message)
        return render.plan_html(plan)

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

    @warns(7)
    def _keep(self, index: int, variant_ids, takes):
        """Show the side-by-side take in place `index` in the panel (player, metrics), marked kept in the
        History."""
        take = self.service.take(variant_ids[index]) if index < len(variant_ids or []) else None
        if take is None:
            raise ValueError("That take has left the studio's history (it keeps the latest takes only); "
                             "generate again.")
        return *self.take_outputs(take, takes or [], kept=take.id), take.id

    def _stream(self, handle: TakeHandle) -> Iterator[dict]:
        """Gradio's own streaming path (the fallback player): queue positions, then the audio in ~1 s pieces."""
        yield {self.live: None, self.metrics: panel.metrics_html(state="waiting", note="waiting for the engine")}
        buffer, sent = [], 0
        for item in handle.stream(positions=True):
            if isinstance(item, Queued):
                if item.position > 1:  # something is ahead of us (1 = next up: the worker takes it at once)
                    yield {self.metrics: panel.metrics_html(state="waiting", note=f"queue position {item.position}")}
                continue
            if len(item.audio):
                buffer.append(item.audio)
            samples = sum(len(b) for b in buffer)
            if buffer and (item.final or sent == 0 or samples >= STREAM_SECONDS * SAMPLE_RATE):
                piece = np.concatenate(buffer)
                buffer, sent = [], sent + len(piece)
                yield {**({self.live: (SAMPLE_RATE, to_pcm16(piece))} if self.streaming else {}),
                       self.metrics: panel.metrics_html(item.metrics, state="streaming", seconds=sent / SAMPLE_RATE,
                                                         warnings=handle.warnings)}

    def stop(self, takes, live_id: str = "", heard=0, request: gr.Request = None):
        """Cancel this session's running take and show it as far as it was heard: `heard` samples, what the
        browser's player played before it fell silent (STOP_JS; 0 when unknown: the take as made). `live_id`:
        the take the browser's player has just stopped, found through the player when the page's event has not
        registered it yet, or has already let it go (its `cancels=` and this handler race)."""
        key = request.session_hash if request else "local"
        with self._lock:
            handle, others = self._active.pop(key, None), self._variants.pop(key, [])
            recent = self._recent.get(key)
        if handle is None and live_id:
            handle = self.player.handle(live_id) or (recent if recent is not None and recent[0] == live_id
                                                     else (None, None))[1]
        if handle is None or (handle.finished.is_set() and handle.take is not None
                              and handle.take.stop_reason != "cancelled"):
            return (gr.skip(),) * 6  # nothing running, or it ended on its own: the page's event shows it
        for h in (handle, *others):
            h.cancel.set()
        if not handle.finished.wait(5.0) or handle.take is None:  # stopped before the first frame
            return panel.metrics_html(state="stopped", note="Stopped before any sound: nothing to keep."), \
                *(gr.skip(),) * 5
        take = handle.take
        if heard and int(heard) < len(take.audio):
            take = self.service.trim(take.id, int(heard)) or take
            self._drop_files(take.id)  # a file written before the cut holds the whole take
        return self.take_outputs(take, takes or [])

    @staticmethod
    def _clip(clip) -> tuple[np.ndarray, int] | None:
        """The clip component's file → (samples, rate), through the bounded decoder (engine/audio.py)."""
        return None if clip is None else load_audio(clip)

    # ------------------------------------------------------------------ history

    @staticmethod
    def _leveled(take, loudness: str) -> np.ndarray:
        """The take's samples normalised to `loudness` under the default true-peak ceiling ("off": as made)."""
        if loudness in (None, "", "off"):
            return take.audio
        return normalize(take.audio, take.sample_rate, loudness, DEFAULT_CEILING).audio

    @warns(1)
    def _download_as(self, fmt, takes, loudness="off"):
        take = self.service.take(takes[-1]) if takes else None
        if take is None:
            return gr.update(label=f"Download {fmt.upper()}")
        return gr.update(value=self.take_file(take, fmt, loudness), label=f"Download {fmt.upper()}")

    @warns(1)
    def _acx_check(self, takes, loudness="off"):
        """Audible's (ACX) rules checked on the latest take as it downloads at the chosen loudness."""
        take = self.service.take(takes[-1]) if takes else None
        if take is None:
            raise ValueError("Generate a take first; then check it.")
        return render.acx_html(acx_check(self._leveled(take, loudness), take.sample_rate))

    @warns(4)
    def _captions(self, takes, request: gr.Request = None):
        """The latest take's captions under its player (studio/views/captions.py)."""
        take = self.service.take(takes[-1]) if takes else None
        if take is None:
            return self.captions.show(None, None, "")
        return self.captions.show(take, self.take_file(take), f"take-{take.id}-seed{take.seed}",
                                  self.access.page_caller(request))

    @warns(5)
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

    @warns(9)
    def _use_settings(self, take_id):
        take = self.service.take(take_id) if take_id is not None else None
        if take is None:
            raise ValueError("Select a take in the history first.")
        s = take.settings
        return (take.text, take.style or "", take.voice_id or NO_VOICE, s["temperature"], s["top_p"], s["top_k"],
                take.seed, s["max_frames"] or 0, s["repeat_guard"] or 0)
