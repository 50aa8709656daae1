"""The step interface every backend implements, as typing Protocols (the engine checks them once, at load).

`StepBackend` is what any take needs: a prefill that fills the KV cache and returns the first step's
logits, and a one-row decode step. `BatchedBackend` adds the step of B takes in their own KV slots, which
the engine's scheduler runs (engine/scheduler.py); `BatchedSampling` lets that scheduler sample the B takes'
next rows on the device in one launch from logits that stay there (without it, the scheduler samples on the
host). `FusedDecode` is the single-stream path that samples on the device and syncs once per chunk
(`begin`, then `rows(n)`). Logits are fp32 [8, 1026] (one row per codebook); rows are int64 [8] codes in
0..1025 (the delay pattern's BOC/EOC included).

    eager torch (`HiggsModel`)    StepBackend + BatchedBackend
    torch-graph                   StepBackend + BatchedBackend + FusedDecode
    cubin                         StepBackend + BatchedBackend + FusedDecode + BatchedSampling

Which path a take runs (engine/generate.py): with a `BatchedBackend` and max_batch > 1, or without a
`FusedDecode`, every take goes through the scheduler; otherwise takes run one at a time through the fused
decode, or through `HostRows` (engine/runner.py) for a backend with only the per-step decode.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Protocol, runtime_checkable

import torch


@runtime_checkable
class StepBackend(Protocol):
    precision: str  # what it really runs ("fp32", "bf16", "fp8", "int8", …)
    max_len: int  # KV positions allocated now
    prefill_chunk: int | None  # a prefill runs in chunks of this many positions (None: whole)
    stream: Any  # the CUDA stream it launches on (None: torch's current one)

    @property
    def info(self) -> dict[str, Any]:
        """The backend's own facts for `engine.info` (kernel target and loader, self-check, graphs)."""

    def prefill(self, ids: torch.Tensor, ref_rows: torch.Tensor | None = None, start: int = 0,
                slot: int = 0) -> torch.Tensor:
        """Prompt ids [L] (and reference rows [R, 8] for the audio placeholders) at positions
        [start, start + L) of KV slot `slot` → the logits of the first decode step."""

    def decode(self, row: torch.Tensor, pos: int) -> torch.Tensor:
        """One row [8] fed at position `pos` of slot 0 → the next step's logits."""

    def setup_cache(self, max_len: int) -> None:
        """(Re)allocate the KV cache for `max_len` positions, keeping what it holds."""


@runtime_checkable
class BatchedBackend(StepBackend, Protocol):
    min_rows: int  # a step of fewer rows is padded to this many (batch invariance)
    max_rows: int  # the most rows `calibrate_rows` measured

    def decode_rows(self, rows: torch.Tensor, slots: list[int], positions: list[int]) -> torch.Tensor:
        """One step of B takes: rows [B, 8], take i fed at positions[i] of KV slot slots[i] → logits
        [B, 8, 1026], each take's the same bits whatever runs beside it."""

    def setup_slots(self, slots: int) -> None:
        """KV slots for `slots` takes decoded together (the engine's max_batch)."""

    def calibrate_rows(self, max_rows: int) -> int:
        """Measure `min_rows` for steps of up to `max_rows` rows; returns it."""


@runtime_checkable
class FusedDecode(StepBackend, Protocol):
    def begin(self, logits: torch.Tensor, pos: int, *, seed: int, temperature: float, top_k: int, top_p: float,
              max_rows: int) -> None:
        """Start a take whose first row is sampled from `logits` (the prefill's) and fed at `pos`."""

    def rows(self, n: int) -> tuple[torch.Tensor, bool]:
        """Run up to n steps on the device, then one host sync: the rows sampled [k, 8] and whether the
        device's stop state (<eoc>, the length cap) ended the take."""


class RowDraw(NamedTuple):
    """What one take's next row depends on besides its logits: its seed and settings (engine/types.py
    `SamplingParams`), the row index `step` (the counter of its uniforms and the delay window's clock) and
    its stop rule's EOC countdown (-1 before an EOC; engine/delay.py `StopRule`)."""

    seed: int
    temperature: float
    top_k: int
    top_p: float
    step: int
    countdown: int


@runtime_checkable
class BatchedSampling(BatchedBackend, Protocol):
    def sample_rows(self, logits: list[torch.Tensor], draws: list[RowDraw]) -> torch.Tensor:
        """B takes' next rows in one launch on the device, each from its own logits [8, 1026] (on the device)
        with its own `RowDraw`: the draws of engine/sampling.py `sample` for the same seeds, then the delay
        window and the EOC countdown of engine/delay.py `StopRule`. Returns int64 [B, 8 + 2] on the device:
        the row, then 1 where that step ends the take's EOC tail, then 1 where its logits were finite (0: its
        row means nothing)."""
