"""The torch path on CUDA (engine/backends/torch_graph.py), its structure checked on the CPU: the static step
against the eager one, device sampling against engine/sampling.py, static buffers and the capture path
(with a recording stand-in for `torch.cuda.graph`), and whole takes through the engine. Its real run, on
CUDA graphs, is the device check's (bench/gpu_check.py, section "torch-graph")."""

from __future__ import annotations

import json

import pytest
import torch

from engine import backends
from engine.backends import torch_graph
from engine.backends.torch_graph import TorchGraphBackend, device_uniforms, seed_base
from engine.checkpoint import load_checkpoint
from engine.delay import StopRule
from engine.generate import Engine
from engine.model import HiggsModel
from engine.prompt import Prompt
from engine.sampling import sample, uniforms

# Logits of the static step against the eager step, fp32 tiny checkpoint, both reading the same cache. Where
# the attention window is exactly the visible positions (pos + 1 == bucket) the ops are the same, so they must
# be equal bit for bit. Elsewhere the softmax sum and P·V also reduce over the masked positions' exact zeros,
# which a CPU whose kernels block the longer reduction differently rounds differently (Intel AVX-512: never
# in 100 steps; AMD EPYC: from the first masked step), so those positions get a rounding bound.
WINDOW_ROUNDING = 1e-5


@pytest.fixture(scope="module")
def ckpt(parity_dir):
    return load_checkpoint(parity_dir / "tiny_checkpoint")


def model(ckpt, max_len=256):
    return HiggsModel.from_state_dict(ckpt.dims, ckpt.backbone, dtype=torch.float32, max_len=max_len)


def fixture(parity_dir, name):
    d = json.loads((parity_dir / f"{name}.json").read_text())
    return d, Prompt(ids=d["prompt_ids"], ref_rows=d["ref_rows"])


class RecordingCapture:
    """Stand-in for CudaCapture: records each captured function; replay calls it and counts."""

    def __init__(self):
        self.captured, self.replays = [], 0

    def __call__(self, fn):
        fn()  # the warm-up run
        self.captured.append(fn)
        outer = self

        class Graph:
            def replay(self):
                outer.replays += 1
                fn()
        return Graph()


# ------------------------------------------------------------------------------------------- sampling
@pytest.mark.parametrize("seed", [0, 1, 12345, 2**63 - 1, 2**63 + 5, 2**64 - 1])
def test_device_uniforms_equal_the_counter_rng(seed):
    base = torch.tensor([seed_base(seed)])
    books = torch.arange(8)
    want = uniforms(seed, 0, 8, steps=300)
    got = torch.stack([device_uniforms(base, torch.tensor([s]), books) for s in range(300)])
    assert torch.equal(got, want)


@pytest.mark.parametrize("settings", [(0.0, 30, 0.8), (0.8, 30, 0.8), (1.0, 0, 0.9), (0.7, 5, 1.0),
                                      (1.3, 1026, 0.5), (0.8, 1, 0.8), (2.0, 0, 1.0)])
def test_device_sampler_picks_what_sample_picks(ckpt, settings):
    """The sampler graph's rows against `engine.sampling.sample` on the same logits with the counter RNG's
    uniforms for that seed and step, past the delay window, ties at the top-k threshold and in the nucleus
    order included. On the CPU the graph is the eager stand-in: the CUDA capture runs in the device check."""
    temperature, top_k, top_p = settings
    backend = TorchGraphBackend(model(ckpt), capture=RecordingCapture())
    d = ckpt.dims
    gen = torch.Generator().manual_seed(3)
    for trial in range(40):
        logits = torch.randn(d.codebooks, d.codebook_vocab, generator=gen) * (1 + trial % 4)
        if trial % 5 == 0:  # ties at the top-k threshold and in the nucleus order
            logits = torch.randint(0, 4, (d.codebooks, d.codebook_vocab), generator=gen).float()
        backend.begin(logits, 10, seed=trial, temperature=temperature, top_k=top_k, top_p=top_p, max_rows=64)
        step = d.codebooks + trial  # every codebook past its BOC window: the row is the sampled one
        with torch.inference_mode():  # as inside rows()
            backend.step.fill_(step)
            backend.sampler.replay()
        want = sample(logits, uniforms(trial, step, d.codebooks), temperature, top_k, top_p)
        assert torch.equal(backend.row, want), (settings, trial)
        assert torch.equal(backend.history[step], want), (settings, trial)


def test_device_stop_state_follows_the_stop_rule(ckpt):
    """cb0 always EOC (greedy): the delay window forces BOC until step k, EOC counts from step 8, and the
    device's done flag rises on the row where StopRule says "eoc"."""
    backend = TorchGraphBackend(model(ckpt), capture=RecordingCapture())
    d = ckpt.dims
    logits = torch.zeros(8, 1026)
    logits[0, d.eoc] = 1.0
    logits[1:, 7] = 1.0
    backend.begin(logits, 10, seed=0, temperature=0.0, top_k=0, top_p=1.0, max_rows=40)
    rule = StopRule(d.codebooks, d.boc, d.eoc, max_frames=None, repeat_guard=None)
    for _ in range(20):
        with torch.inference_mode():  # as inside rows()
            backend.sampler.replay()  # the sampler alone: the logits stay the crafted ones
        rule.push(backend.row.tolist())
        assert backend.row.tolist() == rule.rows[-1]
        assert bool(backend.done) == rule.done, len(rule.rows)
        if rule.done:
            break
    assert rule.stop_reason == "eoc" and len(rule.rows) == d.codebooks + d.codebooks - 1
    assert backend.history[:len(rule.rows)].tolist() == rule.rows
    assert backend.pos.item() == 10 + len(rule.rows) - 1


# ------------------------------------------------------------------------------------------- the static step
def test_static_step_equals_the_eager_step(ckpt, parity_dir):
    _, prompt = fixture(parity_dir, "zero_shot")
    ids = torch.tensor(prompt.ids)
    eager, static = model(ckpt), TorchGraphBackend(model(ckpt), capture=RecordingCapture(), min_bucket=16)
    logits = eager.prefill(ids)
    assert torch.equal(static.prefill(ids), logits)
    exact = 0
    for step in range(40):
        row = logits.argmax(-1)
        row[step + 1:] = ckpt.dims.boc
        pos = len(ids) + step
        # The eager step reads the static backend's cache, so a window-closing step gets identical inputs
        # even after masked steps that rounded differently (their K/V would otherwise differ downstream).
        with torch.inference_mode():
            for a, b in zip(eager.layers, static.model.layers):
                a.self_attn.cache.k.copy_(b.self_attn.cache.k)
                a.self_attn.cache.v.copy_(b.self_attn.cache.v)
        logits, got = eager.decode(row, pos), static.decode(row, pos)
        if pos + 1 == static.bucket(pos):
            assert torch.equal(got, logits), pos
            exact += 1
        else:
            assert (got - logits).abs().max() <= WINDOW_ROUNDING * logits.abs().max(), pos
    assert exact == 2  # positions 15 and 31 close their windows
    assert sorted(static.step_graphs) == [16, 32, 64]


def test_static_buffers_and_one_capture_per_bucket_and_setting(ckpt, parity_dir):
    _, prompt = fixture(parity_dir, "zero_shot")
    ids = torch.tensor(prompt.ids)
    capture = RecordingCapture()
    backend = TorchGraphBackend(model(ckpt), capture=capture, min_bucket=16)
    caches = [(layer.self_attn.cache.k, layer.self_attn.cache.v) for layer in backend.model.layers]

    def addresses():
        return ([t.data_ptr() for t in (backend.row, backend.pos, backend.logits, backend.state, backend.history)]
                + [t.data_ptr() for pair in caches for t in pair])

    first = backend.prefill(ids)
    backend.begin(first, len(ids), seed=7, temperature=0.8, top_k=30, top_p=0.8, max_rows=40)
    before = addresses()
    a, _ = backend.rows(3)
    b, _ = backend.rows(37)
    assert addresses() == before and a.shape == (3, 8) and b.shape == (37, 8)
    # one sampler graph, and step graphs for the windows 16, 32, 64 (positions 15..54)
    assert len(capture.captured) == 4 and capture.replays == 2 * 40
    assert backend.rows(5)[0].shape == (0, 8)  # never past max_rows
    # a second take with the same settings replays the same graphs; new settings capture one sampler
    backend.prefill(ids)
    backend.begin(first, len(ids), seed=7, temperature=0.8, top_k=30, top_p=0.8, max_rows=40)
    again = torch.cat([backend.rows(10)[0], backend.rows(30)[0]])
    assert torch.equal(again, torch.cat([a, b])) and len(capture.captured) == 4
    backend.begin(first, len(ids), seed=7, temperature=0.0, top_k=0, top_p=1.0, max_rows=40)
    assert len(capture.captured) == 5 and addresses() == before
    # a bigger cache drops the step graphs (they read the old cache's addresses)
    backend.setup_cache(512)
    assert backend.step_graphs == {} and backend.max_len == 512


def test_capture_warm_up_does_not_disturb_the_take(ckpt, parity_dir):
    """Graphs captured mid-take (the recording stand-in runs a warm-up, as CUDA capture does) give the rows
    of graphs captured beforehand: the sampler warm-up is undone, the step warm-up computes the same step."""
    _, prompt = fixture(parity_dir, "zero_shot")
    ids = torch.tensor(prompt.ids)
    takes = []
    for warm in (False, True):
        backend = TorchGraphBackend(model(ckpt), capture=RecordingCapture(), min_bucket=16)
        first = backend.prefill(ids)
        if warm:  # every graph exists before the take starts
            backend.begin(first, len(ids), seed=3, temperature=0.8, top_k=30, top_p=0.8, max_rows=45)
            backend.rows(45)
            backend.prefill(ids)
        backend.begin(first, len(ids), seed=3, temperature=0.8, top_k=30, top_p=0.8, max_rows=45)
        takes.append(torch.cat([backend.rows(n)[0] for n in (2, 4, 8, 16, 15)]))
    assert torch.equal(takes[0], takes[1])


# ------------------------------------------------------------------------------------------- whole takes
@pytest.mark.parametrize("name", ["zero_shot", "voice_clone"])
def test_greedy_take_equals_the_parity_codes(parity_dir, name):
    d, prompt = fixture(parity_dir, name)
    # max_batch 1: the fused single-stream path (graphs, device sampling); larger engines batch eagerly
    engine = Engine.load(parity_dir / "tiny_checkpoint", device="cpu", precision="fp32", backend="torch-graph",
                         max_batch=1)
    assert engine.info.backend == "torch-graph" and "stand-in" in engine.info.extra["graphs"]
    assert engine.scheduler is None and engine.info.max_batch == 1
    # load captured every window and the default-settings sampler (a failing capture fails the load)
    assert list(engine.model.sampler_graphs) == [(0.8, 30, 0.8)]
    assert sorted(engine.model.step_graphs) == engine.model.windows() == [256, 512, 1024, 2048, 4096]
    frames = engine.predict(prompt=prompt, temperature=0, max_frames=d["predict_max_frames"], repeat_guard=None)
    assert frames.tolist() == d["frames"]


def test_sampled_take_equals_the_eager_engine(parity_dir):
    _, prompt = fixture(parity_dir, "voice_clone")
    takes = [Engine.load(parity_dir / "tiny_checkpoint", device="cpu", precision="fp32", backend=b,
                         max_batch=1).predict(prompt=prompt, seed=11, max_frames=120) for b in ("torch", "torch-graph")]
    assert torch.equal(takes[0], takes[1]) and len(takes[0]) > 20


def test_auto_on_the_cpu_is_still_the_eager_torch_path(parity_dir):
    engine = Engine.load(parity_dir / "tiny_checkpoint", device="cpu")
    assert engine.info.backend == "torch" and type(engine.model) is HiggsModel


def test_auto_choice_on_a_cuda_device_without_cubins(monkeypatch):
    """A CUDA device where the cubin backend is unavailable (here: its module cannot be imported): auto
    takes torch-graph, with eager torch behind it, and says why."""
    monkeypatch.setitem(backends.BACKENDS, "cubin", "engine.backends.not_installed:load")
    name, fallback, reason = backends.auto_choice(torch.device("cuda"))
    assert (name, fallback) == ("torch-graph", "torch")
    assert reason.startswith("backend 'cubin' is not available") and reason.endswith("using the torch-graph path")
    assert backends.auto_choice(torch.device("cpu")) == (
        "torch", "torch", "no CUDA GPU: the torch reference path runs on the CPU")


def test_auto_falls_back_cubin_then_torch_graph_then_torch():
    def broken(name):
        def factory():
            raise RuntimeError(f"{name} broke")
        return factory

    cubin, graph = broken("cubin"), broken("graph")
    def eager():
        return "eager"

    made = {cubin: cubin, graph: graph, eager: eager}
    saved = dict(backends.BACKENDS)
    backends.BACKENDS.update({"torch-graph": graph, "torch": eager})
    try:
        model, name, reason = backends.start("cubin", cubin, auto=True, reason=None,
                                                      make=lambda f: made[f](), fallback="torch-graph")
    finally:
        backends.BACKENDS.clear()
        backends.BACKENDS.update(saved)
    assert (model, name) == ("eager", "torch")
    assert "cubin broke" in reason and "graph broke" in reason and reason.endswith("using the torch path")
    made[graph] = lambda: "graphed"
    backends.BACKENDS.update({"torch-graph": graph, "torch": eager})
    try:
        model, name, reason = backends.start("cubin", cubin, auto=True, reason=None,
                                                      make=lambda f: made[f](), fallback="torch-graph")
    finally:
        backends.BACKENDS.clear()
        backends.BACKENDS.update(saved)
    assert (model, name) == ("graphed", "torch-graph") and "using the torch-graph path" in reason


def test_fp8_needs_the_cubin_backend(ckpt):
    with pytest.raises(ValueError, match="needs the cubin backend"):
        torch_graph.load(ckpt, device=torch.device("cpu"), dtype=None, precision="fp8")


def test_registered_as_a_backend_module():
    assert backends.BACKENDS["torch-graph"] == "engine.backends.torch_graph:load"
    assert backends.resolve(backends.BACKENDS["torch-graph"]) is torch_graph.load
    assert backends.AUTO_ON_CUDA == ("cubin", "torch-graph")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (the capture itself)")
def test_cuda_graphs_give_the_eager_engines_takes(parity_dir):
    """On a GPU: the real `torch.cuda.graph` captures, greedy and sampled takes against eager torch on the
    same device in fp32 (the window's rounding is far below the fixture's argmax margins; in bf16 it might
    flip a near-tie, which the device check reports instead)."""
    d, prompt = fixture(parity_dir, "voice_clone")
    engines = [Engine.load(parity_dir / "tiny_checkpoint", device="cuda", precision="fp32", backend=b)
               for b in ("torch", "torch-graph")]
    assert engines[1].info.extra["graphs"] == "CUDA graphs"
    for options in (dict(temperature=0, max_frames=d["predict_max_frames"], repeat_guard=None),
                    dict(seed=11, max_frames=120)):
        eager, graphed = (e.predict(prompt=prompt, **options) for e in engines)
        assert torch.equal(eager, graphed), options
