"""The device check's cases: each launches a group of cubins through the ops the engine uses and compares with
kernels/reference.py on random inputs. `CASES` lists (name, cubins it must launch, fn(ops, dev, gen) ->
[(label, err, tol)]); kernels/check.py runs them and checks that together they launch every cubin.
"""

from __future__ import annotations

import torch

from kernels import reference as ref
from kernels.check_rows import (
    AUDIO_ROWS,
    BF16,
    EPS,
    FP8,
    HEAD_DIM,
    HEADS,
    HIDDEN,
    INTER,
    KV_HEADS,
    TOL_BF16,
    TOL_FP8,
    TOL_FP32,
    deq,
    randn,
    rel_max,
)


def case_rmsnorm(ops, dev, gen):
    out = []
    x, w, r = randn(gen, 3, HIDDEN), 1 + randn(gen, HIDDEN, scale=0.1), randn(gen, 3, HIDDEN)
    scale = torch.tensor([0.02])
    for res in (False, True):
        want, _ = ref.rmsnorm_ref(x, w, EPS, r if res else None)
        rd = r.clone().to(dev) if res else None
        y = ops.rmsnorm(x.to(dev), w.to(dev), EPS, residual=rd)
        out.append((f"bf16{' +res' if res else ''}", rel_max(y, want), TOL_BF16))
        rd = r.clone().to(dev) if res else None
        y8 = ops.rmsnorm(x.to(dev), w.to(dev), EPS, residual=rd, scale=scale.to(dev))
        out.append((f"fp8{' +res' if res else ''}", rel_max(deq(y8, scale), want), TOL_FP8))
    return out


def case_silu_mul(ops, dev, gen):
    gu = randn(gen, 3, 2 * INTER)
    want = ref.silu_mul_ref(gu)
    scale = (want.abs().max() / 448.0).float().reshape(1)  # static scale that just covers the range
    y = ops.silu_mul(gu.to(dev))
    y8 = ops.silu_mul(gu.to(dev), scale=scale.to(dev))
    return [("bf16", rel_max(y, want), TOL_BF16), ("fp8", rel_max(deq(y8, scale), want), TOL_FP8)]


def fp8_weight(ops, w):
    w8, s = ops.quantize_weight_fp8(w)
    return w8, s


def case_linear(ops, dev, gen, rows: int):
    """GEMV (rows=1) or GEMM (rows>1): bf16, W8A16 and W8A8, each with and without the residual epilogue."""
    n = 3 * 1024
    a = randn(gen, rows, HIDDEN)
    w = randn(gen, n, HIDDEN, scale=HIDDEN ** -0.5)
    res = randn(gen, rows, n)
    w8, ws = fp8_weight(ops, w.to(dev))
    a_scale = torch.tensor([float(a.float().abs().max()) / 448.0])
    a8 = ops.quantize_fp8(a.to(dev), a_scale.to(dev))
    out = []
    for mode in ("bf16", "w8a16", "w8a8"):
        for use_res in (False, True):
            x = a8 if mode == "w8a8" else a.to(dev)
            wt = w.to(dev) if mode == "bf16" else w8
            kw = dict(w_scale=None if mode == "bf16" else ws, x_scale=a_scale.to(dev) if mode == "w8a8" else None,
                      residual=res.clone().to(dev) if use_res else None)
            y = ops.linear(x.view(-1) if rows == 1 else x, wt, **kw)
            w_scale = kw["w_scale"].cpu() if kw["w_scale"] is not None else None
            want = ref.linear_ref(x.cpu().view(rows, -1), wt.cpu(), w_scale=w_scale,
                                  x_scale=a_scale if mode == "w8a8" else None, residual=res if use_res else None)
            out.append((f"{mode}{' +res' if use_res else ''}", rel_max(y.view(rows, -1), want), TOL_BF16))
    if rows == 1:
        y = ops.gemv(a.view(-1).to(dev), w.to(dev), out_dtype=torch.float32)
        out.append(("bf16 -> fp32", rel_max(y, ref.linear_ref(a, w).view(-1)), TOL_FP32))
    return out


def case_head(ops, dev, gen):
    h, w = randn(gen, HIDDEN), randn(gen, AUDIO_ROWS, HIDDEN, scale=HIDDEN ** -0.5)
    g = 1 + randn(gen, HIDDEN, scale=0.1)
    y = ops.audio_head(h.to(dev), w.to(dev), g.to(dev), EPS)
    return [("norm + head -> fp32", rel_max(y, ref.audio_head_ref(h, w, g, EPS)), TOL_BF16)]


def rope_tables(ops, d, n, dev):
    return ops.rope_tables(1e6, d, n, dev)


def case_rope_kv(ops, dev, gen):
    out = []
    for d, heads, kv in ((HEAD_DIM, HEADS, KV_HEADS), (16, 4, 2)):
        m, start, max_pos = 5, 37, 128
        qkv = randn(gen, m, (heads + 2 * kv) * d)
        qn, kn = 1 + randn(gen, d, scale=0.1), 1 + randn(gen, d, scale=0.1)
        cos, sin = rope_tables(ops, d, max_pos, "cpu")
        kc = torch.zeros(kv, max_pos, d, dtype=BF16, device=dev)
        vc = torch.zeros_like(kc)
        q = ops.qk_norm_rope_kv(qkv.to(dev), qn.to(dev), kn.to(dev), cos.to(dev), sin.to(dev),
                                torch.tensor([start], dtype=torch.int32, device=dev), kc, vc, heads=heads,
                                kv_heads=kv, eps=EPS)
        qr, kr, vr = ref.qk_norm_rope_ref(qkv, qn, kn, cos, sin, torch.arange(start, start + m), heads, kv, EPS)
        err = max(rel_max(q, qr), rel_max(kc[:, start:start + m].transpose(0, 1), kr),
                  rel_max(vc[:, start:start + m].transpose(0, 1), vr))
        out.append((f"d{d}: q, k cache, v cache", err, TOL_BF16))
    return out


def case_attention(ops, dev, gen):
    out = []
    for d, heads, kv in ((HEAD_DIM, HEADS, KV_HEADS), (16, 4, 2)):
        length = 700
        kc, vc = randn(gen, kv, 1024, d), randn(gen, kv, 1024, d)
        q = randn(gen, 1, heads, d)
        pos = torch.tensor([length - 1], dtype=torch.int32)
        y = ops.decode_attention(q.to(dev), kc.to(dev), vc.to(dev), pos.to(dev))
        want = ref.attention_ref(q, kc, vc, pos.long())
        out.append((f"decode d{d} (split-K + combine), {length} positions", rel_max(y.view(1, heads, d), want),
                    TOL_BF16))
        m, start = 24, 40
        qp = randn(gen, m, heads, d)
        p0 = torch.tensor([start], dtype=torch.int32)
        y = ops.prefill_attention(qp.to(dev), kc.to(dev), vc.to(dev), p0.to(dev))
        want = ref.attention_ref(qp, kc, vc, torch.arange(start, start + m))
        out.append((f"prefill d{d}, {m} rows at offset {start}", rel_max(y, want), TOL_BF16))
    return out


def case_sampler(ops, dev, gen):
    """The single-program sampler and the grid sampler (v3; its scratch reused, as a graph reuses it)."""
    out = []
    embed = randn(gen, AUDIO_ROWS, HIDDEN, scale=0.3)
    scratch = ops.sampler_scratch(dev)
    for temperature, top_k, top_p in ((0.0, 0, 1.0), (0.8, 30, 0.8), (1.0, 0, 0.95)):
        logits = torch.randn(8, 1026, generator=gen) * 3
        seed, step = int(torch.randint(0, 2 ** 62, (1,), generator=gen)), 11
        want = ref.sample_row_ref(logits, step=step, seed=seed, temperature=temperature, top_k=top_k, top_p=top_p)
        idx = torch.tensor(want) + 1026 * torch.arange(8)
        for name in ("sample", "sample_grid"):
            state, params = ops.sampler_state(seed, top_k, temperature, top_p, dev)
            state[ops.STATE_STEP] = step
            rows = torch.full((32, 8), -1, dtype=torch.int32, device=dev)
            x = torch.empty(HIDDEN, dtype=BF16, device=dev)
            args = (logits.to(dev), embed.to(dev), state, params, rows, x)
            if name == "sample":
                ops.sample(*args)
            else:
                ops.sample_grid(*args, scratch)
            got = rows[step].tolist()
            err = rel_max(x, embed[idx].double().sum(0)) if got == want else 1.0
            out.append((f"{name} T={temperature} k={top_k} p={top_p}: row {'==' if got == want else '!='} "
                        "reference, embedding", err, TOL_BF16))
    # The grid sampler for 3 takes at once (the grid (8, 3)), each with its own settings and ticket counter.
    takes = ((0.8, 30, 0.8, 5, 11), (0.0, 0, 1.0, 6, 2), (1.0, 0, 0.95, 7, 30))
    logits = torch.randn(len(takes), 8, 1026, generator=gen) * 3
    state, params = ops.sampler_states([t[3] for t in takes], [t[1] for t in takes], [t[0] for t in takes],
                                       [t[2] for t in takes], dev)
    state[:, ops.STATE_STEP] = torch.tensor([t[4] for t in takes], device=dev)
    rows = torch.full((len(takes), 32, 8), -1, dtype=torch.int32, device=dev)
    x = torch.empty(len(takes), HIDDEN, dtype=BF16, device=dev)
    ops.sample_grid(logits.to(dev), embed.to(dev), state, params, rows, x, ops.sampler_scratch(dev, len(takes)))
    for b, (temperature, top_k, top_p, seed, step) in enumerate(takes):
        want = ref.sample_row_ref(logits[b], step=step, seed=seed, temperature=temperature, top_k=top_k,
                                  top_p=top_p)
        got = rows[b, step].tolist()
        idx = torch.tensor(want) + 1026 * torch.arange(8)
        err = rel_max(x[b], embed[idx].double().sum(0)) if got == want else 1.0
        out.append((f"sample_grid take {b} of 3, T={temperature} k={top_k} p={top_p}: row "
                    f"{'==' if got == want else '!='} reference, embedding", err, TOL_BF16))
    return out


def case_fused(ops, dev, gen):
    """The v2 kernels (kernels/fused.py) at the real shapes: the GEMV prologues against float64 math on
    the input the unfused kernels would store (bf16, or e4m3 at the static scale), and the fused attention
    (norm + RoPE + KV write + split-K + combine) against the reference of the three v1 kernels."""
    out = []
    h, g = randn(gen, HIDDEN), 1 + randn(gen, HIDDEN, scale=0.1)
    w = randn(gen, 3 * 1024, HIDDEN, scale=HIDDEN ** -0.5)
    w8, ws = fp8_weight(ops, w.to(dev))
    xn, _ = ref.rmsnorm_ref(h, g, EPS)
    xs = torch.tensor([float(xn.abs().max()) * 2 / 448.0])
    x8 = ops.quantize_fp8(xn.float(), xs).double() * xs.double()
    y = ops.gemv2(h.to(dev), w.to(dev), prologue="norm", norm_w=g.to(dev), eps=EPS)
    out.append(("gemv2 norm bf16", rel_max(y, ref.linear_ref(xn.to(BF16), w)), TOL_BF16))
    y = ops.gemv2(h.to(dev), w8, prologue="norm", norm_w=g.to(dev), eps=EPS, w_scale=ws, x_scale=xs.to(dev))
    out.append(("gemv2 norm w8a8", rel_max(y, ref.linear_ref(x8, w8.cpu(), w_scale=ws.cpu())), TOL_FP8))
    gu = randn(gen, 2 * INTER)
    wd = randn(gen, HIDDEN, INTER, scale=INTER ** -0.5)
    wd8, wds = fp8_weight(ops, wd.to(dev))
    act = ref.silu_mul_ref(gu)
    acts = torch.tensor([float(act.abs().max()) * 2 / 448.0])
    a8 = ops.quantize_fp8(act.float(), acts).double() * acts.double()
    r = randn(gen, HIDDEN)
    y = ops.gemv2(gu.to(dev), wd.to(dev), prologue="silu", residual=r.clone().to(dev))
    out.append(("gemv2 silu bf16 +res", rel_max(y, ref.linear_ref(act.to(BF16), wd, residual=r)), TOL_BF16))
    y = ops.gemv2(gu.to(dev), wd8, prologue="silu", w_scale=wds, x_scale=acts.to(dev), residual=r.clone().to(dev))
    out.append(("gemv2 silu w8a8 +res", rel_max(y, ref.linear_ref(a8, wd8.cpu(), w_scale=wds.cpu(), residual=r)),
                TOL_FP8))
    xo = randn(gen, HEADS * HEAD_DIM)
    wo = randn(gen, HIDDEN, HEADS * HEAD_DIM, scale=(HEADS * HEAD_DIM) ** -0.5)
    wo8, wos = fp8_weight(ops, wo.to(dev))
    y = ops.gemv2(xo.to(dev), wo.to(dev), residual=r.clone().to(dev))
    out.append(("gemv2 bf16 +res", rel_max(y, ref.linear_ref(xo, wo, residual=r)), TOL_BF16))
    y = ops.gemv2(xo.to(dev), wo8, w_scale=wos, residual=r.clone().to(dev))
    out.append(("gemv2 w8a16 +res", rel_max(y, ref.linear_ref(xo, wo8.cpu(), w_scale=wos.cpu(), residual=r)),
                TOL_BF16))
    for d, heads, kv in ((HEAD_DIM, HEADS, KV_HEADS), (16, 4, 2)):
        pos, max_pos = 699, 1024
        qkv = randn(gen, (heads + 2 * kv) * d)
        qn, kn = 1 + randn(gen, d, scale=0.1), 1 + randn(gen, d, scale=0.1)
        cos, sin = rope_tables(ops, d, max_pos, "cpu")
        kc, vc = randn(gen, kv, max_pos, d), randn(gen, kv, max_pos, d)
        qr, kr, vr = ref.qk_norm_rope_ref(qkv[None], qn, kn, cos, sin, torch.tensor([pos]), heads, kv, EPS)
        kw, vw = kc.clone(), vc.clone()
        kw[:, pos], vw[:, pos] = kr[0].to(BF16), vr[0].to(BF16)
        want = ref.attention_ref(qr.to(BF16), kw, vw, torch.tensor([pos]))
        kd, vd = kc.to(dev), vc.to(dev)
        y = ops.decode_attention_fused(qkv.to(dev), qn.to(dev), kn.to(dev), cos.to(dev), sin.to(dev),
                                       torch.tensor([pos], dtype=torch.int32, device=dev), kd, vd, heads=heads,
                                       eps=EPS, scratch=ops.fused_attention_scratch(heads, kv, d, dev))
        err = max(rel_max(y.view(1, heads, d), want), rel_max(kd[:, pos], kr[0]), rel_max(vd[:, pos], vr[0]))
        out.append((f"attention fused d{d}, {pos + 1} positions: out, k/v written", err, TOL_BF16))
    return out


def splitk_inputs(ops, dev, gen, fp8: bool):
    """o_proj (bf16 or W8A16) and down (silu·mul prologue, bf16 or W8A8) at the real shapes:
    [(name, x, w, kwargs, x as the kernel rounds it, fp32 scale or None)]."""
    xo = randn(gen, HEADS * HEAD_DIM)
    wo = randn(gen, HIDDEN, HEADS * HEAD_DIM, scale=(HEADS * HEAD_DIM) ** -0.5)
    gu = randn(gen, 2 * INTER)
    wd = randn(gen, HIDDEN, INTER, scale=INTER ** -0.5)
    act = ref.silu_mul_ref(gu)
    if not fp8:
        return [("o_proj", xo, wo.to(dev), {}, xo.double(), None),
                ("down", gu, wd.to(dev), dict(prologue="silu"), act.to(BF16).double(), None)]
    wo8, wos = fp8_weight(ops, wo.to(dev))
    wd8, wds = fp8_weight(ops, wd.to(dev))
    acts = torch.tensor([float(act.abs().max()) * 2 / 448.0])
    a8 = ops.quantize_fp8(act.float(), acts).double() * acts.double()
    return [("o_proj", xo, wo8, dict(w_scale=wos), xo.double(), wos),
            ("down", gu, wd8, dict(prologue="silu", w_scale=wds, x_scale=acts.to(dev)), a8, wds)]


def case_splitk(ops, dev, gen):
    """The v3 split-K GEMVs (kernels/splitk.py) at the real shapes (o_proj 2560x4096, down 2560x9728) against
    float64, each launched twice on the same scratch: the second launch must give the same bits (the
    reduction adds the partials in split order whichever program finishes last) and the counters must be
    back at zero."""
    out = []
    scratch = ops.gemv_splitk_scratch(HIDDEN, dev)
    for fp8 in (False, True):
        for name, x, w, kw, x_used, ws in splitk_inputs(ops, dev, gen, fp8):
            r = randn(gen, HIDDEN)
            ys = [ops.gemv_splitk(x.to(dev), w, residual=r.to(dev), scratch=scratch, **kw) for _ in range(2)]
            want = ref.linear_ref(x_used[None], w.cpu(), w_scale=None if ws is None else ws.cpu(), residual=r[None])
            label = f"{name} {'fp8' if fp8 else 'bf16'} +res"
            out.append((label, rel_max(ys[0][None], want), TOL_BF16))
            same = torch.equal(ys[0].view(torch.int16), ys[1].view(torch.int16)) and not scratch[1].any()
            out.append((f"{label}: 2nd launch same bits, counters reset", 0.0 if same else 1.0, 0.5))
    return out


BUCKETS = (1, 4, 8, 16)   # the batched step's row buckets (kernels/batch.py)


def case_batch(ops, dev, gen):
    """The batched step's kernels (kernels/batch.py) at the real widths: the M ≤ 16 GEMM for each bucket
    in BF16 and W8A8 (+ residual; and its split-K variant) against float64, and its batch invariance on
    this GPU's tensor cores (each bucket's rows bit-identical to the same rows of the 16-row run, err 0
    or 1); attention for 4
    takes with their own lengths and slots; the sampler for 3 takes with their own settings."""
    out = []
    n = 3 * 1024
    a = randn(gen, 16, HIDDEN)
    w = randn(gen, n, HIDDEN, scale=HIDDEN ** -0.5)
    res = randn(gen, 16, n)
    w8, ws = fp8_weight(ops, w.to(dev))
    a_scale = (a.float().abs().amax(dim=1) / 448.0).clamp(min=1e-12)
    a8 = (a.float() / a_scale[:, None]).to(FP8)
    for mode in ("bf16", "w8a8"):
        x, wt = (a8.to(dev), w8) if mode == "w8a8" else (a.to(dev), w.to(dev))
        kw = dict(w_scale=ws, x_scale=a_scale.to(dev)) if mode == "w8a8" else {}
        full = ops.skinny_gemm(x, wt, **kw)
        for m in BUCKETS:
            part = {k: (v[:m] if k == "x_scale" else v) for k, v in kw.items()}
            y = ops.skinny_gemm(x[:m], wt, **part)
            want = ref.linear_ref(x[:m].cpu(), wt.cpu(), w_scale=ws.cpu() if kw else None,
                                  x_scale=a_scale[:m, None] if kw else None)
            out.append((f"skinny gemm {mode} M {m}", rel_max(y, want), TOL_BF16))
            same = torch.equal(y.view(torch.int16), full[:m].view(torch.int16))
            out.append((f"skinny gemm {mode} M {m}: rows == rows of M 16, bit for bit", 0.0 if same else 1.0, 0.5))
        r = res[:5].clone().to(dev)
        y = ops.skinny_gemm(x[:5], wt, **{k: (v[:5] if k == "x_scale" else v) for k, v in kw.items()}, residual=r,
                            out=r)
        want = ref.linear_ref(x[:5].cpu(), wt.cpu(), w_scale=ws.cpu() if kw else None,
                              x_scale=a_scale[:5, None] if kw else None, residual=res[:5])
        out.append((f"skinny gemm {mode} M 5 +res in place", rel_max(y, want), TOL_BF16))
        scratch = ops.skinny_gemm_scratch(n, dev)
        full = ops.skinny_gemm(x, wt, **kw, residual=res.to(dev), scratch=scratch)
        for m in BUCKETS:
            part = {k: (v[:m] if k == "x_scale" else v) for k, v in kw.items()}
            y = ops.skinny_gemm(x[:m], wt, **part, residual=res[:m].to(dev), scratch=scratch)
            want = ref.linear_ref(x[:m].cpu(), wt.cpu(), w_scale=ws.cpu() if kw else None,
                                  x_scale=a_scale[:m, None] if kw else None, residual=res[:m])
            same = torch.equal(y.view(torch.int16), full[:m].view(torch.int16)) and not scratch[1].any()
            out.append((f"skinny gemm split-K {mode} M {m} +res", rel_max(y, want), TOL_BF16))
            out.append((f"skinny gemm split-K {mode} M {m}: rows == rows of M 16, counters reset", 0.0 if same
                        else 1.0, 0.5))
    for d, heads, kv in ((HEAD_DIM, HEADS, KV_HEADS), (16, 4, 2)):
        lens, slots = [700, 1, 64, 333], [3, 0, 2, 1]
        kc, vc = randn(gen, 4, kv, 1024, d), randn(gen, 4, kv, 1024, d)
        q = randn(gen, 4, heads, d)
        y = ops.decode_attention_batch(q.to(dev), kc.to(dev), vc.to(dev),
                                       torch.tensor(slots, dtype=torch.int32, device=dev),
                                       torch.tensor(lens, dtype=torch.int32, device=dev))
        err = max(rel_max(y[b:b + 1], ref.attention_ref(q[b:b + 1], kc[slot], vc[slot], torch.tensor([length - 1])))
                  for b, (slot, length) in enumerate(zip(slots, lens)))
        out.append((f"decode d{d}, 4 takes, lengths {lens}", err, TOL_BF16))
    embed = randn(gen, AUDIO_ROWS, HIDDEN, scale=0.3)
    takes = [(0.0, 0, 1.0, 11), (0.8, 30, 0.8, 12), (1.0, 0, 0.95, 40)]      # (T, top-k, top-p, step)
    seeds = [int(v) for v in torch.randint(0, 2 ** 62, (len(takes),), generator=gen)]
    logits = torch.randn(len(takes), 8, 1026, generator=gen) * 3
    state, params = ops.sampler_states(seeds, [t[1] for t in takes], [t[0] for t in takes], [t[2] for t in takes], dev)
    state[:, ops.STATE_STEP] = torch.tensor([t[3] for t in takes], device=dev)
    rows = torch.full((len(takes), 48, 8), -1, dtype=torch.int32, device=dev)
    x = torch.empty(len(takes), HIDDEN, dtype=BF16, device=dev)
    ops.sample_batch(logits.to(dev), embed.to(dev), state, params, rows, x)
    for b, (temperature, top_k, top_p, step) in enumerate(takes):
        want = ref.sample_row_ref(logits[b], step=step, seed=seeds[b], temperature=temperature, top_k=top_k,
                                  top_p=top_p)
        got = rows[b, step].tolist()
        idx = torch.tensor(want) + 1026 * torch.arange(8)
        err = rel_max(x[b], embed[idx].double().sum(0)) if got == want else 1.0
        out.append((f"sampler take {b} T={temperature} k={top_k} p={top_p}: row "
                    f"{'==' if got == want else '!='} reference, embedding", err, TOL_BF16))
    return out


def case_batch_step(ops, dev, gen):
    """What the cubin backend's batched step adds to kernels/batch.py's set: the W8A16 split-K GEMM (FP8
    o_proj weight, bf16 attention output, + residual) per bucket against float64 and bit-identical to the
    16-row run; the skinny GEMM with fp32 output (the audio head) likewise; the batched q/k norm + RoPE + KV
    write for 4 takes at their own slots and positions plus a padding row (position -1) that must write
    nothing (err 1 if it did)."""
    out = []
    a = randn(gen, 16, 4096)
    w8, ws = fp8_weight(ops, randn(gen, HIDDEN, 4096, scale=4096 ** -0.5).to(dev))
    res = randn(gen, 16, HIDDEN)
    scratch = ops.skinny_gemm_scratch(HIDDEN, dev)
    full = ops.skinny_gemm(a.to(dev), w8, w_scale=ws, residual=res.to(dev), scratch=scratch)
    head_w = randn(gen, AUDIO_ROWS, HIDDEN, scale=HIDDEN ** -0.5)
    h = randn(gen, 16, HIDDEN)
    logits = ops.skinny_gemm(h.to(dev), head_w.to(dev), out=torch.empty(16, AUDIO_ROWS, device=dev))
    for m in BUCKETS:
        y = ops.skinny_gemm(a[:m].to(dev), w8, w_scale=ws, residual=res[:m].to(dev), scratch=scratch)
        want = ref.linear_ref(a[:m], w8.cpu(), w_scale=ws.cpu(), residual=res[:m])
        same = torch.equal(y.view(torch.int16), full[:m].view(torch.int16)) and not scratch[1].any()
        out.append((f"skinny gemm split-K w8a16 M {m} +res", rel_max(y, want), TOL_BF16))
        out.append((f"skinny gemm split-K w8a16 M {m}: rows == rows of M 16", 0.0 if same else 1.0, 0.5))
        y = ops.skinny_gemm(h[:m].to(dev), head_w.to(dev), out=torch.empty(m, AUDIO_ROWS, device=dev))
        out.append((f"skinny gemm bf16 -> fp32 (audio head) M {m}", rel_max(y, ref.linear_ref(h[:m], head_w)),
                    TOL_FP32))
        out.append((f"skinny gemm bf16 -> fp32 M {m}: rows == rows of M 16", 0.0 if torch.equal(y, logits[:m])
                    else 1.0, 0.5))
    for d, heads, kv in ((HEAD_DIM, HEADS, KV_HEADS), (16, 4, 2)):
        slots, positions, max_pos = [2, 0, 3, 1, 0], [37, 0, 100, 5, -1], 128
        qkv = randn(gen, len(slots), (heads + 2 * kv) * d)
        qn, kn = 1 + randn(gen, d, scale=0.1), 1 + randn(gen, d, scale=0.1)
        cos, sin = rope_tables(ops, d, max_pos, "cpu")
        kc = torch.zeros(4, kv, max_pos, d, dtype=BF16, device=dev)
        vc = torch.zeros_like(kc)
        q = ops.qk_norm_rope_kv_batch(qkv.to(dev), qn.to(dev), kn.to(dev), cos.to(dev), sin.to(dev),
                                      torch.tensor(slots, dtype=torch.int32, device=dev),
                                      torch.tensor(positions, dtype=torch.int32, device=dev), kc, vc, heads=heads,
                                      kv_heads=kv, eps=EPS)
        at = torch.tensor([max(p, 0) for p in positions])
        qr, kr, vr = ref.qk_norm_rope_ref(qkv, qn, kn, cos, sin, at, heads, kv, EPS)
        real = [i for i, p in enumerate(positions) if p >= 0]
        err = max(rel_max(q, qr), rel_max(torch.stack([kc[slots[i], :, positions[i]] for i in real]), kr[real]),
                  rel_max(torch.stack([vc[slots[i], :, positions[i]] for i in real]), vr[real]))
        out.append((f"rope + kv batch d{d}: q, k, v at each take's slot and position", err, TOL_BF16))
        written = (kc != 0).any(-1).any(1).sum().item() + (vc != 0).any(-1).any(1).sum().item()
        out.append((f"rope + kv batch d{d}: only the {len(real)} takes' cells written (padding row: none)",
                    0.0 if written == 2 * len(real) else 1.0, 0.5))
    return out


CASES = [
    ("rmsnorm", {"rmsnorm_bf16", "rmsnorm_add_bf16", "rmsnorm_fp8", "rmsnorm_add_fp8"}, case_rmsnorm),
    ("silu_mul", {"silu_mul_bf16", "silu_mul_fp8"}, case_silu_mul),
    ("gemv", {"gemv_bf16", "gemv_bf16_res", "gemv_bf16_f32out", "gemv_w8a16", "gemv_w8a16_res", "gemv_w8a8",
              "gemv_w8a8_res"}, lambda o, d, g: case_linear(o, d, g, 1)),
    ("gemm", {"gemm_bf16", "gemm_bf16_res", "gemm_w8a16", "gemm_w8a16_res", "gemm_w8a8", "gemm_w8a8_res"},
     lambda o, d, g: case_linear(o, d, g, 300)),
    ("audio_head", {"audio_head_norm_bf16"}, case_head),
    ("rope_kv", {"qk_norm_rope_kv_d128", "qk_norm_rope_kv_d16"}, case_rope_kv),
    ("attention", {"decode_attn_split_d128", "attn_combine_d128", "prefill_attn_d128", "decode_attn_split_d16",
                   "attn_combine_d16", "prefill_attn_d16"}, case_attention),
    ("sampler", {"sample_embed", "sample_embed_grid"}, case_sampler),
    ("fused (v2)", {"gemv2_bf16_res", "gemv2_w8a16_res", "gemv2_norm_bf16", "gemv2_norm_w8a8", "gemv2_silu_bf16_res",
                    "gemv2_silu_w8a8_res", "decode_attn_fused_d128", "decode_attn_fused_d16"}, case_fused),
    ("split-K (v3)", {"gemv3_bf16_res", "gemv3_w8a16_res", "gemv3_silu_bf16_res", "gemv3_silu_w8a8_res"},
     case_splitk),
    ("batch", {"gemm_skinny_bf16", "gemm_skinny_bf16_res", "gemm_skinny_w8a8", "gemm_skinny_w8a8_res",
               "gemm_skinny_bf16_res_split", "gemm_skinny_w8a8_res_split",
               "decode_attn_batch_d128", "decode_attn_batch_d16", "sample_embed_batch"}, case_batch),
    ("batch step", {"gemm_skinny_w8a16_res_split", "gemm_skinny_bf16_f32", "qk_norm_rope_kv_batch_d128",
                    "qk_norm_rope_kv_batch_d16"}, case_batch_step),
]
