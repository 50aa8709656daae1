"""studio/text/pronounce.py: the pronunciation dictionary's rules, its safety, its files and store, and where the studio
applies it (single takes, long takes, "as it will be spoken", the HTTP API, the page's editor)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.demo import TINY_DIMS, reference_tokenizer_path
from engine.longform import plan
from engine.prompt import build_prompt
from engine.tokenizer import HiggsTokenizer
from studio.text.pronounce import (
    MAX_RULES,
    Dictionary,
    DictionaryStore,
    PronunciationError,
    Rule,
    changed,
    from_pls,
    from_tsv,
    merged,
    parse_file,
    rules_json,
    to_tsv,
)
from studio.takes.service import StudioService, Order
from tests.fakes import FakeEngine

NGUYEN = Rule.make("Nguyen", "Win")


@pytest.fixture()
def studio(tmp_path):
    store = DictionaryStore(tmp_path / "dictionary.json")
    service = StudioService(FakeEngine(frames=1), dictionary=store)
    yield service, store
    service.close()


# ------------------------------------------------------------------------------------------ acceptance

def test_a_rule_changes_the_spoken_text_and_the_prompt_ids(studio):
    service, store = studio
    text = "Dr. Nguyen said hello."
    before = service.synthesize(Order(text=text))
    store.replace(Dictionary([NGUYEN]))
    after = service.synthesize(Order(text=text))
    assert (before.prompt_text, after.prompt_text) == (text, "Dr. Win said hello.")
    assert service.engine.started == [text, "Dr. Win said hello."]  # what the engine was given
    tokenizer = HiggsTokenizer.from_file(reference_tokenizer_path())
    ids = [build_prompt(tokenizer, t.prompt_text, dims=TINY_DIMS).ids for t in (before, after)]
    assert ids[0] != ids[1]
    assert ids[1] == build_prompt(tokenizer, "Dr. Win said hello.", dims=TINY_DIMS).ids
    assert after.text == text  # the history keeps what was typed


def test_a_takes_recipe_pins_the_rules_that_fired_and_replays_the_same_prompt(studio):
    from studio.views import render

    service, store = studio
    tomato = Rule.make("tomato", "tomahto")
    store.replace(Dictionary([Rule.make("Smith", "Smyth"), NGUYEN, tomato]))
    text = "Dr. Nguyen ate a tomato."
    take = service.synthesize(Order(text=text))
    recipe = take.recipe()
    assert recipe["dictionary"] == [NGUYEN.to_json(), tomato.to_json()]  # the ones that fired, in their order
    store.replace(Dictionary([Rule.make("Nguyen", "Nwen"), Rule.make("ate", "eight")]))  # the studio's rules move on
    assert service.synthesize(Order(text=text)).prompt_text == "Doctor Nwen eight a tomato."  # numbers, titles written out
    again = service.synthesize(Order(text=recipe["text"], dictionary=Dictionary.from_json(recipe["dictionary"])))
    assert again.prompt_text == take.prompt_text == "Doctor Win ate a tomahto."
    assert again.recipe()["dictionary"] == recipe["dictionary"]
    plain = service.synthesize(Order(text="Nothing to respell.", dictionary=Dictionary()))
    assert plain.recipe()["dictionary"] == [] and plain.prompt_text == "Nothing to respell."
    assert '"dictionary": [{"word": "Nguyen"' in render.recipe_curl(recipe, "http://host/")


def test_the_speech_api_reads_a_recipes_rules_instead_of_the_studios(studio):
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from studio import api

    service, store = studio
    store.replace(Dictionary([Rule.make("Nguyen", "Nwen")]))
    app = FastAPI()
    api.register(app, service, request_timeout=5.0)
    with TestClient(app) as client:
        r = client.post("/v1/audio/speech", json={"input": "Hi Nguyen.", "response_format": "pcm",
                                                  "dictionary": [NGUYEN.to_json()]})
        assert r.status_code == 200 and service.engine.started[-1] == "Hi Win."
        r = client.post("/v1/audio/speech", json={"input": "Hi Nguyen.", "response_format": "pcm", "dictionary": []})
        assert r.status_code == 200 and service.engine.started[-1] == "Hi Nguyen."
        bad = client.post("/v1/audio/speech", json={"input": "Hi.", "dictionary": [{"word": "x"}]})
        assert bad.status_code == 400 and "Rule 1" in bad.json()["error"]["message"]


def test_a_projects_rules_and_the_owners_each_within_the_caps_work_together(studio):
    """Each dictionary is held to the caps when it is saved; a project's take uses both, so together they may
    hold twice as many (a project whose rules pushed the sum past one cap used to fail every take)."""
    from studio.text.respell import MAX_REGEX_RULES

    service, store = studio
    store.replace(Dictionary([Rule.make(rf"\bx{n}\b", "y", regex=True) for n in range(MAX_REGEX_RULES)]))
    project = Dictionary([Rule.make(rf"\bv(\d+)z{n}\b", r"version \1", regex=True) for n in range(10)])
    assert service.respell("x3 and v2z7", project=project) == "y and version 2"
    with pytest.raises(PronunciationError, match=f"at most {MAX_REGEX_RULES} regular"):
        merged(store.dictionary, project)  # one dictionary saved as one keeps one cap


def test_changing_a_rule_marks_exactly_the_segments_holding_its_word():
    segments = ["Nguyen opened the door.", "The hall was dark.", "Ms. NGUYEN lit a lamp.", "SQL is a language.",
                "Nguyenville is a town."]
    old = Dictionary([NGUYEN, Rule.make("SQL", "sequel")])
    respelled = Dictionary([Rule.make("Nguyen", "Nwin"), Rule.make("SQL", "sequel")])
    assert changed(old, respelled, segments) == [0, 2]
    assert changed(old, Dictionary([NGUYEN]), segments) == [3]  # a rule removed
    added = merged(old, Dictionary([Rule.make("lamp", "lahmp")]))
    assert changed(old, added, segments) == [2]
    assert changed(old, Dictionary(reversed(old.rules)), segments) == []
    assert [old.affects(s) for s in segments] == [True, False, True, True, False]
    assert old.fingerprint("The hall was dark.") == "" and old.fingerprint(segments[0]) == old.fingerprint(segments[2])


# ------------------------------------------------------------------------------------------ rules

def test_words_match_whole_in_any_case_unless_told_and_never_inside_tags():
    d = Dictionary([NGUYEN, Rule.make("SQL", "sequel", case_sensitive=True), Rule.make("New York", "Noo York"),
                    Rule.make("laughter", "LAFF"), Rule.make("Win", "Victory")])
    text = "<|sfx:laughter|>Haha nguyen, NGUYEN and Nguyens use SQL, not sql, in new york."
    assert d.apply(text) == "<|sfx:laughter|>Haha Win, Win and Nguyens use sequel, not sql, in Noo York."
    assert d.matches(text) == [NGUYEN, d.rules[1], d.rules[2]]  # one pass: "Win" is not respelled again


def test_later_scoped_and_case_sensitive_rules_win():
    d = Dictionary([Rule.make("tomato", "tomayto"), Rule.make("tomato", "tomahto", language="en-GB"),
                    Rule.make("Ana", "Anna", voice="Narrator"), Rule.make("read", "reed"), Rule.make("read", "red")])
    assert d.apply("tomato", language="en") == "tomahto" and d.apply("tomato", language="fr") == "tomayto"
    assert d.apply("tomato") == "tomahto"  # a text of unknown language takes every language's rules
    assert d.apply("Ana", voice=("v1", "narrator")) == "Anna" and d.apply("Ana", voice=("v2", "Guest")) == "Ana"
    assert d.apply("read") == "red"
    assert Dictionary([Rule.make("us", "you"), Rule.make("US", "U S", case_sensitive=True)]).apply("US us") == "U S you"


def test_regex_rules_with_groups():
    d = Dictionary([Rule.make(r"\bv(\d+)\b", r"version \1", regex=True),
                    Rule.make(r"(?<h>\d+)h(?<m>\d+)", r"\g<h> hours \g<m>", regex=True, case_sensitive=True)])
    assert d.apply("v3 at 10h30, V4") == "version 3 at 10 hours 30, version 4"


@pytest.mark.parametrize("pattern, says", [
    (r"(\w)\1", "backreference"), (r"(?<!a)b", "lookbehind"), (r"a(?=b)", "lookahead"), ("[", "not a valid"),
    ("x*", "matches empty"), (r"\pL{30}", "too large"),
])
def test_patterns_re2_cannot_run_are_refused(pattern, says):
    """RE2 runs every pattern it accepts in time linear in the text (tests/test_hostile_dictionary.py); what it
    cannot express is refused with a sentence."""
    with pytest.raises(PronunciationError, match=says):
        Rule.make(pattern, "y", regex=True)


@pytest.mark.parametrize("make, says", [
    (lambda: Rule.make("", "x"), "empty"), (lambda: Rule.make("w", "<|sfx:cough|>"), "control tag"),
    (lambda: Rule.make("w" * 101, "x"), "limit"), (lambda: Rule.make(r"\d", r"\2", regex=True), "group"),
    (lambda: Dictionary([NGUYEN] * (MAX_RULES + 1)), "at most"),
])
def test_bad_rules_say_what_to_change(make, says):
    with pytest.raises(PronunciationError, match=says):
        make()


# ------------------------------------------------------------------------------------------ files and store

def test_tsv_and_json_round_trip_and_the_version_is_stable():
    d = Dictionary([NGUYEN, Rule.make(r"\bv(\d+)", r"version \1", regex=True, case_sensitive=True, voice="Narrator",
                                      language="en")])
    assert from_tsv(to_tsv(d)) == d and Dictionary.from_json(json.loads(json.dumps(rules_json(d)))) == d
    assert d.version == Dictionary(list(d.rules)).version and len(d.version) == 16 and Dictionary().version == ""
    assert from_tsv("# names\nNguyen\tWin\n\n") == Dictionary([NGUYEN])
    with pytest.raises(PronunciationError, match="Line 1"):
        from_tsv("just one column\n")
    with pytest.raises(PronunciationError, match="unknown fields"):
        Dictionary.from_json({"rules": [{"word": "a", "respelling": "b", "ipa": "x"}]})


PLS = b"""<?xml version="1.0" encoding="UTF-8"?>
<lexicon version="1.0" xmlns="http://www.w3.org/2005/01/pronunciation-lexicon" alphabet="ipa" xml:lang="en-US">
  <lexeme><grapheme>BTW</grapheme><grapheme>btw</grapheme><alias>by the way</alias></lexeme>
  <lexeme><grapheme>tomato</grapheme><phoneme>t\xc9\x99\xcb\x88me\xc9\xaat\xc9\x99\xca\x8a</phoneme></lexeme>
</lexicon>"""

BOMB = b"""<?xml version="1.0"?><!DOCTYPE lexicon [<!ENTITY a "aaaaaaaaaa"><!ENTITY b "&a;&a;&a;&a;&a;&a;&a;&a;">]>
<lexicon xmlns="http://www.w3.org/2005/01/pronunciation-lexicon"><lexeme><grapheme>x</grapheme><alias>&b;</alias>
</lexeme></lexicon>"""


def test_pls_aliases_are_read_and_entities_refused():
    d, notes = from_pls(PLS)
    assert [(r.word, r.respelling, r.language) for r in d.rules] == [("BTW", "by the way", "en")] * 1 + \
        [("btw", "by the way", "en")]
    assert notes == ["1 lexemes without an <alias> were skipped (phonemes are not read)"]
    assert d.apply("BTW, it works.", language="en") == "by the way, it works."
    with pytest.raises(PronunciationError, match="not a lexicon"):
        from_pls(BOMB)
    with pytest.raises(PronunciationError, match="limit"):
        parse_file("big.tsv", b"a\tb\n" * 600_000)
    with pytest.raises(PronunciationError, match="not a PLS"):
        from_pls(b"<speak>hi</speak>")


def test_the_store_keeps_the_rules_on_disk_and_follows_other_writers(tmp_path):
    path = tmp_path / "studio" / "dictionary.json"
    one, two = DictionaryStore(path), DictionaryStore(path)
    assert one.dictionary == Dictionary()
    one.replace(Dictionary([NGUYEN]))
    assert two.dictionary == Dictionary([NGUYEN]) and json.loads(path.read_text())["rules"][0]["word"] == "Nguyen"
    two.replace(Dictionary())
    assert one.dictionary == Dictionary()
    path.write_text("{not json")
    with pytest.raises(PronunciationError, match="unreadable"):
        _ = one.dictionary


# ------------------------------------------------------------------------------------------ where it applies

def test_long_form_segments_and_the_preview_speak_the_respelled_text(studio, tmp_path):
    from studio.views.longform import LongFormView

    service, store = studio
    store.replace(Dictionary([Rule.make("three", "tree", voice="Guest"), NGUYEN]))
    segments = plan("Nguyen has 3 cats and a dog.", normalize=True)
    assert [s.text for s in service.respell_segments(segments)] == ["Win has three cats and a dog."]
    script = plan("A: Nguyen has 3 cats and a dog.\nB: Nguyen has 3 dogs and a cat.",
                  voices={"A": "Narrator", "B": "Guest"})
    assert [s.text for s in service.respell_segments(script, lambda s: s.voice)] == \
        ["Win has three cats and a dog.", "Win has tree dogs and a cat."]
    _, spoken, _ = LongFormView(service, tmp_path).preview("Nguyen has 3 cats and a dog.", "", "", True)
    assert spoken == "Win has three cats and a dog."


def test_a_projects_rules_win_over_the_owners_and_compile_once(studio):

    service, store = studio
    store.replace(Dictionary([NGUYEN, Rule.make("SQL", "sequel")]))
    project = Dictionary([Rule.make("Nguyen", "Nuh-win")])
    assert service.respell("Nguyen knows SQL.", project=project) == "Nuh-win knows sequel."
    assert service.rules(project) is service.rules(Dictionary(project.rules))  # kept while neither changes
    segments = plan("Nguyen knows SQL and the rest.")
    assert [s.text for s in service.respell_segments(segments, project=project)] == \
        ["Nuh-win knows sequel and the rest."]
    keys = [service.pronunciation_key(s, project=project) for s in ("Nguyen knows SQL.", "The rest.")]
    store.replace(Dictionary())
    assert service.respell("Nguyen knows SQL.", project=project) == "Nuh-win knows SQL."
    after = [service.pronunciation_key(s, project=project) for s in ("Nguyen knows SQL.", "The rest.")]
    assert after[0] != keys[0] and after[1] == keys[1] == ""  # only the segment whose rules changed


def test_the_http_api_reads_replaces_and_applies_the_dictionary(studio):
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from studio import api

    service, store = studio
    app = FastAPI()
    api.register(app, service, request_timeout=5.0)
    with TestClient(app) as client:
        assert client.get("/v1/dictionary").json()["rules"] == []
        r = client.put("/v1/dictionary", json={"rules": [{"word": "Nguyen", "respelling": "Win"}]})
        assert r.status_code == 200 and r.json()["version"] == Dictionary([NGUYEN]).version
        bad = client.put("/v1/dictionary", json={"rules": [{"word": r"(\w)\1", "respelling": "x", "regex": True}]})
        assert bad.status_code == 400 and "Rule 1" in bad.json()["error"]["message"]
        assert store.dictionary == Dictionary([NGUYEN])  # a refused dictionary changes nothing
        tsv = client.get("/v1/dictionary?format=tsv")
        assert tsv.headers["content-type"].startswith("text/tab-separated-values") and "Nguyen\tWin" in tsv.text
        r = client.put("/v1/dictionary", content=PLS, headers={"Content-Type": "application/pls+xml"})
        assert [x["word"] for x in r.json()["rules"]] == ["BTW", "btw"] and r.json()["notes"]
        r = client.put("/v1/dictionary", content="Nguyen\tWin\n", headers={"Content-Type": "text/tab-separated-values"})
        assert r.status_code == 200 and len(r.json()["rules"]) == 1
        applied = client.post("/v1/dictionary/apply", json={"input": "Nguyen waved."}).json()
        assert applied["spoken"] == "Win waved." and applied["rules"][0]["word"] == "Nguyen"
        speech = client.post("/v1/audio/speech", json={"input": "Hi Nguyen.", "response_format": "pcm"})
        assert speech.status_code == 200 and service.engine.started[-1] == "Hi Win."


def test_the_page_editor_saves_imports_and_tries_rules(studio, tmp_path):
    from studio.api.access import Access
    from studio.views.dictionary import DictionaryView, dictionary_of

    service, store = studio
    view = DictionaryView(service, Access(), tmp_path)
    rows, export, status = view.save([["Nguyen", "Win", False, False, "", ""], ["", "", False, False, "", ""]])
    assert rows == [["Nguyen", "Win", False, False, "", ""]] and store.dictionary == Dictionary([NGUYEN])
    assert Path(export).read_text() == to_tsv(store.dictionary) and "1 rules" in status
    upload = tmp_path / "lexicon.pls"
    upload.write_bytes(PLS)
    rows, _, status = view.import_file(str(upload), rows)
    assert [r[0] for r in rows] == ["Nguyen", "BTW", "btw"] and "Imported 2 rules" in status
    assert view.trial("Ask Nguyen, btw.", rows) == "Ask Win, by the way."
    with pytest.raises(ValueError, match="Row 1"):
        dictionary_of([[r"(\w)\1", "x", True, False, "", ""]])
