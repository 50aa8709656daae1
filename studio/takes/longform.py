"""What the Long form tab does with a long take once it is made (studio/takes/run.py makes it with
`pieces=True`, every segment's audio kept): its segment table, and any row generated again (a new seed or
edited text) with the take re-assembled, without redoing the rest."""

from __future__ import annotations

import numpy as np

from engine.longtake import LongTake
from studio.takes.run import misheard_segment


def regenerate_segment(service, take: LongTake, index: int, *, seed: int | None = None,
                       text: str | None = None) -> np.ndarray:
    """Generate one segment again (a new seed, or edited text) on the GPU worker, in turn with other
    requests, and return the re-assembled take. Edited text goes through the pronunciation dictionary. With no
    `seed` the row gets one of its own (`fresh_seed`), never another row's."""
    if text is not None and 0 <= index < len(take.segments):
        voice = take.segments[index].voice
        text = service.respell(text, (voice,) if voice else ())
    if seed is None and 0 <= index < len(take.segments) and take.takes[index] is not None:
        seed = fresh_seed(take, index)
    service.run_exclusive(take.regenerate, index, seed=seed, text=text)
    return take.assemble()


def fresh_seed(take: LongTake, index: int) -> int:
    """The next seed after the last one row `index` tried that no row holds and the row has not tried. Row i's
    seed is the take's seed + i, so "the next one" alone would be row i + 1's: the same voice reading twice."""
    attempts = take.takes[index].attempts
    taken = set(take.seeds) | {a.seed for a in attempts}
    seed = attempts[-1].seed if attempts else take.seeds[index]
    while seed in taken:
        seed = (seed + 1) % 2**63  # seeds stay 63-bit (SPEC D6)
    return seed


# How a segment that ended early reads on the page (the engine's stop reasons are its own words).
CUT_SHORT_WORDS = {"max_frames": "cut short: too long", "repeat_guard": "cut short: repeating"}


def segment_rows(take: LongTake) -> list[list]:
    """The segment table: #, speaker, text, seed, seconds, status (waiting / done / cut short / heard wrong,
    with the tries a listening take made), WER ("" when not listened to)."""
    rows = []
    for i, segment in enumerate(take.segments):
        t = take.takes[i]
        status = "waiting" if t is None else CUT_SHORT_WORDS.get(t.stop_reason, "done on a later seed") \
            if t.flagged else "heard wrong" if misheard_segment(take, t) else "done"
        if take.check is not None and t is not None and len(t.attempts) > 1:
            status += f" ({len(t.attempts)} tries)"
        rows.append([i + 1, segment.speaker or "", segment.text, take.seeds[i],
                     round(t.seconds, 2) if t is not None else round(segment.seconds, 1), status,
                     "" if t is None or t.wer is None else round(t.wer, 2)])
    return rows


__all__ = ["CUT_SHORT_WORDS", "fresh_seed", "regenerate_segment", "segment_rows"]
