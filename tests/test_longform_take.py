"""A long take on a tiny random checkpoint (engine/longtake.py): every segment anchored on the same prompt
prefix, the prefix KV reused, each segment bit-identical to a cold generation, regeneration that touches
only its own segment, a recipe that reproduces the take, cancellation."""

from __future__ import annotations

import json
import threading

import numpy as np
import pytest
import torch

from engine import Engine
from engine.delay import apply_delay
from engine.longform import plan
from engine.longtake import LongTake
from engine.prompt import VoiceRef

pytestmark = pytest.mark.demo_threads  # the demo engine in process, as the app runs it (conftest.py)

TEXT = 151672
TTS = 151667
AUDIO = 151670
MAX_FRAMES = 40
OPTIONS = dict(temperature=0.8, top_k=30, top_p=0.8, repeat_guard=32)
STORY = ("The boat left at dawn. The sea was calm and grey. Gulls followed it out past the harbour wall. "
         "By noon the wind had turned. The crew reefed the sails and waited. Nobody spoke for an hour.")


@pytest.fixture(scope="module")
def engine(shared_engine, tiny_checkpoint):
    return shared_engine(tiny_checkpoint, precision="fp32")


@pytest.fixture(scope="module")
def cold(tiny_checkpoint):
    return Engine.load(tiny_checkpoint, device="cpu", precision="fp32")


def segments():
    planned = plan(STORY, normalize=False, min_seconds=1.0, max_seconds=3.5)
    assert len(planned) >= 4
    return planned


def voice() -> VoiceRef:
    gen = torch.Generator().manual_seed(3)
    return VoiceRef(codes=torch.randint(0, 1024, (30, 8), generator=gen), transcript="A calm reference voice.")


def cold_codes(cold, take, index):
    """Segment `index` generated on its own, with nothing of the take in the engine's prefix cache."""
    cold.predict("Something unrelated evicts the cached prefix.", seed=0, max_frames=2)
    t = take.takes[index]
    return cold.predict(prompt=take.prompts[index], seed=t.seed, max_frames=MAX_FRAMES, **OPTIONS)


def test_with_a_voice_every_segment_starts_with_the_voice_prompt(engine, cold):
    ref = voice()
    engine.predict("Evict whatever prefix is cached.", seed=0, max_frames=2)
    take = LongTake(engine, segments(), voice=ref, seed=100, max_frames=MAX_FRAMES, **OPTIONS)
    take.run()
    anchor = take.prompts[0].ids[:take.prompts[0].ids.index(TEXT) + 1]
    for i, prompt in enumerate(take.prompts):
        assert prompt.ids[:len(anchor)] == anchor
        assert torch.equal(prompt.ref_rows, apply_delay(ref.codes, 1024, 1025))
        own = engine.tokenizer.encode(take.segments[i].text)
        assert prompt.ids[len(anchor):] == [*own, AUDIO]  # the segment's own text, nothing of the others
    assert take.takes[0].reused_tokens == 0
    for i in range(1, len(take.segments)):
        t = take.takes[i]
        assert t.reused_tokens == t.prefix_len == len(anchor)  # later segments prefill only their own text
        assert torch.equal(t.codes, cold_codes(cold, take, i))


def test_zero_shot_segments_are_anchored_on_the_first_not_on_the_previous(engine, cold):
    take = LongTake(engine, segments(), seed=7, max_frames=MAX_FRAMES, **OPTIONS)
    take.run()
    first = take.prompts[0]
    assert first.ref_rows is None and first.ids[:2] == [TTS, TEXT]
    anchor = take.anchors[None]
    assert anchor.transcript == take.segments[0].text
    first_codes = take.takes[0].codes
    assert any(torch.equal(anchor.codes, first_codes[s:s + anchor.frames])
               for s in range(first_codes.shape[0] - anchor.frames + 1))  # whole frames of segment 1
    rows = apply_delay(anchor.codes, 1024, 1025)
    shared = take.prompts[1].ids[:take.prompts[1].ids.index(TEXT) + 1]
    for i in range(1, len(take.segments)):
        prompt, t = take.prompts[i], take.takes[i]
        assert torch.equal(prompt.ref_rows, rows) and prompt.ids[:len(shared)] == shared
        # Segment 2 is the first with this anchor: cold, unless it was cut short and generated again.
        assert t.reused_tokens == (0 if i == 1 and not t.retried else len(shared))
        assert torch.equal(t.codes, cold_codes(cold, take, i))


def test_regenerating_one_segment_changes_only_its_samples(engine):
    take = LongTake(engine, segments(), seed=21, max_frames=MAX_FRAMES, **OPTIONS)
    before = take.run()
    spans = take.spans()
    target = 2
    old_seed = take.seeds[target]
    take.regenerate(target, seed=old_seed + 1000)
    after = take.assemble()
    new_spans = take.spans()
    assert take.seeds[target] != old_seed
    for i, ((a, b), (c, d)) in enumerate(zip(spans, new_spans)):
        if i == target:
            assert not np.array_equal(before[a:b], after[c:d])
        else:
            assert np.array_equal(before[a:b], after[c:d]), i
    # The edit also works with new text, and the segment table sees it.
    take.regenerate(1, text="A different line entirely.")
    assert take.segments[1].text == "A different line entirely." and take.takes[1].text == take.segments[1].text


def test_the_recipe_reproduces_the_take_exactly(engine, tiny_checkpoint):
    take = LongTake(engine, segments(), seed=33, max_frames=MAX_FRAMES, **OPTIONS)
    audio = take.run()
    recipe = take.recipe()
    assert [s["seed"] for s in recipe["segments"]] == take.seeds
    again = LongTake.from_recipe(Engine.load(tiny_checkpoint, device="cpu", precision="fp32"),
                                 json.loads(json.dumps(recipe)))
    assert np.array_equal(again.run(), audio)
    with pytest.raises(ValueError, match="not a long-take recipe"):
        LongTake.from_recipe(engine, {"segments": [{"text": "x"}]})


def test_a_segment_cut_short_is_generated_again_with_the_next_seed_and_flagged(engine):
    # Random weights fall into repeated codes: with the guard at 2 frames every segment is cut short.
    options = {**OPTIONS, "repeat_guard": 2}
    take = LongTake(engine, segments(), seed=50, max_frames=MAX_FRAMES, **options)
    take.run()
    assert not take.takes[0].retried and take.takes[0].flagged  # already heard: flagged, not replaced
    for i in range(1, len(take.segments)):
        assert take.takes[i].retried and take.takes[i].flagged
        assert take.seeds[i] == 50 + i + 1


def test_cancel_stops_the_take_at_once(engine):
    cancel = threading.Event()
    take = LongTake(engine, segments(), seed=1, max_frames=MAX_FRAMES, cancel=cancel, **OPTIONS)
    stream = take.stream()
    next(stream)
    cancel.set()
    assert list(stream) == []
    assert all(t is None for t in take.takes[1:])


def test_a_voice_the_take_does_not_have_is_named():
    script = plan("A: Hello there.\nB: Hi.", voices={"A": "anna", "B": "bert"}, normalize=False)
    with pytest.raises(ValueError, match="'bert'"):
        LongTake(None, script, voices={"anna": voice()})


def test_a_script_gives_each_segment_its_speakers_voice_rows(engine):
    gen = torch.Generator().manual_seed(8)
    anna = VoiceRef(codes=torch.randint(0, 1024, (20, 8), generator=gen), transcript="Anna speaking.")
    bert = VoiceRef(codes=torch.randint(0, 1024, (26, 8), generator=gen))
    script = plan("Anna: Good morning. Did you sleep?\n[S2] Not really.\nAnna: Coffee, then.\nCarl: Me too!",
                  voices={"Anna": "anna", "S2": "bert", "Carl": None}, normalize=False)
    take = LongTake(engine, script, voices={"anna": anna, "bert": bert}, seed=4, max_frames=MAX_FRAMES, **OPTIONS)
    take.run()
    rows = {"Anna": apply_delay(anna.codes, 1024, 1025), "S2": apply_delay(bert.codes, 1024, 1025)}
    assert [s.speaker for s in script] == ["Anna", "Anna", "S2", "Anna", "Carl"]
    for segment, prompt in zip(script, take.prompts):
        if segment.speaker == "Carl":  # no voice: his first segment is zero-shot
            assert prompt.ref_rows is None
        else:
            assert torch.equal(prompt.ref_rows, rows[segment.speaker])
    assert set(take.anchors) == {"Carl"}  # only the zero-shot speaker needed an anchor of his own


def test_a_take_that_keeps_no_audio_streams_the_same_samples(engine):
    kept = LongTake(engine, segments(), seed=61, max_frames=MAX_FRAMES, **OPTIONS)
    dropped = LongTake(engine, segments(), seed=61, max_frames=MAX_FRAMES, keep_audio=False, **OPTIONS)
    streamed = np.concatenate([c.audio for c in dropped.stream()])
    assert np.array_equal(streamed, kept.run())
    assert all(s is None for s in dropped.shaped) and all(len(t.audio) == 0 for t in dropped.takes)
    with pytest.raises(ValueError, match="keep_audio"):
        dropped.assemble()
