"""Hostile pronunciation rules: each rule reads the text as written, never another rule's respelling; the spoken
text grows by a stated bound; regular expressions are RE2's (linear time, no backreferences or lookarounds) and
their number and size are capped; validation, `/apply` and respelling leave the event loop free; and "Try a
sentence" with rules of one's own is the owner's, like Save and Import."""

from __future__ import annotations

import json
import os
import random
import string
import time
import tracemalloc

import httpx
import pytest

from studio.text.pronounce import Dictionary, PronunciationError, Rule
from tests.probes import health_latency, loop_held
from tests.studio_server import KEY

BEARER = {"Authorization": f"Bearer {KEY}"}


def regex(pattern: str, respelling: str, **kw) -> Rule:
    return Rule.make(pattern, respelling, regex=True, **kw)


# ------------------------------------------------------------------------------------------ applied once

def test_a_respelling_is_never_matched_again():
    assert Dictionary([regex("a", "b"), regex("b", "c")]).apply("a") == "b"
    assert Dictionary([Rule.make("a", "b"), regex("b", "c")]).apply("a b") == "b c"
    chain = Dictionary([Rule.make("Nguyen", "Win"), regex(r"\bWin\b", "Victory")])
    assert chain.spoken("Nguyen met Win.") == ("Win met Victory.", list(chain.rules))
    # Where two matches overlap the earlier rule wins; `spoken` names the rules that fired in the dictionary's order.
    order = Dictionary([regex(r"\d+", "N"), regex(r"v\d", "version"), regex("x", "ex")])
    assert order.spoken("x v3") == ("ex vN", [order.rules[0], order.rules[2]])


def test_chained_respellings_cannot_amplify_the_text():
    """Three rules with 200-character respellings once turned "aaaa" into 32,000,000 characters."""
    big = "a" * 200
    rules = Dictionary([regex("a", big), regex("[a]", big), regex("a{1}", big)])
    tracemalloc.start()
    try:
        spoken = rules.apply("aaaa")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(spoken) == 4 * 200
    assert peak < 2 * 2 ** 20, f"{peak / 2 ** 20:.1f} MB to respell four characters"


def test_growth_beyond_the_limit_is_refused_naming_the_rule():
    from studio.text.respell import MAX_GROWTH_CHARS, MAX_GROWTH_FACTOR

    loud = Rule.make("a", "b" * 200)
    rules = Dictionary([Rule.make("Nguyen", "Win"), loud])
    assert len(rules.apply("a " * 40)) == 40 * 201  # +7,960 characters: under the fixed allowance
    text = "a " * 2048
    with pytest.raises(PronunciationError) as refused:
        rules.apply(text)
    message = str(refused.value)
    assert "'a'" in message and f"{MAX_GROWTH_FACTOR}×" in message and f"{MAX_GROWTH_CHARS:,}" in message
    long = "Nguyen " * 585  # 4,095 characters that shrink: no limit to meet
    assert rules.apply(long) == "Win " * 585


# ------------------------------------------------------------------------------------------ RE2

@pytest.mark.parametrize("pattern, says", [
    (r"(\w)\1", "backreference"), (r"(?P<x>a)(?P=x)", "backreference"), (r"(?<!a)b", "lookbehind"),
    (r"(?<=a)b", "lookbehind"), (r"a(?=b)", "lookahead"), (r"a(?!b)", "lookahead"), ("[", "not a valid"),
    ("x*", "matches empty"),
])
def test_patterns_re2_cannot_run_are_refused_with_a_sentence(pattern, says):
    with pytest.raises(PronunciationError, match=says) as refused:
        regex(pattern, "y")
    assert f"/{pattern}/" in str(refused.value) and "b'" not in str(refused.value)


def test_nested_repetition_is_linear_time_now():
    rules = Dictionary([regex("(a+)+$", "y"), regex(r"(\w*)*x", "z"), regex(r"q\w*\w*\w*\w*!", "w")])
    text = "a" * 2000 + "! q" + "a" * 2000 + "?"
    start = time.perf_counter()
    assert rules.apply(text) == text
    assert time.perf_counter() - start < 0.5


def test_regex_rules_are_capped_in_number_and_size():
    from studio.text.respell import MAX_REGEX_RULES

    with pytest.raises(PronunciationError, match=f"at most {MAX_REGEX_RULES} regular"):
        Dictionary([regex(rf"\bx{n}\b", "y") for n in range(MAX_REGEX_RULES + 1)])
    Dictionary([regex(rf"\bx{n}\b", "y") for n in range(MAX_REGEX_RULES)] + [Rule.make("w", "v")] * 10)
    with pytest.raises(PronunciationError, match=r"/\\pL\{30\}/ is too large"):
        regex(r"\pL{30}", "y")


def test_the_rules_people_write_read_as_before():
    """What RE2 must keep of the `regex` module's behaviour: case folding, groups by number and name (both
    spellings), respellings outside ASCII, whole words in any script, ASCII `\\b`, `\\d`, `\\w`."""
    d = Dictionary([regex(r"\bv(\d+)\b", r"version \1"),
                    regex(r"(?P<h>\d+)h(?<m>\d+)", r"\g<h> hours \g<m>", case_sensitive=True),
                    regex(r"\bdr\.", "Doktor"), regex(r"€(\d+)", r"\1 Euro (€)")])
    assert d.apply("V3 at 10h30, v4 and 10H30; dr. Who, €5") == \
        "version 3 at 10 hours 30, version 4 and 10H30; Doktor Who, 5 Euro (€)"
    words = Dictionary([Rule.make("café", "kaffee"), Rule.make("Nguyễn", "Win"), Rule.make("C++", "C plus plus"),
                        Rule.make("New York", "Noo York"), Rule.make("New", "Nu")])
    assert words.apply("CAFÉ, cafés, Café! nguyễn C++ C+++ New Yorker, New York.") == \
        "kaffee, cafés, kaffee! Win C plus plus C plus plus+ Nu Yorker, Noo York."
    assert Dictionary([regex(r"\d+", "N")]).apply("7 ٧") == "N ٧"  # \d is ASCII in RE2; \p{Nd} is any digit
    assert Dictionary([regex(r"\p{Nd}+", "N")]).apply("7 ٧") == "N N"


# ------------------------------------------------------------------------------------------ the event loop

def _put(client: httpx.Client, rules: list[dict]) -> httpx.Response:
    return client.put("/v1/dictionary", json={"rules": rules}, headers=BEARER)


@pytest.fixture()
def keyed(keyed_studio):
    """The keyed studio's client; its dictionary is emptied again after the test (other files share it)."""
    with httpx.Client(base_url=keyed_studio.url, timeout=120) as client:
        try:
            yield client
        finally:
            assert _put(client, []).status_code == 200


def test_backtracking_rules_leave_the_event_loop_free(keyed):
    """Forty rules like `\\w*\\d` once held /health for 3-5 s while a PUT probed them on the event loop."""
    rules = [{"word": r"\w*\d", "respelling": "y", "regex": True}] * 40
    with health_latency(str(keyed.base_url), headers=BEARER) as latencies:
        put = _put(keyed, rules)
        applied = keyed.post("/v1/dictionary/apply", json={"input": "a" * 4000}, headers=BEARER)
    assert put.status_code == 200, put.text
    assert applied.status_code == 200 and applied.json()["spoken"] == "a" * 4000
    assert not loop_held(latencies), f"/health waited {sorted(latencies)[-3:]} s"


def test_a_dictionary_at_its_limits_leaves_the_event_loop_free(keyed):
    """The largest dictionary the studio takes (MAX_RULES rules, MAX_REGEX_RULES of them regular expressions of
    MAX_PATTERN characters, the rest MAX_WORD-character words), then applied to MAX_TEXT_CHARS of text."""
    from studio.text.pronounce import MAX_PATTERN, MAX_RULES, MAX_WORD
    from studio.text.respell import MAX_REGEX_RULES
    from studio.takes.limits import MAX_TEXT_CHARS

    rng = random.Random(5)
    words = ["".join(rng.choice(string.ascii_lowercase) for _ in range(MAX_WORD))
             for _ in range(MAX_RULES - MAX_REGEX_RULES)]
    rules = [{"word": w, "respelling": w[:50]} for w in words]
    for n in range(MAX_REGEX_RULES):
        pattern = rf"\b{n}(?:\pL{{3}}\d+|[\p{{Greek}}\p{{Cyrillic}}]+\d|(?:\w*\d){{8}}"
        pattern += "|[a-z]{1,9}\\d" * ((MAX_PATTERN - len(pattern) - 1) // 13) + ")"
        rules.append({"word": pattern[:MAX_PATTERN], "respelling": "r" * 200, "regex": True})
    assert {len(r["word"]) for r in rules} >= {MAX_WORD} and max(len(r["word"]) for r in rules) >= MAX_PATTERN - 13
    text = (" ".join(words[:30]) + "".join(f" {n}abc{n}" for n in range(0, MAX_REGEX_RULES, 20)) + " 12 ab1" * 400)
    text = text[:MAX_TEXT_CHARS]
    with health_latency(str(keyed.base_url), headers=BEARER) as latencies:
        put = _put(keyed, rules)
        applied = keyed.post("/v1/dictionary/apply", json={"input": text}, headers=BEARER)
    assert put.status_code == 200, put.text[:300]
    assert applied.status_code == 200, applied.text[:300]
    assert len(applied.json()["rules"]) == 30 + len(range(0, MAX_REGEX_RULES, 20))
    assert not loop_held(latencies), f"/health waited {sorted(latencies)[-3:]} s"
    over = _put(keyed, rules[1:] + [{"word": r"\bz\b", "respelling": "zed", "regex": True}])
    assert over.status_code == 400 and f"at most {MAX_REGEX_RULES} regular" in over.json()["error"]["message"]


# ------------------------------------------------------------------------------------------ the page

def _trial_event(url: str) -> int:
    config = httpx.get(f"{url}/config", timeout=60).json()
    found = [i for i, dep in enumerate(config["dependencies"]) if dep.get("api_name") == "trial"]
    assert len(found) == 1, "the dictionary's 'Try a sentence' event"
    return found[0]


def table(rows: list[list]) -> dict:
    """The rules table as the page sends it."""
    from studio.text.pronounce import TSV_COLUMNS

    return {"headers": list(TSV_COLUMNS), "data": rows}


def _run(url: str, fn_index: int, data: list, headers: dict | None = None) -> dict:
    """One page event through Gradio's queue, as the browser sends it; the completion message."""
    session = os.urandom(6).hex()
    with httpx.Client(base_url=url, timeout=120, headers=headers) as client:
        joined = client.post("/gradio_api/queue/join",
                             json={"data": data, "fn_index": fn_index, "session_hash": session})
        assert joined.status_code == 200, joined.text
        with client.stream("GET", "/gradio_api/queue/data", params={"session_hash": session}) as stream:
            for line in stream.iter_lines():
                if line.startswith("data:"):
                    message = json.loads(line[5:])
                    if message.get("msg") == "process_completed":
                        return message
    raise AssertionError("the event never completed")


def test_only_the_owner_tries_rules_of_their_own_on_a_public_page(public_studio):
    url = public_studio.url
    trial = _trial_event(url)
    rows = table([["a", "b" * 200, True, False, "", ""]])
    visitor = _run(url, trial, ["a a a", rows])
    assert visitor["success"] is False and "owner" in visitor["output"]["error"]
    empty = table([["", "", False, False, "", ""]] * 3)  # the page's table as a visitor sees it: no rules
    plain = _run(url, trial, ["Nothing to respell.", empty])
    assert plain["success"] is True and plain["output"]["data"] == ["Nothing to respell."]
    owner = _run(url, trial, ["a a", rows], headers=BEARER)
    assert owner["success"] is True and owner["output"]["data"] == ["b" * 200 + " " + "b" * 200]


def test_the_speech_api_refuses_a_recipe_that_outgrows_the_limit(tmp_path):
    """Chained rules once spoke 16,000,000 characters for "A cat." on /v1/audio/speech (+2.1 GB): now each rule
    reads the text as written, and a text that outgrows the limit is a 400 naming the rule."""
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from studio import api
    from studio.text.pronounce import DictionaryStore
    from studio.takes.service import StudioService
    from tests.fakes import FakeEngine

    service = StudioService(FakeEngine(frames=1), dictionary=DictionaryStore(tmp_path / "dictionary.json"))
    app = FastAPI()
    api.register(app, service, request_timeout=5.0)
    rules = [{"word": "a", "respelling": "a" * 200, "regex": True}] * 3
    try:
        with TestClient(app) as client:  # "A cat." first: before, it spoke 16,000,000 characters
            r = client.post("/v1/audio/speech", json={"input": "A cat.", "response_format": "pcm",
                                                      "dictionary": rules})
            assert r.status_code == 200 and service.engine.started[-1] == "a" * 200 + " c" + "a" * 200 + "t."
            r = client.post("/v1/audio/speech", json={"input": "a " * 2000, "response_format": "pcm",
                                                      "dictionary": rules})
            assert r.status_code == 400 and "/a/" in r.json()["error"]["message"], r.text[:300]
    finally:
        service.close()
