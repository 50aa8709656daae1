"""Which attempt of a segment a take keeps (a long take, engine/longtake.py; a project's render,
studio/projects/jobs.py): pure functions of the attempts, no model.

A take given a check (how far an attempt's audio is from its text, lower is better; the studio's is the
word error rate of its ASR, studio/audio/listen.py) scores every attempt; a segment scoring above the threshold is
generated again with the next seed, up to the allowed retries, and the best attempt kept (the lowest score,
then not cut short; ties: the first); an attempt the check cannot judge falls back on the cut-short rule.
Every attempt's seed, stop reason and score is kept and written to the recipe, whose seed is the kept one:
the recipe reproduces the take with no retry and no check.
"""

from __future__ import annotations

from dataclasses import dataclass

# A take that ends on these was cut, not finished: the segment is generated once more with the next seed.
CUT_SHORT = ("max_frames", "repeat_guard")


@dataclass(frozen=True)
class Attempt:
    """One generation of a segment: its seed, how it ended, and the check's score (None: not checked, or the
    check could not tell)."""

    seed: int
    stop_reason: str
    wer: float | None = None

    def as_dict(self) -> dict:
        return {"seed": self.seed, "stop_reason": self.stop_reason,
                "wer": None if self.wer is None else round(self.wer, 4)}


def again(attempts: list[Attempt], *, above: float, retries: int) -> bool:
    """Whether a segment is generated once more after `attempts`. With the check's verdict, the check decides:
    above `above`, up to `retries` times (a take cut short mid-word is heard so; one that only ran on into
    silence is not). Without one (no check, or it could not tell), a take cut short gets its one retry."""
    last, made = attempts[-1], len(attempts) - 1
    if last.wer is None:
        return last.stop_reason in CUT_SHORT and made < 1
    return last.wer > above and made < retries


def best(attempts: list[Attempt]) -> int:
    """The attempt kept: with no verdicts the latest (a cut-short take's retry, as without a check); otherwise
    the lowest score (an unscored attempt counts as the worst), then not cut short, then the first."""
    if all(a.wer is None for a in attempts):
        return len(attempts) - 1
    return min(range(len(attempts)), key=lambda i: (float("inf") if attempts[i].wer is None else attempts[i].wer,
                                                    attempts[i].stop_reason in CUT_SHORT, i))


__all__ = ["CUT_SHORT", "Attempt", "again", "best"]
