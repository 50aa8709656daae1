"""`python -m engine say "text" --out take.wav`: one take from the command line, with its numbers.

Errors a user can fix (no checkpoint offline, bad options) print one line on stderr and exit with 2.
"""

from __future__ import annotations

import argparse
import sys
import time

from .types import DEFAULT_TEMPERATURE, DEFAULT_TOP_K, DEFAULT_TOP_P

DEFAULT_OUT = "take.wav"


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line instead of usage + message
        raise SystemExit(_fail(f"{message} (see `python -m engine say --help`)"))


def _fail(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 2


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m engine", description="Higgs Audio v3 TTS engine")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    say = sub.add_parser("say", help="speak a text into a WAV file")
    say.add_argument("text", nargs="?", help="what to say; inline control tags like <|emotion:elation|> are allowed")
    say.add_argument("--file", default=None, help="speak a whole text file (chapter, script) as one long take")
    say.add_argument("--no-normalize", action="store_true",
                     help="with --file: speak numbers, dates and units as written (default: as words)")
    say.add_argument("--out", default=DEFAULT_OUT, help=f"output WAV (24 kHz mono; default {DEFAULT_OUT})")
    say.add_argument("--checkpoint", default=None,
                     help="checkpoint directory or hub id (default: the official bosonai checkpoint)")
    say.add_argument("--demo", action="store_true", help="use a tiny random checkpoint (no download; the audio is noise)")
    say.add_argument("--stream", action="store_true", help="write audio chunk by chunk as it is generated")
    say.add_argument("--seed", type=int, default=None, help="sampling seed (default: random, printed)")
    say.add_argument("--temperature", type=float, default=DEFAULT_TEMPERATURE,
                     help=f"0 = greedy (default {DEFAULT_TEMPERATURE})")
    say.add_argument("--top-k", type=int, default=DEFAULT_TOP_K)
    say.add_argument("--top-p", type=float, default=DEFAULT_TOP_P)
    say.add_argument("--max-frames", type=int, default=None, help="length cap in frames (25 per second)")
    say.add_argument("--device", default="auto", help="auto, cpu or cuda")
    say.add_argument("--precision", default="auto", help="auto, fp32, bf16, fp16, fp8 (GPU), int8 or int4 (CPU)")
    say.add_argument("--backend", default="auto", help="auto, torch, torch-graph or cubin")
    return parser


def say(args) -> int:
    import soundfile as sf

    from .config import SAMPLE_RATE
    from .cpu import tune_threads
    from .generate import Engine
    from .types import check_options

    if args.demo and args.checkpoint:
        return _fail("give either --demo or --checkpoint, not both")
    check_options(args.temperature, args.top_k, args.top_p)  # before a slow load
    if args.file and args.text:
        return _fail("give either a text or --file, not both")
    if args.file:
        from pathlib import Path

        from .longform import plan
        segments = plan(Path(args.file).read_text(encoding="utf-8"), normalize=not args.no_normalize)
    elif not (args.text or "").strip():
        return _fail("there is no text to speak; give a non-empty sentence")
    if args.demo:
        from .demo import demo_checkpoint
        print("demo mode: a tiny checkpoint with RANDOM weights, so the audio is noise "
              "(it exercises the whole pipeline, not the voice)")
        source = demo_checkpoint()
    else:
        from .checkpoint import DEFAULT_REPO
        source = args.checkpoint or DEFAULT_REPO
    started = time.perf_counter()
    engine = Engine.load(source, device=args.device, precision=args.precision, backend=args.backend)
    tune_threads(engine)
    info = engine.info
    print(f"loaded {info.checkpoint} in {time.perf_counter() - started:.1f} s: "
          f"{info.device}, {info.precision}, backend {info.backend}"
          + (f" ({info.backend_reason})" if info.backend_reason else ""))
    if args.file:
        return _say_long(engine, segments, args)
    chunks = engine.generate_stream(args.text, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                                    seed=args.seed, max_frames=args.max_frames)
    samples = 0
    with sf.SoundFile(args.out, "w", samplerate=SAMPLE_RATE, channels=1, subtype="FLOAT") as out:
        for chunk in chunks:
            out.write(chunk.audio)
            samples += len(chunk.audio)
            if args.stream and len(chunk.audio):
                print(f"  +{len(chunk.audio) / SAMPLE_RATE:.2f} s audio ({samples / SAMPLE_RATE:.2f} s so far)")
            metrics = chunk.metrics
    m = metrics
    mem = m.peak_mem_bytes / 2**20
    print(f"wrote {args.out}: {m.frames} frames, {samples / SAMPLE_RATE:.2f} s, stop: {m.stop_reason}, seed {m.seed}")
    ttfa = "n/a" if m.ttfa_ms is None else f"{m.ttfa_ms:.0f} ms"
    print(f"TTFA {ttfa} | RTF {m.rtf:.3f} | {m.ms_per_frame:.2f} ms/frame | prefill {m.prefill_ms:.0f} ms "
          f"({m.prompt_tokens} tokens) | peak {m.mem_kind} {mem:.0f} MiB")
    return 0


def _say_long(engine, segments, args) -> int:
    import soundfile as sf

    from .config import SAMPLE_RATE
    from .longtake import LongTake

    chars = sum(len(s.source) for s in segments)
    print(f"{args.file}: {chars} characters in {len(segments)} segments")
    take = LongTake(engine, segments, seed=args.seed, temperature=args.temperature, top_k=args.top_k,
                    top_p=args.top_p, max_frames=args.max_frames)
    samples = 0
    with sf.SoundFile(args.out, "w", samplerate=SAMPLE_RATE, channels=1, subtype="FLOAT") as out:
        for chunk in take.stream():
            out.write(chunk.audio)
            samples += len(chunk.audio)
            if args.stream or chunk.done > chunk.segment:
                print(f"  segment {chunk.segment + 1}/{chunk.total}: {samples / SAMPLE_RATE:.2f} s so far")
    for t in take.takes:
        if t.flagged:
            print(f"  segment {t.index + 1} was cut short ({t.stop_reason}"
                  f"{', generated again with the next seed' if t.retried else ''}); listen to it")
    seconds = samples / SAMPLE_RATE
    print(f"wrote {args.out}: {seconds:.2f} s, seeds {take.seeds[0]}…{take.seeds[-1]} (base {take.base_seed})")
    print(f"TTFA {take.ttfa_ms:.0f} ms | RTF {take.wall_ms / 1e3 / max(seconds, 1e-9):.3f} | "
          f"wall {take.wall_ms / 1e3:.1f} s")
    return 0


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    try:
        return say(args)
    except (ValueError, OSError) as exc:
        return _fail(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
