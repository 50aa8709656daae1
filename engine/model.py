"""Torch reference math of the Higgs Audio v3 TTS model: a Qwen3 backbone fed by a text embedding and a
fused 8-codebook audio embedding, read out by the tied audio head (SPEC Part 2 §3, D4).

No I/O, no sampling. `HiggsModel` implements the step interface of docs/ARCHITECTURE.md:

    prefill(ids[L], ref_rows[R, 8] | None, start) -> fp32 logits [8, 1026]   (writes KV [start, start + L))
    decode(row[8], pos)                           -> fp32 logits [8, 1026]   (writes KV at pos)

    decode_rows(rows[B, 8], slots[B], positions[B]) -> fp32 logits [B, 8, 1026] (B takes, one step each)

Each sequence lives in a KV slot (`slot=`, default 0). A prefill is one sequence, so its tensors carry no
batch dimension: activations are [L, hidden], attention works on [heads, L, head_dim]. A decode step runs
B sequences: the matmuls take all B rows at once (the weights are read once for the batch), attention
runs per sequence over its own slot and length with the batch-1 math.

Batch invariance (docs/ARCHITECTURE.md): a row's result must not depend on how many other rows share the
step. CPU GEMM libraries pick kernels by the row count M, and the kernels sum in different orders, so
`decode_rows` pads the batch to `min_rows` rows, the smallest M from which every M up to `max_rows`
gives bit-identical rows for every weight shape of this model, measured at the current thread count
(`calibrate_rows`). A lone take then computes exactly as it would beside 15 others.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .config import AUDIO_PLACEHOLDER, Dims
from .layers import Block, KVCache, RMSNorm, rope_table, signed_sin
from .quant import QUANTIZED, linear, release_pages

# The 11 parameter names of one decoder layer (under `layers.{i}.`), as the checkpoint stores them.
LAYER_SUFFIXES = (
    "input_layernorm.weight", "post_attention_layernorm.weight",
    "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.o_proj.weight",
    "self_attn.q_norm.weight", "self_attn.k_norm.weight",
    "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight",
)

# A prefill runs in chunks of this many positions (engine/runner.py `Runner.plan`), so a newcomer
# joining a running batch delays the others' next step by one chunk at most (engine/scheduler.py).
PREFILL_CHUNK = 64

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
# A layer's projection matrices, as stored: what a weight-only precision (engine/quant.py) packs, and the
# ones fusing copies into q/k/v and gate/up matrices.
PROJECTIONS = tuple(s for s in LAYER_SUFFIXES if s.endswith("_proj.weight"))
COPIED_WHEN_FUSED = tuple(p for p in PROJECTIONS if not p.endswith(("o_proj.weight", "down_proj.weight")))


class HiggsModel(nn.Module):
    """Backbone + embeddings + tied audio head of one checkpoint, in one compute dtype.

    The text embedding keeps the dtype it was stored in (the parity fixture stores it in bf16; the real
    table is 151936 × 2560) and only looked-up rows are cast to the compute dtype, so an fp32 run never
    materialises a second full-vocab copy. Everything else is converted per tensor at load.

    With a weight-only precision (`quant` "int8" / "int4", engine/quant.py) the activations, norms,
    embeddings and head run bf16 and each layer's projection matrices are packed as the layer is built,
    straight from the stored tensors, whose pages are then released: no full float copy of the backbone
    is ever resident."""

    prefill_chunk = PREFILL_CHUNK
    stream = None  # torch's current stream

    def __init__(self, dims: Dims, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"):
        super().__init__()
        self.dims, self.dtype, self.device = dims, dtype, torch.device(device)
        self.quant: str | None = None
        self.layers = nn.ModuleList(Block(dims) for _ in range(dims.layers))
        self.norm = RMSNorm(dims.hidden, dims.rms_eps)
        # Built only on the meta device (`from_state_dict`), so the tables are given, never initialised: a
        # random normal_ there costs a first meta op's import of torch's decompositions (1 s idle, 3 s under load).
        self.text_embedding = nn.Embedding(dims.vocab, dims.hidden, _weight=torch.empty(dims.vocab, dims.hidden))
        self.audio_embedding = nn.Embedding(dims.audio_rows, dims.hidden,
                                            _weight=torch.empty(dims.audio_rows, dims.hidden))
        # Row k of a sampled row indexes block k of the fused table: W[code + 1026·k].
        self.register_buffer("offsets", torch.arange(dims.codebooks) * dims.codebook_vocab, persistent=False)
        self.max_len = 0
        self.cos = self.sin = None
        self.max_rows = self.min_rows = self.rows_threads = 0  # see calibrate_rows
        # A prefill of at least this many rows multiplies int8 matrices as bf16 GEMMs through one reused
        # scratch (quant.linear); None: always the packed kernel. Set at load by the CPU (`gemm_rows_for`).
        self.gemm_rows: int | None = None
        self.scratch: torch.Tensor | None = None

    # ---------------------------------------------------------------- construction
    @property
    def precision(self) -> str:
        """What the backbone really runs: "int8" / "int4" (weight-only), else its dtype's name."""
        return self.quant or next(name for name, dt in DTYPES.items() if dt == self.dtype)

    @classmethod
    def from_state_dict(cls, dims: Dims, state: dict[str, torch.Tensor], *, dtype: torch.dtype = torch.float32,
                        device: str | torch.device = "cpu", max_len: int = 4096, max_rows: int = 16,
                        quant: str | None = None) -> "HiggsModel":
        """Build on the meta device, then assign each stored tensor converted to its target dtype (no
        randomly initialised copy is ever allocated), then fuse q/k/v and gate/up layer by layer (each
        layer's separate matrices are freed as its fused one is built). `quant` packs the projections
        (weight-only, CPU): they are read as stored and packed layer by layer; the rest runs bf16."""
        if quant is not None:
            if quant not in QUANTIZED:
                raise ValueError(f"unknown weight-only precision {quant!r}; use one of {QUANTIZED}")
            if torch.device(device).type != "cpu":
                raise ValueError(f"precision {quant!r} is the CPU path's; on a GPU use 'fp8' or 'bf16'")
            dtype = torch.bfloat16
        with torch.device("meta"):
            model = cls(dims, dtype, device)
        expected = dict(model.named_parameters())
        missing = sorted(set(expected) - set(state))
        unexpected = sorted(set(state) - set(expected))
        if missing or unexpected:
            raise ValueError(f"backbone weights do not match the model: missing {missing[:5]}, "
                             f"unexpected {unexpected[:5]}")
        converted = {}
        for name, param in expected.items():
            tensor = state[name]
            if tuple(tensor.shape) != tuple(param.shape):
                raise ValueError(f"{name} has shape {tuple(tensor.shape)}, config.json implies {tuple(param.shape)}")
            packed_later = quant is not None and name.split(".", 2)[-1] in PROJECTIONS
            target = tensor.dtype if name == "text_embedding.weight" or packed_later else dtype
            converted[name] = tensor.to(device=device, dtype=target)
        model.load_state_dict(converted, assign=True)
        converted.clear()  # the parameters are the only references left, so fusing frees as it goes
        model.offsets = torch.arange(dims.codebooks, device=device) * dims.codebook_vocab
        model.requires_grad_(False)
        for i, layer in enumerate(model.layers):
            layer.self_attn.fuse()
            layer.mlp.fuse()
            if quant is not None:
                layer.self_attn.quantize(quant)
                layer.mlp.quantize(quant)
            # The fused (or packed) matrices are copies: the stored ones are read for the last time, and
            # a memory-mapped checkpoint's pages would otherwise stay resident beside them. (Unpacked, o and
            # down are used as stored, so their pages stay.)
            for suffix in PROJECTIONS if quant is not None else COPIED_WHEN_FUSED:
                release_pages(state[f"layers.{i}.{suffix}"])
        model.quant = quant
        model.gemm_rows = gemm_rows_for(quant)
        model.setup_cache(max_len)
        model.calibrate_rows(max_rows)
        return model

    def setup_cache(self, max_len: int) -> None:
        """Preallocate the KV cache and RoPE tables for sequences up to max_len positions (a cache that
        grows keeps every slot's contents). Every layer's new cache is allocated before any is swapped in,
        so an out-of-memory leaves the old cache and `max_len` as they were and raises a sentence."""
        max_len = min(max_len, self.dims.max_positions)
        if max_len == self.max_len:
            return
        try:
            caches = [layer.self_attn.cache.grown(max_len) if layer.self_attn.cache is not None else
                      KVCache(self.dims.kv_heads, max_len, self.dims.head_dim, self.dtype, self.device)
                      for layer in self.layers]
            cos, sin = rope_table(self.dims, max_len, self.dtype, self.device)
        except torch.OutOfMemoryError:
            caches = None  # raised below, outside the handler, whose traceback would keep them alive
        if caches is None:
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
            raise ValueError(f"not enough memory to grow the KV cache to {max_len} positions (it keeps "
                             f"{self.max_len}); shorten the text, or start with a smaller max_batch")
        for layer, cache in zip(self.layers, caches):
            layer.self_attn.cache = cache
        self.max_len = max_len
        self.cos, self.sin = cos[:, None], signed_sin(sin)[:, None]  # [max_len, 1 (heads), d]

    @property
    def info(self) -> dict[str, str]:
        """The backend's own facts for engine.info: the reference path adds none."""
        return {}

    def setup_slots(self, slots: int) -> None:
        """Nothing to preallocate: a KV slot is allocated the first time a take uses it."""

    def calibrate_rows(self, max_rows: int) -> int:
        """The smallest row count m such that every M in [m, max_rows] gives bit-identical rows in every
        matmul shape of the decode step, measured now (the GEMM library picks its kernel by M, dtype and
        thread count, never by the values, so random inputs tell). `decode_rows` pads to it."""
        layer = self.layers[0]
        weights = [layer.self_attn.wqkv, layer.self_attn.wo, layer.mlp.w_gate_up, layer.mlp.w_down,
                   self.audio_embedding.weight]
        gen = torch.Generator().manual_seed(0)
        low = 1
        for w in weights:
            x = torch.randn(max_rows, w.shape[1], generator=gen).to(device=self.device, dtype=self.dtype)
            want = linear(x, w)
            m = max_rows
            while m > 1 and torch.equal(linear(x[:m - 1], w), want[:m - 1]):
                m -= 1
            low = max(low, m)
        self.max_rows, self.min_rows, self.rows_threads = max_rows, low, torch.get_num_threads()
        return low

    # ---------------------------------------------------------------- kept prefixes (engine/prefix.py)
    @property
    def prefill_scheme(self) -> str:
        """What a prefill's KV bits depend on besides the kernels: the precision and the chunking."""
        return f"{self.precision}, chunks of {self.prefill_chunk}, GEMM from {self.gemm_rows} rows"

    @torch.inference_mode()
    def read_prefix(self, slot: int, length: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Copies of every layer's KV at positions [0, length) of `slot`."""
        return [layer.self_attn.cache.read(slot, length) for layer in self.layers]

    @torch.inference_mode()
    def write_prefix(self, slot: int, kv: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Every layer's KV at positions [0, len) of `slot` from `read_prefix`'s copies."""
        if len(kv) != len(self.layers) or kv[0][0].shape[1] > self.max_len:
            raise ValueError("a kept prefix does not fit this model's cache")
        for layer, (k, v) in zip(self.layers, kv):
            layer.self_attn.cache.write(slot, k, v)

    # ---------------------------------------------------------------- embeddings and head
    def embed_text(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.text_embedding.weight).to(self.dtype)

    def embed_audio(self, rows: torch.Tensor) -> torch.Tensor:
        """rows [..., 8] of codes in [0, 1026) → Σ_k W[row_k + 1026·k], in the backbone dtype."""
        return F.embedding(rows + self.offsets, self.audio_embedding.weight).sum(-2)

    def head(self, h: torch.Tensor) -> torch.Tensor:
        """Final-normed hidden [hidden] → fp32 logits [8, 1026] through the tied audio table."""
        return (self.audio_embedding.weight @ h).float().view(self.dims.codebooks, self.dims.codebook_vocab)

    def embed_prompt(self, ids: torch.Tensor, ref_rows: torch.Tensor | None) -> torch.Tensor:
        return embed_prompt(ids, ref_rows, self.embed_text, self.embed_audio)

    # ---------------------------------------------------------------- the step interface
    def forward(self, x: torch.Tensor, start: int, slot: int = 0) -> torch.Tensor:
        """x [L, hidden] at positions [start, start + L) of `slot` → final-normed hidden state of the last
        position. Causal over the new segment; every cached position before `start` is visible."""
        n = x.shape[0]
        if start + n > self.max_len:
            raise ValueError(f"sequence of {start + n} positions exceeds the cache of {self.max_len}")
        cos, sin = self.cos[start:start + n], self.sin[start:start + n]
        mask = None
        if n > 1:
            mask = torch.ones(n, start + n, dtype=torch.bool, device=x.device).tril(start)
        scratch = self.prefill_scratch() if self.gemm_rows is not None and n >= self.gemm_rows else None
        for layer in self.layers:
            x = layer(x, cos, sin, start, mask, slot, scratch)
        return self.norm(x[-1])

    def prefill_scratch(self) -> torch.Tensor:
        """The one bf16 buffer a prefill dequantises each int8 matrix into in turn (the largest matrix's
        size: 100 MB at full size), allocated at the first long prefill and kept."""
        if self.scratch is None:
            layer = self.layers[0]
            sizes = [w.shape[0] * w.shape[1] for w in (layer.self_attn.wqkv, layer.self_attn.wo,
                                                         layer.mlp.w_gate_up, layer.mlp.w_down)]
            self.scratch = torch.empty(max(sizes), dtype=self.dtype, device=self.device)
        return self.scratch

    @torch.inference_mode()
    def prefill(self, ids: torch.Tensor, ref_rows: torch.Tensor | None = None, start: int = 0,
                slot: int = 0) -> torch.Tensor:
        ids = ids.to(self.device)
        return self.head(self.forward(self.embed_prompt(ids, ref_rows), start, slot))

    @torch.inference_mode()
    def decode(self, row: torch.Tensor, pos: int, slot: int = 0) -> torch.Tensor:
        """One sequence's step at batch 1 (GEMV shapes): what a backend that does not batch builds on
        (the CUDA-graph torch backend, `HostRows`). Not bit-identical to a row of `decode_rows`; the
        engine's torch takes always decode through `decode_rows`."""
        return self.head(self.forward(self.embed_audio(row.to(self.device))[None], pos, slot))

    @torch.inference_mode()
    def decode_rows(self, rows: torch.Tensor, slots: list[int], positions: list[int]) -> torch.Tensor:
        """One decode step of B sequences: rows [B, 8] (sequence i's last sampled row, written at
        positions[i] of slots[i]) → fp32 logits [B, 8, 1026]. Runs max(B, min_rows) rows, so each row
        computes exactly as it would in any other batch of up to `max_rows` (module docstring)."""
        b = rows.shape[0]
        if b > self.max_rows:
            raise ValueError(f"a step of {b} sequences exceeds max_rows={self.max_rows}")
        if max(positions) >= self.max_len:
            raise ValueError(f"position {max(positions)} exceeds the cache of {self.max_len}")
        if torch.get_num_threads() != self.rows_threads:  # the GEMM kernels chosen depend on it
            self.calibrate_rows(self.max_rows)
        x = self.embed_audio(rows.to(self.device))
        if b < self.min_rows:
            x = torch.cat([x, x.new_zeros(self.min_rows - b, x.shape[1])])
        where = torch.tensor(positions, device=self.device)
        cos, sin = self.cos[where], self.sin[where]
        for layer in self.layers:
            x = layer.step(x, cos, sin, slots, positions)
        h = self.norm(x)
        return F.linear(h, self.audio_embedding.weight)[:b].float().view(b, self.dims.codebooks,
                                                                          self.dims.codebook_vocab)


# From this many rows a bf16 GEMM through the scratch beats the packed int8 kernel on a CPU with native bf16
# (docs/PERFORMANCE.md: at full size 8 rows cost 323 ms packed, 467 ms bf16; 40 rows 1,788 against 652 ms).
PREFILL_GEMM_ROWS = 16


def gemm_rows_for(quant: str | None, native_bf16: bool | None = None) -> int | None:
    """`HiggsModel.gemm_rows` for a precision on this CPU: int8 with native bf16 arithmetic only. Without it
    torch's bf16 GEMM runs scalar loops, and an fp32 one through the scratch measured no faster than the
    packed kernel at 64 rows (docs/PERFORMANCE.md), so the packed kernel stays."""
    if quant != "int8":
        return None
    if native_bf16 is None:
        from .cpu import cpu_facts
        native_bf16 = cpu_facts()["native_bf16"]
    return PREFILL_GEMM_ROWS if native_bf16 else None


def embed_prompt(ids: torch.Tensor, ref_rows: torch.Tensor | None, embed_text, embed_audio) -> torch.Tensor:
    """Prompt input rows: text embeddings, with the k-th AUDIO_PLACEHOLDER position taking the fused
    embedding of ref_rows[k] (SPEC Part 2 §4); the placeholder's own id never reaches the text table.
    `embed_text(ids)` / `embed_audio(rows)` are the backend's own lookups (dtype and accumulation are its
    business)."""
    slots = ids == AUDIO_PLACEHOLDER
    x = embed_text(torch.where(slots, 0, ids))
    count = int(slots.sum())
    if count:
        if ref_rows is None or ref_rows.shape[0] < count:
            got = 0 if ref_rows is None else ref_rows.shape[0]
            raise ValueError(f"prompt has {count} reference-audio placeholders but {got} reference rows")
        x[slots] = embed_audio(ref_rows[:count].to(x.device))
    return x


def param_count(dims: Dims) -> int:
    """Backbone + embedding parameters of a checkpoint (used to pick a default precision)."""
    attn = dims.hidden * dims.head_dim * (2 * dims.heads + 2 * dims.kv_heads) + 2 * dims.head_dim
    mlp = 3 * dims.hidden * dims.intermediate
    per_layer = attn + mlp + 2 * dims.hidden
    return dims.layers * per_layer + dims.hidden * (1 + dims.vocab + dims.audio_rows)


def rel_error(x: torch.Tensor, ref: torch.Tensor) -> float:
    """max|x − ref| / max|ref| (the parity fixture's logit metric)."""
    x, ref = torch.as_tensor(x).double(), torch.as_tensor(ref).double()
    return float((x - ref).abs().max() / ref.abs().max())


__all__ = ["HiggsModel", "embed_prompt", "param_count", "rel_error", "DTYPES", "LAYER_SUFFIXES", "PROJECTIONS"]
