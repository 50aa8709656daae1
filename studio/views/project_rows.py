"""What the Projects tab (studio/views/projects.py) says: its tables' rows, the project's line, the render job's
progress in words, which of Render / Pause / Resume / Cancel apply, and the picker's names. Plain functions of
the API's JSON (docs/PROJECTS.md), so each is tested without a page."""

from __future__ import annotations

from studio.takes.longform import CUT_SHORT_WORDS  # a cut-short reason in a listener's words

CHAPTER_HEADERS = ["#", "chapter", "voice", "state", "segments", "seconds"]
CHAPTER_WIDTHS = ["6%", "34%", "18%", "22%", "10%", "10%"]
SEGMENT_HEADERS = ["#", "text", "seed", "seconds", "state", "WER"]
SEGMENT_WIDTHS = ["6%", "44%", "14%", "9%", "17%", "10%"]
SEGMENT_STATES = {"waiting": "not rendered", "stale": "out of date", "done": "done"}
# The job's state (studio/projects/store.py JOB_STATES) → how its progress line starts.
JOB_WORDS = {"queued": "waiting to render", "running": "rendering", "paused": "paused at", "done": "done",
             "cancelled": "cancelled at", "failed": "failed at"}
UNFINISHED = ("queued", "running", "paused")
NARRATOR = "narrator"  # a chapter spoken in the project's narrator voice


def chapter_state(chapter: dict, job_state: str | None = None) -> str:
    """A chapter's state as the table says it: not started, rendering x of n (paused at x of n while its job is
    paused), done, out of date, skipped."""
    if chapter.get("skip"):
        return "skipped"
    if chapter["state"] == "rendering":
        verb = "paused at" if job_state == "paused" else "rendering"
        return f"{verb} {chapter['rendered']} of {chapter['segments']}"
    return "out of date" if chapter["state"] == "stale" else chapter["state"]


def chapter_rows(project: dict | None, voice_names: dict | None = None) -> list[list]:
    """#, title, voice (a cast chapter's saved voice, else the narrator), state, segments, seconds."""
    if not project:
        return []
    job_state = (project.get("job") or {}).get("state")
    names = voice_names or {}
    return [[c["index"] + 1, c["title"], names.get(c.get("voice"), c.get("voice")) or NARRATOR,
             chapter_state(c, job_state), c["segments"], round(c.get("seconds") or 0, 1)]
            for c in project["chapters"]]


def segment_state(state: str) -> str:
    if state.startswith("cut short"):
        reason = state.partition("(")[2].rstrip(")")
        return CUT_SHORT_WORDS.get(reason, "cut short")
    return SEGMENT_STATES.get(state, state)


def segment_rows(chapter: dict | None) -> list[list]:
    if not chapter:
        return []
    # Seeds as text: they are 63-bit, more than a JavaScript number holds exactly. WER: what listen and retry
    # heard (studio/audio/listen.py), with the tries it took; "" when the segment was not listened to.
    return [[s["index"] + 1, s["text"], "" if s.get("seed") is None else str(s["seed"]),
             round(s.get("seconds") or 0, 1), segment_state(s["state"]), _wer(s)] for s in chapter["segments"]]


def _wer(segment: dict) -> str:
    wer, attempts = segment.get("wer"), segment.get("attempts") or []
    if wer is None:
        return ""
    return f"{wer:.2f}" + (f" ({len(attempts)} tries)" if len(attempts) > 1 else "")


def job_line(job: dict | None) -> str:
    """The render job in one line: what it is doing and how far it got ("paused at 3 of 9 segments"), time
    left while it renders, RTF, the error if any."""
    if not job:
        return "not rendered yet"
    state = job["state"]
    progress = f"{job['done']} of {job['total']} segments"
    verb = JOB_WORDS.get(state, state)
    parts = [f"{verb} {progress}" if verb.endswith(" at") or state == "running" else f"{verb} · {progress}"]
    if state in ("queued", "running") and job.get("eta_s") is not None:
        parts.append(f"about {_duration(job['eta_s'])} left")
    if job.get("rtf"):
        parts.append(f"RTF {job['rtf']:.2f}")
    if job.get("error"):
        parts.append(f"error: {job['error']}")
    return " · ".join(parts)


def controls(job: dict | None, has_project: bool = True) -> tuple[bool, bool, bool, bool]:
    """Which of Render, Pause, Resume, Cancel apply to the project's latest job."""
    state = (job or {}).get("state")
    if not has_project:
        return False, False, False, False
    if state not in UNFINISHED:
        return True, False, False, False
    return False, state in ("queued", "running"), state == "paused", True


def outputs(project: dict | None, chapter: int | None) -> tuple[bool, bool, bool, bool]:
    """Which of Play chapter, ACX check, Export and Captions apply: the first two once the chosen chapter is
    rendered (every segment, as its text and settings are now), the other two once any chapter is (a chapter
    still missing from a whole-book export is named when it is asked for)."""
    done = [c["state"] == "done" for c in (project or {}).get("chapters", [])]
    picked = chapter is not None and 1 <= chapter <= len(done) and done[int(chapter) - 1]
    return picked, picked, any(done), any(done)


def summary_md(project: dict | None) -> str:
    if not project:
        return "No project open: create one below, or pick one."
    by = f" by {project['author']}" if project.get("author") else ""
    disk = project.get("disk_bytes") or 0
    return (f"**{project['title']}**{by} · {len(project['chapters'])} chapters · {disk / 1e6:.1f} MB on disk\n\n"
            f"Render: {job_line(project.get('job'))}")


def _duration(seconds: float) -> str:
    seconds = round(seconds)
    return f"{seconds // 60} min {seconds % 60} s" if seconds >= 60 else f"{seconds} s"


def project_choices(summaries: list[dict]) -> list[tuple[str, str]]:
    """The picker's names: each project's title, and "(2)", "(3)" … after a title an older project has."""
    seen: dict[str, int] = {}
    out = []
    for p in summaries:
        seen[p["title"]] = seen.get(p["title"], 0) + 1
        count = seen[p["title"]]
        out.append((p["title"] if count == 1 else f"{p['title']} ({count})", p["id"]))
    return out


__all__ = ["CHAPTER_HEADERS", "SEGMENT_HEADERS", "chapter_rows", "chapter_state", "controls", "job_line", "outputs",
           "project_choices", "segment_rows", "segment_state", "summary_md"]
