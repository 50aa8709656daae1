"""StudioService policy on a scripted fake engine: FIFO order and positions, cancel through the take's handle,
validation, style/voice resolution, history bound. (The real engine runs in the client and browser tests.)"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import numpy as np
import pytest

from engine.types import SamplingParams, SpeechEngine
from studio.takes.service import Queued, ServiceBusy, StudioService, Order
from tests.fakes import FakeEngine
from tests.helpers import request

@dataclass
class FakePreset:
    name: str
    prefix: str


class FakePresets:
    def get(self, name):
        return {"calm": FakePreset("calm", "<|emotion:contentment|><|prosody:speed_slow|>")}.get(name)


@dataclass
class FakeVoice:
    id: str
    name: str
    style: str | None = None
    preset: bool = False


class FakeVoices:
    def __init__(self):
        self.v = FakeVoice("voice_abc", "Ann", style="calm")

    def get(self, key, visitor=False):
        if key not in (self.v.id, self.v.name):
            raise ValueError(f"No saved voice called {key!r}")
        return self.v

    def list(self, visitor=False):
        return [self.v]

    def voice_ref(self, voice_id, encode):
        return ("cached", voice_id)


@pytest.fixture
def svc():
    s = StudioService(FakeEngine(), FakeVoices(), FakePresets(), history_size=3)
    yield s
    s.close()


def run(svc, **kw):
    handle = svc.start(request(**kw))
    chunks = list(handle.stream())
    return handle, chunks


def test_the_fake_engine_is_a_speech_engine_streaming_the_real_types():
    from engine.types import Chunk, Metrics
    from tests.fakes import ScriptedEngine

    for engine in (FakeEngine(), ScriptedEngine()):
        assert isinstance(engine, SpeechEngine)
        chunks = list(engine.generate_stream("Hi.", seed=3, temperature=0))
        assert all(type(c) is Chunk and type(c.metrics) is Metrics for c in chunks)
        assert [c.final for c in chunks] == [False, False, False, True] and chunks[-1].metrics.stop_reason == "eoc"
        assert engine.calls[-1]["seed"] == 3 and engine.calls[-1]["temperature"] == 0
    with pytest.raises(ValueError, match="temperature"):  # settings are checked as the real engine checks them
        list(FakeEngine().generate_stream("Hi.", temperature=-1))


def test_stream_yields_chunks_and_records_take(svc):
    handle, chunks = run(svc, text="Hello there.", seed=5)
    assert [c.final for c in chunks] == [False, False, False, True]
    take = svc.history[-1]
    assert handle.take is take and handle.finished.is_set()
    assert take.seed == 5 and take.stop_reason == "eoc" and len(take.audio) == 3 * 960
    assert take.recipe() == {"text": "Hello there.", "voice_id": None, "style": None, "seed": 5, "temperature": 0.8,
                             "top_k": 30, "top_p": 0.8, "max_frames": None, "repeat_guard": 32, "dictionary": []}


def test_random_seed_is_drawn_and_recorded(svc):
    handle, _ = run(svc, text="Hi.")
    assert handle.order.params.seed is None  # the request stays as asked; the handle holds the seed drawn
    assert 0 <= handle.seed < 2 ** 31 and svc.history[-1].seed == handle.seed == svc.engine.calls[-1]["seed"]


def test_stream_takes_a_request_and_passes_the_params_whole(svc):
    params = SamplingParams(temperature=0.3, top_k=5, top_p=0.9, seed=7, max_frames=2, repeat_guard=None)
    chunks = list(svc.stream(Order(text="Hi.", params=params)))
    assert chunks[-1].final and {k: v for k, v in svc.engine.calls[-1].items() if k not in ("text", "voice")} == \
        params.as_dict()
    assert svc.history[-1].settings == {"temperature": 0.3, "top_k": 5, "top_p": 0.9, "max_frames": 2,
                                        "repeat_guard": None}


@pytest.mark.parametrize("kw, match", [
    (dict(text="  "), "empty"),
    (dict(text="x" * 100_001), "limit"),
    (dict(text="a", temperature=3), "temperature"),
    (dict(text="a", top_p=0), "top_p"),
    (dict(text="a", top_k=-1), "top_k"),
    (dict(text="a", seed=-4), "seed"),
    (dict(text="a", max_frames=0), "max_frames"),
    (dict(text="a", max_frames=8193), "max_frames"),
    (dict(text="a", voice="Ann", clip=(np.ones(10), 24000)), "not both"),
    (dict(text="a", clip=(np.zeros(0), 24000)), "reference clip"),
    (dict(text="a", style="nonexistent"), "Unknown style"),
    (dict(text="a", voice="Bob"), "No saved voice"),
])
def test_validation_errors(svc, kw, match):
    with pytest.raises(ValueError, match=match):
        run(svc, **kw)
    assert svc.engine.started == []


def test_style_preset_and_raw_prefix_and_lint(svc):
    req, _ = run(svc, text="Good night.", style="calm")
    assert svc.engine.started[-1] == "<|emotion:contentment|><|prosody:speed_slow|>Good night."
    handle = svc.start(request(text="Hi <|emotion:bogus|> there.", style="<|style:whispering|>"))
    assert any("bogus" in w for w in handle.warnings)  # known before the take is queued
    list(handle.stream())
    assert svc.engine.started[-1].startswith("<|style:whispering|>Hi")


def test_saved_voice_by_name_uses_cached_ref_and_default_style(svc):
    run(svc, text="Hello.", voice="Ann")
    call = svc.engine.calls[-1]
    assert call["voice"] == ("cached", "voice_abc")
    assert call["text"].startswith("<|emotion:contentment|>")  # the voice's default style
    assert svc.history[-1].voice_id == "voice_abc" and svc.history[-1].voice_name == "Ann"


def test_one_off_reference_clip_is_encoded(svc):
    run(svc, text="Hello.", clip=(np.ones(2400, np.float32), 24000), clip_text="Hi")
    assert svc.engine.calls[-1]["voice"] == ("ref", 2400, 24000, "Hi")


def test_history_is_bounded(svc):
    for i in range(5):
        run(svc, text=f"take {i}.", seed=i)
    assert [t.text for t in svc.history] == ["take 2.", "take 3.", "take 4."]
    assert svc.take(svc.history[0].id) is svc.history[0]


def test_fifo_order_and_positions():
    svc = StudioService(FakeEngine(frames=5, delay=0.05), None, None)
    positions: dict[int, list[int]] = {i: [] for i in range(4)}
    threads = []
    for i in range(4):
        req = request(text=f"r{i}.", seed=1)
        threads.append(threading.Thread(target=lambda r=req, i=i: positions[i].extend(
            q.position for q in svc.stream(r, positions=True) if isinstance(q, Queued))))
        threads[-1].start()
        time.sleep(0.03)  # submission order r0, r1, r2, r3
    assert svc.queue_depth >= 3
    for t in threads:
        t.join(10)
    assert svc.engine.started == ["r0.", "r1.", "r2.", "r3."]
    assert positions[3][0] == 4 and positions[3] == sorted(positions[3], reverse=True)
    assert positions[3] == list(dict.fromkeys(positions[3]))  # one event per change
    assert svc.queue_depth == 0
    svc.close()


def test_cancel_running_stops_promptly_and_next_starts():
    svc = StudioService(FakeEngine(frames=1000, delay=0.01), None, None)
    long = svc.start(request(text="long.", seed=1))
    nxt = request(text="next.", seed=2, max_frames=2)
    got = []

    def consume():
        for c in long.stream():
            got.append(c)

    t = threading.Thread(target=consume)
    t.start()
    while len(got) < 3:
        time.sleep(0.01)
    t0 = time.monotonic()
    long.cancel.set()
    chunks = list(svc.stream(nxt))
    assert time.monotonic() - t0 < 1.0
    t.join(5)
    assert got[-1].final and got[-1].metrics.stop_reason == "cancelled" and len(got) < 100
    assert "long." in svc.engine.closed
    assert chunks[-1].final and chunks[-1].metrics.stop_reason == "eoc"
    assert [t.stop_reason for t in svc.history] == ["cancelled", "eoc"]
    svc.close()


def test_requests_run_together_up_to_the_engines_batch_slots():
    """Two slots: two requests start at once and a visitor waits only once both are busy; its position
    counts the requests ahead of it plus one for the busy slots."""
    svc = StudioService(FakeEngine(frames=40, delay=0.01, max_batch=2), None, None)
    assert svc.slots == 2 and svc.status()["max_batch"] == 2
    positions: dict[int, list[int]] = {i: [] for i in range(4)}
    threads = []
    for i in range(4):
        req = request(text=f"r{i}.", seed=1)
        threads.append(threading.Thread(target=lambda r=req, i=i: positions[i].extend(
            q.position for q in svc.stream(r, positions=True) if isinstance(q, Queued))))
        threads[-1].start()
        time.sleep(0.03)
    assert svc.engine.started[:2] == ["r0.", "r1."] and svc.engine.closed == []  # both running at once
    for t in threads:
        t.join(10)
    assert positions[0] in ([], [1]) and positions[1] in ([], [1])  # never behind anyone
    assert positions[2][0] == 2 and positions[3][0] == 3
    assert svc.engine.started == ["r0.", "r1.", "r2.", "r3."] and svc.queue_depth == 0
    svc.close()


def test_a_remote_engine_runs_as_many_requests_as_it_sends_the_server_at_once():
    import httpx

    from engine.remote import DEFAULT_CONCURRENCY, RemoteEngine

    down = httpx.MockTransport(lambda request: httpx.Response(503))
    for engine, slots in ((RemoteEngine("http://s", transport=down), DEFAULT_CONCURRENCY),
                          (RemoteEngine("http://s", transport=down, concurrency=3), 3)):
        svc = StudioService(engine, None, None)
        assert svc.slots == slots and svc.status()["max_batch"] == slots
        svc.close()


def test_stop_cancels_one_take_and_the_take_beside_it_goes_on():
    svc = StudioService(FakeEngine(frames=60, delay=0.01, max_batch=2), None, None)
    stopped, kept = svc.start(request(text="stopped.", seed=1)), svc.start(request(text="kept.", seed=2))
    got: dict[str, list] = {"stopped.": [], "kept.": []}
    threads = [threading.Thread(target=lambda h=h: got[h.order.text].extend(h.stream())) for h in (stopped, kept)]
    for t in threads:
        t.start()
    while len(got["stopped."]) < 3 or len(got["kept."]) < 3:
        time.sleep(0.01)
    stopped.cancel.set()
    for t in threads:
        t.join(10)
    assert got["stopped."][-1].metrics.stop_reason == "cancelled" and len(got["stopped."]) < 60
    assert got["kept."][-1].metrics.stop_reason == "eoc" and got["kept."][-1].metrics.frames == 60
    assert not kept.cancel.is_set()
    svc.close()


def test_cancel_while_waiting_leaves_queue():
    svc = StudioService(FakeEngine(frames=30, delay=0.01), None, None)
    first = threading.Thread(target=lambda: list(svc.stream(request(text="a.", seed=1))))
    first.start()
    time.sleep(0.05)
    handle = svc.start(request(text="b.", seed=1))
    threading.Timer(0.05, handle.cancel.set).start()
    assert list(handle.stream()) == []
    first.join(5)
    assert svc.engine.started == ["a."]
    svc.close()


def test_abandoned_consumer_frees_the_worker():
    svc = StudioService(FakeEngine(frames=1000, delay=0.01), None, None)
    handle = svc.start(request(text="a.", seed=1))
    gen = handle.stream()
    next(gen)
    gen.close()
    t0 = time.monotonic()
    list(svc.stream(request(text="b.", seed=1, max_frames=1)))
    assert time.monotonic() - t0 < 1.0
    # The abandoned take is still recorded on the worker side, marked as stopped.
    assert handle.finished.wait(2) and handle.take.stop_reason == "cancelled" and len(handle.take.audio) >= 960
    svc.close()


def test_queue_timeout():
    svc = StudioService(FakeEngine(frames=100, delay=0.01), None, None, queue_timeout=0.1)
    first = threading.Thread(target=lambda: list(svc.stream(request(text="a.", seed=1))))
    first.start()
    time.sleep(0.05)
    with pytest.raises(ServiceBusy):
        list(svc.stream(request(text="b.", seed=1)))
    first.join(5)
    svc.close()


def test_engine_error_reaches_caller_and_worker_survives(svc):
    def boom(*a, **k):
        raise RuntimeError("CUDA out of memory")
        yield

    good = svc.engine.generate_stream
    svc.engine.generate_stream = boom
    with pytest.raises(RuntimeError, match="out of memory"):
        run(svc, text="a.")
    svc.engine.generate_stream = good
    _, chunks = run(svc, text="b.")
    assert chunks[-1].final


def test_run_exclusive_and_status(svc):
    assert svc.run_exclusive(lambda x: x * 2, 21) == 42
    st = svc.status()
    assert st["device"] == "cpu" and st["demo"] is True and st["queue_depth"] == 0 and st["control_tags"] == 43


def test_variants_take_the_seeds_after_the_takes_own(svc):
    first = svc.start(request(text="Hi.", temperature=0.5))
    others = svc.variants(first, 3)
    assert [h.seed for h in others] == [first.seed + 1, first.seed + 2]
    assert all(h.params.temperature == 0.5 and h.order.text == "Hi." for h in others)
    assert svc.variants(svc.start(request(text="Hi.", seed=2 ** 63 - 1)), 2)[0].seed == 0  # wraps in 63 bits
    for bad in (0, 5, True):
        with pytest.raises(ValueError, match="Takes"):
            svc.variants(first, bad)


def test_the_history_keeps_a_bounded_length_of_audio(svc, monkeypatch):
    """Beyond the newest take, at most HISTORY_SECONDS of audio stay (a long take recorded whole is large)."""
    monkeypatch.setattr("studio.takes.service.HISTORY_SECONDS", 0.15)  # each fake take is 0.12 s
    for seed in (1, 2, 3):
        run(svc, text="Hi.", seed=seed)
    assert [t.seed for t in svc.history] == [2, 3]
