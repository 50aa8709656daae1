"""The scheduler's takes sampled on the device (engine/runner.py `Runner.sample_rows` over the cubin backend's
`sample_rows`, engine/backends/cubin_steps.py), on the CPU under Triton's interpreter: a batch of takes with
different seeds and settings gets the host sampler's rows and stop states (engine/sampling.py `sample_row`,
engine/delay.py `StopRule`) through either batched sampler cubin, a take with NaN logits ends alone, and an
engine's takes, batched with a joiner, a cancel and a faulty neighbour, give the codes host sampling gives
them alone. The torch backends keep host sampling. On a GPU (the gpu tier, skipped elsewhere) the cubin
engine samples on the device by default and gives host sampling's codes."""

import copy
import threading

import pytest
import torch

pytest.importorskip("triton", reason="Triton is not installed (pip install -r requirements-dev.txt)")

from engine.backends.base import BatchedSampling
from engine.backends.cubin import CubinBackend
from engine.backends.torch_graph import TorchGraphBackend
from engine.checkpoint import load_checkpoint
from engine.delay import StopRule
from engine.generate import Engine
from engine.model import HiggsModel
from engine.prompt import Prompt, zero_shot_ids
from engine.runner import Runner
from engine.sampling import NonFiniteLogits, sample_row, uniforms
from engine.types import EngineInfo, SamplingParams
from kernels import manifest as mf
from kernels import ops
from kernels.runtime import InterpretedKernels, available, cubin_ops
from tests import interp_rounding
from tests.helpers import held_pair, take_in_thread, wait_for

interp_rounding.install()

GPU_OK, GPU_REASON = available()

MAX_LEN = 64
EOC = 1025
# (temperature, top_k, top_p, seed): the defaults, greedy, top-p only, top-k only, plain softmax, and a take
# whose logits turn NaN
TAKES = [(0.8, 30, 0.8, 2**62 + 12345), (0.0, 30, 0.8, 7), (1.3, 0, 0.9, 99), (0.7, 50, 1.0, 2**40 + 1),
         (1.0, 0, 1.0, 5), (0.8, 30, 0.8, 11)]
# Rows each take has before the first compared step, and where cb0 drew EOC among them: inside the delay window
# (its EOC too early to count), at step 8 (EOC drawn now starts the tail), inside the tail, past the window,
# on the tail's last row, past the window.
HISTORY = [(3, None), (8, None), (11, 9), (20, None), (14, 8), (9, None)]


@pytest.fixture(scope="module")
def ckpt(parity_dir):
    return load_checkpoint(parity_dir / "tiny_checkpoint", progress=False)


def rules_with_history():
    """Each take's stop rule after its HISTORY (repeat guard off, room for 40 frames)."""
    rules = []
    for rows, eoc_at in HISTORY:
        rule = StopRule(max_frames=40, repeat_guard=None)
        for s in range(rows):
            rule.push([EOC if s == eoc_at else 5] + [6] * 7)
        rules.append(rule)
    return rules


def step_logits(step, gen):
    logits = torch.randn(len(TAKES), 8, 1026, generator=gen) * torch.tensor([1.0, 3.0, 2.0, 1.0, 5.0, 1.0])[:, None, None]
    logits[[0, 1], 0, EOC] = 30.0  # take 0 draws EOC in its delay window (no effect), take 1 past it: its tail starts
    if step == 1:
        logits[5, 3, 7] = float("nan")
    return logits


@pytest.mark.parametrize("sampler,cubin", [("cta", "sample_embed_batch"), ("grid", "sample_embed_grid")])
def test_device_rows_and_stop_states_are_the_host_samplers(ckpt, sampler, cubin):
    """Two steps of six takes through the committed sampler cubin (launched as on a GPU, run by the
    interpreter): each take's row and stop rule equal `sample_row`'s on a twin rule, the delay window, the EOC
    start at step ≥ 8 and the end of a tail included; the take whose logits hold a NaN ends with
    `NonFiniteLogits` and its neighbours' rows are unaffected."""
    kernels = InterpretedKernels(mf.load(90))
    be = CubinBackend(ckpt.dims, ckpt.backbone, ops=cubin_ops(kernels), device="cpu", precision="bf16",
                      max_len=MAX_LEN, sampler=sampler)
    be.setup_slots(len(TAKES))
    runner = Runner(be, ckpt.dims, torch.device("cpu"), batched=True)
    assert isinstance(be, BatchedSampling) and not runner.device_sampling  # off CUDA, only when asked
    params = [SamplingParams(temperature=t, top_k=k, top_p=p, seed=s) for t, k, p, s in TAKES]
    device_rules = rules_with_history()
    host_rules = copy.deepcopy(device_rules)
    gen = torch.Generator().manual_seed(21)
    live = list(range(len(TAKES)))
    for step in range(2):
        logits = step_logits(step, gen)
        got = runner.sample_rows([logits[i] for i in live], [device_rules[i] for i in live],
                                 [params[i] for i in live])
        for i, row in zip(live, got):
            p, rule = params[i], host_rules[i]
            u = uniforms(p.seed, 0, 8, steps=rule.max_rows).view(-1, 8)
            try:
                want = sample_row(logits[i], u, rule, p.temperature, p.top_k, p.top_p)
            except NonFiniteLogits as exc:
                assert isinstance(row, NonFiniteLogits) and str(row) == str(exc), (step, i, row)
                continue
            assert row == want, (step, i)
            mine = device_rules[i]
            assert (mine.step, mine.countdown, mine.stop_reason) == (rule.step, rule.countdown, rule.stop_reason)
        live = [i for i, row in zip(live, got) if not isinstance(row, Exception) and not device_rules[i].done]
        if step == 0:
            assert live == [0, 1, 2, 3, 5], "take 4's tail ends at its first step"
            assert device_rules[1].countdown == 6 and device_rules[0].countdown is None
            assert device_rules[0].rows[-1][4:] == [1024] * 4  # codebooks past the step: BOC
    assert live == [0, 1, 2, 3]
    assert cubin in kernels.launches and kernels.launches.count(cubin) == 2  # one launch a step


def test_the_torch_backends_sample_on_the_host():
    assert not any(hasattr(backend, "sample_rows") for backend in (HiggsModel, TorchGraphBackend))


def test_a_device_stop_state_the_rule_does_not_share_ends_that_take_alone(ckpt):
    """A backend whose sampler ends a tail that engine/delay.py keeps going: that take gets the sentence, its
    neighbour its row."""

    class Disagreeing:
        def sample_rows(self, logits, draws):
            return torch.tensor([[5] * 8 + [int(d.step == 9), 1] for d in draws])

    runner = Runner(Disagreeing(), ckpt.dims, torch.device("cpu"), batched=True)
    rules = [StopRule(repeat_guard=None) for _ in range(2)]
    for s in range(9):
        rules[0].push([5] * 8)
    got = runner.sample_rows([torch.zeros(8, 1026)] * 2, rules, [SamplingParams(seed=1)] * 2)
    assert isinstance(got[0], RuntimeError) and "disagree at row 9" in str(got[0]), got[0]
    assert got[1] == [5] + [1024] * 7


# ------------------------------------------------------------------------------------------- the engine
PROMPTS = [Prompt(ids=zero_shot_ids(t)) for t in ([9707, 11, 419, 374], [2805, 22636], [576, 4024, 6666],
                                                  [9707, 2805])]
PARAMS = [SamplingParams(temperature=0.8, seed=7, max_frames=6, repeat_guard=None),
          SamplingParams(temperature=0.0, seed=8, max_frames=6, repeat_guard=None),
          SamplingParams(temperature=0.0, seed=9, max_frames=3, repeat_guard=None),
          SamplingParams(temperature=0.7, top_k=50, top_p=1.0, seed=10, max_frames=6, repeat_guard=None)]


class TorchStepsDeviceRows:
    """The torch reference's steps (milliseconds a step here; the interpreted cubin step takes about a second)
    with the cubin backend's `sample_rows`, run through its batched sampler under the interpreter: the
    scheduler's device sampling at a cost CI allows. The logits' maker does not matter to the draws."""

    def __init__(self, model, sampler):
        self.model, self.sampler = model, sampler

    def __getattr__(self, name):
        return getattr(self.model, name)

    def sample_rows(self, logits, draws):
        return self.sampler.sample_rows(logits, draws)


@pytest.fixture(scope="module")
def engine(ckpt):
    """An Engine (no codec, max_batch 4) on `TorchStepsDeviceRows`."""
    sampler = CubinBackend(ckpt.dims, ckpt.backbone, ops=ops, device="cpu", precision="bf16", max_len=MAX_LEN)
    sampler.setup_slots(4)
    model = TorchStepsDeviceRows(HiggsModel.from_state_dict(ckpt.dims, ckpt.backbone, max_len=MAX_LEN), sampler)
    engine = Engine(model, None, None, ckpt.dims, EngineInfo(device="cpu", precision="fp32", backend="torch"),
                    max_batch=4)
    assert isinstance(model, BatchedSampling) and engine.scheduler is not None and not engine.runner.device_sampling
    return engine


def start(engine, i, out, cancel=None):
    """Take i in a thread; its codes, or the exception it raised, land in out[i]."""
    return take_in_thread(engine, out, i, PROMPTS[i], PARAMS[i], cancel)


def test_engine_takes_sampled_on_the_device_give_the_codes_of_host_sampling(engine, monkeypatch):
    """Takes 0, 1 and 2 alone with host sampling, then on the device in one batch: takes 0 and 1 start
    together, take 2 joins at the 3rd step, take 3 at the 4th and gets an inf in its logits for row 2, and
    take 1 is cancelled after its 11th row. Every finished take's codes are its codes alone, the cancelled
    take's so far are a prefix of them, the faulty take ends alone with `NonFiniteLogits`, and each step's
    takes were sampled in one device launch."""
    alone = {i: engine.predict(prompt=PROMPTS[i], params=PARAMS[i]) for i in (0, 1, 2)}
    real_step, real_sample = engine.runner.decode_rows, engine.runner.sample_rows
    steps, launches, threads, out, cancel = [], [], [], {}, threading.Event()

    def hooked(rows, slots, positions, stream=None):
        steps.append(len(rows))
        if len(steps) == 3:
            threads.append(start(engine, 2, out))
        if len(steps) == 4:
            threads.append(start(engine, 3, out))
        takes = {t.params.seed: t for t in engine.scheduler.active}
        cut = takes.get(PARAMS[1].seed)
        if cut is not None and len(cut.rule.rows) == 11:
            cancel.set()  # after its 11th row: 4 frames of its 6
        logits = real_step(rows, slots, positions, stream)
        faulty = takes.get(PARAMS[3].seed)
        if faulty is not None and faulty.slot in slots and faulty.rule.step == 2:
            with torch.inference_mode():
                logits[slots.index(faulty.slot), 2, 9] = float("inf")
        return logits

    def counted(logits, *args):
        launches.append(len(logits))
        return real_sample(logits, *args)

    monkeypatch.setattr(engine.runner, "decode_rows", hooked)
    monkeypatch.setattr(engine.runner, "sample_rows", counted)
    monkeypatch.setattr(engine.runner, "device_sampling", True)
    threads += held_pair(engine, start, out, cancel)
    wait_for(lambda: len(threads) >= 4, 120)
    for t in threads:
        t.join(120)
    assert isinstance(out[3], NonFiniteLogits) and "NaN or inf" in str(out[3]), out[3]
    assert torch.equal(out[0], alone[0]) and torch.equal(out[2], alone[2]), out
    cut = out[1]
    assert 0 < len(cut) < len(alone[1]) and torch.equal(cut, alone[1][:len(cut)])
    assert max(launches) >= 3 and len(launches) >= len(steps)  # every step's takes in one launch


@pytest.mark.gpu
@pytest.mark.skipif(not (GPU_OK and torch.cuda.is_available()), reason=f"needs an NVIDIA GPU: {GPU_REASON}")
def test_the_cubin_engine_on_a_gpu_samples_on_the_device_and_gives_host_samplings_codes(parity_dir):
    """The cubin backend's batched step on CUDA: device sampling is on by default, and a batch's codes are
    those the same engine gives with host sampling of the same logits (the kernels' exp and fp32 sums are not
    torch's: a pick can differ only where u or top_p falls within rounding of a boundary, which a take of this
    size does not meet)."""
    engine = Engine.load(parity_dir / "tiny_checkpoint", device="cuda", backend="cubin", precision="bf16",
                         max_batch=4)
    assert engine.runner.device_sampling
    params = [SamplingParams.of(p, max_frames=40) for p in PARAMS]
    device = engine.generate_batch(PROMPTS, params)
    engine.runner.device_sampling = False
    host = engine.generate_batch(PROMPTS, params)
    assert engine.scheduler.largest == 4
    for d, h in zip(device, host):
        assert torch.equal(d.codes, h.codes)
