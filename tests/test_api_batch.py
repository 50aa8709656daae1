"""Concurrent `/v1/audio/speech` requests decode as one batch (issue 13), and each gives the codes it gives
alone: the demo checkpoint behind the real service and API, in process."""

from __future__ import annotations

import threading
import time

import pytest

from studio.takes.service import StudioService

N = 8


@pytest.fixture(scope="module")
def api(shared_engine):
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from studio import api as speech_api

    service = StudioService(shared_engine())
    app = FastAPI()
    speech_api.register(app, service)
    with TestClient(app) as client:
        yield client, service
    service.close()


def speech(client, i: int):
    body = {"input": f"Take number {i} of the batch.", "response_format": "flac", "seed": 100 + i,
            "max_frames": 24, "repeat_guard": None, "temperature": 0.0 if i == 0 else 0.8}  # one greedy take
    r = client.post("/v1/audio/speech", json=body)
    assert r.status_code == 200, r.text
    return r.headers


def test_eight_concurrent_requests_run_as_one_batch_with_the_codes_they_give_alone(api):
    client, service = api
    alone = [speech(client, i) for i in range(N)]
    assert all(h["x-batch-size"] == "1" for h in alone)
    health = client.get("/health").json()
    assert health["max_batch"] == service.engine.info.max_batch >= N and health["batch_size"] == 1

    together: dict[int, dict] = {}
    scheduler = service.engine.scheduler
    # Hold admission until all eight wait, so they start as one batch whatever the threads' timing.
    with scheduler.held():
        threads = [threading.Thread(target=lambda i=i: together.update({i: speech(client, i)})) for i in range(N)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 60
        while len(scheduler.waiting) < N and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(scheduler.waiting) == N
    for t in threads:
        t.join(120)
    assert sorted(together) == list(range(N))
    assert [together[i]["x-batch-size"] for i in range(N)] == [str(N)] * N
    assert [together[i]["x-codes-sha256"] for i in range(N)] == [alone[i]["x-codes-sha256"] for i in range(N)]
    assert len({h["x-codes-sha256"] for h in alone}) == N  # eight different takes, not one repeated
    assert client.get("/health").json()["batch_size"] == N
