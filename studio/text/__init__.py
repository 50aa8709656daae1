"""User text → one clean line: the one rule for names, transcripts and descriptions of voices and presets."""

from __future__ import annotations

import unicodedata
from typing import Any


def clean_line(value: Any, what: str, limit: int, *, required: bool = False,
               error: type[ValueError] = ValueError) -> str:
    """`value` as one line: NFC, control characters (Unicode category C) as spaces, runs of space as one,
    trimmed; None is empty. Raises `error` with a sentence naming `what` when it is not text, empty but
    `required`, or longer than `limit` characters."""
    if value is None:
        value = ""
    if not isinstance(value, str):
        raise error(f"The {what} must be text.")
    value = unicodedata.normalize("NFC", value)
    value = "".join(" " if unicodedata.category(ch).startswith("C") else ch for ch in value)
    value = " ".join(value.split())
    if required and not value:
        raise error(f"The {what} is empty.")
    if len(value) > limit:
        raise error(f"The {what} is {len(value)} characters long; the limit is {limit}.")
    return value
