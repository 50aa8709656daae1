"""Long-form benchmark on the demo checkpoint: `python -m bench.longform [--chars 3000] [--runs 3]`.

Plans a text of about `--chars` characters (engine/longform.py), streams it as one long take
(engine/longtake.py) and, in the same run, a one-sentence take of the plan's first segment with the same
settings, alternately. Reported (medians): characters, segments, TTFA of both and their ratio, RTF and wall
time of the long take. The demo's random weights fall into repeated codes, so every segment is cut short
by the repeat guard and most are generated twice (the retry): the RTF is that of the worst case.
"""

from __future__ import annotations

import argparse
import statistics
import time

from bench.common import Table, machine_line
from engine import Engine
from engine.config import SAMPLE_RATE
from engine.demo import demo_checkpoint
from engine.longform import plan
from engine.longtake import LongTake

PARAGRAPH = ("The lighthouse keeper climbed the stairs every evening at six. He wound the clock, trimmed the wick "
             "and polished the great lens until it shone. <|emotion:contemplation|>Some nights he wondered who "
             "was out there, watching the beam sweep across the water. Ships passed without a sound. In the "
             "morning he wrote the weather in his book: wind, cloud, the height of the waves.")


def text_of(chars: int) -> str:
    paragraphs = []
    while sum(map(len, paragraphs)) < chars:
        paragraphs.append(PARAGRAPH)
    return "\n\n".join(paragraphs)


def short_ttfa_ms(engine, text: str, seed: int) -> float:
    started = time.perf_counter()
    for chunk in engine.generate_stream(text, seed=seed):
        if len(chunk.audio):
            ttfa = 1e3 * (time.perf_counter() - started)
            break
    return ttfa


def main(argv=None) -> Table:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chars", type=int, default=3000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args(argv)
    engine = Engine.load(demo_checkpoint(), device="cpu")
    text = text_of(args.chars)
    segments = plan(text)
    LongTake(engine, segments[:2], seed=0).run()  # warm-up: first calls allocate
    long_ttfa, short_ttfa, rtf, wall, seconds = [], [], [], [], []
    for run in range(args.runs):
        short_ttfa.append(short_ttfa_ms(engine, segments[0].text, seed=run))
        take = LongTake(engine, segments, seed=run)
        audio = take.run()
        long_ttfa.append(take.ttfa_ms)
        wall.append(take.wall_ms)
        seconds.append(len(audio) / SAMPLE_RATE)
        rtf.append(take.wall_ms / 1e3 / seconds[-1])
    med = statistics.median
    table = Table("Long form, demo checkpoint (random tiny weights)",
                  ["characters", "segments", "TTFA ms (long)", "TTFA ms (one sentence)", "ratio", "RTF",
                   "wall s", "audio s"],
                  [[len(text), len(segments), round(med(long_ttfa), 1), round(med(short_ttfa), 1),
                    round(med(long_ttfa) / med(short_ttfa), 2), round(med(rtf), 4), round(med(wall) / 1e3, 2),
                    round(med(seconds), 1)]])
    print(machine_line())
    print(table.markdown())
    return table


if __name__ == "__main__":
    main()
