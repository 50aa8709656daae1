"""Every Triton kernel against its float64 / pure-python reference, run on the CPU by Triton's interpreter.

Outputs are poisoned (NaN, or -1 for integers) before each launch so an element the kernel failed to write
shows up. Shapes are small but not tile-aligned, so every masked edge and multi-iteration loop runs with the
production tiles.
"""

import json

import pytest
import torch
import triton
import triton.language as tl

from engine import sampling
from kernels import ops
from kernels import reference as ref
from kernels.common import to_e4m3
from tests import interp_rounding
from tests.conftest import PARITY, parity_missing
from tests.helpers import SAMPLING_CASES, nan_like, rel_err, scripted_logits

interp_rounding.install()

FP8 = torch.float8_e4m3fn
BF16 = torch.bfloat16


def fp8_step(v):
    """Spacing of the e4m3 grid at |v| (subnormal spacing 2^-9 below 2^-6)."""
    e = torch.floor(torch.log2(v.abs().clamp(min=2.0 ** -6)))
    return torch.pow(2.0, e - 3)


def assert_within_one_fp8_step(y8, exact):
    assert not torch.isnan(y8.float()).any(), "unwritten fp8 outputs"
    err = (y8.double() - exact).abs()
    assert (err <= fp8_step(exact)).all(), f"fp8 output off by more than one step: {err.max().item()}"


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


# ---------------------------------------------------------------------------------------------- fp8 rounding
@triton.jit
def _e4m3_probe(X, Y, N, BLOCK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    tl.store(Y + i, to_e4m3(tl.load(X + i, mask=i < N)), mask=i < N)


def test_to_e4m3_matches_torch_bit_for_bit():
    # The interpreter's own fp32→fp8 cast gets these wrong (KERNELS.md §2); the in-kernel rounding must not.
    special = torch.tensor([1.9698, -7.89, 0.00175, 2.0 ** -10, 2.0 ** -9 * 1.5, 2.0 ** -9 * 2.5, 447.9, 464.0,
                            500.0, -1e4, 0.0, 1.0625, 1.1875, 240.0, 248.0])
    x = torch.cat([special, torch.randn(3000) * 3, torch.randn(1000) * 0.01, torch.randn(81) * 200])
    y = torch.full_like(x, float("nan")).to(FP8)
    _e4m3_probe[(1,)](x, y, x.numel(), BLOCK=4096)
    want = x.clamp(-448, 448).to(FP8)
    assert torch.equal(y.view(torch.uint8), want.view(torch.uint8))


# ---------------------------------------------------------------------------------------------- norm
@pytest.mark.parametrize("residual", [False, True])
def test_rmsnorm_bf16(residual):
    m, n = 3, 200
    x = torch.randn(m, n).to(BF16)
    w = (1 + 0.1 * torch.randn(n)).to(BF16)
    r = torch.randn(m, n).to(BF16) if residual else None
    want, h = ref.rmsnorm_ref(x, w, 1e-6, residual=r)
    r_k = r.clone() if residual else None
    y = ops.rmsnorm(x, w, 1e-6, out=nan_like((m, n), BF16), residual=r_k)
    assert not torch.isnan(y.float()).any()
    torch.testing.assert_close(y.double(), want, rtol=2 ** -7, atol=1e-2)
    if residual:
        assert torch.equal(r_k, h)  # the residual stream now holds x + r, rounded once


@pytest.mark.parametrize("residual", [False, True])
def test_rmsnorm_fp8(residual):
    m, n = 2, 300
    x = torch.randn(m, n).to(BF16)
    w = (1 + 0.1 * torch.randn(n)).to(BF16)
    r = torch.randn(m, n).to(BF16) if residual else None
    scale = torch.tensor([0.02])
    want, _ = ref.rmsnorm_ref(x, w, 1e-6, residual=r)
    y8 = ops.rmsnorm(x, w, 1e-6, out=nan_like((m, n), BF16).to(FP8), residual=r.clone() if residual else None,
                     scale=scale)
    assert_within_one_fp8_step(y8, (want / 0.02).clamp(-448, 448))


# ---------------------------------------------------------------------------------------------- GEMV / GEMM
def _weights(n, k, fp8):
    w = torch.randn(n, k) / k ** 0.5
    if fp8:
        return ops.quantize_weight_fp8(w)
    return w.to(BF16), None


@pytest.mark.parametrize("mode", ["bf16", "bf16_res", "bf16_f32out", "w8a16", "w8a16_res", "w8a8", "w8a8_res"])
def test_gemv(mode):
    n, k = 40, 600                      # 3 row blocks (last partial), K loop of 3 (bf16) / 2 (fp8) steps
    w, w_scale = _weights(n, k, "w8" in mode)
    x = torch.randn(k).to(BF16)
    x_scale = None
    if mode.startswith("w8a8"):
        x_scale = torch.tensor([0.01])
        x = ops.quantize_fp8(x, x_scale)
    res = torch.randn(n).to(BF16) if mode.endswith("_res") else None
    out_dtype = torch.float32 if mode.endswith("f32out") else BF16
    want = ref.linear_ref(x, w, w_scale=w_scale, x_scale=x_scale, residual=res)
    y = ops.gemv(x, w, w_scale=w_scale, x_scale=x_scale, residual=res, out=nan_like((n,), out_dtype))
    assert not torch.isnan(y.float()).any()
    assert rel_err(y, want) < (1e-6 if out_dtype == torch.float32 else 8e-3)


def test_gemv_residual_in_place():
    n, k = 24, 64
    w, _ = _weights(n, k, False)
    x = torch.randn(k).to(BF16)
    h = torch.randn(n).to(BF16)
    want = ref.linear_ref(x, w, residual=h)
    ops.gemv(x, w, residual=h, out=h)
    assert rel_err(h, want) < 8e-3


@pytest.mark.parametrize("mode", ["bf16", "bf16_res", "w8a16", "w8a8_res"])
def test_gemm(mode):
    m, n, k = 70, 150, 200             # 2×2 tiles, both partial; K loop 4 (bf16) / 2 (fp8)
    w, w_scale = _weights(n, k, "w8" in mode)
    a = torch.randn(m, k).to(BF16)
    a_scale = None
    if mode.startswith("w8a8"):
        a_scale = torch.tensor([0.01])
        a = ops.quantize_fp8(a, a_scale)
    res = torch.randn(m, n).to(BF16) if mode.endswith("_res") else None
    want = ref.linear_ref(a, w, w_scale=w_scale, x_scale=a_scale, residual=res)
    y = ops.gemm(a, w, w_scale=w_scale, a_scale=a_scale, residual=res, out=nan_like((m, n), BF16))
    assert not torch.isnan(y.float()).any()
    assert rel_err(y, want) < 8e-3


# ---------------------------------------------------------------------------------------------- RoPE + KV
@pytest.mark.parametrize("head_dim,rows", [(16, 3), (128, 1)])
def test_qk_norm_rope_kv(head_dim, rows):
    heads, kv_heads, max_pos, start = 4, 2, 40, 29
    cos, sin = ops.rope_tables(1e6, head_dim, max_pos)
    qkv = torch.randn(rows, (heads + 2 * kv_heads) * head_dim).to(BF16)
    qn = (1 + 0.1 * torch.randn(head_dim)).to(BF16)
    kn = (1 + 0.1 * torch.randn(head_dim)).to(BF16)
    kc = nan_like((kv_heads, max_pos, head_dim), BF16)
    vc = nan_like((kv_heads, max_pos, head_dim), BF16)
    pos = torch.tensor([start], dtype=torch.int32)
    q = ops.qk_norm_rope_kv(qkv, qn, kn, cos, sin, pos, kc, vc, heads=heads, kv_heads=kv_heads, eps=1e-6,
                            q_out=nan_like((rows, heads, head_dim), BF16))
    positions = torch.arange(start, start + rows)
    q_ref, k_ref, v_ref = ref.qk_norm_rope_ref(qkv, qn, kn, cos, sin, positions, heads, kv_heads, 1e-6)
    torch.testing.assert_close(q.double(), q_ref, rtol=2 ** -7, atol=2e-2)
    torch.testing.assert_close(kc[:, start:start + rows].double(), k_ref.transpose(0, 1), rtol=2 ** -7, atol=2e-2)
    assert torch.equal(vc[:, start:start + rows].double(), v_ref.transpose(0, 1))
    untouched = torch.ones(max_pos, dtype=torch.bool)
    untouched[start:start + rows] = False
    assert torch.isnan(kc[:, untouched].float()).all() and torch.isnan(vc[:, untouched].float()).all()


def test_rope_tables_are_bf16_rounded_d4():
    cos, sin = ops.rope_tables(1e6, 16, 50)
    inv = 1.0 / (1e6 ** (torch.arange(0, 16, 2).float() / 16))
    f = torch.arange(50).float()[:, None] * inv
    assert torch.equal(cos.float(), torch.cat((f, f), -1).cos().to(BF16).float())
    assert torch.equal(sin.float(), torch.cat((f, f), -1).sin().to(BF16).float())


# ---------------------------------------------------------------------------------------------- attention
def _cache(kv_heads, max_pos, d, length):
    kc = nan_like((kv_heads, max_pos, d), BF16)        # NaN beyond the valid length: must never be read
    vc = nan_like((kv_heads, max_pos, d), BF16)
    kc[:, :length] = torch.randn(kv_heads, length, d).to(BF16)
    vc[:, :length] = torch.randn(kv_heads, length, d).to(BF16)
    return kc, vc


@pytest.mark.parametrize("heads,kv_heads,d,pos", [(4, 2, 16, 0), (4, 2, 16, 36), (8, 2, 128, 299)])
def test_decode_attention(heads, kv_heads, d, pos):
    kc, vc = _cache(kv_heads, 320, d, pos + 1)
    q = torch.randn(heads, d).to(BF16)
    out = ops.decode_attention(q, kc, vc, torch.tensor([pos], dtype=torch.int32), out=nan_like((heads, d), BF16))
    want = ref.attention_ref(q[None], kc, vc, torch.tensor([pos]))[0]
    assert not torch.isnan(out.float()).any()
    torch.testing.assert_close(out.double(), want, rtol=2 ** -7, atol=1e-2)


def test_prefill_attention_causal_at_offset():
    heads, kv_heads, d, start, m = 4, 2, 16, 10, 70
    kc, vc = _cache(kv_heads, 100, d, start + m)
    q = torch.randn(m, heads, d).to(BF16)
    out = ops.prefill_attention(q, kc, vc, torch.tensor([start], dtype=torch.int32),
                                out=nan_like((m, heads, d), BF16))
    want = ref.attention_ref(q, kc, vc, torch.arange(start, start + m))
    assert not torch.isnan(out.float()).any()
    torch.testing.assert_close(out.double(), want, rtol=2 ** -6, atol=2e-2)


# ---------------------------------------------------------------------------------------------- MLP / head
def test_silu_mul_bf16_and_fp8():
    m, inter = 2, 1500
    gu = torch.randn(m, 2 * inter).to(BF16)
    want = ref.silu_mul_ref(gu)
    y = ops.silu_mul(gu, out=nan_like((m, inter), BF16))
    assert not torch.isnan(y.float()).any()
    torch.testing.assert_close(y.double(), want, rtol=2 ** -7, atol=1e-3)
    scale = torch.tensor([0.005])
    y8 = ops.silu_mul(gu, out=nan_like((m, inter), BF16).to(FP8), scale=scale)
    assert_within_one_fp8_step(y8, (want / 0.005).clamp(-448, 448))


@pytest.mark.parametrize("hidden", [64, 300])
def test_audio_head_fused_norm(hidden):
    n = 1100                    # the kernel is generic in N (8208 in the model); 69 row blocks, last partial
    w = (torch.randn(n, hidden) / hidden ** 0.5).to(BF16)
    h = (3 * torch.randn(hidden)).to(BF16)
    g = (1 + 0.1 * torch.randn(hidden)).to(BF16)
    y = ops.audio_head(h, w, g, 1e-6, out=nan_like((n,), torch.float32))
    want = ref.audio_head_ref(h, w, g, 1e-6)
    assert not torch.isnan(y).any()
    assert rel_err(y, want) < 1e-5


# ---------------------------------------------------------------------------------------------- sampler
def _run_sampler(logits, *, step, seed, temperature, top_k, top_p, hidden=24, countdown=-1, done=0):
    embed = torch.randn(8 * 1026, hidden).to(BF16)
    state, params = ops.sampler_state(seed, top_k, temperature, top_p, "cpu")
    state[0], state[3], state[4] = step, countdown, done
    rows = torch.full((step + 3, 8), -1, dtype=torch.int32)
    x = nan_like((hidden,), BF16)
    ops.sample(logits, embed, state, params, rows, x)
    return rows, state, x, embed


@pytest.mark.parametrize("temperature,top_k,top_p", SAMPLING_CASES)
def test_sampler_matches_python_d6(temperature, top_k, top_p):
    gen = torch.Generator().manual_seed(int(temperature * 100) + top_k)
    for trial in range(4):
        logits = torch.randn(8, 1026, generator=gen) * (1 + 2 * trial)
        seed = int(torch.randint(0, 2 ** 62, (1,), generator=gen)) * 3 + trial   # spans > 2^63 too
        step = 8 + 37 * trial
        rows, state, _, _ = _run_sampler(logits, step=step, seed=seed, temperature=temperature, top_k=top_k,
                                         top_p=top_p)
        want = ref.sample_row_ref(logits, step=step, seed=seed, temperature=temperature, top_k=top_k, top_p=top_p)
        assert rows[step].tolist() == want, (trial, seed)
        assert int(state[0]) == step + 1
        if top_p > 0:  # the engine's CPU sampler (SPEC D6 in torch) must agree too; it rejects top_p = 0
            engine_row = sampling.sample(logits, sampling.uniforms(seed, step), temperature, top_k, top_p)
            engine_row[step + 1:] = 1024
            assert rows[step].tolist() == engine_row.tolist(), (trial, seed)


def test_sampler_ties_and_threshold_edges():
    """Logits on a coarse grid make many exact ties at the top-k and top-p cut points. (top_p is kept off
    an exact multiple of the tied mass: there the cut depends on fp32 summation order, which D6 leaves open.)"""
    gen = torch.Generator().manual_seed(7)
    for trial, (temperature, top_k, top_p) in enumerate([(1.0, 30, 1.0), (1.0, 5, 0.5), (0.9, 0, 0.3),
                                                         (1.0, 100, 0.955), (0.0, 30, 0.8)]):
        logits = torch.randint(0, 4, (8, 1026), generator=gen).float()
        seed = 1000 + trial
        rows, _, _, _ = _run_sampler(logits, step=20, seed=seed, temperature=temperature, top_k=top_k, top_p=top_p)
        want = ref.sample_row_ref(logits, step=20, seed=seed, temperature=temperature, top_k=top_k, top_p=top_p)
        assert rows[20].tolist() == want, trial
        assert want == sampling.sample(logits, sampling.uniforms(seed, 20), temperature, top_k, top_p).tolist()


def test_sampler_greedy_ties_lowest_index_and_delay_window():
    logits = torch.zeros(8, 1026)
    logits[:, 5] = 3.0
    logits[:, 900] = 3.0                              # tie with 5: the lower index wins
    for step in range(9):
        rows, state, x, embed = _run_sampler(logits, step=step, seed=1, temperature=0.0, top_k=30, top_p=0.8)
        want = [5 if k <= step else 1024 for k in range(8)]
        assert rows[step].tolist() == want
        assert (rows[:step] == -1).all() and (rows[step + 1:] == -1).all()
        # Next input = fused embedding of the row (bf16 rows summed in fp32, rounded once).
        idx = torch.tensor(want) + 1026 * torch.arange(8)
        torch.testing.assert_close(x.float(), embed[idx].double().sum(0).to(BF16).float(), rtol=2 ** -8, atol=0)


def test_sampler_uniform_matches_counter_rng():
    # One-hot-free check of u: with two equal logits, the pick is index 0 iff u < 0.5.
    logits = torch.full((8, 1026), -1e4)
    logits[:, 0] = 0.0
    logits[:, 1] = 0.0
    for seed in (0, 1, 2 ** 63 + 5, 2 ** 64 - 1):
        rows, _, _, _ = _run_sampler(logits, step=9, seed=seed, temperature=1.0, top_k=0, top_p=1.0)
        assert rows[9].tolist() == [0 if ref.uniform(seed, 9, k) < 0.5 else 1 for k in range(8)]


def test_sampler_stop_state_matches_sglang_trace():
    """Greedy kernel steps on the fixture's scripted logits reproduce sglang-omni's emitted rows and stop."""
    if not (PARITY / "stop_trace.json").exists():
        parity_missing(str(PARITY / "stop_trace.json"))
    cases = json.loads((PARITY / "stop_trace.json").read_text())["cases"]
    for case in cases:
        state, params = ops.sampler_state(0, 0, 0.0, 1.0, "cpu")
        max_rows = case["max_rows"]
        rows = torch.full((max_rows, 8), -1, dtype=torch.int32)
        embed = torch.zeros(8 * 1026, 8, dtype=BF16)
        x = torch.empty(8, dtype=BF16)
        emitted = 0
        while emitted < max_rows:
            ops.sample(scripted_logits(emitted, case["overrides"]), embed, state, params, rows, x)
            emitted += 1
            if int(state[4]):
                break
        assert rows[:emitted].tolist() == case["rows"], case["name"]


def test_sampler_stop_state_transitions():
    logits = torch.zeros(8, 1026)
    logits[0, 1025] = 5.0                             # cb0 greedily picks EOC every step
    for step, countdown, done in [(3, -1, 0), (7, -1, 0), (8, -1, 0), (12, 6, 0), (12, 1, 0), (13, 0, 1)]:
        _, state, _, _ = _run_sampler(logits, step=step, seed=0, temperature=0.0, top_k=0, top_p=1.0,
                                      countdown=countdown, done=done)
        want = ref.stop_state_ref(step, 1025, countdown, done)
        assert (int(state[3]), int(state[4])) == want, (step, countdown, done)


# ---------------------------------------------------------------------------------------------- ops ↔ KERNELS
_TORCH_TYPES = {"*bf16": BF16, "*fp8e4nv": FP8, "*fp32": torch.float32, "*i32": torch.int32, "*i64": torch.int64}


def test_every_ops_launch_has_a_kernel_spec(monkeypatch):
    """The cubin runtime serves an ops call only if a KernelSpec was compiled for exactly its constexprs and
    launch options: run every op once (production tiles, the tiny model's dims) and match each launch."""
    import importlib

    specs = [s for m in ("norm", "gemv", "rope_kv", "attention", "mlp", "head", "sampler", "gemm")
             for s in importlib.import_module(f"kernels.{m}").KERNELS]
    launches = []

    class Recorder:
        def __init__(self, jit):
            self.jit = jit

        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                launches.append((self.jit, args, dict(kwargs)))
                return self.jit[grid](*args, **kwargs)
            return launch

    for name, value in list(vars(ops).items()):
        if isinstance(value, triton.runtime.jit.JITFunction) or hasattr(value, "fn") and hasattr(value, "arg_names"):
            monkeypatch.setattr(ops, name, Recorder(value))

    hidden, inter, heads, kv, d = 64, 128, 4, 2, 16
    x = torch.randn(3, hidden).to(BF16)
    g = torch.ones(hidden, dtype=BF16)
    s1 = torch.tensor([0.05])
    w, _ = _weights(hidden, hidden, False)
    w8, ws = _weights(hidden, hidden, True)
    for rows in (x[:1], x):
        ops.rmsnorm(rows, g, 1e-6)
        ops.rmsnorm(rows, g, 1e-6, residual=rows.clone())
        a8 = ops.rmsnorm(rows, g, 1e-6, scale=s1)
        ops.rmsnorm(rows, g, 1e-6, residual=rows.clone(), scale=s1)
        for res in (None, rows.clone()):
            ops.linear(rows, w, residual=res)
            ops.linear(rows, w8, w_scale=ws, residual=res)
            ops.linear(a8, w8, w_scale=ws, x_scale=s1, residual=res)
        ops.silu_mul(torch.randn(rows.shape[0], 2 * inter).to(BF16))
        ops.silu_mul(torch.randn(rows.shape[0], 2 * inter).to(BF16), scale=s1)
    ops.gemv(x[0], w, out_dtype=torch.float32)
    kc, vc = _cache(kv, 32, d, 8)
    pos = torch.tensor([4], dtype=torch.int32)
    cos, sin = ops.rope_tables(1e6, d, 32)
    q = ops.qk_norm_rope_kv(torch.randn(3, (heads + 2 * kv) * d).to(BF16), g[:d], g[:d], cos, sin, pos, kc, vc,
                            heads=heads, kv_heads=kv, eps=1e-6)
    ops.decode_attention(q[0], kc, vc, pos)
    kb, vb = torch.stack([kc, kc]), torch.stack([vc, vc])  # two slots
    ops.qk_norm_rope_kv_batch(torch.randn(2, (heads + 2 * kv) * d).to(BF16), g[:d], g[:d], cos, sin,
                              torch.tensor([1, 0], dtype=torch.int32), torch.tensor([5, -1], dtype=torch.int32),
                              kb, vb, heads=heads, kv_heads=kv, eps=1e-6)
    ops.prefill_attention(q, kc, vc, pos)
    ops.audio_head(x[0], torch.randn(40, hidden).to(BF16), g, 1e-6)
    _run_sampler(torch.randn(8, 1026), step=0, seed=1, temperature=0.8, top_k=30, top_p=0.8, hidden=hidden)
    state, params = ops.sampler_state(1, 30, 0.8, 0.8, "cpu")
    ops.sample_grid(torch.randn(8, 1026), torch.randn(8 * 1026, hidden).to(BF16), state, params,
                    torch.full((3, 8), -1, dtype=torch.int32), nan_like((hidden,), BF16), ops.sampler_scratch("cpu"))

    used = set()
    for jit, args, kwargs in launches:
        options = {k: kwargs.pop(k) for k in ("num_warps", "num_stages") if k in kwargs}
        bound = dict(zip(jit.arg_names, args))
        candidates = [s for s in specs if s.fn is jit and s.constexprs == kwargs
                      and options.get("num_warps", s.num_warps) == s.num_warps
                      and options.get("num_stages", s.num_stages) == s.num_stages]
        score = lambda s: sum(getattr(bound[p], "dtype", None) == _TORCH_TYPES.get(t)
                              for p, t in s.signature.items() if t.startswith("*"))
        candidates.sort(key=score, reverse=True)
        assert candidates, f"{jit.fn.__name__} launched with {kwargs} {options}: no KernelSpec"
        assert len(candidates) == 1 or score(candidates[0]) > score(candidates[1]), [s.name for s in candidates]
        used.add(candidates[0].name)
    missing = {s.name for s in specs} - used
    # head_dim-128 variants are for the 4B model; everything else must be exercised by ops.
    assert all(name.endswith("_d128") for name in missing), sorted(missing)
