"""A/B timing of the v1 kernels against the v2 kernels that replace them, and of v2's GEMV against v3's
split-K, at the real decode shapes through the cubins: µs, weight bytes over time and the ratio per
replaced piece of a layer (INFO rows; the correctness rows are kernels/check_cases.py's).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from kernels.check_cases import fp8_weight, rope_tables, splitk_inputs
from kernels.check_rows import EPS, HEAD_DIM, HEADS, HIDDEN, INTER, KV_HEADS, Row, randn
from kernels.timing import seconds_per_call

REAL_SHAPES = dict(hidden=HIDDEN, inter=INTER, heads=HEADS, kv_heads=KV_HEADS, head_dim=HEAD_DIM, positions=700)


def cuda_timer(calls: int = 20):
    """Seconds per call of fn, `calls` calls between two CUDA events on the current stream (the caller enters
    the kernels' stream)."""
    return lambda fn: seconds_per_call(fn, calls=calls)


def ab_pairs(ops, dev, gen, precision: str, shapes=REAL_SHAPES):
    """(name, bytes streamed, v1 callable, v2 callable) per replaced piece of one decode layer."""
    hid, inter, heads, kv, d = (shapes[k] for k in ("hidden", "inter", "heads", "kv_heads", "head_dim"))
    fp8 = precision == "fp8"

    def weight(n, k):
        w = randn(gen, n, k, scale=k ** -0.5).to(dev)
        return fp8_weight(ops, w) if fp8 else (w, None)

    one = torch.ones(1, device=dev) * 0.02 if fp8 else None
    h, g, r = randn(gen, hid).to(dev), (1 + randn(gen, hid, scale=0.1)).to(dev), randn(gen, hid).to(dev)
    pairs = []
    for name, n in (("qkv (norm + gemv)", (heads + 2 * kv) * d), ("gate_up (norm + gemv)", 2 * inter)):
        w, ws = weight(n, hid)
        pairs.append((name, w.numel() * w.element_size(),
                      lambda w=w, ws=ws: ops.linear(ops.rmsnorm(h, g, EPS, scale=one), w, w_scale=ws, x_scale=one),
                      lambda w=w, ws=ws: ops.gemv2(h, w, prologue="norm", norm_w=g, eps=EPS, w_scale=ws, x_scale=one)))
    wo, wos = weight(hid, heads * d)
    a = randn(gen, heads * d).to(dev)
    pairs.append(("o_proj (+ residual)", wo.numel() * wo.element_size(),
                  lambda: ops.linear(a, wo, w_scale=wos, residual=r, out=r),
                  lambda: ops.gemv2(a, wo, w_scale=wos, residual=r, out=r)))
    wd, wds = weight(hid, inter)
    gu = randn(gen, 2 * inter).to(dev)
    pairs.append(("down (silu·mul + gemv + residual)", wd.numel() * wd.element_size(),
                  lambda: ops.linear(ops.silu_mul(gu, scale=one), wd, w_scale=wds, x_scale=one, residual=r, out=r),
                  lambda: ops.gemv2(gu, wd, prologue="silu", w_scale=wds, x_scale=one, residual=r, out=r)))
    pos, max_pos = shapes["positions"] - 1, shapes["positions"] + 8
    qkv = randn(gen, (heads + 2 * kv) * d).to(dev)
    qn, kn = (1 + randn(gen, d, scale=0.1)).to(dev), (1 + randn(gen, d, scale=0.1)).to(dev)
    cos, sin = rope_tables(ops, d, max_pos, dev)
    kc, vc = randn(gen, kv, max_pos, d).to(dev), randn(gen, kv, max_pos, d).to(dev)
    p = torch.tensor([pos], dtype=torch.int32, device=dev)
    scratch, fused = ops.attention_scratch(heads, d, dev), ops.fused_attention_scratch(heads, kv, d, dev)

    def attention_v1():
        q = ops.qk_norm_rope_kv(qkv[None], qn, kn, cos, sin, p, kc, vc, heads=heads, kv_heads=kv, eps=EPS)
        return ops.decode_attention(q[0], kc, vc, p, scratch=scratch)

    pairs.append((f"attention (norm + RoPE + KV + split-K + combine), {pos + 1} positions",
                  2 * kv * (pos + 1) * d * 2, attention_v1,
                  lambda: ops.decode_attention_fused(qkv, qn, kn, cos, sin, p, kc, vc, heads=heads, eps=EPS,
                                                     scratch=fused)))
    return pairs


def ab_rows(ops, dev, gen, timer, shapes=REAL_SHAPES) -> Iterator[Row]:
    """Per replaced piece of a layer, FP8 and BF16: v1 and v2 time (µs), bytes over time (GB/s), ratio; each
    row yielded as it is timed."""
    for precision in ("fp8", "bf16"):
        for name, nbytes, v1, v2 in ab_pairs(ops, dev, gen, precision, shapes):
            t1, t2 = timer(v1), timer(v2)
            yield Row("A/B kernels", f"{precision} {name}",
                      f"v1 {t1 * 1e6:.1f} µs {nbytes / t1 / 1e9:.0f} GB/s | v2 {t2 * 1e6:.1f} µs "
                      f"{nbytes / t2 / 1e9:.0f} GB/s | v1/v2 {t1 / t2:.2f}x", "", "INFO")


def splitk_ab_rows(ops, dev, gen, timer) -> Iterator[Row]:
    """Split-K: o_proj and down as v2's GEMV and as v3's split-K GEMV, FP8 and BF16, at the real
    shapes: µs, weight bytes over time and the ratio; each row yielded as it is timed."""
    scratch = ops.gemv_splitk_scratch(HIDDEN, dev)
    r = randn(gen, HIDDEN).to(dev)
    for fp8 in (True, False):
        for name, x, w, kw, _, _ in splitk_inputs(ops, dev, gen, fp8):
            x = x.to(dev)
            t2 = timer(lambda: ops.gemv2(x, w, residual=r, out=r, **kw))
            t3 = timer(lambda: ops.gemv_splitk(x, w, residual=r, out=r, scratch=scratch, **kw))
            nbytes = w.numel() * w.element_size()
            yield Row("A/B kernels", f"{'fp8' if fp8 else 'bf16'} {name} v2 GEMV vs v3 split-K",
                      f"v2 {t2 * 1e6:.1f} µs {nbytes / t2 / 1e9:.0f} GB/s | v3 {t3 * 1e6:.1f} µs "
                      f"{nbytes / t3 / 1e9:.0f} GB/s | v2/v3 {t2 / t3:.2f}x", "", "INFO")


def timed_ab_rows(kernels) -> Iterator[Row]:
    """`ab_rows` at the real shapes on this GPU, through the cubins, timed on the kernels' stream; each row
    yielded as it is timed, so an overrun keeps the rows already made."""
    from kernels.runtime import cubin_ops

    try:
        with torch.cuda.stream(kernels.stream) if kernels.stream is not None else contextlib.nullcontext():
            ops, dev, gen = cubin_ops(kernels), torch.device("cuda"), torch.Generator().manual_seed(2)
            yield from ab_rows(ops, dev, gen, cuda_timer())
            yield from splitk_ab_rows(ops, dev, gen, cuda_timer())
    except Exception as exc:  # a failure here is one row; the correctness rows above stand
        yield Row("A/B kernels", "timing", f"{type(exc).__name__}: {exc}"[:120], "", "FAIL")
