"""A take: as it goes through the studio's line (`TakeHandle`), followed into an asyncio loop (`LoopTake`),
and as the history keeps it (`Take`). studio/takes/run.py makes the handles, studio/takes/service.py
records the takes; every door follows them."""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.peaks import peak_ceiling
from engine.types import Metrics, SamplingParams
from studio.audio.loudness import Loudness, measure
from studio.takes.gpu_queue import GpuQueue, Job


@dataclass
class Take:
    """One finished (or stopped) generation, as the history keeps it."""

    id: int
    created: float
    text: str  # what the user typed
    prompt_text: str  # what the model saw: style prefix + text
    voice_id: str | None
    voice_name: str | None
    style: str | None
    settings: dict[str, Any]
    seed: int
    metrics: Metrics
    audio: np.ndarray
    sample_rate: int
    warnings: list[str]
    door: str  # where the take was asked: "ui", "api", "ws", "mcp", "wyoming", "project"
    pronunciations: tuple = ()  # the pronunciation rules that fired on its text (studio/text/pronounce.py Rule)
    peak_cut_db: float = 0.0  # the deepest cut the true-peak ceiling made (engine/peaks.py; 0.0: none)

    @property
    def stop_reason(self) -> str:
        return self.metrics.stop_reason or ""

    @functools.cached_property
    def loudness(self) -> Loudness:
        """The take's levels as made (studio/audio/loudness.py), measured when first asked for: by the page or
        the API, off the GPU line, not in the slot the take was made in."""
        return measure(self.audio, self.sample_rate)

    @property
    def seconds(self) -> float:
        return len(self.audio) / self.sample_rate

    def recipe(self) -> dict[str, Any]:
        """Everything needed to reproduce this take (PRODUCT §7.7): with `dictionary`, the pronunciation rules
        that fired on it (none: `[]`), so that the recipe reads the text as it was read whatever the studio's
        dictionary holds by then (the speech API's `dictionary` field takes it). `peak_ceiling`, when the
        true-peak ceiling every take passes acted on this one: the ceiling and the deepest cut it made."""
        return {"text": self.text, "voice_id": self.voice_id, "style": self.style, "seed": self.seed,
                **self.settings, "dictionary": [rule.to_json() for rule in self.pronunciations],
                **peak_ceiling(self.peak_cut_db)}


class TakeHandle:
    """One take on its way through the line: what was asked (`order`, studio/takes/order.py) and its `plan`
    (studio/takes/prepare.py), the settings it runs with (`params`, with its seed), the notes for the user
    (`warnings`), the `cancel` any thread may set, and the recorded `take` once `finished` is set. `stream()` puts it in the line and yields what it makes; however the stream ends
    (the consumer stops early, fails or goes away), a take that has not finished is cancelled."""

    def __init__(self, line: GpuQueue, order: Any, params: SamplingParams, warnings: list[str],
                 work: Callable[[Job, TakeHandle], None], *, plan: Any = None):
        self.order, self.plan, self.params, self.warnings = order, plan, params, warnings
        self.cancel = threading.Event()
        self.finished = threading.Event()
        self.take: Any = None  # a Take (a LongTake for the page's long form) once finished
        self._line, self._work = line, work

    @property
    def seed(self) -> int:
        return self.params.seed

    def stream(self, *, positions: bool = False) -> Iterator[Any]:
        try:
            yield from self._line.run(lambda job: self._work(job, self), self.cancel, caller=self.order.caller,
                                      positions=positions)
        finally:
            if not self.finished.is_set():
                self.cancel.set()  # stopped, failed or abandoned by the consumer: free the slot

    def finish(self, take: Any = None) -> None:
        """Record the end (the worker calls it, so the take lands even when the consumer has gone)."""
        self.take = take
        self.finished.set()


_END = object()


class LoopTake:
    """A take followed into an asyncio loop: a thread of its own follows `handle.stream()` (it blocks while the
    take waits its turn and between chunks) and hands each item to the loop. Started at once."""

    def __init__(self, handle: TakeHandle, loop: asyncio.AbstractEventLoop, *, name: str = "higgs-take"):
        self.handle, self._loop = handle, loop
        self._items: asyncio.Queue = asyncio.Queue()
        threading.Thread(target=self._pump, name=name, daemon=True).start()

    def _pump(self) -> None:
        try:
            for item in self.handle.stream():
                self._hand(item)
            self._hand(_END)
        except Exception as exc:  # handed to the loop as the last item, where the client hears it
            self._hand(exc)

    def _hand(self, item) -> None:
        try:
            self._loop.call_soon_threadsafe(self._items.put_nowait, item)
        except RuntimeError:  # the loop has stopped (the server is shutting down)
            self.handle.cancel.set()

    async def items(self) -> AsyncIterator[Any]:
        """The stream's items as they come; what it raised, if anything, comes as the last item."""
        while (item := await self._items.get()) is not _END:
            yield item

    def cancel(self) -> None:
        self.handle.cancel.set()  # the engine ends the take at its next step; its slot goes to the next one


__all__ = ["LoopTake", "Take", "TakeHandle"]
