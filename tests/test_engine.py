"""Acceptance tests of the public Engine API on the parity checkpoint (SPEC D1, D4–D7; shared/parity)."""

import json
import threading

import numpy as np
import pytest
import torch

from engine.generate import Engine
from engine.model import rel_error
from engine.prompt import Prompt, VoiceRef
from engine.streaming import FIRST_PUSH_FRAMES
from engine.types import Chunk, Metrics, SpeechEngine


@pytest.fixture(scope="module")
def engine(parity_dir):
    return Engine.load(parity_dir / "tiny_checkpoint", device="cpu", precision="fp32")


def fixture(parity_dir, name):
    d = json.loads((parity_dir / f"{name}.json").read_text())
    prompt = Prompt(ids=d["prompt_ids"], ref_rows=d["ref_rows"])
    return d, prompt, torch.from_numpy(np.load(parity_dir / f"{name}_prefill_logits.npy"))


def test_load_info(engine):
    info = engine.info
    assert info.device == "cpu" and info.precision == "fp32" and info.backend == "torch"
    assert info.backend_reason and not info.demo and not engine.is_remote
    assert isinstance(engine, SpeechEngine)
    # the flat form the status panel and /health read: the local engine's facts, then the backend's
    assert set(info.as_dict()) == {"checkpoint", "root", "device", "precision", "precision_reason", "backend",
                                   "backend_reason", "demo", "params", "tokenizer", "codec", "memory_plan",
                                   "max_batch", "min_rows"}


@pytest.mark.parametrize("name", ["zero_shot", "voice_clone"])
def test_prefill_logits_within_1e4(engine, parity_dir, name):
    _, prompt, ref = fixture(parity_dir, name)
    logits = engine.prefill(prompt)
    assert logits.shape == (8, 1026) and logits.dtype == torch.float32
    assert rel_error(logits, ref) < 1e-4


@pytest.mark.parametrize("name", ["zero_shot", "voice_clone"])
def test_greedy_frames_exact(engine, parity_dir, name):
    d, prompt, _ = fixture(parity_dir, name)
    frames = engine.predict(prompt=prompt, temperature=0, max_frames=d["predict_max_frames"], repeat_guard=None)
    assert frames.dtype == torch.long and frames.shape == (143, 8)
    assert frames.tolist() == d["frames"]


def test_prefix_cache_warm_equals_cold(parity_dir, engine):
    _, prompt, _ = fixture(parity_dir, "voice_clone")
    cold = Engine.load(parity_dir / "tiny_checkpoint", device="cpu", precision="fp32")
    cold_logits = cold.prefill(prompt)
    cold_codes = cold.predict(prompt=prompt, temperature=0.8, seed=7, max_frames=40, repeat_guard=None)
    engine.prefill(fixture(parity_dir, "zero_shot")[1])  # evict: another prefix
    engine.runner.prefixes.forget()  # and none kept (engine/prefix.py; tests/test_prefix.py covers kept ones)
    first = engine.generate_stream(prompt=prompt, temperature=0.8, seed=7, max_frames=40, repeat_guard=None)
    assert list(first)[-1].metrics.reused_tokens == 0
    warm_logits = engine.prefill(prompt)
    assert torch.equal(warm_logits, cold_logits)
    chunks = list(engine.generate_stream(prompt=prompt, temperature=0.8, seed=7, max_frames=40, repeat_guard=None))
    assert chunks[-1].metrics.reused_tokens == prompt.prefix_len > 0
    warm_codes = engine.predict(prompt=prompt, temperature=0.8, seed=7, max_frames=40, repeat_guard=None)
    assert torch.equal(warm_codes, cold_codes)


def test_synthesize_matches_reference_decode(engine, parity_dir):
    for codes_file, wav_file in (("decode_codes.npy", "decode_wav.npy"), ("decode_random_codes.npy", "decode_random_wav.npy")):
        codes, ref = np.load(parity_dir / codes_file), np.load(parity_dir / wav_file)
        wav = engine.synthesize(torch.from_numpy(codes))
        assert wav.dtype == np.float32 and wav.shape == (960 * len(codes),)
        assert np.linalg.norm(wav - ref) / np.linalg.norm(ref) < 1e-4


def test_stream_equals_one_shot_and_metrics(engine, parity_dir):
    _, prompt, _ = fixture(parity_dir, "zero_shot")
    chunks = list(engine.generate_stream(prompt=prompt, temperature=0.8, seed=3, max_frames=80, repeat_guard=None))
    assert all(isinstance(c, Chunk) for c in chunks) and chunks[-1].final and not any(c.final for c in chunks[:-1])
    assert len(chunks) >= 3  # streamed, not one blob
    # small first chunk: the engine pushes its first FIRST_PUSH_FRAMES complete frames, then doubles
    assert 0 < len(chunks[0].audio) <= FIRST_PUSH_FRAMES * 960 < len(chunks[1].audio)
    streamed = np.concatenate([c.audio for c in chunks])
    codes = engine.predict(prompt=prompt, temperature=0.8, seed=3, max_frames=80, repeat_guard=None)
    one_shot = engine.synthesize(codes)
    assert streamed.shape == one_shot.shape == (960 * 80,)
    assert np.abs(streamed - one_shot).max() <= 1e-5 * np.abs(one_shot).max()
    assert np.array_equal(engine.generate(prompt=prompt, temperature=0.8, seed=3, max_frames=80, repeat_guard=None), streamed)
    m = chunks[-1].metrics
    assert isinstance(m, Metrics)
    assert m.frames == 80 and m.rows == 87 and m.stop_reason == "max_frames" and m.seed == 3
    assert m.ttfa_ms > 0 and m.rtf > 0 and m.ms_per_frame > 0 and m.prefill_ms > 0
    assert m.prompt_tokens == len(prompt) and m.peak_mem_bytes > 0 and m.mem_kind == "rss"
    assert (m.precision, m.backend, m.device) == ("fp32", "torch", "cpu")


def test_seed_none_reported_and_reproducible(engine, parity_dir):
    _, prompt, _ = fixture(parity_dir, "zero_shot")
    last = list(engine.generate_stream(prompt=prompt, max_frames=20))[-1]
    seed = last.metrics.seed
    assert isinstance(seed, int) and 0 <= seed < 2**63
    a = engine.predict(prompt=prompt, seed=seed, max_frames=20)
    b = engine.predict(prompt=prompt, seed=seed, max_frames=20)
    assert torch.equal(a, b)


def test_cancel_and_close(engine, parity_dir):
    _, prompt, _ = fixture(parity_dir, "zero_shot")
    cancel = threading.Event()
    stream = engine.generate_stream(prompt=prompt, temperature=0.8, seed=1, max_frames=200, repeat_guard=None,
                                    cancel=cancel)
    first = next(stream)
    cancel.set()
    rest = list(stream)
    assert not first.final and rest[-1].final and rest[-1].metrics.stop_reason == "cancelled"
    assert rest[-1].metrics.frames < 200
    stream = engine.generate_stream(prompt=prompt, max_frames=200)
    next(stream)
    stream.close()  # GeneratorExit: releases the engine
    assert engine.runner.lock.acquire(timeout=1)
    engine.runner.lock.release()


def test_two_threads_do_not_interleave(engine, parity_dir):
    _, prompt, _ = fixture(parity_dir, "voice_clone")
    want = engine.predict(prompt=prompt, temperature=0.8, seed=5, max_frames=30, repeat_guard=None)
    results = [None] * 4

    def run(i):
        results[i] = engine.predict(prompt=prompt, temperature=0.8, seed=5, max_frames=30, repeat_guard=None)
    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(torch.equal(r, want) for r in results)


def test_bf16_runs_close(parity_dir):
    engine = Engine.load(parity_dir / "tiny_checkpoint", device="cpu", precision="bf16")
    assert engine.info.precision == "bf16"
    _, prompt, ref = fixture(parity_dir, "zero_shot")
    assert rel_error(engine.prefill(prompt), ref) < 5e-2
    frames = engine.predict(prompt=prompt, temperature=0, max_frames=10, repeat_guard=None)
    assert frames.shape == (10, 8) and int(frames.max()) < 1024


def test_voice_ref_and_encode_voice(engine, parity_dir):
    wav = np.load(parity_dir / "encode_48000.npy")
    voice = engine.encode_voice(wav, 24000, transcript="hello")
    assert isinstance(voice, VoiceRef) and voice.codes.shape[1] == 8 and voice.transcript == "hello"
    prompt = engine.build_prompt("Say this.", voice=voice)
    assert prompt.ids.count(-100) == voice.codes.shape[0] + 7
    frames = engine.predict("Say this.", voice=voice, seed=2, max_frames=12)
    assert frames.shape[1] == 8 and frames.shape[0] <= 12


def test_bad_arguments(engine, parity_dir):
    _, prompt, _ = fixture(parity_dir, "zero_shot")
    with pytest.raises(ValueError, match="text"):
        engine.predict("   ")
    with pytest.raises(ValueError, match="text"):
        engine.generate_stream("")
    with pytest.raises(ValueError, match="temperature"):
        engine.predict(prompt=prompt, temperature=-1)
    with pytest.raises(ValueError, match="top_p"):
        engine.generate(prompt=prompt, top_p=0)
    with pytest.raises(ValueError, match="top_p"):
        engine.predict(prompt=prompt, top_p=1.5)
    with pytest.raises(ValueError, match="max_frames"):
        engine.predict(prompt=prompt, max_frames=0)
    with pytest.raises(ValueError, match="shape"):
        engine.synthesize(torch.zeros(8, dtype=torch.long))
    with pytest.raises(ValueError, match="0..1023"):
        engine.synthesize(torch.full((3, 8), 1024))
    with pytest.raises(ValueError, match="device"):
        Engine.load(parity_dir / "tiny_checkpoint", device="tpu")
    with pytest.raises(ValueError, match="precision"):
        Engine.load(parity_dir / "tiny_checkpoint", precision="int3")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="GPU"):
            Engine.load(parity_dir / "tiny_checkpoint", backend="cubin")
        with pytest.raises(ValueError, match="GPU"):
            Engine.load(parity_dir / "tiny_checkpoint", device="cuda")


def test_backend_registry(parity_dir, monkeypatch):
    from engine import backends
    from engine.backends import eager

    built = []

    def fake(checkpoint, *, device, dtype, max_len, precision=None):
        built.append((device.type, dtype, max_len))
        return eager.load(checkpoint, device=device, dtype=dtype, max_len=max_len, precision=precision)

    monkeypatch.setitem(backends.BACKENDS, "fake", fake)
    engine = Engine.load(parity_dir / "tiny_checkpoint", backend="fake")
    assert engine.info.backend == "fake" and built == [("cpu", torch.float32, 4096)]
    with pytest.raises(ValueError, match="unknown backend"):
        Engine.load(parity_dir / "tiny_checkpoint", backend="nope")


class FusedTorch:
    """A backend with the fused-decode protocol of engine/backends/cubin.py (`begin`, then `rows(n)` runs
    n steps and returns the sampled rows and the device stop flag), built from the torch model and the host
    sampler, so the engine's batched path is checked against its per-step path on the CPU."""

    def __init__(self, model):
        self.model = model

    def __getattr__(self, name):  # prefill, decode, setup_cache, max_len
        return getattr(self.model, name)

    def begin(self, logits, pos, *, seed, temperature, top_k, top_p, max_rows):
        from engine.delay import StopRule
        from engine.sampling import uniforms
        self.rule = StopRule(max_frames=max_rows - 7, repeat_guard=None)
        self.logits, self.pos, self.u = logits, pos, uniforms(seed, 0, steps=max_rows)
        self.options = (temperature, top_k, top_p)

    def rows(self, n):
        from engine.sampling import sample
        out = []
        for _ in range(n):
            if self.rule.done:
                break
            out.append(self.rule.push(sample(self.logits, self.u[self.rule.step], *self.options).tolist()))
            if not self.rule.done:
                self.logits = self.model.decode(torch.tensor(out[-1]), self.pos)
                self.pos += 1
        return torch.tensor(out, dtype=torch.long).view(-1, 8), self.rule.done


def test_fused_decode_protocol_matches_per_step(engine, parity_dir, monkeypatch):
    from engine import backends
    from engine.backends import eager

    def fused(checkpoint, *, device, dtype, max_len, precision=None):
        return FusedTorch(eager.load(checkpoint, device=device, dtype=dtype, max_len=max_len))

    monkeypatch.setitem(backends.BACKENDS, "fused-torch", fused)
    # max_batch 1: a backend with the fused protocol batches (and skips it) only when max_batch > 1
    other = Engine.load(parity_dir / "tiny_checkpoint", backend="fused-torch", precision="fp32", max_batch=1)
    d, prompt, _ = fixture(parity_dir, "voice_clone")
    frames = other.predict(prompt=prompt, temperature=0, max_frames=143, repeat_guard=None)
    assert frames.tolist() == d["frames"]
    options = dict(prompt=prompt, temperature=0.9, seed=12, max_frames=60, repeat_guard=None)
    assert torch.equal(other.predict(**options), engine.predict(**options))
    ours = list(other.generate_stream(**options))
    ref = list(engine.generate_stream(**options))
    assert [len(c.audio) for c in ours] == [len(c.audio) for c in ref]
    assert np.array_equal(np.concatenate([c.audio for c in ours]), np.concatenate([c.audio for c in ref]))
    # the host guard stops a take the device would have continued
    guarded = other.predict(prompt=prompt, temperature=0, max_frames=143, repeat_guard=8)
    assert torch.equal(guarded, engine.predict(prompt=prompt, temperature=0, max_frames=143, repeat_guard=8))


def test_a_backend_that_fails_to_start_falls_back_only_under_auto():
    from engine.backends import BACKENDS, BackendUnavailable, resolve, start

    def broken(**_):
        raise RuntimeError("cuInit failed")

    made = []
    def make(factory):
        made.append(factory)
        return factory() if factory is broken else "torch-model"

    model, name, reason = start("cubin", broken, auto=True, reason=None, make=make)
    assert (model, name) == ("torch-model", "torch") and made[-1] is resolve(BACKENDS["torch"])
    assert "cubin" in reason and "cuInit failed" in reason and "torch path" in reason
    with pytest.raises(BackendUnavailable, match="failed to start.*cuInit failed"):
        start("cubin", broken, auto=False, reason=None, make=make)
