"""The torch path on CUDA as a real fallback: `HiggsModel`'s own weights and math, with the decode step
at static shapes captured in CUDA graphs and sampling on the device, behind the fused decode protocol
(`begin` / `rows`) that the cubin backend has. It is what users get when the cubins cannot run, and the
honest baseline for the cubin path's speed-up (eager torch pays ~40 launches per layer from Python).

Static shapes. The KV cache is `HiggsModel`'s preallocated one (written in place, same addresses for the
life of a cache size). The step reads its row and position from device buffers (`row`, `pos`), writes
K/V at `pos` with `index_copy_`, and attends over a fixed window `cache[:, :length]` with the positions
after `pos` masked out, where `length` is a bucket (a power of two, at least MIN_BUCKET, at most the
cache): one graph per bucket, so a short take does not pay for 4k positions of attention every row.

Numbers. Every op is the eager step's own (`HiggsModel.decode`), except the attention window: at
`pos + 1 == length` the step is bit-identical to eager; with masked positions in the window the softmax
sums and the P·V product reduce over a longer axis of exact zeros, which can change the reduction order,
so logits may differ from eager by float rounding (0 on the CPU tests' fp32 model; tests/test_torch_graph.py
bounds it; the device check measures it on the GPU).

Sampling on the device. The sampler graph replays `engine.sampling.sample` itself (its shapes never
depend on the data and it never syncs with the host), so it picks exactly what the eager path picks on
the same logits; the SPEC D6 uniforms are computed on the device from the seed and a step counter
(splitmix64 in int64 tensor ops, wrap-around multiplies, logical shifts by masking). The delay window and
the D5 stop state follow `kernels/sampler.py`. One sampler graph per (temperature, top_k, top_p): these
pick the ops (greedy, top-k, top-p) through `sample`'s Python branches. `rows(n)` replays n × (sampler, step)
and syncs once. `load` captures every window and the default sampler up front (`warm_up`): a capture
that fails then fails the load, where "auto" falls back to eager torch with the reason.

Batching. With max_batch > 1 the engine runs every take through `decode_rows`, `HiggsModel`'s eager
batched step (no graphs; sampling on the host, per take), over per-slot caches (`prefill(slot=)`); the
graphs above serve an engine with max_batch 1. A seed's codes from the two can differ by float rounding
(the batched step pads to `min_rows` rows; the graphs run one row over a masked window).

Where there is no CUDA (the CPU tests) the "graph" is a stand-in that replays by calling the same step
function (`eager_capture`), so every path but the driver's capture runs in CI. `auto` never picks this
backend on the CPU: there the eager torch path stays the default, unchanged.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from engine.delay import MAX_ROWS
from engine.layers import apply_rope, rms_norm
from engine.model import HiggsModel
from engine.sampling import GOLDEN, MIX1, MIX2, sample, splitmix64
from engine.types import DEFAULT_TEMPERATURE, DEFAULT_TOP_K, DEFAULT_TOP_P

# The smallest attention window a step graph covers (positions); windows double up to the cache size.
MIN_BUCKET = 256
# Sampler graphs kept for distinct (temperature, top_k, top_p); each is ~30 small ops.
MAX_SAMPLER_GRAPHS = 8


def _signed(x: int) -> int:
    """A 64-bit pattern as the int64 value torch stores."""
    return x - (1 << 64) if x >= 1 << 63 else x


def _shr(z: torch.Tensor, n: int) -> torch.Tensor:
    """Logical right shift of int64 bit patterns (torch's `>>` is arithmetic: mask off the sign copies)."""
    return (z >> n) & ((1 << (64 - n)) - 1)


def splitmix64_t(z: torch.Tensor) -> torch.Tensor:
    """`engine.sampling.splitmix64` on int64 tensors (two's-complement wrap-around = uint64 arithmetic)."""
    z = z + _signed(GOLDEN)
    z = (z ^ _shr(z, 30)) * _signed(MIX1)
    z = (z ^ _shr(z, 27)) * _signed(MIX2)
    return z ^ _shr(z, 31)


def seed_base(seed: int) -> int:
    """splitmix64(seed) as int64: the per-take half of u(seed, step, k), computed once on the host."""
    return _signed(splitmix64(int(seed) & ((1 << 64) - 1)))


def device_uniforms(base: torch.Tensor, step: torch.Tensor, codebooks: torch.Tensor) -> torch.Tensor:
    """u(seed, step, k) for k in `codebooks` (int64 [K]) as fp32 [K], on the device: `base` = seed_base(seed)
    and `step` are int64 [1] tensors. Equal to `engine.sampling.uniforms` bit for bit (24-bit values)."""
    bits = splitmix64_t(base ^ (step * 8 + codebooks))
    return _shr(bits, 40).float() * 2.0 ** -24


# ------------------------------------------------------------------------------------------- capture
class EagerGraph:
    """Stand-in for a captured graph where there is no CUDA: replay calls the step function."""

    def __init__(self, fn: Callable[[], None]):
        self.replay = fn


def eager_capture(fn: Callable[[], None]) -> EagerGraph:
    fn()  # the warm-up run a CUDA capture makes, so both paths mutate the buffers alike
    return EagerGraph(fn)


class CudaCapture:
    """`capture(fn) -> graph` on one device: one warm-up run on a side stream (lazy cuBLAS / allocator
    initialisation must not happen inside the capture), then `torch.cuda.graph` on the same side stream
    in thread-local error mode (another thread's allocation cannot invalidate it). All graphs share one
    memory pool: they run one after another on one stream and pass data only through buffers allocated
    outside the graphs, so their temporaries never outlive a replay."""

    def __init__(self, device: torch.device):
        self.device = device
        self.pool = torch.cuda.graph_pool_handle()
        self.stream = torch.cuda.Stream(device)

    def __call__(self, fn: Callable[[], None]):
        caller = torch.cuda.current_stream(self.device)
        self.stream.wait_stream(caller)
        with torch.cuda.stream(self.stream):
            fn()
        caller.wait_stream(self.stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool, stream=self.stream, capture_error_mode="thread_local"):
            fn()
        return graph


# ------------------------------------------------------------------------------------------- backend
class TorchGraphBackend:
    """`HiggsModel` behind the step interface, with the decode step and the sampler replayed as graphs."""

    prefill_chunk = None  # a prompt's prefill is one eager pass
    stream = None  # torch's current stream

    def __init__(self, model: HiggsModel, *, capture: Callable | None = None, min_bucket: int = MIN_BUCKET):
        self.model, self.dims, self.device = model, model.dims, model.device
        self.precision = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}[model.dtype]
        self.capture = capture or (CudaCapture(self.device) if self.device.type == "cuda" else eager_capture)
        self.min_bucket = min_bucket
        self.info = {"graphs": "CUDA graphs" if self.device.type == "cuda" and capture is None
                     else "stand-in (no CUDA: steps replayed eagerly)"}
        d, dev = self.dims, self.device
        # Static inputs and outputs of the graphs: allocated once, updated in place.
        self.row = torch.zeros(d.codebooks, dtype=torch.long, device=dev)
        self.pos = torch.zeros(1, dtype=torch.long, device=dev)
        self.logits = torch.zeros(d.codebooks, d.codebook_vocab, dtype=torch.float32, device=dev)
        self.state = torch.zeros(4, dtype=torch.long, device=dev)  # step, eoc countdown, done, base position
        self.step, self.countdown, self.done, self.base = (self.state[i:i + 1] for i in range(4))
        self.seed = torch.zeros(1, dtype=torch.long, device=dev)  # seed_base(seed)
        self.codebook = torch.arange(d.codebooks, device=dev)
        self.history = torch.zeros(0, d.codebooks, dtype=torch.long, device=dev)
        self.step_graphs: dict[int, object] = {}
        self.sampler_graphs: dict[tuple, object] = {}
        self.positions = torch.arange(model.max_len, device=dev)
        self.taken = self.take_rows = 0
        self.sampler = None

    @property
    def max_len(self) -> int:
        return self.model.max_len

    def setup_cache(self, max_len: int) -> None:
        """Resize the model's cache; the step graphs read the old one's addresses, so they are dropped."""
        before = self.model.max_len
        self.model.setup_cache(max_len)
        if self.model.max_len != before:
            self.step_graphs.clear()
            self.positions = torch.arange(self.model.max_len, device=self.device)

    def prefill(self, ids: torch.Tensor, ref_rows: torch.Tensor | None = None, start: int = 0,
                slot: int = 0) -> torch.Tensor:
        return self.model.prefill(ids, ref_rows, start, slot=slot)

    # ---------------------------------------------------------------- batched decode (eager, the scheduler's)
    def decode_rows(self, rows: torch.Tensor, slots: list[int], positions: list[int]) -> torch.Tensor:
        """`HiggsModel.decode_rows`: the eager batched step, padded to `min_rows` (batch invariance)."""
        return self.model.decode_rows(rows, slots, positions)

    def calibrate_rows(self, max_rows: int) -> int:
        return self.model.calibrate_rows(max_rows)

    def setup_slots(self, slots: int) -> None:
        self.model.setup_slots(slots)

    @property
    def min_rows(self) -> int:
        return self.model.min_rows

    @property
    def max_rows(self) -> int:
        """The most rows `decode_rows` is calibrated for (HiggsModel.calibrate_rows)."""
        return self.model.max_rows

    # ---------------------------------------------------------------- the static step
    def bucket(self, pos: int) -> int:
        """The attention window (positions) of the step graph that serves position `pos`."""
        length = self.min_bucket
        while length < pos + 1:
            length *= 2
        return min(length, self.max_len)

    def _step(self, length: int) -> None:
        """The decode step of `HiggsModel.decode` for row `self.row` at position `self.pos`, attending over
        the window [0, length) of the cache; writes fp32 logits into `self.logits`."""
        m = self.model
        x = m.embed_audio(self.row)[None]
        cos, sin = m.cos.index_select(0, self.pos), m.sin.index_select(0, self.pos)
        hidden = self.positions[:length] > self.pos
        for layer in m.layers:
            x = x + self._attention(layer.self_attn, layer.input_layernorm(x), cos, sin, length, hidden)
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        self.logits.copy_(m.head(m.norm(x[-1])))

    def _attention(self, attn, x, cos, sin, length: int, hidden: torch.Tensor) -> torch.Tensor:
        """`engine.layers.Attention.forward` at one query, with the K/V write and the window static."""
        heads, kv_heads, d = attn.heads, attn.kv_heads, attn.head_dim
        qkv = F.linear(x, attn.wqkv).view(1, heads + 2 * kv_heads, d)
        qk = apply_rope(rms_norm(qkv[:, :heads + kv_heads], attn.qk_norm, attn.eps), cos, sin)
        attn.cache.k.index_copy_(1, self.pos, qk[:, heads:].transpose(0, 1))
        attn.cache.v.index_copy_(1, self.pos, qkv[:, heads + kv_heads:].transpose(0, 1))
        keys, values = attn.cache.k[:, :length], attn.cache.v[:, :length]
        q = qk[:, :heads].transpose(0, 1).reshape(kv_heads, heads // kv_heads, d)
        scores = (torch.bmm(q, keys.transpose(1, 2)) * d ** -0.5).masked_fill(hidden, float("-inf"))
        out = torch.bmm(torch.softmax(scores, -1, dtype=torch.float32).to(q.dtype), values)
        return attn.o_proj(out.view(heads, 1, d).transpose(0, 1).reshape(1, heads * d))

    def _run_step(self, pos: int) -> None:
        """Replay the step graph for `pos` (row and pos already in their buffers, or about to be written
        by the sampler replayed before it). A missing graph is captured here, when the buffers hold this
        very step's inputs: the warm-up then writes the same K/V and logits the replay writes."""
        length = self.bucket(pos)
        graph = self.step_graphs.get(length)
        if graph is None:
            graph = self.step_graphs[length] = self.capture(lambda: self._step(length))
        graph.replay()

    @torch.inference_mode()
    def decode(self, row: torch.Tensor, pos: int) -> torch.Tensor:
        self._check_room(pos + 1)
        self.row.copy_(row.reshape(-1))
        self.pos.fill_(pos)
        self._run_step(pos)
        return self.logits.clone()

    def _check_room(self, end: int) -> None:
        if end > self.max_len:
            raise ValueError(f"sequence of {end} positions exceeds the cache of {self.max_len}")

    # ---------------------------------------------------------------- fused decode (sampling on device)
    def _sample(self, temperature: float, top_k: int, top_p: float) -> None:
        """Sample row `step` from `self.logits` (D6), apply the delay window and the stop state (D5), store
        it in `history[step]`, and set `row` / `pos` for the step that feeds it."""
        d = self.dims
        u = device_uniforms(self.seed, self.step, self.codebook)
        row = sample(self.logits, u, temperature, top_k, top_p)
        row = torch.where(self.codebook > self.step, d.boc, row)  # codebook k is BOC until step k
        started = self.countdown >= 0
        trigger = (~started) & (self.step >= d.codebooks) & (row[:1] == d.eoc)
        count = torch.where(trigger, d.codebooks - 2, torch.where(started, (self.countdown - 1).clamp(min=0),
                                                                  self.countdown))
        self.done.copy_(torch.where((trigger | started) & (count == 0), 1, self.done))
        self.countdown.copy_(count)
        self.history.index_copy_(0, self.step, row[None])
        self.row.copy_(row)
        self.pos.copy_(self.base + self.step)
        self.step.add_(1)

    def _reset(self, logits: torch.Tensor, pos: int, seed: int) -> None:
        self.state.copy_(torch.tensor([0, -1, 0, pos]))
        self.seed.fill_(seed_base(seed))
        self.logits.copy_(logits.reshape(self.logits.shape))
        self.history.fill_(-1)

    @torch.inference_mode()
    def begin(self, logits: torch.Tensor, pos: int, *, seed: int, temperature: float, top_k: int, top_p: float,
              max_rows: int) -> None:
        """Start a take whose first row is sampled from `logits` (the prefill's) and fed at `pos`."""
        self._check_room(pos + max_rows)
        if self.history.shape[0] < max_rows:  # the sampler graphs write the old history: recapture
            self.history = torch.zeros(max_rows, self.dims.codebooks, dtype=torch.long, device=self.device)
            self.sampler_graphs.clear()
        key = (float(temperature), int(top_k), float(top_p))
        self._reset(logits, pos, seed)
        if key not in self.sampler_graphs:
            if len(self.sampler_graphs) >= MAX_SAMPLER_GRAPHS:
                self.sampler_graphs.pop(next(iter(self.sampler_graphs)))
            self.sampler_graphs[key] = self.capture(lambda: self._sample(*key))
            self._reset(logits, pos, seed)  # the warm-up sampled a row: start the take afresh
        self.sampler = self.sampler_graphs[key]
        self.start, self.taken, self.take_rows = pos, 0, max_rows

    def windows(self) -> list[int]:
        """Every attention window a step graph can have at this cache size."""
        return sorted({self.bucket(pos) for pos in range(0, self.max_len, self.min_bucket)} | {self.max_len})

    def warm_up(self) -> None:
        """Capture every window's step graph and the sampler at the default settings, so that a capture
        that fails does so at load (where "auto" falls back to eager torch with the reason) and a first
        take's time to first audio does not pay for captures. Writes K/V at position `window - 1` of each
        window and at 0: positions that a take's prefill or steps write before the mask lets them be read."""
        zero = torch.zeros(self.dims.codebooks, dtype=torch.long, device=self.device)
        for length in self.windows():
            self.decode(zero, length - 1)
        self.begin(torch.zeros_like(self.logits), 0, seed=0, temperature=DEFAULT_TEMPERATURE, top_k=DEFAULT_TOP_K,
                   top_p=DEFAULT_TOP_P, max_rows=min(MAX_ROWS, self.max_len))
        self.rows(1)

    @torch.inference_mode()
    def rows(self, n: int) -> tuple[torch.Tensor, bool]:
        """Advance up to n steps on the device, then ONE host sync: the rows sampled ([k, 8] int64) and
        whether the device stop state finished the take."""
        n = max(0, min(n, self.take_rows - self.taken))  # never step past the room begin() checked
        for i in range(n):
            self.sampler.replay()
            self._run_step(self.start + self.taken + i)
        out = torch.cat([self.history[self.taken:self.taken + n].flatten(), self.done]).cpu()  # the one sync
        self.taken += n
        return out[:-1].view(n, self.dims.codebooks), bool(out[-1])


# -------------------------------------------------------------------------------------------- engine hook
def load(checkpoint, *, device, dtype=None, max_len: int = 4096, precision: str | None = None) -> TorchGraphBackend:
    """Engine factory. On the CPU it runs with the stand-in graphs (the same static step, replayed
    eagerly); `auto` never picks it there."""
    if dtype is None:
        raise ValueError(f"precision {precision!r} needs the cubin backend; the torch-graph path runs fp32, bf16 "
                         "or fp16")
    model = HiggsModel.from_state_dict(checkpoint.dims, checkpoint.backbone, dtype=dtype, device=device,
                                       max_len=max_len)
    backend = TorchGraphBackend(model)
    backend.warm_up()
    return backend
