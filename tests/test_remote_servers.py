"""`app.py --remote` against the vLLM-Omni and SGLang-Omni fakes (tests/remote_fakes.py, written from their
code): through our `/v1/audio/speech`, voice routes, `/health` and page, each server gets the request it
accepts and the studio gives back exactly the audio the server sent. (A studio driving another studio, the
third kind, is tests/test_remote.py's parity test.)"""

from __future__ import annotations

import base64
import io
import threading

import httpx
import numpy as np
import pytest
import soundfile as sf

from engine.config import SAMPLES_PER_FRAME
from engine.remote import RemoteEngine
from tests.helpers import gen_args
from tests.remote_fakes import DELAY_TAIL, MODEL, SglangOmniFake, VllmOmniFake, pcm_of, serve, wav_clip
from tests.studio_server import free_port, running_studio

pytestmark = pytest.mark.slow

KINDS = {"vllm-omni": VllmOmniFake, "sglang-omni": SglangOmniFake}


@pytest.fixture(scope="module", params=list(KINDS))
def remote(request, tmp_path_factory):
    """(fake, front): a fake server and a studio started with `--remote` at it."""
    with serve(KINDS[request.param]()) as fake:
        with running_studio(tmp_path_factory.mktemp(request.param), "--remote", fake.url) as front:
            yield fake, front


def speak(front: str, **body) -> httpx.Response:
    return httpx.post(f"{front}/v1/audio/speech", json={"input": "Hello there.", **body}, timeout=120)


def data_url(wav: bytes) -> str:
    return "data:audio/wav;base64," + base64.b64encode(wav).decode()


def test_zero_shot_wav_is_the_servers_take_asked_for_in_its_dialect(remote):
    fake, front = remote
    r = speak(front, response_format="wav", stream=False, seed=7, temperature=0.3, max_new_tokens=10)
    assert r.status_code == 200, r.text
    audio, rate = sf.read(io.BytesIO(r.content), dtype="int16")
    sent = fake.takes[-1]
    assert rate == 24000 and len(audio) == 10 * SAMPLES_PER_FRAME and np.array_equal(audio, pcm_of(sent))
    body = sent.body
    assert body["model"] == MODEL and body["seed"] == 7 and body["max_new_tokens"] == 10 + DELAY_TAIL
    if isinstance(fake, VllmOmniFake):
        # No `voice` (a non-uploaded one is refused), raw PCM asked for by name, no sampling it would drop.
        assert "voice" not in body and body["stream_format"] == "audio" and fake.dropped[-1] == set()
        assert "vLLM-Omni server ignores temperature, top-k and top-p" in r.headers["x-warnings"]
    else:
        assert body["voice"] == "default" and body["temperature"] == 0.3
        assert "ignores temperature" not in r.headers.get("x-warnings", "")


def test_streamed_pcm_is_exactly_what_the_server_sent(remote):
    fake, front = remote
    r = speak(front, response_format="pcm", seed=11, max_new_tokens=20)
    assert r.status_code == 200, r.text
    sent = pcm_of(fake.takes[-1])
    assert len(sent) == 20 * SAMPLES_PER_FRAME and np.array_equal(np.frombuffer(r.content, "<i2"), sent)


def test_a_one_off_clip_travels_as_ref_audio_and_ref_text(remote):
    fake, front = remote
    r = speak(front, response_format="pcm", seed=11, max_new_tokens=8, ref_audio=data_url(wav_clip(2.0)),
              ref_text="A steady hum.")
    assert r.status_code == 200, r.text
    sent = fake.takes[-1]
    assert sent.body["ref_audio"].startswith("data:audio/wav;base64,") and sent.body["ref_text"] == "A steady hum."
    assert sent.body.get("voice") == ("default" if isinstance(fake, SglangOmniFake) else None)
    assert np.array_equal(np.frombuffer(r.content, "<i2"), pcm_of(sent))
    zero_shot = speak(front, response_format="pcm", seed=11, max_new_tokens=8)
    assert not np.array_equal(np.frombuffer(zero_shot.content, "<i2"), pcm_of(sent))  # the clip was used


def test_a_voice_is_created_listed_used_and_deleted_through_the_studio(remote):
    fake, front = remote
    saved = httpx.post(f"{front}/v1/audio/voices", timeout=120, files={"audio_sample": ("c.wav", wav_clip(2.5))},
                       data={"name": "Front Voice", "ref_text": "A low hum.", "consent": "true"})
    assert saved.status_code == 201, saved.text
    voice_id = saved.json()["id"]
    assert "Front Voice" in [v["name"] for v in httpx.get(f"{front}/v1/audio/voices").json()["voices"]]
    r = speak(front, response_format="pcm", voice="Front Voice", max_new_tokens=6)
    assert r.status_code == 200, r.text
    sent = fake.takes[-1]
    assert sent.body["ref_audio"].startswith("data:audio/wav;base64,") and sent.body["ref_text"] == "A low hum."
    assert np.array_equal(np.frombuffer(r.content, "<i2"), pcm_of(sent))
    assert httpx.delete(f"{front}/v1/audio/voices/{voice_id}").status_code == 200
    assert "Front Voice" not in [v["name"] for v in httpx.get(f"{front}/v1/audio/voices").json()["voices"]]
    gone = speak(front, response_format="pcm", voice="Front Voice")
    assert gone.status_code == 404 and "Front Voice" in gone.json()["error"]["message"]


def test_eight_api_requests_are_in_flight_at_the_server_at_once(remote):
    fake, front = remote
    fake.state.peak, fake.gate = 0, 8  # each take waits at the fake until eight are there
    try:
        results = [None] * 8

        def one(i):
            results[i] = speak(front, response_format="pcm", seed=100 + i, max_new_tokens=5)

        threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        fake.gate = None
    assert [r.status_code for r in results] == [200] * 8
    assert fake.peak == 8


def test_health_and_page_say_which_server_and_whether_it_honours_sampling(remote):
    fake, front = remote
    health = httpx.get(f"{front}/health").json()
    assert health["backend"] == "remote" and health["device"] == fake.url and health["remote_kind"] == fake.name
    config = httpx.get(f"{front}/config", timeout=60).json()
    by_id = {c["props"].get("elem_id"): c["props"] for c in config["components"] if c.get("props")}
    assert fake.name in by_id["remote-kind"]["value"]
    temperature = by_id["temperature"]
    if isinstance(fake, VllmOmniFake):
        assert "ignores temperature, top-k and top-p" in health["sampling_note"]
        assert temperature["interactive"] is False and temperature["info"] == health["sampling_note"]
    else:
        assert "sampling_note" not in health and temperature.get("interactive") is not False


def test_three_takes_from_the_page_all_arrive(remote):
    from studio.views.page import Page
    from studio.takes.service import StudioService

    fake, _ = remote
    service = StudioService(RemoteEngine(fake.url), None, None)
    try:
        page = Page(service)
        page.build()
        before = len(fake.takes)
        final = list(page.takes.generate(**gen_args("Three ways.", seed=41, takes_n=3, max_frames=4)))[-1]
        takes = [service.take(i) for i in final[page.takes.variant_ids]]
        assert [t.seed for t in takes] == [41, 42, 43]
        sent = {t.body["seed"]: pcm_of(t) for t in fake.takes[before:]}
        assert sorted(sent) == [41, 42, 43]
        for take in takes:
            assert np.array_equal(np.round(take.audio * 32767).astype("<i2"), sent[take.seed])
    finally:
        service.close()


def test_a_refusal_or_an_unreachable_server_is_one_sentence_not_a_500(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with serve(VllmOmniFake()) as fake:
        with running_studio(tmp_path / "a", "--remote", fake.url, "--remote-model", "not-served",
                            "--remote-concurrency", "3") as front:
            assert httpx.get(f"{front}/health").json()["max_batch"] == 3
            r = speak(front, response_format="pcm")
            assert r.status_code == 400, r.text
            message = r.json()["error"]["message"]
            assert message.startswith(f"The vLLM-Omni server at {fake.url} refused the take (404): The model "
                                      "`not-served` does not exist.")
    closed = f"http://127.0.0.1:{free_port()}"
    with running_studio(tmp_path / "b", "--remote", closed, env={"HIGGS_REMOTE_CONCURRENCY": "5"}) as front:
        assert httpx.get(f"{front}/health").json()["max_batch"] == 5
        r = speak(front, response_format="pcm")
        assert r.status_code == 502, r.text
        assert r.json()["error"]["message"].startswith(f"Could not reach the speech server at {closed}: ")


def test_a_refusal_reaches_the_page_as_the_servers_sentence():
    import gradio as gr

    from studio.views.page import Page
    from studio.takes.service import StudioService

    with serve(VllmOmniFake()) as fake:
        service = StudioService(RemoteEngine(fake.url, model="not-served"), None, None)
        try:
            page = Page(service)
            page.build()
            with pytest.raises(gr.Error) as err:
                list(page.takes.generate(**gen_args("Refused.")))
            assert f"The vLLM-Omni server at {fake.url} refused the take (404): The model `not-served` does not " \
                   "exist." in err.value.message
        finally:
            service.close()
