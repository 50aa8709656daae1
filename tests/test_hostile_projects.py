"""Hostile project use: twelve render requests at once make one job (and Cancel stops it: no twin renders on),
and a cover a kill left without its project is swept at start."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

from studio.projects.store import Store, write_atomic
from studio.projects.types import SegmentRow

# Forty chapters: planning the job takes long enough for twelve requests to overlap in it.
BOOK = "\n\n".join(f"## Chapter {n}\n\n" + "The boat left at dawn. The sea was calm. Gulls followed it out. " * 20
                     for n in range(40))
CONCURRENT = 12


def _burst(url: str, project: str) -> list[httpx.Response]:
    """`CONCURRENT` render requests for `project` at once, each on a connection opened beforehand."""
    start = threading.Barrier(CONCURRENT)

    def render(_):
        with httpx.Client(base_url=url, timeout=60) as client:
            client.get("/health")  # connected: the barrier releases requests, not handshakes
            start.wait()
            return client.post(f"/v1/projects/{project}/render", json={})

    with ThreadPoolExecutor(CONCURRENT) as pool:
        return list(pool.map(render, range(CONCURRENT)))


def test_twelve_concurrent_renders_make_one_job_and_cancel_stops_it(demo_studio):
    with httpx.Client(base_url=demo_studio.url, timeout=60) as client:
        created = client.post("/v1/projects", json={"title": "Twelve at once", "text": BOOK, "format": "markdown",
                                                    "settings": {"max_frames": 8}})
        assert created.status_code == 201, created.text
        project = created.json()["id"]
        try:
            for _ in range(3):  # three bursts: the race, when there is one, shows in nearly every burst
                answers = _burst(demo_studio.url, project)
                assert [r.status_code for r in answers] == [202] * CONCURRENT, [r.text for r in answers]
                jobs = {r.json()["id"] for r in answers}
                try:
                    assert len(jobs) == 1, f"{len(jobs)} jobs for one project"  # before: 8-12 in most bursts
                    assert client.get(f"/v1/projects/{project}").json()["job"] == next(iter(jobs))
                finally:
                    for job in jobs:
                        client.post(f"/v1/jobs/{job}/cancel")
                deadline = time.monotonic() + 10
                while (states := {client.get(f"/v1/jobs/{job}").json()["state"] for job in jobs}) - {"cancelled"}:
                    assert time.monotonic() < deadline, states  # nothing renders on after Cancel
                    time.sleep(0.1)
                assert client.get(f"/v1/projects/{project}").json()["job"] is None
        finally:
            client.delete(f"/v1/projects/{project}")


def test_the_sweep_removes_a_cover_whose_project_was_never_stored(tmp_path):
    store = Store(tmp_path / "projects")
    try:
        kept = store.create_project("owner", title="Kept", settings={}, cover=b"\xff\xd8kept",
                                    cover_type="image/jpeg",
                                    chapters=[("One", "Hi.", False, [SegmentRow(0, "Hi.", "Hi.", 0.0)])])
        write_atomic(store.cover_path("0123456789ab"), b"\xff\xd8orphan")  # a kill before the project's row
        half = store.covers_dir / "fedcba987654.img.tmp-1-1"
        half.write_bytes(b"\xff\xd8half")
        assert store.sweep() == 2
        assert sorted(p.name for p in store.covers_dir.iterdir()) == [f"{kept.id}.img"]
        assert store.cover(kept.id) == b"\xff\xd8kept"
    finally:
        store.close()
