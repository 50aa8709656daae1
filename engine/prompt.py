"""The `Prompt` value (ids plus delayed reference rows) and the zero-shot / voice-clone builders of
SPEC D1 / Part 2 §4. Prompts are built from ids, never from a chat template or a text preamble.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch

from .config import AUDIO_PLACEHOLDER, CODEBOOK_SIZE, CODEBOOKS, Dims
from .delay import apply_delay
from .tokenizer import ADDED_FIRST, AUDIO, CONTROL_TAG_IDS, REF_AUDIO, REF_TEXT, TEXT, TTS


@dataclass(frozen=True, eq=False)
class VoiceRef:
    """A reference voice: codec codes [T, 8] of the clip (not delayed) and its transcript, if known."""

    codes: torch.Tensor
    transcript: str | None = None

    def __post_init__(self):
        codes = torch.as_tensor(self.codes)
        if codes.is_floating_point() or codes.dtype == torch.bool:
            raise ValueError(f"voice codes must be integers, got {codes.dtype}")
        if codes.ndim != 2 or codes.shape[0] < 1 or codes.shape[1] != CODEBOOKS:
            raise ValueError(f"voice codes must be [frames, {CODEBOOKS}] with at least one frame, "
                             f"got shape {tuple(codes.shape)}")
        if int(codes.min()) < 0 or int(codes.max()) >= CODEBOOK_SIZE:
            raise ValueError(f"voice codes must lie in 0..{CODEBOOK_SIZE - 1}, got "
                             f"{int(codes.min())}..{int(codes.max())}")
        object.__setattr__(self, "codes", codes.long())
        transcript = (self.transcript or "").strip()
        object.__setattr__(self, "transcript", transcript or None)

    @property
    def frames(self) -> int:
        return self.codes.shape[0]


@dataclass(frozen=True, eq=False)
class Prompt:
    """Prompt ids, where each AUDIO_PLACEHOLDER (-100) takes the fused embedding of the next row of
    `ref_rows` (the delayed reference codes, [T + 7, 8])."""

    ids: list[int]
    ref_rows: torch.Tensor | None = None

    def __post_init__(self):
        ids = [int(i) for i in self.ids]
        if not ids:
            raise ValueError("a prompt needs at least one id")
        object.__setattr__(self, "ids", ids)
        placeholders = ids.count(AUDIO_PLACEHOLDER)
        rows = self.ref_rows
        if rows is not None:
            rows = torch.as_tensor(rows)
            if rows.is_floating_point() or rows.ndim != 2:
                raise ValueError(f"ref_rows must be an integer [rows, codebooks] tensor, got "
                                 f"{rows.dtype} {tuple(rows.shape)}")
            if rows.numel() and int(rows.min()) < 0:
                raise ValueError("ref_rows hold negative codes")
            rows = rows.long()
            object.__setattr__(self, "ref_rows", rows)
        if placeholders != (0 if rows is None else rows.shape[0]):
            raise ValueError(f"prompt has {placeholders} reference-audio placeholders but "
                             f"{0 if rows is None else rows.shape[0]} reference rows")

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def prefix_len(self) -> int:
        """Length of the part shared by every request with the same voice and style (SPEC D1): up to and
        including `<|text|>`, plus the control tags that immediately follow it. Always leaves at least one
        id to prefill, since the logits come from the last position. 0 when there is no `<|text|>`."""
        try:
            end = self.ids.index(TEXT) + 1
        except ValueError:
            return 0
        while end < len(self.ids) and self.ids[end] in CONTROL_TAG_IDS:
            end += 1
        return min(end, len(self.ids) - 1)

    @property
    def cache_key(self) -> tuple[tuple[int, ...], str | None]:
        """Key of the reusable prefix: its ids and a digest of the reference rows (placeholder ids alone do
        not tell two voices apart)."""
        digest = None
        if self.ref_rows is not None:
            rows = self.ref_rows.contiguous()
            digest = hashlib.sha256(str(tuple(rows.shape)).encode() + rows.numpy().tobytes()).hexdigest()
        return tuple(self.ids[:self.prefix_len]), digest


def zero_shot_ids(text_ids: list[int]) -> list[int]:
    """`[<|tts|>, <|text|>, *text, <|audio|>]`."""
    return [TTS, TEXT, *text_ids, AUDIO]


def clone_ids(text_ids: list[int], n_ref_rows: int, ref_text_ids: list[int] | None = None) -> list[int]:
    """`[<|tts|>, (<|ref_text|>, *ref_text), <|ref_audio|>, -100 × rows, <|text|>, *text, <|audio|>]`."""
    if n_ref_rows <= 0:
        raise ValueError(f"a voice-clone prompt needs reference rows, got {n_ref_rows}")
    ref_text = [REF_TEXT, *ref_text_ids] if ref_text_ids else []
    return [TTS, *ref_text, REF_AUDIO, *[AUDIO_PLACEHOLDER] * n_ref_rows, TEXT, *text_ids, AUDIO]


def _encode_text(tokenizer, text: str, what: str) -> list[int]:
    ids = tokenizer.encode(text.strip())
    structural = sorted({i for i in ids if i >= ADDED_FIRST and i not in CONTROL_TAG_IDS})
    if structural:
        names = ", ".join(tokenizer.decode([i]) for i in structural)
        raise ValueError(f"the {what} contains {names}, which would break the prompt; remove it "
                         "(only <|emotion:…|>, <|style:…|>, <|sfx:…|> and <|prosody:…|> tags are allowed)")
    return ids


def build_prompt(tokenizer, text: str, voice: VoiceRef | None = None, *, dims: Dims) -> Prompt:
    """Zero-shot prompt for `text`, or a voice-clone prompt when `voice` is given."""
    if not text or not text.strip():
        raise ValueError("there is no text to speak; type a sentence first")
    text_ids = _encode_text(tokenizer, text, "text")
    if voice is None:
        return Prompt(zero_shot_ids(text_ids))
    if voice.codes.shape[1] != dims.codebooks:
        raise ValueError(f"the voice has {voice.codes.shape[1]} codebooks but the model uses {dims.codebooks}")
    rows = apply_delay(voice.codes, dims.boc, dims.eoc)
    ref_text_ids = _encode_text(tokenizer, voice.transcript, "reference transcript") if voice.transcript else None
    return Prompt(clone_ids(text_ids, rows.shape[0], ref_text_ids), rows)
