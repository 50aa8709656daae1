"""The reconstructed tokenizer against the real one's published ids, special ids by name, and the tag lint."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from tokenizers import Tokenizer

from engine import tokenizer as T
from engine.prompt import zero_shot_ids
from engine.demo import QWEN2_SPLIT, build_reference_tokenizer, reference_tokenizer_path

# SPEC D3 / Part 2 §1.4: ids read from the official tokenizer.json by a public parity fixture.
D3_TEXT = "Welcome to SpeakSwiftly. This is the first official Higgs Audio v3 parity fixture."
D3_IDS = [13936, 311, 67201, 55336, 398, 13, 1096, 374, 279, 1156, 3946, 472, 61147, 12352, 348, 18, 49615, 12507, 13]
TAG_TEXT = "<|emotion:elation|>Welcome aboard. Hello there <|prosody:pause|> and thanks for listening."
TAG_PROMPT = [151667, 151672, 151681, 13936, 36506, 13, 21927, 1052, 220, 151722, 323, 9339, 369, 14289, 13, 151670]


@pytest.fixture(scope="module")
def tok() -> T.HiggsTokenizer:
    return T.HiggsTokenizer.from_file(reference_tokenizer_path())


def test_spec_d3_ids_and_zero_shot_prompt(tok):
    assert tok.encode(D3_TEXT) == D3_IDS
    assert zero_shot_ids(tok.encode(D3_TEXT)) == [151667, 151672, *D3_IDS, 151670]


def test_spec_1_4_example_with_inline_tags(tok):
    assert zero_shot_ids(tok.encode(TAG_TEXT)) == TAG_PROMPT
    assert tok.decode(tok.encode(TAG_TEXT)) == TAG_TEXT


def test_build_reference_tokenizer_is_a_tokenizers_object():
    raw = build_reference_tokenizer()
    assert isinstance(raw, Tokenizer)
    assert raw.get_vocab_size(with_added_tokens=True) == 151727
    assert raw.encode(D3_TEXT, add_special_tokens=False).ids == D3_IDS


def test_all_84_added_tokens_are_contiguous_single_tokens(tok):
    raw = build_reference_tokenizer()
    added = {i: t.content for i, t in raw.get_added_tokens_decoder().items()}
    assert sorted(added) == list(range(151643, 151727))
    for text, tag in T.CONTROL_TAGS.items():
        assert tok.encode(text) == [tag.id]
        assert added[tag.id] == text
    for name, i in T.SPECIAL.items():
        assert added[i] == name


def test_matches_tiktoken_on_ordinary_text(tok):
    """The BPE merges derived from the ranks reproduce tiktoken's rank-ordered merging."""
    tiktoken = pytest.importorskip("tiktoken")
    import base64
    import unicodedata

    from engine.demo import ranks_path

    ranks = {base64.b64decode(t): int(r) for t, r in (l.split() for l in ranks_path().read_bytes().splitlines() if l)}
    enc = tiktoken.Encoding("qwen", pat_str=QWEN2_SPLIT, mergeable_ranks=ranks, special_tokens={})
    texts = ["Hello, world!  Ça va?  日本語のテキストです。", "def f(x):\n\treturn x**2  # 12345 \r\n\n",
             "Ünïcödé naïve café — “quotes” … emoji 🎉🤖", "I'll've we're THEY'RE don't", "   spaces   ",
             "Привет мир, как дела?", "مرحبا بالعالم", "한국어 텍스트", "e\u0301 composed by NFC"]
    for text in texts:
        assert tok.encode(text) == enc.encode(unicodedata.normalize("NFC", text)), text


def test_special_ids_resolved_by_name(tok):
    assert tok.special == T.SPECIAL
    assert (T.TTS, T.TEXT, T.AUDIO, T.REF_AUDIO, T.REF_TEXT, T.AUDIO_END, T.ENDOFTEXT) == (
        151667, 151672, 151670, 151679, 151680, 151671, 151643)


def _tokenizer_file_with(tmp_path, rename: dict[str, str]):
    data = json.loads(reference_tokenizer_path().read_text())
    for entry in data["added_tokens"]:
        entry["content"] = rename.get(entry["content"], entry["content"])
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(data))
    return path


def test_missing_special_token_is_named(tmp_path):
    path = _tokenizer_file_with(tmp_path, {"<|ref_text|>": "<|something_else|>"})
    with pytest.raises(ValueError, match=r"lacks 1 special tokens \(<\|ref_text\|>\)"):
        T.HiggsTokenizer.from_file(path)


def test_special_token_at_another_id_is_refused(tmp_path):
    path = _tokenizer_file_with(tmp_path, {"<|text|>": "<|audio|>", "<|audio|>": "<|text|>"})
    with pytest.raises(ValueError, match=r"<\|text\|> is 151670 \(expected 151672\)"):
        T.HiggsTokenizer.from_file(path)


def test_unreadable_tokenizer_file(tmp_path):
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(ValueError, match="not a readable tokenizer.json"):
        T.HiggsTokenizer.from_file(tmp_path / "tokenizer.json")
    with pytest.raises(ValueError, match="no tokenizer file"):
        T.HiggsTokenizer.from_file(tmp_path / "absent.json")


def test_control_tag_table():
    assert len(T.CONTROL_TAGS) == 43
    assert Counter(t.category for t in T.CONTROL_TAGS.values()) == {
        "emotion": 21, "style": 3, "sfx": 9, "prosody": 8, "expressive": 2}
    ids = sorted(T.CONTROL_TAG_IDS)
    assert ids == [*range(151681, 151702), *range(151704, 151724), 151725, 151726]
    assert T.CONTROL_TAGS["<|emotion:helplessness|>"].id == 151701
    assert T.CONTROL_TAGS["<|style:whispering|>"].id == 151706
    assert T.CONTROL_TAGS["<|sfx:sneeze|>"].id == 151715
    assert T.CONTROL_TAGS["<|prosody:long_pause|>"].id == 151723
    assert T.CONTROL_TAGS["<|prosody:expressive_low|>"].id == 151726
    positional = {t.text for t in T.CONTROL_TAGS.values() if not t.sentence_level}
    assert positional == {"<|prosody:pause|>", "<|prosody:long_pause|>"} | {
        t for t in T.CONTROL_TAGS if t.startswith("<|sfx:")}


def _lint(text, **kw):
    return [(w.position, w.tag, w.severity) for w in T.lint_tags(text, **kw)]


@pytest.mark.parametrize("text", [
    "Plain text without tags.",
    TAG_TEXT,
    "<|emotion:awe|><|prosody:speed_slow|>Look at that. <|style:whispering|>Quiet now!",
    "First line\n<|emotion:sadness|>second line",
    "He said “stop.” <|prosody:pitch_high|>Then he left.",
    "Wait <|prosody:long_pause|> for it. <|sfx:laughter|>Haha, that was good.",
    "A cough <|sfx:cough|>Ahem in the middle is fine.",
])
def test_lint_accepts_well_placed_tags(text):
    assert T.lint_tags(text) == []


def test_lint_unknown_and_structural_tags_are_errors():
    assert _lint("Hi <|emotion:joy|> there.") == [(3, "<|emotion:joy|>", "error")]
    warnings = T.lint_tags("Say <|audio|> now.")
    assert [(w.position, w.severity) for w in warnings] == [(4, "error")]
    assert "structural" in warnings[0].message


def test_lint_sentence_level_tag_inside_a_sentence():
    text = "We went home <|emotion:sadness|>and cried."
    assert _lint(text) == [(13, "<|emotion:sadness|>", "warning")]
    assert _lint("Fast <|prosody:speed_fast|>now.") == [(5, "<|prosody:speed_fast|>", "warning")]
    # positional tags do not reset the sentence: the emotion tag after it is still mid-sentence
    assert _lint("One <|prosody:pause|><|emotion:awe|>two.") == [(21, "<|emotion:awe|>", "warning")]


def test_lint_sfx_needs_an_attached_onomatopoeia():
    assert _lint("Funny. <|sfx:laughter|> Haha.") == [(7, "<|sfx:laughter|>", "warning")]
    assert _lint("Funny. <|sfx:laughter|>") == [(7, "<|sfx:laughter|>", "warning")]
    assert _lint("<|sfx:sigh|><|prosody:pause|>Hmm") == [(0, "<|sfx:sigh|>", "warning")]


def test_lint_clone_mode_warns_on_a_leading_emotion_only():
    assert _lint("<|emotion:anger|>Get out!", clone=True) == [(0, "<|emotion:anger|>", "warning")]
    assert _lint("  <|emotion:anger|>Get out!", clone=True) == [(2, "<|emotion:anger|>", "warning")]
    assert _lint("<|emotion:anger|>Get out!") == []
    assert _lint("Now, <|emotion:anger|>get out!", clone=True) == [(5, "<|emotion:anger|>", "warning")]  # mid-sentence
    assert _lint("Now. <|emotion:anger|>Get out!", clone=True) == []
    assert _lint("<|style:shouting|>Get out!", clone=True) == []


def test_estimate_seconds():
    assert T.estimate_seconds("a" * 15) == pytest.approx(1.0)
    assert T.estimate_seconds("<|emotion:awe|>" + "a" * 30) == pytest.approx(2.0)
    assert T.estimate_seconds("word   " * 5) == pytest.approx(len("word word word word word") / 15)  # one space per run
    assert T.estimate_seconds("a <|prosody:pause|> b <|prosody:long_pause|>") == pytest.approx(len("a b") / 15 + 1.5)
    assert T.estimate_seconds("") == 0.0
