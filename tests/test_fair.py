"""A fair public studio, through the service and the live route in process (a scripted engine, and the demo
engine for long takes): admission order, a visitor's share, who counts as one visitor, a long take's
segments taking turns. The running studio's acceptance tests are tests/test_fair_studio.py."""

from __future__ import annotations

import json
import threading
import time

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from engine.config import SAMPLE_RATE
from studio.api.access import Access, client_address, visitor
from studio.takes.admission import OWNER, Caller
from studio.views.live import ROUTE, TOKEN_HEADER
from studio.views.page import Page
from studio.takes.service import Queued, StudioService, TooManyTakes
from tests.fakes import FakeEngine
from tests.helpers import request, tone

KEY = "SECRET"
A, B, C = Caller.visitor("10.0.0.1"), Caller.visitor("10.0.0.2"), Caller.visitor("10.0.0.3")


class CountingEngine(FakeEngine):
    """A FakeEngine with `max_batch` slots that records the most takes running at once."""

    def __init__(self, max_batch: int, **kw):
        super().__init__(max_batch=max_batch, **kw)
        self.running = self.most = 0
        self._lock = threading.Lock()

    def generate_stream(self, text, **kw):
        with self._lock:
            self.running += 1
            self.most = max(self.most, self.running)
        try:
            yield from super().generate_stream(text, **kw)
        finally:
            with self._lock:
                self.running -= 1


def wait_for(condition, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_three_visitors_and_the_keyed_caller_are_admitted_by_the_rule():
    svc = StudioService(FakeEngine(frames=400, delay=0.005), None, None)  # one slot
    holder = svc.start(request(text="holder", seed=1))
    threads = [threading.Thread(target=lambda: list(holder.stream()))]
    threads[0].start()
    wait_for(lambda: svc.engine.started == ["holder"])
    last: dict[str, int] = {}

    def submit(name: str, caller: Caller) -> None:
        req = request(text=name, seed=1, max_frames=4, caller=caller)  # quick once the holder stops
        depth = svc.queue_depth

        def run():
            for item in svc.stream(req, positions=True):
                if isinstance(item, Queued):
                    last[name] = item.position
        threads.append(threading.Thread(target=run))
        threads[-1].start()
        wait_for(lambda: svc.queue_depth == depth + 1)  # in line before the next one arrives

    for name, caller in (("a1", A), ("a2", A), ("a3", A), ("b1", B), ("b2", B), ("c1", C), ("owner", OWNER)):
        submit(name, caller)
    expected = ["owner", "a1", "b1", "c1", "a2", "b2", "a3"]
    # Each sees the place the rule gives it (2 = next, behind the busy slot), not its arrival order.
    wait_for(lambda: {n: last.get(n) for n in expected} == {n: i + 2 for i, n in enumerate(expected)})
    holder.cancel.set()
    for thread in threads:
        thread.join(20)
    assert svc.engine.started == ["holder", *expected] and svc.queue_depth == 0
    svc.close()


def test_a_visitor_alone_still_batches_up_to_its_share_and_the_api_up_to_every_slot():
    svc = StudioService(CountingEngine(16, frames=30, delay=0.01), None, None, visitor_concurrency=3)
    requests = [request(text=f"v{i}", seed=i, caller=A) for i in range(4)]
    threads = [threading.Thread(target=lambda r=r: list(svc.stream(r))) for r in requests]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)
    assert svc.engine.most == 3  # the visitor's three decode together, the fourth waits for one of them
    svc.engine.most = 0
    requests = [request(text=f"o{i}", seed=i) for i in range(8)]  # the keyed API: the owner
    threads = [threading.Thread(target=lambda r=r: list(svc.stream(r))) for r in requests]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)
    assert svc.engine.most == 8
    svc.close()


def test_a_visitor_past_its_share_gets_the_sentence_and_the_studio_stays_open_to_others():
    svc = StudioService(CountingEngine(2, frames=10_000, delay=0.005), None, None, visitor_concurrency=1,
                        visitor_queue=1)
    running = svc.start(request(text="a-running", caller=A))
    waiting = svc.start(request(text="a-waiting", caller=A))
    streams = [running.stream(positions=True), waiting.stream(positions=True)]
    first = [threading.Thread(target=lambda s=s: next(s, None)) for s in streams]
    for thread in first:
        thread.start()
        thread.join(10)
    with pytest.raises(TooManyTakes, match="You already have 1 take waiting"):
        next(svc.stream(request(text="a-more", caller=A)))
    b = request(text="b", caller=B, max_frames=3)
    assert list(svc.stream(b))[-1].final  # B's share is its own: it runs in the slot A may not take
    for req, stream in zip((running, waiting), streams):
        req.cancel.set()
        stream.close()
    svc.close()


def test_one_address_is_one_visitor_and_the_forwarded_address_counts_only_on_a_space(monkeypatch):
    headers = {"x-forwarded-for": "1.2.3.4, 10.0.0.9"}
    monkeypatch.delenv("SPACE_ID", raising=False)
    assert client_address(headers, "127.0.0.1") == "127.0.0.1"  # anyone can write that header
    assert visitor(headers, "127.0.0.1", fallback="token") == visitor({}, "127.0.0.1", fallback="other")
    assert visitor({}, None, fallback="token") == Caller.visitor("token")
    monkeypatch.setenv("SPACE_ID", "someone/studio")
    assert client_address(headers, "10.16.3.80") == "1.2.3.4"  # the Spaces proxy names the client first
    assert client_address({}, "10.16.3.80") == "10.16.3.80"


@pytest.fixture
def public_page():
    service = StudioService(CountingEngine(4, frames=4, delay=0.005), None, None, visitor_concurrency=1,
                            visitor_queue=0)
    page = Page(service, Access(KEY, public_page=True))
    page.build()
    app = FastAPI()
    page.player.mount(app, access=page.access)
    with TestClient(app) as client:
        yield page, client
    service.close()


def live(client, page, live_id: str, headers: dict | None = None) -> list[dict]:
    body = {"request": json.dumps({"text": "Hello.", "style": "", "voice": "", "clip_text": "", "temperature": 0.8,
                                   "top_p": 0.8, "top_k": 30, "seed": 1, "max_frames": 0, "repeat_guard": 32,
                                   "live_id": live_id})}
    r = client.post(ROUTE, data=body, headers={TOKEN_HEADER: page.player.issue_token(), **(headers or {})})
    return [json.loads(line) for line in r.iter_lines() if line]


def test_the_live_route_gives_each_client_address_one_share(public_page, monkeypatch):
    page, client = public_page
    monkeypatch.setenv("SPACE_ID", "someone/studio")
    holder = page.service.start(request(text="held", caller=Caller.visitor("1.2.3.4"), max_frames=1500))
    threading.Thread(target=lambda: list(holder.stream()), daemon=True).start()
    wait_for(lambda: "held" in page.service.engine.started)
    # A new token from the same address is the same visitor: its one running take is all its share.
    refused = live(client, page, "same-address-1", {"X-Forwarded-For": "1.2.3.4"})
    assert refused[-1]["type"] == "error" and "takes waiting" in refused[-1]["message"]
    assert live(client, page, "other-address-1", {"X-Forwarded-For": "5.6.7.8"})[-1]["type"] == "done"
    monkeypatch.delenv("SPACE_ID")
    # Off a Space the header is the client's own word: the connection's address counts, a different one here.
    assert live(client, page, "forged-header-1", {"X-Forwarded-For": "1.2.3.4"})[-1]["type"] == "done"
    # The owner's key is never held to a visitor's share.
    assert live(client, page, "owner-key-1", {"Authorization": f"Bearer {KEY}"})[-1]["type"] == "done"
    holder.cancel.set()


def test_a_long_takes_segments_take_turns_with_another_caller(shared_engine):
    svc = StudioService(shared_engine(max_batch=1), None, None)
    assert svc.slots == 1
    text = " ".join(f"Sentence number {i} of a chapter that is long enough to be planned in several "
                    "segments of speech, one after another." for i in range(6))  # four segments
    long = request(text=text, seed=3, max_frames=12, caller=A)
    events: list[str] = []
    chunks = svc.stream(long)
    next(chunks)  # the first segment is running
    short = request(text="A short take.", seed=4, max_frames=6, caller=B)
    done = threading.Thread(target=lambda: (list(svc.stream(short)), events.append("short done")))
    done.start()
    for chunk in chunks:
        if chunk.final:
            events.append("long done")
    done.join(60)
    assert events == ["short done", "long done"]  # B waited one segment, not the whole chapter
    svc.close()


def test_library_voices_are_private_until_shared_and_imports_come_in_private(tmp_path):
    from studio.voices import Consent, VoiceLibrary

    library = VoiceLibrary(tmp_path / "voices")
    voice = library.add((SAMPLE_RATE, tone(2.0, pitch=180)), name="Mine", transcript="Mine.", consent=Consent("owner"))
    assert voice.shared is False and library.list(visitor=True) == []
    with pytest.raises(ValueError, match="No saved voice called 'Mine'"):
        library.get("Mine", visitor=True)
    with pytest.raises(ValueError, match="No saved voice"):
        library.get(voice.id, visitor=True)  # by id too, with the same sentence as for no voice at all
    # A library written before the flag existed: voice.json without "shared" reads as private.
    meta = json.loads((voice.path / "voice.json").read_text())
    assert "shared" not in meta
    shared = library.update(voice.id, shared=True)
    assert shared.shared and library.get(voice.id, visitor=True).id == voice.id
    assert [v.name for v in library.list(visitor=True)] == ["Mine"]
    with pytest.raises(ValueError, match="true or false"):
        library.update(voice.id, shared="yes")
    other = VoiceLibrary(tmp_path / "other")
    imported = other.import_zip(library.export_zip())  # the bundle says shared; the importer decides
    assert [v.shared for v in imported] == [False]


def test_the_owner_shares_a_voice_over_the_api_and_bad_changes_are_sentences(tmp_path):
    from studio import api
    from studio.voices import Consent, VoiceLibrary

    library = VoiceLibrary(tmp_path / "voices")
    voice = library.add((SAMPLE_RATE, tone(2.0, pitch=180)), name="Mine", transcript="Mine.", consent=Consent("owner"))
    service = StudioService(FakeEngine(), library, None)
    app = FastAPI()
    api.register(app, service, api_key=KEY)
    auth = {"Authorization": f"Bearer {KEY}"}
    with TestClient(app) as http:
        assert http.patch(f"/v1/audio/voices/{voice.id}", json={"shared": True}).status_code == 401
        r = http.patch(f"/v1/audio/voices/{voice.id}", headers=auth, json={"shared": True})
        assert r.status_code == 200 and r.json()["shared"] is True and library.get(voice.id).shared
        assert http.get(f"/v1/audio/voices/{voice.id}", headers=auth).json()["shared"] is True
        for body, words in (({"shared": "yes"}, "true or false"), ({"colour": "red"}, "Unknown field"),
                            ([], "JSON object"), ({}, "JSON object")):
            r = http.patch(f"/v1/audio/voices/{voice.id}", headers=auth, json=body)
            assert r.status_code == 400 and words in r.json()["error"]["message"], r.text
        r = http.patch(f"/v1/audio/voices/{voice.id}", headers=auth, json={"shared": False, "name": "Still mine"})
        assert r.status_code == 200 and (r.json()["shared"], r.json()["name"]) == (False, "Still mine")
        assert http.patch("/v1/audio/voices/v_0000000000000000", headers=auth,
                          json={"shared": True}).status_code == 404
    service.close()


def test_the_share_has_flags_with_environment_twins(monkeypatch):
    import app

    monkeypatch.delenv("SPACE_ID", raising=False)
    args = app.parse_args([])
    assert (args.visitor_concurrency, args.visitor_queue) == (2, 4)
    monkeypatch.setenv("HIGGS_VISITOR_CONCURRENCY", "3")
    monkeypatch.setenv("HIGGS_VISITOR_QUEUE", "0")
    args = app.parse_args([])
    assert (args.visitor_concurrency, args.visitor_queue) == (3, 0)
    assert app.parse_args(["--visitor-concurrency", "5"]).visitor_concurrency == 5
    with pytest.raises(ValueError, match="at least 1"):
        StudioService(FakeEngine(), None, None, visitor_concurrency=0)


def test_the_voices_tab_shares_and_unshares_a_voice(tmp_path):
    from studio.voices import Consent, VoiceLibrary

    library = VoiceLibrary(tmp_path / "voices")
    voice = library.add((SAMPLE_RATE, tone(2.0, pitch=180)), name="Mine", transcript="Mine.", consent=Consent("owner"))
    page = Page(StudioService(FakeEngine(), library, None))  # no key: the page is the owner's
    page.build()
    row = page.voices._voice_rows()[0]  # name and sharing first, the id last
    assert (row[0], row[1], row[-1]) == ("Mine", "private", voice.id)
    rows, _ = page.voices._edit_voice(voice.id, "Mine", "Mine.", "", "", True)
    assert rows[0][1] == "shared" and library.get(voice.id, visitor=True).shared
    public = Page(page.service, Access(KEY, public_page=True))
    assert [v for _, v in public.voice_choices(Caller.visitor("1.2.3.4"))][2:] == [voice.id]
    page.voices._edit_voice(voice.id, "Mine", "Mine.", "", "", False)
    assert public.voice_choices(Caller.visitor("1.2.3.4"))[2:] == [] and page.voices._voice_rows()[0][1] == "private"
    page.service.close()
