"""Projects: a book in, a chaptered audiobook out, rendered by a job that survives a closed tab and a restart.
The shared value types are in `types.py`; see docs/PROJECTS.md for the layout and the HTTP API."""
