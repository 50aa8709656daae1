"""The kill test: a 3-chapter project renders on the demo engine while its server is `kill -9`ed at random
moments (at least 8) and started again each time; the job finishes, no segment file is corrupt or half
there, and every chapter's PCM equals an uninterrupted render's, sample for sample.

The server is tests/projects_server.py: the studio's service, projects store, render worker and HTTP API in
a process forked from one that loaded the engine once, so a restart takes a fraction of a second instead of
`app.py`'s ~10 s of imports and loading (the bench, bench/projects.py, restarts `app.py` itself)."""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import httpx
import numpy as np
import soundfile as sf

from engine.types import EngineInfo
from studio.projects.export import export
from studio.projects.library import Projects
from studio.projects.store import TEMP_MARK, Store
from studio.text.pronounce import Dictionary

REPO = Path(__file__).resolve().parents[1]
KILLS = 8
# Three chapters of one-sentence paragraphs: every paragraph is a segment of its own (the planner never joins
# paragraphs), so the job has many short segments to be killed between and inside.
SEGMENTS = 8  # per chapter: on a quiet machine a demo segment renders in ~0.15 s, and 8 kills need room
BOOK = "\n\n".join(
    f"# Chapter {c}\n\n" + "\n\n".join(f"Line {c}.{n} of the sea." for n in range(SEGMENTS)) for c in (1, 2, 3))
SETTINGS = {"seed": 2024, "max_frames": 8}


class Zygote:
    """tests/projects_server.py: `start(folder)` forks a server on `folder` and returns its pid and URL."""

    def __init__(self, tmp: Path):
        self.log = open(tmp / "zygote.log", "w")
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.projects_server"], cwd=REPO, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.log, text=True, bufsize=1)
        self.info = json.loads(self._line())
        self.children: set[int] = set()

    def _line(self) -> str:
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the server exited: {Path(self.log.name).read_text()[-3000:]}")
        return line

    def start(self, folder: Path) -> tuple[int, str]:
        self.proc.stdin.write(f"start {folder}\n")
        self.proc.stdin.flush()
        pid, port = self._line().split()
        self.children.add(int(pid))
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url + "/v1/projects", timeout=2).status_code == 200:
                    return int(pid), url
            assert time.monotonic() < deadline, (folder / "server.log").read_text()[-3000:]
            time.sleep(0.05)

    def kill(self, pid: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        self.children.discard(pid)

    def close(self) -> None:
        for pid in list(self.children):
            self.kill(pid)
        self.proc.kill()  # it holds nothing that needs closing; its children are gone
        self.proc.wait(10)
        self.log.close()


def reader(info: dict) -> SimpleNamespace:
    """What `Projects` reads of a studio's service to read a book back: the engine's identity, no voice library,
    and the pronunciation rules as `StudioService.rules` gives them without an owner's dictionary."""
    return SimpleNamespace(engine=SimpleNamespace(info=EngineInfo(**info)), voices=None,
                           rules=lambda project=None: project if project is not None else Dictionary())


def chapters_pcm(folder: Path, info: dict, project_id: str) -> list[np.ndarray]:
    """Every chapter's samples as the export reads them, from the files in `folder` alone."""
    service = reader(info)
    store = Store(folder)
    try:
        projects = Projects(store, service)
        return [projects.chapter_pcm(project_id, c.position) for c in store.chapters(project_id)]
    finally:
        store.close()


def m4b_pcm(folder: Path, info: dict, project_id: str, tmp: Path) -> np.ndarray:
    """The book exported as M4B (studio/projects/export.py, as the export route makes it), decoded back to
    PCM16 by ffmpeg: what a listener of the audiobook hears."""
    service = reader(info)
    store = Store(folder)
    try:
        chapters, meta = Projects(store, service).book(project_id)
        path = tmp / f"{folder.name}.m4b"
        with path.open("wb") as out:
            for piece in export(chapters, meta, "m4b").body:
                out.write(piece)
    finally:
        store.close()
    pcm = subprocess.run(["ffmpeg", "-v", "error", "-i", str(path), "-f", "s16le", "-ac", "1", "-"],
                         check=True, capture_output=True).stdout
    return np.frombuffer(pcm, np.int16)


def check_files(folder: Path) -> int:
    """Every render row names complete files (the FLAC decodes to its samples, the codes load); no temporary
    file is left. Returns the renders."""
    store = Store(folder)
    try:
        keys = [r["key"] for r in store._rows("SELECT key FROM renders")]
        for render in store.renders(keys).values():
            flac, codes = store.render_paths(render.key)
            audio, rate = sf.read(flac, dtype="float32")
            assert rate == 24000 and len(audio) == render.samples
            assert np.load(codes)["codes"].shape == (render.frames, 8)
        assert not [p for p in store.renders_dir.rglob("*") if TEMP_MARK in p.name]
        return len(keys)
    finally:
        store.close()


def render(url: str) -> tuple[str, str]:
    r = httpx.post(url + "/v1/projects", json={"title": "Sea", "text": BOOK, "format": "markdown", "settings": SETTINGS})
    assert r.status_code == 201, r.text
    project = r.json()["id"]
    job = httpx.post(f"{url}/v1/projects/{project}/render", json={}).json()["id"]
    return project, job


def job_state(url: str, job: str) -> dict:
    return httpx.get(f"{url}/v1/jobs/{job}", timeout=10).json()


def wait_done(url: str, job: str, timeout: float = 120) -> dict:
    deadline = time.monotonic() + timeout
    while (state := job_state(url, job))["state"] != "done":
        assert state["state"] in ("queued", "running") and time.monotonic() < deadline, state
        time.sleep(0.05)
    return state


def test_kill_9_at_random_moments_and_the_book_comes_out_the_same(tmp_path):
    rng = random.Random(int(os.environ.get("HIGGS_KILL_SEED", "0")) or None)
    zygote = Zygote(tmp_path)
    killed, clean = tmp_path / "killed", tmp_path / "clean"
    try:
        # the uninterrupted render runs beside the one that is killed (one core each)
        _, clean_url = zygote.start(clean)
        clean_project, clean_job = render(clean_url)
        pid, url = zygote.start(killed)
        project, job = render(url)
        kills, progress = 0, []
        while kills < KILLS:
            state = job_state(url, job)
            assert state["state"] in ("queued", "running"), f"the job ended after {kills} kills: {state}"
            if state["state"] == "running":
                time.sleep(rng.uniform(0.0, 0.2))  # anywhere in a segment: generating, writing, committing
                zygote.kill(pid)
                kills += 1
                progress.append(state["done"])
                pid, url = zygote.start(killed)
            else:
                time.sleep(0.02)
        final = wait_done(url, job)
        assert final["done"] == final["total"] == 3 * SEGMENTS
        wait_done(clean_url, clean_job)
    finally:
        zygote.close()
    assert check_files(killed) == check_files(clean) == 3 * SEGMENTS
    after_kills = chapters_pcm(killed, zygote.info, project)
    uninterrupted = chapters_pcm(clean, zygote.info, clean_project)
    assert len(after_kills) == 3 and progress[-1] < 3 * SEGMENTS
    for mine, theirs in zip(after_kills, uninterrupted):
        assert len(mine) > 0 and np.array_equal(mine, theirs)
    # The acceptance's own words: the exported M4B's audio equals the uninterrupted render's, sample for sample.
    book_after_kills = m4b_pcm(killed, zygote.info, project, tmp_path)
    book_uninterrupted = m4b_pcm(clean, zygote.info, clean_project, tmp_path)
    assert len(book_after_kills) >= sum(map(len, after_kills)) and np.array_equal(book_after_kills, book_uninterrupted)
