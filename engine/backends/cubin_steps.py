"""The cubin backend's two decode steps beside the single-row `decode`: the batched step of the engine's
scheduler (`decode_rows`, with `sample_rows`, its takes' rows sampled on the device) and the fused
single-stream decode that samples on the device (`begin` / `rows`). `CubinBackend`
(engine/backends/cubin.py) inherits both; they use its weights, caches, static buffers and `_on_stream`.

Batched decode. `decode_rows(rows [M, 8], slots, positions)` runs one step of M takes, each in
its own KV slot at its own position, and returns fp32 logits [M, 8, 1026] on the device for the engine's
scheduler, which samples them there (`sample_rows`, below). Per layer, 9 launches for the whole batch:

    rmsnorm (-> fp8) | skinny GEMM qkv | batched q/k norm + RoPE + KV write (per-row slot and position)
    batched attention + combine (per-row slot and length) | skinny GEMM o_proj (+ residual, split-K)
    rmsnorm (-> fp8) | skinny GEMM gate_up | silu·mul (-> fp8) | skinny GEMM down (+ residual, split-K)

then the final rmsnorm and the audio head as one more skinny GEMM (fp32 logits). The skinny GEMMs
(kernels/batch.py) are BF16, W8A8, or W8A16 for o_proj on the FP8 path (its input is the attention output,
which has no quantiser; FP8 weight, BF16 activations, BF16 MMA). Rows are padded to a bucket of 1, 4, 8
or 16 (`ROW_BUCKETS`), and each bucket's step is one CUDA graph whose inputs (rows, slots, positions,
lengths) are device buffers copied in before the replay; padding rows carry code 0, position -1 (the KV
write skips them) and length 1 over slot 0, and their outputs are discarded. More than 16 takes run as
several steps of at most 16.

Batch invariance by construction: the GEMM always multiplies a 16-row activation tile in a fixed K order
whatever M is, every other kernel (norms, silu·mul, RoPE/KV write, attention, combine) runs one program
per row, and the embedding sums the 8 codebooks elementwise in a fixed order, so a take's logits are the
same bits alone, in any bucket, beside any other takes, in any slot (tests/test_cubin_batch.py). They are
not the bits of the single-stream step (`decode` / `rows`: GEMVs, another reduction order): an engine
with max_batch 1 runs that fused path, one with max_batch > 1 runs every take, a lone one included,
through `decode_rows`, so the same seed gives codes that differ by float rounding between the two.

Batched sampling. `sample_rows(logits, draws)` samples the next row of B takes in ONE launch of the batched
sampler: `sample_batch_kernel` (kernels/batch.py, one program per take) or, with the "grid" sampler,
`sample_grid_kernel` as the grid (8, B) (kernels/sampler.py), the committed cubins either way. Each take's
sampler state (seed, settings, step, EOC countdown) is written from the scheduler's books for that step
(`RowDraw`, engine/backends/base.py), so the device keeps no take's state between steps and a take joins,
leaves or moves to another batch position at any step boundary. A program reads only its own take's
logits and state, so a take's row is the same in any company. The picks are SPEC D6's, as engine/sampling.py
makes them (the same counter RNG; a pick can differ only where u or top_p falls within float rounding of a
boundary: the kernels' fp32 sums and exp are not torch's), and the kernel applies the delay window and the
EOC countdown of engine/delay.py. Only the rows, the EOC-tail flags and a finite flag per take come back
(`[B, 10]` int64). A take whose logits hold NaN or inf is flagged and sampled from zeros instead (no kernel
sees a NaN); the engine ends it. The kernels also write each row's fused embedding, unused here: the
batched step embeds its rows itself, in its own sum order, so the logits are the same bits whoever sampled
the rows.

Fused decode. `begin` sets the sampler state from the take's seed and settings; `rows(n)` replays one CUDA
graph per step (sample row `step` on the device, embed it, run the GEMV step at its position) and syncs
once at the end. Off CUDA the same step runs eagerly (the CPU tests).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.backends.base import RowDraw
from engine.backends.torch_graph import EagerGraph

# Row buckets of the batched step: one CUDA graph each; M takes run in the smallest bucket that holds them.
ROW_BUCKETS = (1, 4, 8, 16)
BF16 = torch.bfloat16


class BatchedStep:
    """`decode_rows` over the backend's per-slot caches, one graph per row bucket, and `sample_rows`, its rows."""

    min_rows = 1  # invariant by construction (module docstring): no padding to calibrate
    _draw_buffers: tuple | None = None  # `sample_rows`' row history, next inputs and grid scratch

    def calibrate_rows(self, max_rows: int) -> int:
        """Every row count computes alike here, so there is nothing to measure: records `max_rows`."""
        self.max_rows = max_rows
        return self.min_rows

    def _capture_buckets(self) -> None:
        """Capture every bucket's graph now, with all rows padding (position -1 writes no KV), so no take
        pays for captures in the middle of a batch; only where takes decode together (slots > 1)."""
        if self.slots < 2 or self._calib is not None or not self.max_len:
            return
        with self._on_stream():
            self.b_meta[0].zero_()
            self.b_meta[1].fill_(-1)
            self.b_meta[2].fill_(1)
            self.b_rows.zero_()
            for p in ROW_BUCKETS:
                self.row_graphs[p] = self._capture_rows(p)

    @staticmethod
    def bucket(m: int) -> int:
        """The row bucket (and graph) a step of m ≤ 16 takes runs in."""
        return next(b for b in ROW_BUCKETS if b >= m)

    @torch.inference_mode()
    def decode_rows(self, rows: torch.Tensor, slots: list[int], positions: list[int], *,
                    bucket: int | None = None) -> torch.Tensor:
        """One decode step of B takes: rows [B, 8] (take i's last sampled row, fed at positions[i] of KV slot
        slots[i]) -> fp32 logits [B, 8, 1026]. Each take's logits are the same bits whatever else runs
        beside it (module docstring); B > 16 runs as steps of at most 16 takes. `bucket` runs B ≤ bucket
        takes in that bucket's graph, padded (the self-check: one take beside three padding rows)."""
        b = rows.shape[0]
        if not b == len(slots) == len(positions):
            raise ValueError(f"decode_rows: {b} rows for {len(slots)} slots and {len(positions)} positions")
        for slot in slots:
            self._check_slot(slot)
        self._check_room(max(positions) + 1)
        if len(set(slots)) != b:
            raise ValueError(f"decode_rows: two takes in one KV slot ({slots})")
        if bucket is not None and (bucket not in ROW_BUCKETS or b > bucket):
            raise ValueError(f"decode_rows: {b} rows do not run in bucket {bucket} (buckets {ROW_BUCKETS})")
        rows = rows.to(self.device)
        out = torch.empty(b, self.dims.codebooks, self.dims.codebook_vocab, dtype=torch.float32, device=self.device)
        group = ROW_BUCKETS[-1]
        with self._on_stream():
            for lo in range(0, b, group):
                hi = min(lo + group, b)
                self._step_group(rows[lo:hi], slots[lo:hi], positions[lo:hi], bucket)
                out[lo:hi] = self.b_logits[:hi - lo].view(hi - lo, *out.shape[1:])
        return out

    def _step_group(self, rows: torch.Tensor, slots: list[int], positions: list[int], bucket: int | None = None
                    ) -> None:
        """Copy ≤ 16 takes' inputs into the static buffers, padded to their bucket, and replay its graph."""
        m = rows.shape[0]
        p = bucket or self.bucket(m)
        pad = p - m
        meta = torch.tensor([[*slots, *[0] * pad], [*positions, *[-1] * pad], [x + 1 for x in positions] + [1] * pad],
                            dtype=torch.int32)
        self.b_meta[:, :p].copy_(meta)
        self.b_rows[:m].copy_(rows)
        self.b_rows[m:p].zero_()
        graph = self.row_graphs.get(p)
        if graph is None:  # captured when the buffers hold this very step: the warm-up runs are this step
            graph = self.row_graphs[p] = self._capture_rows(p)
        graph.replay()

    def _capture_rows(self, p: int):
        if self.device.type != "cuda":
            return EagerGraph(lambda: self._step_rows(p))  # the CPU tests: the same step, replayed eagerly
        from kernels.runtime import capture_graph

        return capture_graph(lambda: self._step_rows(p), self.stream or torch.cuda.current_stream(self.device))

    def _step_rows(self, p: int) -> None:
        """The batched step over the first p rows of the static buffers (the bucket's graph body). The
        residual stream is rebuilt from the rows' embeddings, so a replay (or a capture's warm-up run)
        recomputes the same step from its inputs."""
        ops, d = self.ops, self.dims
        slots, positions, lens = self.b_meta[0, :p], self.b_meta[1, :p], self.b_meta[2, :p]
        h = self.b_h[:p]
        e = F.embedding(self.b_rows[:p] + self.offsets, self.audio_w).float()
        acc = e[:, 0]
        for k in range(1, d.codebooks):  # elementwise, in codebook order: no reduction whose order could vary
            acc = acc + e[:, k]
        h.copy_(acc)
        fp8 = self.precision == "fp8"
        for L in self.layers:
            xn = ops.rmsnorm(h, L.ln1, d.rms_eps, scale=L.x_qkv)
            qkv = ops.skinny_gemm(xn, L.qkv, w_scale=L.qkv_s, x_scale=L.rows_qkv if fp8 else None)
            q = ops.qk_norm_rope_kv_batch(qkv, L.q_norm, L.k_norm, self.cos, self.sin, slots, positions, L.kc, L.vc,
                                          heads=d.heads, kv_heads=d.kv_heads, eps=d.rms_eps)
            a = ops.decode_attention_batch(q, L.kc, L.vc, slots, lens, scratch=self.b_attn_scratch)
            ops.skinny_gemm(a.view(p, -1), L.o, w_scale=L.o_s, residual=h, out=h, scratch=self.b_split)
            xn = ops.rmsnorm(h, L.ln2, d.rms_eps, scale=L.x_gate_up)
            gu = ops.skinny_gemm(xn, L.gate_up, w_scale=L.gate_up_s, x_scale=L.rows_gate_up if fp8 else None)
            act = ops.silu_mul(gu, scale=L.x_down)
            ops.skinny_gemm(act, L.down, w_scale=L.down_s, x_scale=L.rows_down if fp8 else None, residual=h, out=h,
                            scratch=self.b_split)
        ops.skinny_gemm(ops.rmsnorm(h, self.norm_w, d.rms_eps), self.audio_w, out=self.b_logits[:p])

    @torch.inference_mode()
    def sample_rows(self, logits: list[torch.Tensor], draws: list[RowDraw]) -> torch.Tensor:
        """B takes' next rows in one sampler launch (module docstring): logits [8, 1026] per take, on the
        device; returns int64 [B, 8 + 2] on the device: the row, 1 where it ends the take's EOC tail, 1 where
        its logits were finite."""
        ops, d = self.ops, self.dims
        b = len(draws)
        if b != len(logits) or not 0 < b <= self.slots:
            raise ValueError(f"sample_rows: {len(logits)} takes' logits for {b} draws ({self.slots} slots)")
        state = [[0] * (ops.STATE_DONE + 1) for _ in draws]
        for s, r in zip(state, draws):
            seed = r.seed & (2**64 - 1)  # the kernel reads the 64 bits as int64
            s[ops.STATE_STEP], s[ops.STATE_TOP_K], s[ops.STATE_COUNTDOWN] = r.step, r.top_k, r.countdown
            s[ops.STATE_SEED] = seed - 2**64 if seed >= 2**63 else seed
        with self._on_stream():
            x = torch.stack([t.to(self.device).reshape(d.codebooks, d.codebook_vocab) for t in logits])
            finite = x.sum((1, 2)).isfinite()  # engine/sampling.py `sample_row`'s test, per take
            x = torch.where(finite[:, None, None], x, 0.0)
            # From pinned memory without a wait, so the whole launch queues behind the step still running
            # and the host waits once, for the rows (the caller's transfer).
            pinned = self.device.type == "cuda"
            state = torch.tensor(state, dtype=torch.int64, pin_memory=pinned).to(self.device, non_blocking=True)
            params = torch.tensor([[r.temperature, r.top_p] for r in draws], dtype=torch.float32,
                                  pin_memory=pinned).to(self.device, non_blocking=True)
            rows, x_out, scratch = self._sampler_buffers()
            if self.sampler == "grid":
                ops.sample_grid(x, self.audio_w, state, params, rows[:b], x_out[:b], scratch)
            else:
                ops.sample_batch(x, self.audio_w, state, params, rows[:b], x_out[:b])
            picked = rows[torch.arange(b, device=self.device), state[:, ops.STATE_STEP] - 1]
            return torch.cat([picked.long(), state[:, ops.STATE_DONE, None], finite[:, None].long()], 1)

    def _sampler_buffers(self) -> tuple:
        """`sample_rows`' static buffers for `slots` takes, (re)made when the slots or the cache length change:
        the row history the kernels write row `step` into (int32 [slots, max_len, 8]: a take's step is below
        its last position), the next inputs they also write, and the grid sampler's picks and tickets."""
        shape = (self.slots, self.max_len, self.dims.codebooks)
        if self._draw_buffers is None or self._draw_buffers[0].shape != shape:
            self._draw_buffers = (
                torch.zeros(shape, dtype=torch.int32, device=self.device),
                torch.zeros(self.slots, self.dims.hidden, dtype=BF16, device=self.device),
                self.ops.sampler_scratch(self.device, takes=self.slots) if self.sampler == "grid" else None)
        return self._draw_buffers


class FusedStep:
    """The fused single-stream decode: sampling on the device, one CUDA graph per step."""

    def begin(self, logits: torch.Tensor, pos: int, *, seed: int, temperature: float, top_k: int, top_p: float,
              max_rows: int) -> None:
        """Start a take whose first row is sampled from `logits` (the prefill's) and fed at `pos`."""
        self._check_room(pos + max_rows)
        with self._on_stream():
            state, params = self.ops.sampler_state(seed, top_k, temperature, top_p, self.device)
            if self.graph is None or self.rows_buf.shape[0] < max_rows:
                # max_len rows, the most any take can have (_check_room above): the self-check's short take at
                # load sizes the buffer, and the graph captured over it, for every later take (no recapture)
                self.state, self.params = state, params
                self.rows_buf = torch.full((self.max_len, self.dims.codebooks), -1, dtype=torch.int32, device=self.device)
                self.x_row = torch.zeros(1, self.dims.hidden, dtype=BF16, device=self.device)
                self.h_row = torch.zeros_like(self.x_row)
                self.base = torch.zeros(1, dtype=torch.int64, device=self.device)
                self.graph = None
            else:  # graph inputs are updated in place: same addresses, new values
                self.state.copy_(state)
                self.params.copy_(params)
                self.rows_buf.fill_(-1)
            self.logits.copy_(logits.reshape(-1))
            self.base.fill_(pos)
        self.taken, self.take_rows = 0, max_rows

    def _fused_step(self) -> None:
        """Sample row state.step from self.logits, embed it, and run the step at base + step."""
        ops = self.ops
        if self.sampler == "grid":
            ops.sample_grid(self.logits, self.audio_w, self.state, self.params, self.rows_buf, self.x_row.view(-1),
                            self.sampler_scratch)
        else:
            ops.sample(self.logits, self.audio_w, self.state, self.params, self.rows_buf, self.x_row.view(-1))
        self.pos.copy_(self.base + self.state[:1] - 1)  # the row just sampled sits at base + step
        self.h_row.copy_(self.x_row)
        self._layers(self.h_row)

    @torch.inference_mode()
    def rows(self, n: int) -> tuple[torch.Tensor, bool]:
        """Advance up to n steps on the device, then ONE host sync: the rows sampled ([k, 8] int64) and
        whether the sampler's stop state finished the take."""
        n = max(0, min(n, self.take_rows - self.taken))  # never step past the room begin() checked
        with self._on_stream():
            if self.device.type == "cuda" and self.graph is None:
                self._capture()
            for _ in range(n):
                if self.graph is not None:
                    self.graph.replay()
                else:
                    self._fused_step()
            state = self.state.tolist()  # the one sync per chunk
        step, done = int(state[self.ops.STATE_STEP]), bool(state[self.ops.STATE_DONE])
        rows = self.rows_buf[self.taken:min(step, self.take_rows)].long().cpu()
        self.taken = step
        return rows, done

    def _capture(self) -> None:
        """Capture `_fused_step` into one CUDA graph. Warm-up runs mutate the take's state, so inputs are
        snapshotted and restored; KV written past the take's position is overwritten before it is read."""
        from kernels.runtime import capture_graph

        saved = [t.clone() for t in (self.state, self.params, self.rows_buf, self.logits, self.base)]
        self.graph = capture_graph(self._fused_step, self.stream or torch.cuda.current_stream(self.device))
        for t, s in zip((self.state, self.params, self.rows_buf, self.logits, self.base), saved):
            t.copy_(s)
