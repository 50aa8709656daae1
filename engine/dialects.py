"""What each kind of speech server accepts (`Dialect`), how the client tells them apart from what they
answer, and the voice names each stores (engine/remote.py drives them)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from .config import CODEBOOKS

# The delayed codebooks end CODEBOOKS - 1 steps after the last frame starts (engine/delay.py's StopRule.delay):
# a server counting model steps needs that many more than our frame budget.
DELAY_TAIL = CODEBOOKS - 1
SGLANG_VOICE_NAME = re.compile(r"^(?=.*[A-Za-z0-9])[A-Za-z0-9_.-]+$")


@dataclass(frozen=True)
class Dialect:
    """What one kind of server accepts. `zero_shot_voice`: the `voice` that means "no voice" (None: send no
    `voice`); `stream`: the fields that ask for raw PCM as it is made; `sampling`: whether temperature /
    top-k / top-p are in its request schema; `length_field` and `length_tail`: how a frame budget is
    spelled and what it adds (model steps = frames + the delay tail)."""

    key: str
    name: str
    zero_shot_voice: str | None
    stream: dict[str, Any]
    sampling: bool
    length_field: str
    length_tail: int


# Each kind's facts, read from the servers' code (tests/remote_fakes.py names the files and commits).
STUDIO = Dialect("higgs-studio", "Higgs Studio", None, {"stream": True}, True, "max_frames", 0)
VLLM_OMNI = Dialect("vllm-omni", "vLLM-Omni", None, {"stream": True, "stream_format": "audio"}, False,
                    "max_new_tokens", DELAY_TAIL)
SGLANG_OMNI = Dialect("sglang-omni", "SGLang-Omni", "default", {"stream": True, "stream_format": "audio"}, True,
                      "max_new_tokens", DELAY_TAIL)
OPENAI = Dialect("openai", "OpenAI-compatible", None, {"stream": True, "stream_format": "audio"}, True,
                 "max_new_tokens", DELAY_TAIL)
DIALECTS = {d.key: d for d in (STUDIO, VLLM_OMNI, SGLANG_OMNI, OPENAI)}


def detect_dialect(health: Any, models: Any, voices: Any) -> Dialect:
    """Which kind of server answered: our studio's `/health` has `engine_loaded` and `formats`; vLLM lists
    its models as `owned_by: "vllm"`, SGLang-Omni as `"sglang-omni"`; failing those, the Omni voices listing
    tells them apart (SGLang-Omni lists the preset `"default"`, vLLM-Omni only uploads)."""
    if isinstance(health, dict) and "engine_loaded" in health and "formats" in health:
        return STUDIO
    cards = models.get("data") if isinstance(models, dict) else None
    owners = {str(c.get("owned_by", "")).lower() for c in cards or [] if isinstance(c, dict)}
    if "vllm" in owners or "vllm-omni" in owners:
        return VLLM_OMNI
    if any(o.startswith("sglang") for o in owners):
        return SGLANG_OMNI
    if isinstance(voices, dict) and "uploaded_voices" in voices:
        return SGLANG_OMNI if "default" in (voices.get("voices") or []) else VLLM_OMNI
    return OPENAI


def server_voice_name(dialect: Dialect, name: str) -> str:
    """Our voice name → the name `dialect`'s server stores it under, or ValueError saying why it would refuse
    it. Our names may hold spaces; SGLang-Omni's may not, so spaces become underscores there."""
    name = (name or "").strip()
    if not name:
        raise ValueError("The voice needs a name.")
    if dialect is SGLANG_OMNI:
        mapped = re.sub(r"\s+", "_", name)
        if not SGLANG_VOICE_NAME.fullmatch(mapped):
            raise ValueError(f"The SGLang-Omni server takes voice names of letters, digits, '.', '_' and '-' only "
                             f"(spaces become '_'); {name!r} would be refused. Rename the voice.")
        if mapped.lower() == "default":
            raise ValueError("The SGLang-Omni server reserves the voice name 'default' for zero-shot; pick another.")
        return mapped
    if dialect is VLLM_OMNI and (name in (".", "..") or any(c in name for c in "/\\\x00")):
        raise ValueError(f"The vLLM-Omni server refuses voice names with '/', '\\' or NUL, and '.' or '..'; "
                         f"{name!r} would be refused. Rename the voice.")
    return name
