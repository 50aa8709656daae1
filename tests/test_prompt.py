"""Prompt builders against the parity prompts, prefix_len, cache keys and input validation."""

from __future__ import annotations

import json

import pytest
import torch

from engine.prompt import Prompt, VoiceRef, build_prompt, clone_ids, zero_shot_ids
from engine.demo import TINY_DIMS, reference_tokenizer_path
from engine.tokenizer import AUDIO, REF_AUDIO, REF_TEXT, TEXT, TTS, HiggsTokenizer

AWE, SLOW, PAUSE = 151692, 151717, 151722


def standin(text: str) -> list[int]:
    """The parity fixture's stand-in tokenizer: one id per character."""
    return [1000 + ord(ch) % 500 for ch in text]


@pytest.fixture(scope="module")
def tok() -> HiggsTokenizer:
    return HiggsTokenizer.from_file(reference_tokenizer_path())


def test_zero_shot_ids_equal_parity(parity_dir):
    case = json.loads((parity_dir / "zero_shot.json").read_text())
    assert zero_shot_ids(standin(case["prompt_text"])) == case["prompt_ids"]


def test_clone_ids_and_delayed_rows_equal_parity(parity_dir, tok):
    case = json.loads((parity_dir / "voice_clone.json").read_text())
    ids = clone_ids(standin(case["prompt_text"]), len(case["ref_rows"]), standin(case["reference_text"]))
    assert ids == case["prompt_ids"]
    # build_prompt delays the voice codes exactly like the reference did
    voice = VoiceRef(torch.tensor(case["ref_codes"]), case["reference_text"])
    prompt = build_prompt(tok, case["prompt_text"], voice, dims=TINY_DIMS)
    assert prompt.ref_rows.tolist() == case["ref_rows"]
    assert prompt.ids == clone_ids(tok.encode(case["prompt_text"]), len(case["ref_rows"]),
                                   tok.encode(case["reference_text"]))


def test_clone_ids_without_reference_text():
    assert clone_ids([5, 6], 3) == [TTS, REF_AUDIO, -100, -100, -100, TEXT, 5, 6, AUDIO]
    assert clone_ids([5], 1, []) == [TTS, REF_AUDIO, -100, TEXT, 5, AUDIO]
    with pytest.raises(ValueError):
        clone_ids([5], 0)


def test_build_prompt_uses_the_real_tokenizer(tok):
    prompt = build_prompt(tok, "  Hello there.  ", dims=TINY_DIMS)
    assert prompt.ids == [TTS, TEXT, *tok.encode("Hello there."), AUDIO]
    assert prompt.ref_rows is None
    codes = torch.randint(0, 1024, (4, 8), generator=torch.Generator().manual_seed(0))
    clone = build_prompt(tok, "Hi.", VoiceRef(codes, "Ref words."), dims=TINY_DIMS)
    ref = tok.encode("Ref words.")
    assert clone.ids == [TTS, REF_TEXT, *ref, REF_AUDIO, *[-100] * 11, TEXT, *tok.encode("Hi."), AUDIO]
    assert clone.ref_rows.shape == (11, 8)
    no_text = build_prompt(tok, "Hi.", VoiceRef(codes, "   "), dims=TINY_DIMS)
    assert REF_TEXT not in no_text.ids and no_text.ids[1] == REF_AUDIO


@pytest.mark.parametrize("text", ["", "   ", "\n\t"])
def test_empty_text_is_refused_with_a_sentence(tok, text):
    with pytest.raises(ValueError, match="no text to speak"):
        build_prompt(tok, text, dims=TINY_DIMS)


def test_structural_tokens_in_text_are_refused(tok):
    with pytest.raises(ValueError, match=r"<\|audio\|>"):
        build_prompt(tok, "Hello <|audio|> there", dims=TINY_DIMS)
    codes = torch.zeros(2, 8, dtype=torch.long)
    with pytest.raises(ValueError, match="reference transcript contains <\\|text\\|>"):
        build_prompt(tok, "Hello", VoiceRef(codes, "a <|text|> b"), dims=TINY_DIMS)


@pytest.mark.parametrize("ids, expected", [
    ([TTS, TEXT, 5, 6, AUDIO], 2),
    ([TTS, TEXT, AWE, SLOW, 5, AUDIO], 4),
    ([TTS, TEXT, AWE, 5, SLOW, 6, AUDIO], 3),            # a tag after the first word is not part of the prefix
    ([TTS, TEXT, PAUSE, 5, AUDIO], 3),                   # any control tag right after <|text|> is
    ([TTS, TEXT, AWE, SLOW, AUDIO], 4),                  # the last id always stays for the second segment
    ([TTS, TEXT, AWE, SLOW], 3),
    ([5, 6, 7], 0),                                      # no <|text|>: nothing shareable
])
def test_prefix_len(ids, expected):
    assert Prompt(ids).prefix_len == expected


def test_prefix_len_of_a_clone_prompt():
    rows = torch.zeros(9, 8, dtype=torch.long)
    ids = clone_ids([5, 6], 9, [7])
    assert Prompt(ids, rows).prefix_len == ids.index(TEXT) + 1 == 14


def test_cache_key_shares_voice_and_style_only():
    rows = torch.arange(72).reshape(9, 8) % 1024
    a = Prompt(clone_ids([AWE, 5, 6], 9, [7]), rows)
    b = Prompt(clone_ids([AWE, 8], 9, [7]), rows.clone())
    assert a.cache_key == b.cache_key
    assert a.cache_key[0] == tuple(a.ids[:a.prefix_len])
    other_rows = rows.clone()
    other_rows[3, 2] += 1
    assert Prompt(clone_ids([AWE, 5, 6], 9, [7]), other_rows).cache_key != a.cache_key
    assert Prompt(clone_ids([SLOW, 5, 6], 9, [7]), rows).cache_key != a.cache_key
    assert Prompt(zero_shot_ids([5])).cache_key == ((TTS, TEXT), None)


def test_prompt_checks_placeholders_against_rows():
    with pytest.raises(ValueError, match="3 reference-audio placeholders but 2 reference rows"):
        Prompt(clone_ids([5], 3), torch.zeros(2, 8, dtype=torch.long))
    with pytest.raises(ValueError, match="1 reference-audio placeholders but 0"):
        Prompt(clone_ids([5], 1))
    with pytest.raises(ValueError, match="0 reference-audio placeholders but 2"):
        Prompt(zero_shot_ids([5]), torch.zeros(2, 8, dtype=torch.long))
    with pytest.raises(ValueError, match="integer"):
        Prompt(clone_ids([5], 2), torch.zeros(2, 8))


def test_voice_ref_validation():
    ok = VoiceRef(torch.full((3, 8), 1023, dtype=torch.int32), "  words ")
    assert ok.codes.dtype == torch.long and ok.transcript == "words" and ok.frames == 3
    assert VoiceRef(torch.zeros(1, 8, dtype=torch.long), "").transcript is None
    for bad in (torch.zeros(3, 7, dtype=torch.long), torch.zeros(0, 8, dtype=torch.long),
                torch.zeros(8, dtype=torch.long)):
        with pytest.raises(ValueError, match=r"\[frames, 8\]"):
            VoiceRef(bad)
    for value in (1024, 1025, -1):
        with pytest.raises(ValueError, match="0..1023"):
            VoiceRef(torch.full((2, 8), value, dtype=torch.long))
    with pytest.raises(ValueError, match="integers"):
        VoiceRef(torch.zeros(2, 8))
