"""The grid sampler (kernels/sampler.py `sample_grid_kernel`, the cubin backend's variant "v3"): one program
per codebook with radix thresholds must give exactly what the single-program sampler gives — the same
picks (SPEC D6, against kernels/reference.py and engine/sampling.py), the same stop state (D5), the same
row and the bit-identical next input — on the CPU interpreter, outputs NaN/-1-poisoned. The interpreter
runs the 8 programs one after another, so the ticket protocol is exercised in one order; the SASS test
(tests/test_kernels_fused_sass.py) checks its single integer atomic behind a release fence."""

import json

import pytest
import torch
import triton
import triton.language as tl

from engine import sampling
from kernels import ops
from kernels import reference as ref
from kernels.sampler import _largest_bits_with_count, _largest_bits_with_mass, _radix_largest
from tests.conftest import PARITY, parity_missing
from tests.helpers import SAMPLER_TAKES, SAMPLING_CASES, committed_cubins, nan_like, sass_instructions, scripted_logits

BF16 = torch.bfloat16
HIDDEN = 24


def run(sampler, logits, embed, *, step, seed, temperature, top_k, top_p, countdown=-1, done=0, max_rows=None,
        scratch=None):
    """One step of `sampler` ("cta" or "grid") from a fresh state; returns (rows, state, x, scratch)."""
    state, params = ops.sampler_state(seed, top_k, temperature, top_p, "cpu")
    state[0], state[3], state[4] = step, countdown, done
    rows = torch.full((step + 3 if max_rows is None else max_rows, 8), -1, dtype=torch.int32)
    x = nan_like((embed.shape[1],), BF16)
    if sampler == "grid":
        scratch = scratch or ops.sampler_scratch("cpu")
        scratch[0].fill_(-1)
        ops.sample_grid(logits, embed, state, params, rows, x, scratch)
    else:
        ops.sample(logits, embed, state, params, rows, x)
    return rows, state, x, scratch


def both(logits, **kw):
    """The grid sampler's step and the single program's, on the same inputs; asserts they are identical
    (row history, state, next input bit for bit) and that the ticket counter is back to zero."""
    embed = torch.randn(8 * 1026, HIDDEN, generator=torch.Generator().manual_seed(3)).to(BF16)
    g_rows, g_state, g_x, scratch = run("grid", logits, embed, **kw)
    c_rows, c_state, c_x, _ = run("cta", logits, embed, **kw)
    assert torch.equal(g_rows, c_rows) and torch.equal(g_state, c_state)
    assert not torch.isnan(g_x.float()).any() and torch.equal(g_x.view(torch.int16), c_x.view(torch.int16))
    assert int(scratch[1]) == 0
    return g_rows, g_state


@pytest.mark.parametrize("temperature,top_k,top_p", SAMPLING_CASES)
def test_grid_sampler_matches_d6_and_the_single_program(temperature, top_k, top_p):
    gen = torch.Generator().manual_seed(int(temperature * 100) + top_k + 1)
    for trial in range(3):
        logits = torch.randn(8, 1026, generator=gen) * (1 + 2 * trial)
        seed = int(torch.randint(0, 2 ** 62, (1,), generator=gen)) * 3 + trial   # spans > 2^63 too
        step = 8 + 37 * trial
        rows, state = both(logits, step=step, seed=seed, temperature=temperature, top_k=top_k, top_p=top_p)
        want = ref.sample_row_ref(logits, step=step, seed=seed, temperature=temperature, top_k=top_k, top_p=top_p)
        assert rows[step].tolist() == want, (trial, seed)
        assert int(state[0]) == step + 1
        if top_p > 0:  # the engine's CPU sampler rejects top_p = 0
            engine_row = sampling.sample(logits, sampling.uniforms(seed, step), temperature, top_k, top_p)
            engine_row[step + 1:] = 1024
            assert rows[step].tolist() == engine_row.tolist(), (trial, seed)


def test_grid_sampler_ties_at_the_cuts():
    """Coarse logits: many exact ties at the top-k and top-p thresholds, resolved by index (top_p kept off
    an exact multiple of the tied mass, where D6 leaves the cut to fp32 summation order)."""
    gen = torch.Generator().manual_seed(7)
    for trial, (temperature, top_k, top_p) in enumerate([(1.0, 30, 1.0), (1.0, 5, 0.5), (0.9, 0, 0.3),
                                                         (1.0, 100, 0.955), (1.0, 1025, 0.7), (0.0, 30, 0.8)]):
        logits = torch.randint(0, 4, (8, 1026), generator=gen).float()
        seed = 1000 + trial
        rows, _ = both(logits, step=20, seed=seed, temperature=temperature, top_k=top_k, top_p=top_p)
        want = ref.sample_row_ref(logits, step=20, seed=seed, temperature=temperature, top_k=top_k, top_p=top_p)
        assert rows[20].tolist() == want, trial
        assert want == sampling.sample(logits, sampling.uniforms(seed, 20), temperature, top_k, top_p).tolist()


def test_grid_sampler_greedy_ties_and_delay_window():
    logits = torch.zeros(8, 1026)
    logits[:, 5] = 3.0
    logits[:, 900] = 3.0                              # tie with 5: the lower index wins
    for step in range(9):
        rows, _ = both(logits, step=step, seed=1, temperature=0.0, top_k=30, top_p=0.8)
        assert rows[step].tolist() == [5 if k <= step else 1024 for k in range(8)]
        assert (rows[:step] == -1).all() and (rows[step + 1:] == -1).all()


def test_grid_sampler_uniform_is_the_counter_rng():
    logits = torch.full((8, 1026), -1e4)
    logits[:, :2] = 0.0                               # two equal logits: index 0 iff u < 0.5
    for seed in (0, 1, 2 ** 63 + 5, 2 ** 64 - 1):
        rows, _ = both(logits, step=9, seed=seed, temperature=1.0, top_k=0, top_p=1.0)
        assert rows[9].tolist() == [0 if ref.uniform(seed, 9, k) < 0.5 else 1 for k in range(8)]


def test_grid_sampler_stop_state_transitions_and_full_history():
    logits = torch.zeros(8, 1026)
    logits[0, 1025] = 5.0                             # cb0 greedily picks EOC every step
    for step, countdown, done in [(3, -1, 0), (7, -1, 0), (8, -1, 0), (12, 6, 0), (12, 1, 0), (13, 0, 1)]:
        _, state = both(logits, step=step, seed=0, temperature=0.0, top_k=0, top_p=1.0, countdown=countdown,
                        done=done)
        assert (int(state[3]), int(state[4])) == ref.stop_state_ref(step, 1025, countdown, done)
    # past the history's end: no row is stored, the state and the next input still advance
    rows, state = both(logits, step=6, seed=0, temperature=0.0, top_k=0, top_p=1.0, max_rows=6)
    assert (rows == -1).all() and int(state[0]) == 7


def test_grid_sampler_stop_trace_matches_sglang():
    """Greedy grid-sampler steps on the fixture's scripted logits reproduce sglang-omni's rows and stop, with
    one scratch (and its ticket counter) reused launch after launch, as the captured graph reuses it."""
    if not (PARITY / "stop_trace.json").exists():
        parity_missing(str(PARITY / "stop_trace.json"))
    scratch = ops.sampler_scratch("cpu")
    for case in json.loads((PARITY / "stop_trace.json").read_text())["cases"]:
        state, params = ops.sampler_state(0, 0, 0.0, 1.0, "cpu")
        rows = torch.full((case["max_rows"], 8), -1, dtype=torch.int32)
        embed, x = torch.zeros(8 * 1026, 8, dtype=BF16), torch.empty(8, dtype=BF16)
        emitted = 0
        while emitted < case["max_rows"]:
            ops.sample_grid(scripted_logits(emitted, case["overrides"]), embed, state, params, rows, x, scratch)
            emitted += 1
            if int(state[4]):
                break
        assert rows[:emitted].tolist() == case["rows"], case["name"]


# ---------------------------------------------------------------------------------------------- B takes
def test_grid_sampler_takes_are_each_sampled_as_alone():
    """The grid (8, B) in `sample_batch`'s layout: each take, with its own settings, seed, step and stop state,
    gets exactly what the single-program sampler gives it alone (row history, state, next input), and every
    take's ticket counter is back at zero; take 2 draws EOC inside its own tail, take 3 starts its tail."""
    takes = SAMPLER_TAKES + [(0.0, 0, 1.0, 3, 9, -1, 0)]
    gen = torch.Generator().manual_seed(13)
    logits = torch.randn(len(takes), 8, 1026, generator=gen) * 2
    logits[2, 0, 1025] = logits[5, 0, 1025] = 30.0
    embed = torch.randn(8 * 1026, 32, generator=gen).to(BF16)
    state, params = ops.sampler_states([t[3] for t in takes], [t[1] for t in takes], [t[0] for t in takes],
                                       [t[2] for t in takes], "cpu")
    for i, (_, _, _, _, step, countdown, done) in enumerate(takes):
        state[i, 0], state[i, 3], state[i, 4] = step, countdown, done
    rows = torch.full((len(takes), max(t[4] for t in takes) + 3, 8), -1, dtype=torch.int32)
    x = nan_like((len(takes), 32), BF16)
    scratch = ops.sampler_scratch("cpu", takes=len(takes))
    ops.sample_grid(logits, embed, state, params, rows, x, scratch)
    assert (scratch[1] == 0).all()
    for b, (temperature, top_k, top_p, seed, step, countdown, done) in enumerate(takes):
        one_state, one_params = ops.sampler_state(seed, top_k, temperature, top_p, "cpu")
        one_state[0], one_state[3], one_state[4] = step, countdown, done
        one_rows = torch.full(rows.shape[1:], -1, dtype=torch.int32)
        one_x = nan_like((32,), BF16)
        ops.sample(logits[b], embed, one_state, one_params, one_rows, one_x)
        assert torch.equal(rows[b], one_rows) and torch.equal(state[b], one_state), b
        assert torch.equal(x[b].view(torch.int16), one_x.view(torch.int16)), b
    assert state[5, 3:].tolist() == [6, 0]              # EOC at step 9 starts take 5's own tail


# ---------------------------------------------------------------------------------------------- the search
@triton.jit
def _search_kernel(BITS, KEEP, Q, OUT, need, top_p, BLOCK_V: tl.constexpr, RADIX_BITS: tl.constexpr):
    v = tl.arange(0, BLOCK_V)[None, :]
    bits = tl.load(BITS + v)
    keep = tl.load(KEEP + v) != 0
    q = tl.load(Q + v)
    tl.store(OUT + tl.arange(0, 1), _largest_bits_with_count(bits, keep, need, 1))
    tl.store(OUT + 1 + tl.arange(0, 1), _radix_largest(bits, keep, need, q, top_p, False, 1, RADIX_BITS))
    tl.store(OUT + 2 + tl.arange(0, 1), _largest_bits_with_mass(bits, keep, q, top_p, 1))
    tl.store(OUT + 3 + tl.arange(0, 1), _radix_largest(bits, keep, need, q, top_p, True, 1, RADIX_BITS))


@pytest.mark.parametrize("radix_bits", [1, 2, 3])
def test_radix_search_finds_the_bisections_threshold(radix_bits):
    """`_radix_largest` against the bisection it replaces, on probabilities with heavy ties, a mask, and
    the edge cuts: need = all kept / 1, top_p ≤ 0 (the cap), above the total mass (no t qualifies)."""
    gen = torch.Generator().manual_seed(radix_bits)
    for trial in range(6):
        logits = torch.randint(0, 6, (256,), generator=gen).float() if trial % 2 else torch.randn(256, generator=gen)
        p = torch.softmax(logits * (1 + trial), -1)
        keep = torch.rand(256, generator=gen) < 0.7
        q = torch.where(keep, p, 0.0)
        q = q / q.sum()
        kept = int(keep.sum())
        for need, top_p in ((1, 0.0), (kept, 0.5), (int(torch.randint(1, kept, (1,), generator=gen)), 0.9),
                            (3, 1.5), (kept // 2, -1.0)):
            out = torch.full((4,), -1, dtype=torch.int32)
            _search_kernel[(1,)](p.view(torch.int32), keep.to(torch.int32), q, out, need, top_p, BLOCK_V=256,
                                 RADIX_BITS=radix_bits)
            assert out[1] == out[0] and out[3] == out[2], (trial, need, top_p, out.tolist())


# ---------------------------------------------------------------------------------------------- the backend
@pytest.mark.parametrize("variant,sampler,want", [("v1", None, "sample"), ("v2", None, "sample"),
                                                  ("v3", None, "sample_grid"), ("v2", "grid", "sample_grid"),
                                                  ("v3", "cta", "sample")])
def test_backend_variant_picks_its_sampler(tiny_checkpoint_dims, variant, sampler, want, monkeypatch):
    """v1 / v2 keep the single-program sampler, v3 samples on the grid; `sampler=` overrides either way
    (the device check's A/B). The step itself is stubbed: only the sampler's launch is looked at."""
    from engine.backends.cubin import CubinBackend

    dims, backbone = tiny_checkpoint_dims
    calls = []
    for name in ("sample", "sample_grid"):
        real = getattr(ops, name)
        monkeypatch.setattr(ops, name, lambda *a, _n=name, _f=real: calls.append(_n) or _f(*a))
    be = CubinBackend(dims, backbone, ops=ops, device="cpu", precision="bf16", max_len=32, variant=variant,
                      sampler=sampler)
    be.begin(torch.randn(8, 1026), 3, seed=5, temperature=0.8, top_k=30, top_p=0.8, max_rows=4)
    monkeypatch.setattr(be, "_layers", lambda h: None)
    rows, _ = be.rows(2)
    assert calls == [want, want] and rows.shape == (2, 8)


def test_backend_refuses_an_unknown_sampler(tiny_checkpoint_dims):
    from engine.backends.cubin import CubinBackend

    dims, backbone = tiny_checkpoint_dims
    with pytest.raises(ValueError, match="sampler must be"):
        CubinBackend(dims, backbone, ops=ops, device="cpu", precision="bf16", max_len=32, sampler="warp")


@pytest.fixture(scope="module")
def tiny_checkpoint_dims(parity_dir):
    from engine.checkpoint import load_checkpoint

    ckpt = load_checkpoint(parity_dir / "tiny_checkpoint", progress=False)
    return ckpt.dims, ckpt.backbone


# ---------------------------------------------------------------------------------------------- SASS
def _grid_cubins():
    from kernels import manifest as mf
    return [mf.load(cc).root / mf.load(cc).kernels[name].cubin
            for cc, name in committed_cubins("sample_embed_grid")]


@pytest.mark.skipif(not _grid_cubins(), reason="no committed grid-sampler cubins (python -m kernels.build)")
@pytest.mark.parametrize("cubin", _grid_cubins(), ids=lambda p: p.parent.name)
def test_grid_sampler_takes_one_integer_ticket_after_a_release_fence(cubin):
    """The finishing program is chosen by one integer `ATOMG.E.ADD` per program with a GPU-scope `MEMBAR`
    among the 8 instructions before it (every pick stored before the counter moves), and no float atomics
    anywhere; no spills is checked for every committed cubin by tests/test_kernels_build.py."""
    ins = sass_instructions(cubin)
    atoms = [i for i, (_, op, _) in enumerate(ins) if op.startswith(("ATOM", "RED."))]   # not REDUX (warp)
    assert len(atoms) == 1 and ins[atoms[0]][1].startswith("ATOMG.E.ADD") and ".F32" not in ins[atoms[0]][1]
    before = [op for _, op, _ in ins[max(0, atoms[0] - 8):atoms[0]]]     # sm_89 schedules it 7 before
    assert any(op.startswith("MEMBAR") and op.endswith(".GPU") for op in before), before


def test_committed_manifests_serve_the_grid_sampler():
    """The cubin runtime's copy of ops finds the committed grid-sampler cubin on every arch (constexprs,
    warps, argument list, alignment) for one take and for B takes, with the bits `ops` gives."""
    from kernels import manifest as mf
    from kernels.runtime import InterpretedKernels, cubin_ops

    gen = torch.Generator().manual_seed(21)
    logits = torch.randn(2, 8, 1026, generator=gen) * 2
    embed = torch.randn(8 * 1026, 32, generator=gen).to(BF16)

    def run(o):
        state, params = o.sampler_states([3, 4], [30, 0], [0.8, 1.0], [0.8, 0.95], "cpu")
        state[:, 0] = torch.tensor([9, 2])
        rows, x = torch.full((2, 12, 8), -1, dtype=torch.int32), nan_like((2, 32), BF16)
        o.sample_grid(logits, embed, state, params, rows, x, o.sampler_scratch("cpu", 2))
        one_state, one_params = o.sampler_state(3, 30, 0.8, 0.8, "cpu")
        one_rows, one_x = torch.full((12, 8), -1, dtype=torch.int32), nan_like((32,), BF16)
        o.sample_grid(logits[0], embed, one_state, one_params, one_rows, one_x, o.sampler_scratch("cpu"))
        return rows, state, x, one_rows, one_state, one_x

    want = run(ops)
    served = 0
    for cc in mf.TARGETS:
        try:
            kernels = InterpretedKernels(mf.load(cc))
        except mf.ManifestError:
            continue
        got = run(cubin_ops(kernels))
        assert kernels.launches == ["sample_embed_grid"] * 2
        assert all(torch.equal(a.view(torch.int16) if a.dtype == BF16 else a, b.view(torch.int16)
                               if b.dtype == BF16 else b) for a, b in zip(got, want)), cc
        served += 1
    assert served, "no committed manifest"
