"""The page's static files (`studio/static/`): its CSS and JavaScript, kept as files so they can be linted.

Gradio reads the stylesheet at launch (`css_paths`) and takes each component's script as text (`js_on_load`);
the browser fetches the live player's AudioWorklet module itself, from `ROUTE`, which `mount` serves.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles

STATIC_DIR = Path(__file__).resolve().parents[1] / "static"
ROUTE = "/studio/static"  # live.js names the worklet's address under it
STYLESHEET = STATIC_DIR / "studio.css"


def script(name: str) -> str:
    """The text of a script in `studio/static/`, for a component's `js_on_load`."""
    return (STATIC_DIR / name).read_text(encoding="utf-8")


def mount(app: FastAPI) -> None:
    """Serve `studio/static/` at `ROUTE` on Gradio's running FastAPI app (after launch, like the API)."""
    app.mount(ROUTE, StaticFiles(directory=STATIC_DIR), name="studio-static")
