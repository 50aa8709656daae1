"""A saved voice's prompt prefix is computed once (engine/prefix.py): a warmed voice's take copies the kept KV
instead of prefilling its clip and gives the codes of a cold take bit for bit; the entry is kept across
engines (on disk) and is never used for another voice, another precision or a changed checkpoint."""

from __future__ import annotations

import os
import shutil

import pytest
import torch

from engine.generate import Engine
from engine.prompt import VoiceRef
from engine.runner import prefix_key


def voice(seed: int = 0, transcript: str = "A calm reference voice.") -> VoiceRef:
    gen = torch.Generator().manual_seed(seed)
    return VoiceRef(codes=torch.randint(0, 1024, (30, 8), generator=gen), transcript=transcript)


def take(engine, v, seed=3):
    """A take's codes and its reused prompt positions, with every slot's own prefix forgotten first, so a
    reuse can only come from the kept prefixes."""
    engine.scheduler.forget_prefixes()
    out = engine.generate_batch(["Good morning to you."], voice=v,
                                params=[engine_params(seed)])[0]
    return out.codes, out.metrics.reused_tokens


def engine_params(seed):
    from engine.types import SamplingParams
    return SamplingParams(temperature=0.8, seed=seed, max_frames=12, repeat_guard=None)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, tiny_checkpoint):
    root = tmp_path_factory.mktemp("prefix") / "ckpt"
    shutil.copytree(tiny_checkpoint, root)
    return root


def load(root, precision="fp32"):
    return Engine.load(root, device="cpu", precision=precision, max_batch=4)


def test_warmed_voice_reuses_its_prefix_and_gives_the_cold_codes(checkpoint):
    cold = load(checkpoint)
    v = voice(1)
    want, reused = take(cold, v)
    assert reused == 0
    again, reused = take(cold, v)  # the first take's prefix was kept in memory as it ran
    assert reused > 30 and torch.equal(again, want)
    warm = load(checkpoint)
    assert warm.warm_voice(v) is True
    assert warm.warm_voice(v) is False  # kept already
    got, reused = take(warm, v)
    prompt = warm.build_prompt("Good morning to you.", voice=v)
    assert reused == prefix_key(prompt)[1] > 30  # the clip's rows came from the kept KV
    assert torch.equal(got, want)


def test_another_voice_or_a_changed_one_never_uses_the_entry(checkpoint):
    engine = load(checkpoint)
    a = voice(2)
    engine.warm_voice(a)
    codes = a.codes.clone()
    codes[5, 3] = (codes[5, 3] + 1) % 1024  # the same voice, its clip re-recorded: one code differs
    for other in (VoiceRef(codes=codes, transcript=a.transcript), VoiceRef(codes=a.codes, transcript="Other words.")):
        got, reused = take(engine, other)
        assert reused == 0
        assert torch.equal(got, take(load(checkpoint), other)[0])


def test_kept_on_disk_across_engines_and_keyed_by_precision_and_checkpoint(checkpoint, tmp_path):
    v = voice(3)
    first = load(checkpoint)
    first.keep_prefixes(tmp_path)
    assert first.warm_voice(v) is True
    assert len(list(tmp_path.glob("*.pt"))) == 1
    want = take(load(checkpoint), v)[0]  # cold, no store directory

    again = load(checkpoint)  # a restart: the entry is read from disk, not computed
    again.keep_prefixes(tmp_path)
    assert again.warm_voice(v) is False and again.runner.prefixes.loads == 1
    got, reused = take(again, v)
    assert reused > 30 and torch.equal(got, want)

    other = load(checkpoint, precision="bf16")  # another precision computes its own
    other.keep_prefixes(tmp_path)
    assert other.warm_voice(v) is True and len(list(tmp_path.glob("*.pt"))) == 2

    weights = min(checkpoint.glob("*.safetensors"))  # the checkpoint's weights replaced
    stat = weights.stat()
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    changed = load(checkpoint)
    changed.keep_prefixes(tmp_path)
    assert changed.warm_voice(v) is True and changed.runner.prefixes.loads == 0


def test_a_damaged_file_is_a_miss(checkpoint, tmp_path):
    v = voice(4)
    engine = load(checkpoint)
    engine.keep_prefixes(tmp_path)
    engine.warm_voice(v)
    (path,) = tmp_path.glob("*.pt")
    path.write_bytes(b"not a tensor file")
    fresh = load(checkpoint)
    fresh.keep_prefixes(tmp_path)
    assert fresh.warm_voice(v) is True  # computed again, and written again
    assert torch.equal(take(fresh, v)[0], take(load(checkpoint), v)[0])


def test_the_studio_warms_saved_voices_with_codes_in_the_background(checkpoint, tmp_path):
    from types import SimpleNamespace

    from studio.voices.warm import warm_voices

    saved = {"a": voice(5), "b": None}  # "b" still needs encoding: left for its first take

    class Voices:
        def list(self):
            return [SimpleNamespace(id=i, name=i, codes=lambda i=i: None if saved[i] is None else saved[i].codes)
                    for i in saved]

        def voice_ref(self, voice_id, encode):
            assert encode is None  # warming never encodes a clip
            return saved[voice_id]

    engine = load(checkpoint)
    thread = warm_voices(SimpleNamespace(engine=engine, voices=Voices()), directory=tmp_path)
    thread.join(120)
    assert not thread.is_alive() and len(list(tmp_path.glob("*.pt"))) == 1
    assert engine.runner.stored(prefix_key(engine.build_prompt("Hi.", voice=saved["a"])))
    assert warm_voices(SimpleNamespace(engine=SimpleNamespace(is_remote=True), voices=Voices())) is None


def test_a_take_prefills_before_a_warm_up_admitted_with_it(checkpoint, monkeypatch):
    """A warm-up runs in the background: admitted at the same boundary as a take, it prefills after it."""
    import threading
    import time

    engine = load(checkpoint)
    slots = []
    original = engine.runner.prefill_segment
    monkeypatch.setattr(engine.runner, "prefill_segment",
                        lambda ids, rows, start, slot, stream=None: slots.append(slot) or original(ids, rows, start,
                                                                                                 slot, stream))

    def waiting(n):
        while len(engine.scheduler.waiting) < n:
            time.sleep(0.005)

    with engine.scheduler.held():
        warm = threading.Thread(target=engine.warm_voice, args=(voice(6),), daemon=True)
        warm.start()
        waiting(1)  # the warm-up is first in line (slot 0), the take second (slot 1)
        take = threading.Thread(target=engine.predict, args=("Good morning.",),
                                kwargs={"params": engine_params(1)}, daemon=True)
        take.start()
        waiting(2)
    warm.join(60)
    take.join(60)
    assert slots[0] == 1 and 0 in slots
