"""The projects' state on disk: one SQLite database (projects, chapters, segments, renders, jobs) and the rendered
segments' files beside it (docs/PROJECTS.md has the layout).

SQLite because a crash mid-write never leaves half a record, and "which segments are unrendered" is a query.
One connection behind one lock is the one writer (WAL lets readers of other processes, e.g. a backup, read
meanwhile). A render's audio (FLAC) and codes (NPZ) are written to a temporary file, fsynced and renamed into
place before its row is inserted, so a row always names complete files; `sweep()` at start removes the
temporary files a kill left behind.

A render is keyed by the hash of everything that makes its audio (studio/projects/recipes.py), so the same
key is never rendered twice, in any project; a segment row names the key it was last rendered under.
"""

from __future__ import annotations

import io
import json
import os
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import soundfile as sf

from engine.config import SAMPLE_RATE
from studio.files.durable import fsync_dir, write_file
from studio.projects.types import Chapter, JobRow, Project, Render, SegmentRow

DB_NAME = "projects.sqlite3"
TEMP_MARK = ".tmp-"  # in the name of every file being written; swept at start
JOB_STATES = ("queued", "running", "paused", "done", "cancelled", "failed")
UNFINISHED = ("queued", "running", "paused")
FLAC_SUBTYPE = "PCM_24"  # lossless for the engine's output at 24 kHz, and exactly what every later read sees
_FLAC_MAX = 1 - 2.0 ** -23  # the largest PCM_24 sample, as a float

_SCHEMA = """
CREATE TABLE IF NOT EXISTS projects (
    id TEXT PRIMARY KEY, owner TEXT NOT NULL, title TEXT NOT NULL, author TEXT NOT NULL DEFAULT '',
    language TEXT NOT NULL DEFAULT '', settings TEXT NOT NULL, extra TEXT NOT NULL DEFAULT '{}',
    cover_type TEXT, created REAL NOT NULL, updated REAL NOT NULL, dictionary TEXT NOT NULL DEFAULT '[]');
CREATE TABLE IF NOT EXISTS chapters (
    id INTEGER PRIMARY KEY AUTOINCREMENT, project TEXT NOT NULL REFERENCES projects(id) ON DELETE CASCADE,
    position INTEGER NOT NULL, title TEXT NOT NULL, text TEXT NOT NULL, skip INTEGER NOT NULL DEFAULT 0,
    finished INTEGER NOT NULL DEFAULT 0, "cast" TEXT NOT NULL DEFAULT '{}');
CREATE INDEX IF NOT EXISTS chapters_by_project ON chapters(project, position);
CREATE TABLE IF NOT EXISTS segments (
    chapter INTEGER NOT NULL REFERENCES chapters(id) ON DELETE CASCADE, position INTEGER NOT NULL,
    text TEXT NOT NULL, source TEXT NOT NULL, pause_after REAL NOT NULL, speaker TEXT, voice TEXT,
    seed INTEGER, key TEXT, PRIMARY KEY (chapter, position));
CREATE TABLE IF NOT EXISTS renders (
    key TEXT PRIMARY KEY, seed INTEGER NOT NULL, stop_reason TEXT, retried INTEGER NOT NULL,
    samples INTEGER NOT NULL, frames INTEGER NOT NULL, bytes INTEGER NOT NULL, anchor TEXT,
    wall_s REAL NOT NULL, recipe TEXT NOT NULL, created REAL NOT NULL);
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY, project TEXT NOT NULL REFERENCES projects(id) ON DELETE CASCADE,
    state TEXT NOT NULL, chapters TEXT, done INTEGER NOT NULL DEFAULT 0, total INTEGER NOT NULL DEFAULT 0,
    rendered INTEGER NOT NULL DEFAULT 0, audio_s REAL NOT NULL DEFAULT 0, wall_s REAL NOT NULL DEFAULT 0,
    error TEXT, created REAL NOT NULL, updated REAL NOT NULL);
CREATE INDEX IF NOT EXISTS jobs_by_state ON jobs(state, created);
"""


class ProjectNotFound(KeyError, ValueError):
    """No such project (or not the caller's); the message says so."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "no such project"


class Store:
    """The database and the render files under `root`. Every method is safe from any thread."""

    def __init__(self, root: str | Path):
        self.root = Path(root)
        self.renders_dir = self.root / "renders"
        self.covers_dir = self.root / "covers"
        for folder in (self.root, self.renders_dir, self.covers_dir):
            folder.mkdir(parents=True, exist_ok=True)
        self._lock = threading.RLock()
        self._db = sqlite3.connect(self.root / DB_NAME, check_same_thread=False, isolation_level=None)
        self._db.row_factory = sqlite3.Row
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")  # a committed row survives a power cut, not only a kill
        self._db.execute("PRAGMA foreign_keys=ON")
        self._db.executescript(_SCHEMA)
        columns = {r["name"] for r in self._db.execute("PRAGMA table_info(projects)")}
        if "dictionary" not in columns:  # a folder made before projects had a pronunciation dictionary
            self._db.execute("ALTER TABLE projects ADD COLUMN dictionary TEXT NOT NULL DEFAULT '[]'")
        if "cast" not in {r["name"] for r in self._db.execute("PRAGMA table_info(chapters)")}:  # before casting
            self._db.execute("ALTER TABLE chapters ADD COLUMN \"cast\" TEXT NOT NULL DEFAULT '{}'")

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # ---------------------------------------------------------------- plumbing
    def _tx(self):
        return _Transaction(self._db, self._lock)

    def _rows(self, sql: str, args: Iterable[Any] = ()) -> list[sqlite3.Row]:
        with self._lock:
            return self._db.execute(sql, tuple(args)).fetchall()

    def sweep(self) -> int:
        """Remove what a killed process left: temporary files, and covers whose project was never stored (a
        cover is written before its project's row). At start, before any request; returns how many."""
        known = {r["id"] for r in self._rows("SELECT id FROM projects")}
        left = [p for folder in (self.renders_dir, self.covers_dir) for p in folder.rglob(f"*{TEMP_MARK}*")]
        left += [p for p in self.covers_dir.glob("*.img") if p.stem not in known]
        for path in left:
            path.unlink(missing_ok=True)
        return len(left)

    # ---------------------------------------------------------------- projects
    def create_project(self, owner: str, *, title: str, author: str = "", language: str = "", settings: dict,
                       chapters: list[tuple[str, str, bool, list[SegmentRow]]], extra: dict | None = None,
                       cover: bytes | None = None, cover_type: str | None = None) -> Project:
        """A new project with its chapters `(title, text, skip, segments)`, in one transaction: either all of it
        is stored or nothing is."""
        project_id = uuid.uuid4().hex[:12]
        now = time.time()
        if cover is not None:
            write_atomic(self.cover_path(project_id), cover)
        try:
            with self._tx() as db:
                db.execute("INSERT INTO projects (id, owner, title, author, language, settings, extra, cover_type, "
                           "created, updated) VALUES (?,?,?,?,?,?,?,?,?,?)",
                           (project_id, owner, title, author, language, json.dumps(settings),
                            json.dumps(extra or {}), cover_type if cover is not None else None, now, now))
                for position, (name, text, skip, segments) in enumerate(chapters):
                    cur = db.execute("INSERT INTO chapters (project, position, title, text, skip) VALUES (?,?,?,?,?)",
                                     (project_id, position, name, text, int(skip)))
                    _insert_segments(db, cur.lastrowid, segments)
        except BaseException:
            self.cover_path(project_id).unlink(missing_ok=True)
            raise
        return self.project(project_id, owner)

    def project(self, project_id: str, owner: str | None = None) -> Project:
        rows = self._rows("SELECT * FROM projects WHERE id = ?", (str(project_id),))
        if not rows or (owner is not None and rows[0]["owner"] != owner):
            raise ProjectNotFound(f"No project {project_id!r}; GET /v1/projects lists them.")
        return _project(rows[0])

    def projects(self, owner: str | None = None) -> list[Project]:
        if owner is None:
            return [_project(r) for r in self._rows("SELECT * FROM projects ORDER BY created")]
        return [_project(r) for r in self._rows("SELECT * FROM projects WHERE owner = ? ORDER BY created", (owner,))]

    def update_project(self, project_id: str, **fields) -> None:
        allowed = {"title", "author", "language", "settings", "extra", "dictionary"}
        if set(fields) - allowed:
            raise ValueError(f"unknown project field(s) {sorted(set(fields) - allowed)}")
        values = {k: json.dumps(v) if k in ("settings", "extra", "dictionary") else v for k, v in fields.items()}
        with self._tx() as db:
            sets = ", ".join(f"{k} = ?" for k in values)
            db.execute(f"UPDATE projects SET {sets}, updated = ? WHERE id = ?",
                       (*values.values(), time.time(), project_id))

    def delete_project(self, project_id: str) -> None:
        """The project, its chapters and jobs, its cover, and every render no other segment names."""
        with self._tx() as db:
            db.execute("DELETE FROM projects WHERE id = ?", (project_id,))
            orphans = [r["key"] for r in db.execute(
                "SELECT key FROM renders WHERE key NOT IN (SELECT key FROM segments WHERE key IS NOT NULL)")]
            db.executemany("DELETE FROM renders WHERE key = ?", [(k,) for k in orphans])
        for key in orphans:
            for path in self.render_paths(key):
                path.unlink(missing_ok=True)
        self.cover_path(project_id).unlink(missing_ok=True)

    def cover_path(self, project_id: str) -> Path:
        return self.covers_dir / f"{project_id}.img"

    def cover(self, project_id: str) -> bytes | None:
        try:
            return self.cover_path(project_id).read_bytes()
        except FileNotFoundError:
            return None

    # ---------------------------------------------------------------- chapters and segments
    def chapters(self, project_id: str) -> list[Chapter]:
        return [_chapter(r) for r in self._rows("SELECT * FROM chapters WHERE project = ? ORDER BY position",
                                                (project_id,))]

    def segments(self, chapter_id: int) -> list[SegmentRow]:
        return [_segment(r) for r in self._rows("SELECT * FROM segments WHERE chapter = ? ORDER BY position",
                                                (chapter_id,))]

    def replace_chapters(self, project_id: str, chapters: list[tuple[int | None, str, str, bool, list[SegmentRow] | None,
                                                                     dict]]) -> None:
        """The project's chapters as `(id or None for a new one, title, text, skip, segments or None to keep them,
        cast)` in their new order, in one transaction; chapters not listed are removed."""
        with self._tx() as db:
            keep = {cid for cid, *_ in chapters if cid is not None}
            for row in db.execute("SELECT id FROM chapters WHERE project = ?", (project_id,)).fetchall():
                if row["id"] not in keep:
                    db.execute("DELETE FROM chapters WHERE id = ?", (row["id"],))
            # positions are rewritten through negative numbers so no two rows ever share one mid-way
            for position, (cid, title, text, skip, segments, cast) in enumerate(chapters):
                if cid is None:
                    cid = db.execute("INSERT INTO chapters (project, position, title, text, skip, \"cast\") "
                                     "VALUES (?,?,?,?,?,?)",
                                     (project_id, -1 - position, title, text, int(skip), json.dumps(cast))).lastrowid
                else:
                    db.execute("UPDATE chapters SET position = ?, title = ?, text = ?, skip = ?, \"cast\" = ? "
                               "WHERE id = ?", (-1 - position, title, text, int(skip), json.dumps(cast), cid))
                if segments is not None:
                    db.execute("DELETE FROM segments WHERE chapter = ?", (cid,))
                    _insert_segments(db, cid, segments)
            db.execute("UPDATE chapters SET position = -1 - position WHERE project = ?", (project_id,))
            db.execute("UPDATE projects SET updated = ? WHERE id = ?", (time.time(), project_id))

    def set_segment(self, chapter_id: int, position: int, **fields) -> None:
        allowed = {"seed", "key"}
        if set(fields) - allowed:
            raise ValueError(f"unknown segment field(s) {sorted(set(fields) - allowed)}")
        with self._tx() as db:
            sets = ", ".join(f"{k} = ?" for k in fields)
            db.execute(f"UPDATE segments SET {sets} WHERE chapter = ? AND position = ?",
                       (*fields.values(), chapter_id, position))
            if "seed" in fields:  # a change to the plan (a key only records a render)
                db.execute("UPDATE projects SET updated = ? WHERE id = (SELECT project FROM chapters WHERE id = ?)",
                           (time.time(), chapter_id))

    def mark_finished(self, chapter_ids: Iterable[int]) -> None:
        """The chapters are finished, in one transaction; one already marked is not written again (a job
        marks every complete chapter after each segment it renders)."""
        with self._tx() as db:
            db.executemany("UPDATE chapters SET finished = 1 WHERE id = ? AND finished = 0",
                           [(cid,) for cid in chapter_ids])

    # ---------------------------------------------------------------- renders
    def render_paths(self, key: str) -> tuple[Path, Path]:
        folder = self.renders_dir / key[:2]
        return folder / f"{key}.flac", folder / f"{key}.npz"

    def render(self, key: str | None) -> Render | None:
        if not key:
            return None
        rows = self._rows("SELECT * FROM renders WHERE key = ?", (key,))
        return _render(rows[0]) if rows else None

    def renders(self, keys: Iterable[str]) -> dict[str, Render]:
        keys = [k for k in set(keys) if k]
        out: dict[str, Render] = {}
        for start in range(0, len(keys), 500):  # under SQLite's bound-variable limit
            part = keys[start:start + 500]
            rows = self._rows(f"SELECT * FROM renders WHERE key IN ({','.join('?' * len(part))})", part)
            out.update((r["key"], _render(r)) for r in rows)
        return out

    def save_render(self, key: str, audio: np.ndarray, codes: np.ndarray, *, seed: int, stop_reason: str | None,
                    retried: bool, anchor: str | None, wall_s: float, recipe: dict) -> Render:
        """Write the render's files (each complete on disk before the next step), then its row."""
        flac_path, codes_path = self.render_paths(key)
        flac = encode_flac(audio)
        buf = io.BytesIO()
        np.savez(buf, codes=np.asarray(codes, dtype=np.int16))
        write_atomic(codes_path, buf.getvalue())
        write_atomic(flac_path, flac)
        samples = len(audio)
        with self._tx() as db:
            db.execute("INSERT OR REPLACE INTO renders VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                       (key, int(seed), stop_reason, int(retried), samples, int(np.asarray(codes).shape[0]),
                        len(flac) + buf.getbuffer().nbytes, anchor, float(wall_s), json.dumps(recipe), time.time()))
        return self.render(key)

    def read_audio(self, key: str) -> np.ndarray:
        """A render's samples, float32 mono 24 kHz, exactly as stored."""
        audio, rate = sf.read(self.render_paths(key)[0], dtype="float32")
        if rate != SAMPLE_RATE:
            raise ValueError(f"render {key} is at {rate} Hz, not {SAMPLE_RATE}")
        return audio

    def read_codes(self, key: str) -> np.ndarray:
        with np.load(self.render_paths(key)[1], allow_pickle=False) as data:
            return data["codes"].astype(np.int64)

    # ---------------------------------------------------------------- jobs
    def add_job(self, project_id: str, chapters: list[int] | None, total: int) -> JobRow:
        job_id = uuid.uuid4().hex[:12]
        now = time.time()
        with self._tx() as db:
            db.execute("INSERT INTO jobs (id, project, state, chapters, total, created, updated) VALUES (?,?,?,?,?,?,?)",
                       (job_id, project_id, "queued", None if chapters is None else json.dumps(chapters), total,
                        now, now))
        return self.job(job_id)

    def job(self, job_id: str) -> JobRow:
        rows = self._rows("SELECT * FROM jobs WHERE id = ?", (str(job_id),))
        if not rows:
            raise ProjectNotFound(f"No job {job_id!r}.")
        return _job(rows[0])

    def jobs(self, project_id: str | None = None, states: Iterable[str] | None = None) -> list[JobRow]:
        sql, args = "SELECT * FROM jobs WHERE 1", []
        if project_id is not None:
            sql, args = sql + " AND project = ?", [project_id]
        if states is not None:
            states = list(states)
            sql += f" AND state IN ({','.join('?' * len(states))})"
            args += states
        return [_job(r) for r in self._rows(sql + " ORDER BY created", args)]

    def update_job(self, job_id: str, *, only_if: Iterable[str] | None = None, **fields) -> bool:
        """Change a job's fields; with `only_if`, only while its state is one of those (True if it changed)."""
        allowed = {"state", "chapters", "done", "total", "rendered", "audio_s", "wall_s", "error"}
        if set(fields) - allowed:
            raise ValueError(f"unknown job field(s) {sorted(set(fields) - allowed)}")
        if fields.get("state") not in (None, *JOB_STATES):
            raise ValueError(f"unknown job state {fields['state']!r}")
        if "chapters" in fields:
            fields["chapters"] = None if fields["chapters"] is None else json.dumps(fields["chapters"])
        sql = f"UPDATE jobs SET {', '.join(f'{k} = ?' for k in fields)}, updated = ? WHERE id = ?"
        args = [*fields.values(), time.time(), job_id]
        if only_if is not None:
            only_if = list(only_if)
            sql += f" AND state IN ({','.join('?' * len(only_if))})"
            args += only_if
        with self._tx() as db:
            return db.execute(sql, args).rowcount > 0

    def disk_bytes(self, project_id: str) -> int:
        """Bytes of the renders this project's segments name, and of its cover."""
        rows = self._rows("SELECT COALESCE(SUM(r.bytes), 0) AS n FROM renders r WHERE r.key IN "
                          "(SELECT s.key FROM segments s JOIN chapters c ON s.chapter = c.id WHERE c.project = ?)",
                          (project_id,))
        cover = self.cover_path(project_id)
        return int(rows[0]["n"]) + (cover.stat().st_size if cover.exists() else 0)


class _Transaction:
    """`with store._tx() as db:` one BEGIN IMMEDIATE … COMMIT under the store's lock (ROLLBACK on error)."""

    def __init__(self, db: sqlite3.Connection, lock: threading.RLock):
        self.db, self.lock = db, lock

    def __enter__(self) -> sqlite3.Connection:
        self.lock.acquire()
        self.db.execute("BEGIN IMMEDIATE")
        return self.db

    def __exit__(self, kind, exc, tb) -> None:
        try:
            self.db.execute("COMMIT" if kind is None else "ROLLBACK")
        finally:
            self.lock.release()


def write_atomic(path: Path, data: bytes) -> None:
    """`data` at `path`, never half-written: a temporary file beside it, fsynced, renamed over it, the folder
    fsynced (so the rename itself is on disk before anything refers to the file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_name(f"{path.name}{TEMP_MARK}{os.getpid()}-{threading.get_ident()}")  # what sweep() finds
    write_file(temp, data)
    os.replace(temp, path)
    fsync_dir(path.parent)


def as_stored(audio: np.ndarray) -> np.ndarray:
    """`audio` as `Store.read_audio` will give it back once saved (FLAC's 24-bit samples)."""
    return sf.read(io.BytesIO(encode_flac(audio)), dtype="float32")[0]


def encode_flac(audio: np.ndarray) -> bytes:
    buf = io.BytesIO()
    samples = np.clip(np.asarray(audio, dtype=np.float32), -1.0, _FLAC_MAX)
    sf.write(buf, samples, SAMPLE_RATE, format="FLAC", subtype=FLAC_SUBTYPE)
    return buf.getvalue()


def _insert_segments(db: sqlite3.Connection, chapter_id: int, segments: list[SegmentRow]) -> None:
    db.executemany("INSERT INTO segments VALUES (?,?,?,?,?,?,?,?,?)",
                   [(chapter_id, i, s.text, s.source, s.pause_after, s.speaker, s.voice, s.seed, s.key)
                    for i, s in enumerate(segments)])


def _project(r: sqlite3.Row) -> Project:
    return Project(r["id"], r["owner"], r["title"], r["author"], r["language"], json.loads(r["settings"]),
                   json.loads(r["extra"]), r["cover_type"], r["created"], r["updated"], json.loads(r["dictionary"]))


def _chapter(r: sqlite3.Row) -> Chapter:
    return Chapter(r["id"], r["project"], r["position"], r["title"], r["text"], bool(r["skip"]), bool(r["finished"]),
                   json.loads(r["cast"]))


def _segment(r: sqlite3.Row) -> SegmentRow:
    return SegmentRow(r["position"], r["text"], r["source"], r["pause_after"], r["speaker"], r["voice"], r["seed"],
                      r["key"])


def _render(r: sqlite3.Row) -> Render:
    return Render(r["key"], r["seed"], r["stop_reason"], bool(r["retried"]), r["samples"], r["frames"], r["bytes"],
                  r["anchor"], r["wall_s"], json.loads(r["recipe"]))


def _job(r: sqlite3.Row) -> JobRow:
    return JobRow(r["id"], r["project"], r["state"], None if r["chapters"] is None else json.loads(r["chapters"]),
                  r["done"], r["total"], r["rendered"], r["audio_s"], r["wall_s"], r["error"], r["created"],
                  r["updated"])
