"""The fast GPU step: the Triton kernels, loaded from the committed cubins, composed behind the step
interface of engine/backends/base.py (`prefill`, `decode`, `setup_cache`, `max_len`), plus the batched step
and a fused decode that samples on the device and replays the whole step as one CUDA graph (both in
engine/backends/cubin_steps.py).

One decode step of variant "v1", per layer (10 launches), then the head and the sampler:

    rmsnorm(h) -> fp8 x   | gemv qkv (W8A8)  | q/k norm + RoPE + KV write | split-K attention | combine
    gemv o_proj (W8A16, + residual into h)   | rmsnorm(h) -> fp8 | gemv gate_up (W8A8) | silu·mul -> fp8
    gemv down (W8A8, + residual into h)      ... audio head (final norm fused) -> fp32 logits -> sampler

Variant "v2" (the default, kernels/fused.py) runs the same math in 5 launches per layer: the norms and
silu·mul move into the prologue of the GEMV that consumes them, and q/k norm + RoPE + KV write and the
combine into the attention kernel. Prefill, and the BF16 calibration pass (which must observe the
quantised inputs), always use v1's kernels. "v1" stays selectable so a device check can time both steps
in one run on the same GPU. Variant "v3" is v2 with o_proj and down (N = 2560, too few row blocks to fill
the GPU) as split-K GEMVs with a fixed-order reduction (kernels/splitk.py), and the sampler as one program
per codebook with radix thresholds (`sample_grid_kernel` in kernels/sampler.py: the same picks, state and
next input as the single-program sampler v1 and v2 keep); v2 stays the default until a GPU run measures
v3 against it. `sampler` ("cta" one program, "grid" one per codebook) overrides the variant's sampler, so
the device check can time each change on its own.

KV slots: caches [slots, kv_heads, max_len, D] per layer, one contiguous slot per take (the layout the
batched attention indexes), allocated for the engine's max_batch (`setup_slots`; 1 until the engine
asks; the engine plans how many fit the card, engine/backends/memory.py). That is 144 KiB per position
for the 4B model: 576 MiB per slot at 4096 positions, 9 GiB for 16 slots. The single-stream path and
calibration use slot 0. Resizing is exception-safe (`_allocate`), and with more than one slot every
bucket's graph is captured right after it, so no take waits for a capture in the middle of a batch.

The backend takes an `ops` provider: `kernels.runtime.cubin_ops(CubinKernels())` on a GPU, or the
interpreter (`kernels.ops` / `cubin_ops(InterpretedKernels(...))`) in the CPU tests, so CI runs this very
composition on the tiny checkpoint and compares it with the torch reference.

Precision. "fp8" (default on 8.9 / 9.0 / 12.0): W8A8 with per-output-channel weight scales quantised at
load and static per-tensor activation scales, calibrated once at load by running fixed built-in prompts
(text, voice clone, long context: engine/backends/calibration.py) through the BF16 path (never a user's
request, so a take does not depend on which request came first); the scales and the saturation and
underflow rates under them are kept in `calibration`. o_proj keeps bf16 activations (W8A16: attention
output has no fused quantiser). The BF16 copies of quantised weights are freed after calibration. "bf16"
keeps every weight in bf16.

Self-check. `load` trusts the kernels only after `self_check` (engine/backends/self_check.py): a fixed
prompt and teacher-forced decode steps, the batched step's buckets, greedy and sampled fused rows, and a
long context (a kept prefix, a prefill at an offset with reference audio rows, a decode step at position
1000), through this backend and through the torch path on the same device and weights, compared against
documented thresholds.
A failure raises `SelfCheckFailed`, which the engine turns into the torch path under backend "auto" (with
the figures as the reason) and into an error when "cubin" was asked for; a pass puts the figures in
`engine.info["self_check"]` (engine/backends/self_check.py). Under "auto" all of it first runs in a
separate process (`load_trusted`, engine/backends/trust.py), so a kernel fault cannot poison the studio's CUDA context.
"""

from __future__ import annotations

import contextlib
import math

import torch
import torch.nn.functional as F

from engine.backends.calibration import (
    CALIBRATION_DECODE_STEPS,
    Calibration,
    CalibrationPrompt,
    Recorder,
    calibration_prompts,
)
from engine.backends.cubin_steps import ROW_BUCKETS, BatchedStep, FusedStep
from engine.backends.memory import NotEnoughMemory, check_room
from engine.backends.self_check import SelfCheckFailed, run_self_check
from engine.config import Dims
from engine.model import embed_prompt

PRECISIONS = ("fp8", "bf16")
VARIANTS = ("v1", "v2", "v3")
VARIANT_SAMPLER = {"v1": "cta", "v2": "cta", "v3": "grid"}

BF16 = torch.bfloat16


def cache_tensor(shape: tuple[int, ...], device) -> torch.Tensor:
    """One layer's keys or values for every slot (the tests inject an out-of-memory here)."""
    return torch.zeros(shape, dtype=BF16, device=device)


class Layer:
    """Device tensors of one decoder layer (weights fused: qkv = [q; k; v], gate_up = [gate; up]); FP8
    static activation scales `x_*` [1] and their per-row copies `rows_*` [16] for the skinny GEMMs; caches
    kc / vc [slots, kv_heads, max_len, D] and k / v, slot 0's views."""

    __slots__ = ("ln1", "ln2", "q_norm", "k_norm", "qkv", "o", "gate_up", "down",
                 "qkv_s", "o_s", "gate_up_s", "down_s", "x_qkv", "x_gate_up", "x_down", "rows_qkv", "rows_gate_up",
                 "rows_down", "kc", "vc", "k", "v")

    def __init__(self):
        for name in self.__slots__:
            setattr(self, name, None)


class CubinBackend(BatchedStep, FusedStep):
    """Owns the fused weights, KV caches, positions and sampler state of one model on one device; the
    batched and the fused decode steps are in engine/backends/cubin_steps.py."""

    prefill_chunk = None  # a prompt's prefill is one GEMM pass

    def __init__(self, dims: Dims, backbone: dict[str, torch.Tensor], *, ops, device, precision: str = "fp8",
                 max_len: int = 4096, stream=None, calibration_steps: int = CALIBRATION_DECODE_STEPS,
                 variant: str = "v2", sampler: str | None = None):
        if precision not in PRECISIONS:
            raise ValueError(f"cubin backend precision must be one of {PRECISIONS}, got {precision!r}")
        if variant not in VARIANTS:
            raise ValueError(f"cubin backend variant must be one of {VARIANTS}, got {variant!r}")
        if torch.device(device).type == "cuda" and stream is None:
            # the cubins launch on the loader's stream; torch work on another would race them
            raise ValueError("the cubin backend on CUDA needs the kernels' stream (stream=CubinKernels().stream)")
        sampler = sampler or VARIANT_SAMPLER[variant]
        if sampler not in ("cta", "grid"):
            raise ValueError(f"cubin backend sampler must be 'cta' or 'grid', got {sampler!r}")
        self.dims, self.ops, self.precision, self.variant, self.sampler = dims, ops, precision, variant, sampler
        self.device, self.stream = torch.device(device), stream
        self.max_len, self.slots = 0, 1
        self.max_rows = ROW_BUCKETS[-1]  # what `calibrate_rows` last recorded; any row count runs
        self.graph = None
        self.row_graphs: dict[int, object] = {}  # bucket -> the batched step's graph
        self.info: dict = {}  # joins engine.info (kernel target and loader, set by `load`)
        self._calib: Recorder | None = None  # while calibrating
        self.calibration: Calibration | None = None  # the FP8 scales and their rates (fp8 only)
        dev = self.device

        def w(name):
            return backbone[name].to(device=dev, dtype=BF16)

        self.layers = []
        for i in range(dims.layers):
            p, L = f"layers.{i}.", Layer()
            L.ln1, L.ln2 = w(p + "input_layernorm.weight"), w(p + "post_attention_layernorm.weight")
            L.q_norm, L.k_norm = w(p + "self_attn.q_norm.weight"), w(p + "self_attn.k_norm.weight")
            L.qkv = torch.cat([w(p + f"self_attn.{x}_proj.weight") for x in "qkv"]).contiguous()
            L.o = w(p + "self_attn.o_proj.weight").contiguous()
            L.gate_up = torch.cat([w(p + "mlp.gate_proj.weight"), w(p + "mlp.up_proj.weight")]).contiguous()
            L.down = w(p + "mlp.down_proj.weight").contiguous()
            self.layers.append(L)
        self.norm_w = w("norm.weight")
        self.text_w = w("text_embedding.weight")
        self.audio_w = w("audio_embedding.weight").contiguous()
        self.offsets = torch.arange(dims.codebooks, device=dev) * dims.codebook_vocab
        with self._on_stream():
            self.pos = torch.zeros(1, dtype=torch.int32, device=dev)
            self.logits = torch.zeros(dims.audio_rows, dtype=torch.float32, device=dev)
            self.attn_scratch = ops.attention_scratch(dims.heads, dims.head_dim, dev)
            self.fused_scratch = ops.fused_attention_scratch(dims.heads, dims.kv_heads, dims.head_dim, dev)
            self.splitk_scratch = ops.gemv_splitk_scratch(dims.hidden, dev) if variant == "v3" else None
            self.sampler_scratch = ops.sampler_scratch(dev) if sampler == "grid" else None
            # The batched step's static inputs and outputs (graph buffers: same addresses for life).
            rows = ROW_BUCKETS[-1]
            self.b_rows = torch.zeros(rows, dims.codebooks, dtype=torch.long, device=dev)
            self.b_meta = torch.zeros(3, rows, dtype=torch.int32, device=dev)  # slots, positions, lengths
            self.b_h = torch.zeros(rows, dims.hidden, dtype=BF16, device=dev)
            self.b_logits = torch.zeros(rows, dims.audio_rows, dtype=torch.float32, device=dev)
            self.b_attn_scratch = ops.attention_scratch(rows * dims.heads, dims.head_dim, dev)
            self.b_split = ops.skinny_gemm_scratch(dims.hidden, dev)
        self.setup_cache(max_len)
        if precision == "fp8":
            self._calibrate_and_quantize(calibration_steps)

    # ---------------------------------------------------------------- setup
    def setup_cache(self, max_len: int) -> None:
        """(Re)size the KV caches and RoPE tables to max_len positions, keeping every slot's contents (takes
        in flight keep their KV); drops the captured graphs, which hold the old addresses."""
        max_len = min(max_len, self.dims.max_positions)
        if max_len != self.max_len:
            self._allocate(self.slots, max_len)

    def setup_slots(self, slots: int) -> None:
        """KV slots for `slots` takes decoded together (the engine's max_batch), contents of the slots kept."""
        if slots < 1:
            raise ValueError(f"the cubin backend needs at least one KV slot, got {slots}")
        if slots != self.slots:
            self._allocate(slots, self.max_len)

    def _allocate(self, slots: int, max_len: int) -> None:
        """New caches of `slots` × `max_len` holding the old contents. The graphs go first (they hold the
        old addresses, and their pools memory this may need); every new tensor is allocated before any is
        swapped in, so an out-of-memory keeps the old cache, recaptures its graphs and raises a sentence."""
        d = self.dims
        keep_slots, keep_len = min(slots, self.slots), min(max_len, self.max_len)
        shape = (slots, d.kv_heads, max_len, d.head_dim)
        self.graph, self.row_graphs = None, {}
        what = f"a KV cache of {slots} slots × {max_len} positions"
        try:
            if self.max_len:  # growth: the new cache is allocated beside the old one
                check_room(2 * len(self.layers) * math.prod(shape) * 2, self.device, what)
            with self._on_stream():
                new = [(cache_tensor(shape, self.device), cache_tensor(shape, self.device)) for _ in self.layers]
                rope = (self.ops.rope_tables(d.rope_theta, d.head_dim, max_len, self.device)
                        if max_len != self.max_len else (self.cos, self.sin))
                for L, (kc, vc) in zip(self.layers, new):
                    if L.kc is not None:
                        kc[:keep_slots, :, :keep_len] = L.kc[:keep_slots, :, :keep_len]
                        vc[:keep_slots, :, :keep_len] = L.vc[:keep_slots, :, :keep_len]
        except torch.OutOfMemoryError:
            new, refusal = None, None  # raised below, outside the handler: its traceback keeps the new tensors
        except NotEnoughMemory as exc:
            new, refusal = None, str(exc)
        else:
            refusal = None
        if new is None:
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
            self._capture_buckets()
            raise NotEnoughMemory(refusal or f"not enough GPU memory for {what}; the cache keeps {self.slots} "
                                  f"slots × {self.max_len} positions: shorten the text, or start the studio "
                                  "with a smaller max_batch")
        for L, (kc, vc) in zip(self.layers, new):
            L.kc, L.vc = kc, vc
            L.k, L.v = kc[0], vc[0]
        self.cos, self.sin = rope
        self.slots, self.max_len = slots, max_len
        self._capture_buckets()

    def _calibrate_and_quantize(self, decode_steps: int) -> None:
        """Record the calibration prompts in BF16 (engine/backends/calibration.py; the long context followed
        by `decode_steps` decode steps), then quantise weights per output channel and set the static
        activation scales."""
        ops = self.ops
        prompts = calibration_prompts(self.dims, self.max_len, decode_steps)
        self.calibration = self.record(prompts).result(prompts)
        scales = self.calibration.scales
        with self._on_stream():
            for i, L in enumerate(self.layers):
                L.x_qkv, L.x_gate_up, L.x_down = (scales[i, k].reshape(1).to(self.device, copy=True) for k in range(3))
                L.qkv, L.qkv_s = ops.quantize_weight_fp8(L.qkv)
                L.o, L.o_s = ops.quantize_weight_fp8(L.o)
                L.gate_up, L.gate_up_s = ops.quantize_weight_fp8(L.gate_up)
                L.down, L.down_s = ops.quantize_weight_fp8(L.down)
                L.rows_qkv, L.rows_gate_up, L.rows_down = (
                    x.expand(ROW_BUCKETS[-1]).contiguous() for x in (L.x_qkv, L.x_gate_up, L.x_down))
        if self.device.type == "cuda":
            torch.cuda.empty_cache()  # the bf16 copies are gone; return their blocks

    def record(self, prompts: list[CalibrationPrompt]) -> Recorder:
        """Run `prompts` through the BF16 path, each prefilled in slot 0 and followed by its decode rows (fixed
        rows, so no logits are needed and the head does not run), recording every quantised input: the
        calibration's pass, and on a "bf16" backend other prompts' rates under given scales (the device
        check's held-out prompts). Not once the weights are FP8."""
        if self.layers[0].x_qkv is not None:
            raise ValueError("record() runs the BF16 path: a bf16 backend, or an fp8 one before it is quantised")
        self._calib = Recorder(len(prompts), len(self.layers), self.device)
        try:
            for kind, prompt in enumerate(prompts):
                self._calib.kind = kind
                self.prefill(prompt.ids, prompt.ref_rows, 0)
                for step, row in enumerate([] if prompt.decode is None else prompt.decode):
                    self.decode(row, len(prompt.ids) + step)
            return self._calib
        finally:
            self._calib = None

    def _observe(self, i: int, key: str, x: torch.Tensor) -> None:
        """During calibration (all bf16) record a quantised input."""
        if self._calib is not None:
            self._calib.observe(i, key, x)

    @contextlib.contextmanager
    def _on_stream(self):
        """Run on the kernels' stream, ordered after and before the caller's stream (event waits only)."""
        if self.stream is None:
            yield
            return
        caller = torch.cuda.current_stream(self.device)
        self.stream.wait_stream(caller)
        with torch.cuda.stream(self.stream):
            yield
        caller.wait_stream(self.stream)

    # ---------------------------------------------------------------- the step
    def _layers(self, h: torch.Tensor, slot: int = 0) -> None:
        """h [M, hidden] bf16 at positions pos[0] + i (device) of KV slot `slot`, the residual stream updated
        in place; writes fp32 logits of the last row into self.logits."""
        ops, d = self.ops, self.dims
        m = h.shape[0]
        if m == 1 and self.variant != "v1" and self._calib is None:
            self._layers_v2(h, slot)
            return
        for i, L in enumerate(self.layers):
            k, v = L.kc[slot], L.vc[slot]
            xn = ops.rmsnorm(h, L.ln1, d.rms_eps, scale=L.x_qkv)
            self._observe(i, "qkv", xn)
            qkv = ops.linear(xn, L.qkv, w_scale=L.qkv_s, x_scale=L.x_qkv)
            q = ops.qk_norm_rope_kv(qkv, L.q_norm, L.k_norm, self.cos, self.sin, self.pos, k, v,
                                    heads=d.heads, kv_heads=d.kv_heads, eps=d.rms_eps)
            if m == 1:
                a = ops.decode_attention(q, k, v, self.pos, scratch=self.attn_scratch)
            else:
                a = ops.prefill_attention(q, k, v, self.pos)
            ops.linear(a.view(m, -1), L.o, w_scale=L.o_s, residual=h, out=h)
            xn = ops.rmsnorm(h, L.ln2, d.rms_eps, scale=L.x_gate_up)
            self._observe(i, "gate_up", xn)
            gu = ops.linear(xn, L.gate_up, w_scale=L.gate_up_s, x_scale=L.x_gate_up)
            act = ops.silu_mul(gu, scale=L.x_down)
            self._observe(i, "down", act)
            ops.linear(act, L.down, w_scale=L.down_s, x_scale=L.x_down, residual=h, out=h)
        if self._calib is None:  # a calibration pass feeds fixed rows (`record`): it needs no logits
            ops.audio_head(h[-1], self.audio_w, self.norm_w, d.rms_eps, out=self.logits)

    def _layers_v2(self, h: torch.Tensor, slot: int = 0) -> None:
        """`_layers` for one decode row in 5 launches per layer (kernels/fused.py), same rounding points;
        "v3" runs o_proj and down as split-K GEMVs (kernels/splitk.py)."""
        ops, d = self.ops, self.dims
        row = h.view(-1)
        split = self.variant == "v3"
        for L in self.layers:
            qkv = ops.gemv2(row, L.qkv, prologue="norm", norm_w=L.ln1, eps=d.rms_eps, w_scale=L.qkv_s,
                            x_scale=L.x_qkv)
            a = ops.decode_attention_fused(qkv, L.q_norm, L.k_norm, self.cos, self.sin, self.pos, L.kc[slot],
                                           L.vc[slot], heads=d.heads, eps=d.rms_eps, scratch=self.fused_scratch)
            if split:
                ops.gemv_splitk(a.view(-1), L.o, w_scale=L.o_s, residual=row, out=row, scratch=self.splitk_scratch)
            else:
                ops.gemv2(a.view(-1), L.o, w_scale=L.o_s, residual=row, out=row)
            gu = ops.gemv2(row, L.gate_up, prologue="norm", norm_w=L.ln2, eps=d.rms_eps, w_scale=L.gate_up_s,
                           x_scale=L.x_gate_up)
            if split:
                ops.gemv_splitk(gu, L.down, prologue="silu", w_scale=L.down_s, x_scale=L.x_down, residual=row,
                                out=row, scratch=self.splitk_scratch)
            else:
                ops.gemv2(gu, L.down, prologue="silu", w_scale=L.down_s, x_scale=L.x_down, residual=row, out=row)
        ops.audio_head(row, self.audio_w, self.norm_w, d.rms_eps, out=self.logits)

    def _embed(self, ids: torch.Tensor, ref_rows: torch.Tensor | None) -> torch.Tensor:
        """Prompt rows; reference rows are summed in fp32 and rounded once, as the sampler kernel writes
        decode inputs."""
        return embed_prompt(ids, ref_rows, lambda t: F.embedding(t, self.text_w), self._embed_rows)

    def _embed_rows(self, rows: torch.Tensor) -> torch.Tensor:
        return F.embedding(rows + self.offsets, self.audio_w).float().sum(-2).to(BF16)

    def _check_room(self, end: int) -> None:
        if end > self.max_len:
            raise ValueError(f"sequence of {end} positions exceeds the cache of {self.max_len}")

    def _check_slot(self, slot: int) -> None:
        if not 0 <= slot < self.slots:
            raise ValueError(f"KV slot {slot} does not exist: the cubin backend has {self.slots} (setup_slots)")

    @torch.inference_mode()
    def prefill(self, ids: torch.Tensor, ref_rows: torch.Tensor | None = None, start: int = 0,
                slot: int = 0) -> torch.Tensor:
        ids = ids.to(self.device)
        self._check_room(start + len(ids))
        self._check_slot(slot)
        with self._on_stream():
            h = self._embed(ids, ref_rows)
            self.pos.fill_(start)
            self._layers(h, slot)
            out = self.logits.view(self.dims.codebooks, self.dims.codebook_vocab).clone()
        return out

    @torch.inference_mode()
    def decode(self, row: torch.Tensor, pos: int) -> torch.Tensor:
        self._check_room(pos + 1)
        with self._on_stream():
            h = self._embed_rows(row.to(self.device).long()[None])
            self.pos.fill_(pos)
            self._layers(h)
            out = self.logits.view(self.dims.codebooks, self.dims.codebook_vocab).clone()
        return out


# -------------------------------------------------------------------------------------------- engine hook
def probe(device) -> str | None:
    """Why the cubin backend cannot run on `device` (None when it can)."""
    from kernels import runtime

    ok, reason = runtime.available(torch.device(device).index or 0)
    if not ok:
        return reason
    try:
        import triton  # noqa: F401  (kernels/ops.py computes grids with triton.cdiv)
    except ImportError:
        return "triton is not installed (torch's CUDA wheels bring it; pip install triton)"
    return None


def resolve_precision(precision: str | None, dtype: torch.dtype | None) -> str:
    """'auto'/None -> fp8 (every cubin arch has FP8 tensor cores); 'bf16' forces BF16."""
    if precision in (None, "auto", "fp8"):
        if dtype not in (None, torch.bfloat16):
            raise ValueError(f"the cubin backend computes in bf16/fp8, not {dtype}; use precision 'bf16' or 'fp8'")
        return "fp8"
    if precision == "bf16":
        return "bf16"
    raise ValueError(f"unknown precision {precision!r} for the cubin backend; use 'auto', 'fp8' or 'bf16'")


def load(checkpoint, *, device, dtype=None, max_len: int = 4096, precision: str | None = None,
         variant: str = "v2") -> CubinBackend:
    """Engine factory: CubinKernels for the device's arch, ops launched from them, weights from the
    checkpoint's internal names."""
    from kernels import runtime

    device = torch.device(device)
    kernels = runtime.CubinKernels(device.index or 0)
    ops = runtime.cubin_ops(kernels)
    backend = CubinBackend(checkpoint.dims, checkpoint.backbone, ops=ops, device=device,
                           precision=resolve_precision(precision, dtype), max_len=max_len, stream=kernels.stream,
                           variant=variant)
    check = run_self_check(backend, checkpoint)
    if not check.ok:  # auto: the engine falls back to the torch path with this sentence; explicit: raises it
        raise SelfCheckFailed(f"the cubin kernels' self-check {check.summary}")
    backend.info = {"kernel_arch": kernels.manifest.target, "kernel_variant": variant,
                    "kernel_loader": f"{kernels.loader_name} ({kernels.loader_reason})",
                    "self_check": check.summary}
    return backend
