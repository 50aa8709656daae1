"""The KV cache planned from the card: how many takes (slots) and positions fit in the memory left after
the weights, with a stated headroom for everything that is not the cache.

    plan = plan_kv(dims, free_bytes=..., total_bytes=..., max_batch=16, max_len=4096)
    plan.slots, plan.positions, plan.summary   # "14 slots × 4096 positions = 8.5 GB KV ..."

The cache is [slots, kv_heads, positions, head_dim] keys and values per layer: 144 KiB per position for
the 4B model in bf16, so 16 slots at 4096 positions are 9.7 GB — more than a 16 GB card has beside
the weights. The planned cache must fit in the free memory measured after the weights are loaded, less
HEADROOM: activations of a prefill chunk, the CUDA graphs' pools, the codec and the allocator's
fragmentation. Slots go first (a card that holds fewer takes serves fewer listeners at once); positions
are cut only when not even one slot of `max_len` fits. Growth later (a long take) allocates the bigger
cache beside the old one, so it is checked against the free memory then (`check_room`) and refused with
a sentence rather than run into an out-of-memory in the middle of a batch.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.config import Dims

GB = 1e9
# Not the cache: a prefill chunk's activations and attention scores (~0.5 GB at 4k positions), the bucket
# graphs' pools, the codec's weights and activations (~0.5 GB), allocator fragmentation; more on big cards,
# whose users run longer prompts and more takes.
HEADROOM_MIN_BYTES = int(2 * GB)
HEADROOM_SHARE = 0.05
# Positions are cut in whole multiples of this (the torch-graph path's smallest attention window).
POSITION_STEP = 256


class NotEnoughMemory(ValueError):
    """The card cannot hold the KV cache asked for; the message says what fits and what to do."""


def kv_bytes_per_position(dims: Dims, itemsize: int = 2) -> int:
    """Keys and values of every layer for one position of one slot (bf16: itemsize 2)."""
    return dims.layers * 2 * dims.kv_heads * dims.head_dim * itemsize


def headroom(total_bytes: int) -> int:
    return max(HEADROOM_MIN_BYTES, int(HEADROOM_SHARE * total_bytes))


@dataclass(frozen=True)
class MemoryPlan:
    slots: int
    positions: int
    kv_bytes: int        # slots × positions × kv_bytes_per_position
    free_bytes: int      # measured after the weights
    headroom_bytes: int
    asked: tuple[int, int]  # (max_batch, max_len) before the plan

    @property
    def summary(self) -> str:
        cut = "" if (self.slots, self.positions) == self.asked else \
            f", cut from {self.asked[0]} × {self.asked[1]} to fit"
        return (f"{self.slots} slots × {self.positions} positions = {self.kv_bytes / GB:.1f} GB KV of "
                f"{self.free_bytes / GB:.1f} GB free after the weights, {self.headroom_bytes / GB:.1f} GB kept "
                f"as headroom{cut}")


def plan_kv(dims: Dims, *, free_bytes: int, total_bytes: int, max_batch: int, max_len: int,
            itemsize: int = 2) -> MemoryPlan:
    """The most slots (≤ max_batch) of max_len positions that fit in free_bytes less the headroom; one
    slot of fewer positions when not even one fits; NotEnoughMemory when not POSITION_STEP positions do."""
    room = headroom(total_bytes)
    budget = free_bytes - room
    per_position = kv_bytes_per_position(dims, itemsize)
    slots = min(max_batch, max(budget, 0) // (per_position * max_len))
    positions = max_len
    if slots < 1:
        slots = 1
        positions = min(max_len, max(budget, 0) // per_position // POSITION_STEP * POSITION_STEP)
        if positions < POSITION_STEP:
            raise NotEnoughMemory(
                f"the GPU has {free_bytes / GB:.1f} GB free after the weights, not enough for a KV cache of "
                f"{POSITION_STEP} positions ({POSITION_STEP * per_position / GB:.2f} GB) beside "
                f"{room / GB:.1f} GB of headroom; use a GPU with more memory, precision 'fp8', or device='cpu'")
    return MemoryPlan(int(slots), int(positions), int(slots * positions * per_position), int(free_bytes), room,
                      (max_batch, max_len))


def plan_for_device(dims: Dims, device, *, max_batch: int, max_len: int, itemsize: int = 2) -> MemoryPlan:
    """`plan_kv` from what the card says now (`torch.cuda.mem_get_info`, after the weights are loaded)."""
    import torch

    free, total = torch.cuda.mem_get_info(device)
    return plan_kv(dims, free_bytes=free, total_bytes=total, max_batch=max_batch, max_len=max_len,
                   itemsize=itemsize)


def check_room(extra_bytes: int, device, what: str) -> None:
    """Refuse an allocation of extra_bytes on a CUDA device that would leave less than the headroom free:
    the sentence names `what` (the growth asked for). No-op off CUDA."""
    import torch

    if torch.device(device).type != "cuda":
        return
    free, total = torch.cuda.mem_get_info(device)
    if extra_bytes > free - headroom(total):
        raise NotEnoughMemory(f"not enough GPU memory for {what}: it needs {extra_bytes / GB:.1f} GB and "
                              f"{free / GB:.1f} GB is free ({headroom(total) / GB:.1f} GB kept as headroom); "
                              "shorten the text, or start the studio with a smaller max_batch")
