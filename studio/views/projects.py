"""The "Projects" tab: a book on the server, its chapters and segments, its render job and its exports.

Everything shown comes from the project store on the server (docs/PROJECTS.md), read again by a timer while
the tab is open, so a closed tab, a reload or another browser shows the same state and the same progress; the
page only remembers (in the browser) which project was open. Rendering is the store's job, never this
page's: Render, Pause, Resume and Cancel only ask the job runner. Thin over studio/projects/.
"""

from __future__ import annotations

import functools
import itertools
from pathlib import Path

import gradio as gr

from engine.config import SAMPLE_RATE
from studio.access import Access
from studio.projects.export import EXPORT_FORMATS, export
from studio.views.toasts import warns

CHAPTER_HEADERS = ["#", "chapter", "state", "segments", "seconds"]
SEGMENT_HEADERS = ["#", "text", "seed", "seconds", "state"]
POLL_SECONDS = 1.0
OWNER_ONLY_PROJECTS = ("Projects are the studio's owner's: log in with the studio's key, or use /v1/projects with "
                       "`Authorization: Bearer <key>`.")
UPLOAD_TYPES = [".txt", ".md", ".markdown", ".epub"]


def chapter_state(chapter: dict) -> str:
    """A chapter's state as the table says it: not started, rendering x of n, done, stale."""
    if chapter.get("skip"):
        return "skipped"
    if chapter["state"] == "rendering":
        return f"rendering {chapter['rendered']} of {chapter['segments']}"
    return chapter["state"]


def chapter_rows(project: dict | None) -> list[list]:
    if not project:
        return []
    return [[c["index"] + 1, c["title"], chapter_state(c), c["segments"], round(c.get("seconds") or 0, 1)]
            for c in project["chapters"]]


def segment_rows(chapter: dict | None) -> list[list]:
    if not chapter:
        return []
    return [[s["index"] + 1, s["text"], "" if s.get("seed") is None else s["seed"],
             round(s.get("seconds") or 0, 1), s["state"]] for s in chapter["segments"]]


def job_line(job: dict | None) -> str:
    """The render job in one line: state, segments done of total, time left, RTF, the error if any."""
    if not job:
        return "not rendered yet"
    parts = [job["state"], f"{job['done']} of {job['total']} segments"]
    if job["state"] in ("queued", "running") and job.get("eta_s") is not None:
        parts.append(f"about {_duration(job['eta_s'])} left")
    if job.get("rtf"):
        parts.append(f"RTF {job['rtf']:.2f}")
    if job.get("error"):
        parts.append(f"error: {job['error']}")
    return " · ".join(parts)


def summary_md(project: dict | None) -> str:
    if not project:
        return "No project open: create one below, or pick one."
    by = f" by {project['author']}" if project.get("author") else ""
    disk = project.get("disk_bytes") or 0
    return (f"**{project['title']}**{by} · {len(project['chapters'])} chapters · {disk / 1e6:.1f} MB on disk\n\n"
            f"Render: {job_line(project.get('job'))}")


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 60} min {seconds % 60} s" if seconds >= 60 else f"{seconds} s"


def project_choices(summaries: list[dict]) -> list[tuple[str, str]]:
    return [(f"{p['title']} ({p['id']})", p["id"]) for p in summaries]


class ProjectsView:
    """Builds the tab and handles its events over the project store and its render jobs."""

    _files = itertools.count(1)

    def __init__(self, projects, out_dir: str | Path, access: Access | None = None):
        self.projects = projects
        self.out_dir = Path(out_dir)
        self.access = access or Access()


__all__ = ["ProjectsView", "chapter_rows", "chapter_state", "job_line", "segment_rows", "summary_md"]
