"""The Projects tab's edits of a project (studio/views/projects.py takes them from `ProjectEdits`): its narrator
voice, style, seed, script voices and loudness; a chapter's own voice and style (casting,
studio/projects/casting.py); its name; deleting it after a confirmation. Script lines (`Name: …`) take the
voices of a `Speaker = voice name` map, read as the Long form tab reads it (studio/views/longform.py)."""

from __future__ import annotations

import gradio as gr

from studio.takes.admission import OWNER
from studio.views.longform import parse_voices_map

ZERO_SHOT = ("no saved voice", "")
PROJECTS = ("the project's", "")  # a chapter's voice or style left to the project's


class ProjectEdits:
    """Mixed into `ProjectsView`, which holds `projects`, `runner`, `choices()`, `_id()`, `_index()` and
    `_views()`."""

    # ---------------------------------------------------------------- what the boxes offer
    def voices(self) -> list:
        return self.projects.service.list_voices(OWNER)

    def voice_names(self) -> dict[str, str]:
        return {v.id: v.name for v in self.voices()}

    def voice_choices(self, none=ZERO_SHOT) -> list[tuple[str, str]]:
        return [none] + [(v.name, v.id) for v in self.voices()]

    def style_choices(self, none=("none", "")) -> list[tuple[str, str]]:
        return [none] + [(name, name) for name, _ in self.projects.service.list_styles()]

    def form(self, project_id: str | None) -> tuple:
        """The project's own boxes as it is stored: narrator, style, seed, script voices, loudness, name, and
        the chapter's voice and style boxes (their choices read again: a voice saved since is offered)."""
        if not project_id:
            return ("",) * 6 + (gr.update(choices=self.voice_choices(PROJECTS), value=""),
                                gr.update(choices=self.style_choices(PROJECTS), value=""))
        project = self.projects.project(project_id, OWNER.key)
        settings, names = project.settings, self.voice_names()
        script = "\n".join(f"{speaker} = {names.get(voice, voice or '')}".rstrip()
                           for speaker, voice in (settings.get("voices") or {}).items())
        return (gr.update(choices=self.voice_choices(), value=settings.get("voice") or ""),
                gr.update(choices=self.style_choices(), value=settings.get("style") or ""),
                str(settings["seed"]), script, settings.get("loudness") or "off", project.title,
                gr.update(choices=self.voice_choices(PROJECTS), value=""),
                gr.update(choices=self.style_choices(PROJECTS), value=""))

    # ---------------------------------------------------------------- handlers
    def save_settings(self, project_id: str, narrator, style, seed, script, chapter):
        """The project's narrator voice, style, seed and script voices; every chapter is planned again, and
        what they change turns stale (a render makes only that)."""
        project_id = self._id(project_id)
        seed = (seed or "").strip()
        if seed and not seed.isdigit():
            raise ValueError(f"A seed is a whole number, not {seed!r}; leave the box empty to keep the one it has.")
        settings = {"voice": narrator or None, "style": style or None, "voices": parse_voices_map(script or "")}
        if seed:
            settings["seed"] = int(seed)
        self._refuse_while_rendering(project_id, "changing its voice or style")
        self.projects.patch(project_id, {"settings": settings}, OWNER.key)
        gr.Info("Saved: the chapters it changes are out of date until they are rendered again.")
        return self._views(project_id, chapter)

    def save_loudness(self, project_id: str, loudness) -> None:
        """The loudness the project's exports are levelled to (nothing is rendered again)."""
        if project_id:
            self.projects.patch(project_id, {"settings": {"loudness": loudness or "off"}}, OWNER.key)

    def cast_chapter(self, project_id: str, chapter, voice, style):
        """The chosen chapter spoken in `voice` with `style` (empty: the project's); its segments turn stale."""
        project_id = self._id(project_id)
        index = self._index(project_id, chapter)
        self._refuse_while_rendering(project_id, "casting a chapter")
        self.projects.patch(project_id, {"chapters": [{"index": index, "voice": voice or None,
                                                       "style": style or None}]}, OWNER.key)
        return self._views(project_id, chapter)

    def rename(self, project_id: str, title):
        project_id = self._id(project_id)
        self.projects.patch(project_id, {"title": title or ""}, OWNER.key)  # ValueError for an empty title
        return gr.update(choices=self.choices(), value=project_id), *self._views(project_id, 1)

    def ask_delete(self, project_id: str):
        """The confirmation: what will be lost, and two buttons."""
        project = self.projects.project(self._id(project_id), OWNER.key)
        return gr.update(visible=True), (f"Delete **{project.title}**, its chapters and all their audio? "
                                         "This cannot be undone.")

    def delete(self, project_id: str):
        """The project and its audio gone (never while a render of it is unfinished); the newest other opens."""
        project_id = self._id(project_id)
        if self.projects.active_job(project_id) is not None:
            raise ValueError("This project has a render that has not finished (running or paused); cancel it "
                             "first, then delete the project.")
        title = self.projects.project(project_id, OWNER.key).title
        self.projects.delete(project_id, OWNER.key)
        gr.Info(f"Deleted {title}.")
        choices = self.choices()
        newest = choices[-1][1] if choices else None
        return (gr.update(visible=False), gr.update(choices=choices, value=newest), newest or "",
                *self.form(newest), *self._views(newest, 1))

    @staticmethod
    def keep():
        return gr.update(visible=False)

    def _refuse_while_rendering(self, project_id: str, what: str) -> None:
        active = self.projects.active_job(project_id)
        if active is not None and self.projects.store.job(active[0]).state == "running":
            raise ValueError(f"The project is rendering; pause or cancel it before {what}.")


__all__ = ["PROJECTS", "ZERO_SHOT", "ProjectEdits"]
