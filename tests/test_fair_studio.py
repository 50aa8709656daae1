"""A fair public studio against a real `app.py --demo --api-key SECRET --public-page` (what a Space runs):

* a flood: visitor A opens 24 live takes with one page token; visitor B, from another address, starts a short
  take and hears it within max(4 × B alone, 1.5 s); A's takes past its share are refused with the sentence,
  and the ones admitted all finish;
* voice visibility: a private owner voice is listed to no visitor (page load, `/config`, every event by
  `fn_index`) and usable by none (live route, page event); a shared one is; the owner sees and uses both;
* `gradio_client`: `view_api` lists the documented endpoints; `/synthesize` answers a visitor within the
  public limits, refuses more, and counts against the visitor's share.

Two visitors are two client addresses: the tests' clients connect from 127.0.0.1 and 127.0.0.2 (off a
Space the connection's address is what counts; tests/test_fair.py covers the forwarded one)."""

from __future__ import annotations

import json
import statistics

import httpx
import pytest
import soundfile as sf

from tests.helpers import clip_bytes, events, refused, run_event
from tests.live_client import LiveTake, client, page_token, wait
from tests.studio_server import KEY

pytestmark = pytest.mark.slow

BEARER = {"Authorization": f"Bearer {KEY}"}
TOO_MANY = "takes waiting"
# The public studio is shared with tests/test_security.py, whose "Owner Voice" no name here may contain.
PRIVATE, SHARED = "Hidden Owner Speaker", "Shared House Speaker"
PRIVATE_TRANSCRIPT = "Only the owner may speak with this one."
PRIVATE_STYLE = "<|emotion:bitterness|><|prosody:pitch_low|>"


@pytest.fixture(scope="module")
def studio(public_studio):
    """The public studio with one private and one shared voice of the owner's; (url, {name: id})."""
    url, ids = public_studio.url, {}
    for name, pitch, transcript in ((PRIVATE, 150.0, PRIVATE_TRANSCRIPT), (SHARED, 220.0, "A shared voice.")):
        r = httpx.post(f"{url}/v1/audio/voices", headers=BEARER, timeout=120,
                       data={"name": name, "ref_text": transcript, "consent": "true",
                             **({"style": PRIVATE_STYLE} if name == PRIVATE else {})},
                       files={"audio_sample": ("clip.wav", clip_bytes(pitch=pitch, tremolo=0.0), "audio/wav")})
        assert r.status_code == 201 and r.json()["shared"] is False, r.text  # saved voices start private
        ids[name] = r.json()["id"]
    r = httpx.patch(f"{url}/v1/audio/voices/{ids[SHARED]}", headers=BEARER, json={"shared": True})
    assert r.status_code == 200 and r.json()["shared"] is True, r.text
    return url, ids


def test_one_visitors_flood_does_not_starve_another(studio):
    url, _ = studio
    a_http, b_http = client(url, "127.0.0.1"), client(url, "127.0.0.2")
    b_token = page_token(b_http)
    alone = []
    for _ in range(3):
        take = LiveTake(b_http, b_token)
        take.join(120)
        assert take.end == "done", take.lines
        alone.append(take.first_audio)
    b_alone = statistics.median(alone)

    a_token = page_token(a_http)  # one token for all 24
    flood = [LiveTake(a_http, a_token, text="A visitor with a script. " * 4, max_frames=600, seed=i)
             for i in range(24)]
    wait(lambda: sum(t.end == "error" for t in flood) == 18 and sum(t.first_audio is not None for t in flood) >= 2,
         120, "A's share to fill")
    b = LiveTake(b_http, b_token)
    b.join(120)
    assert b.end == "done", b.lines
    assert b.first_audio <= max(4 * b_alone, 1.5), (b.first_audio, b_alone)
    for take in flood:
        take.join(600)
    ends = [t.end for t in flood]
    assert ends.count("done") == 6 and ends.count("error") == 18, ends
    assert all(TOO_MANY in t.lines[-1]["message"] for t in flood if t.end == "error")
    # A's waiting takes were told where they stood: behind A's own running takes, never first in line.
    assert all(m["position"] >= 2 for t in flood for m in t.lines if m["type"] == "queued")
    print(f"\nB first audio: alone {b_alone * 1000:.0f} ms, under A's flood {b.first_audio * 1000:.0f} ms")


def test_a_private_voice_is_the_owners_alone_and_a_shared_one_is_everyones(studio):
    url, ids = studio
    private_marks = (PRIVATE, ids[PRIVATE], PRIVATE_TRANSCRIPT, PRIVATE_STYLE)
    visitor = client(url)

    def clean(text: str, marks=private_marks) -> bool:
        return not any(mark in text for mark in marks)

    config = visitor.get("/config")
    assert config.status_code == 200 and clean(config.text)
    by_name = events(config.json())
    load = visitor.post("/gradio_api/run/predict", json={"data": [], "fn_index": by_name["refresh_lists"],
                                                          "session_hash": "v"})
    assert SHARED in load.text and clean(load.text)
    # Every event, by fn_index, with nothing and with the private voice's id in every input (an error may echo
    # the id it was given; nothing may add what the id stands for).
    beyond_id = private_marks[:1] + private_marks[2:]
    for fn_index, dep in enumerate(config.json()["dependencies"]):
        for value, marks in ((None, private_marks), (ids[PRIVATE], beyond_id)):
            status, message = run_event(visitor, fn_index, [value] * len(dep["inputs"]))
            assert clean(json.dumps(message), marks), (dep["api_name"], message)

    token = page_token(visitor)
    by_id = LiveTake(visitor, token, voice=ids[PRIVATE])
    by_id.join(120)
    assert by_id.end == "error" and "No voice called" in by_id.lines[-1]["message"]
    assert clean(json.dumps(by_id.lines), beyond_id)
    by_name_take = LiveTake(visitor, token, voice=PRIVATE)
    by_name_take.join(120)
    assert by_name_take.end == "error"
    shared = LiveTake(visitor, token, voice=ids[SHARED])
    shared.join(120)
    assert shared.end == "done", shared.lines
    generate = by_name["generate"]
    args = ["Hello from a visitor.", "", ids[PRIVATE], None, "", 0.8, 0.8, 30, 1, 8, 0, 1, False, "speak", [], ""]
    assert "No voice called" in refused(run_event(visitor, generate, args)[1])
    args[2] = ids[SHARED]
    assert run_event(visitor, generate, args)[1]["success"]

    # The owner: the key on the same events, and the API, see and use both.
    owner = client(url, headers=BEARER)
    load = owner.post("/gradio_api/run/predict", json={"data": [], "fn_index": by_name["refresh_lists"],
                                                        "session_hash": "o"})
    assert PRIVATE in load.text and SHARED in load.text
    args[2] = ids[PRIVATE]
    assert run_event(owner, generate, args, headers=BEARER)[1]["success"]
    listed = {v["name"]: v["shared"] for v in owner.get("/v1/audio/voices").json()["voices"]}
    assert listed[PRIVATE] is False and listed[SHARED] is True
    r = owner.post("/v1/audio/speech", json={"input": "Hello.", "voice": PRIVATE, "response_format": "wav",
                                             "max_frames": 8})
    assert r.status_code == 200 and len(r.content) > 44


def test_gradio_client_calls_the_documented_endpoints_as_a_visitor(studio):
    from gradio_client import Client

    url, ids = studio
    gc = Client(url, verbose=False)
    endpoints = gc.view_api(print_info=False, return_format="dict")["named_endpoints"]
    assert {"/synthesize", "/list_voices"} <= set(endpoints)
    path = gc.predict("Hello from gradio_client.", api_name="/synthesize")
    audio, rate = sf.read(path)
    assert rate == 24_000 and len(audio) > 0
    listed = json.dumps(gc.predict(api_name="/list_voices"))
    assert SHARED in listed and PRIVATE not in listed and ids[PRIVATE] not in listed
    with pytest.raises(Exception, match="up to 1000 characters"):
        gc.predict("word " * 250, api_name="/synthesize")
    with pytest.raises(Exception, match="No voice called"):
        gc.predict("Hello.", ids[PRIVATE], api_name="/synthesize")
    # The same visitor (this address) fills its share through the page's live route: two running, four waiting.
    http = client(url)
    token = page_token(http)
    holding = [LiveTake(http, token, max_frames=1500, seed=i) for i in range(6)]
    wait(lambda: sum(t.first_audio is not None for t in holding) == 2
         and sum(any(m["type"] == "queued" for m in t.lines) for t in holding) == 4, 120, "the share to fill")
    with pytest.raises(Exception, match=TOO_MANY):
        gc.predict("One more, please.", api_name="/synthesize")
    for take in holding:
        take.stop.set()
    for take in holding:
        take.join(30)
    wait(lambda: httpx.get(f"{url}/health").json()["queue_depth"] == 0, 60, "the cancelled takes to leave")
    # The owner's key in a header lifts the public limits.
    owner = Client(url, verbose=False, headers=BEARER)
    assert sf.read(owner.predict("word " * 250, api_name="/synthesize"))[1] == 24_000
