"""Start Higgs Studio: parse flags and environment, load the engine once, warm it up, launch the page
with the OpenAI-compatible API on the same port.

    python app.py --demo                      # tiny random checkpoint: everything works, the audio is noise
    python app.py --checkpoint ./higgs-tts-3-4b --port 7860 --mcp --api-key secret
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import logging
import os
import sqlite3
import sys
import time
from pathlib import Path

DEFAULT_CHECKPOINT = "bosonai/higgs-tts-3-4b"


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    env = os.environ
    on_spaces = bool(env.get("SPACE_ID"))
    p = argparse.ArgumentParser(description="Higgs Studio: a fast voice studio for Higgs Audio v3 TTS-4B.")
    p.add_argument("--checkpoint", default=env.get("HIGGS_CHECKPOINT", DEFAULT_CHECKPOINT),
                   help="checkpoint directory or Hugging Face id (env HIGGS_CHECKPOINT)")
    p.add_argument("--demo", action="store_true", default=_env_flag("HIGGS_DEMO"),
                   help="use a tiny random checkpoint (no download; the audio is noise) (env HIGGS_DEMO=1)")
    p.add_argument("--device", default=env.get("HIGGS_DEVICE", "auto"), choices=["auto", "cpu", "cuda"])
    p.add_argument("--precision", default=env.get("HIGGS_PRECISION", "auto"),
                   choices=["auto", "fp8", "bf16", "fp32", "int8", "int4"],
                   help="auto: fp8 on a GPU's fast path, int8 for the 4B model on a CPU (fp32 for --demo); int8 / "
                        "int4 are the CPU path's weight-only formats")
    p.add_argument("--retrust", action="store_true",
                   help="probe the GPU kernels again in a separate process, ignoring the verdict cached for this GPU, "
                        "driver and build, and overwrite it")
    p.add_argument("--host", default="0.0.0.0" if on_spaces else env.get("GRADIO_SERVER_NAME", "127.0.0.1"))
    p.add_argument("--port", type=int, default=int(env.get("PORT") or env.get("GRADIO_SERVER_PORT") or 7860))
    p.add_argument("--share", action="store_true", help="also open a public gradio.live link")
    p.add_argument("--allowed-hosts", default=env.get("HIGGS_ALLOWED_HOSTS", ""),
                   help="comma-separated host names a keyless local studio also answers to, besides localhost "
                        "and IP addresses (a leading dot allows subdomains; env HIGGS_ALLOWED_HOSTS; "
                        "docs/SECURITY.md, DNS rebinding)")
    p.add_argument("--mcp", action="store_true", default=_env_flag("GRADIO_MCP_SERVER"),
                   help="serve the studio's tools over MCP at /gradio_api/mcp/")
    p.add_argument("--api-key", default=env.get("HIGGS_API_KEY"),
                   help="the owner's key: required as a Bearer key on /v1/* and MCP, and as the page's login "
                        "password (env HIGGS_API_KEY; docs/SECURITY.md)")
    p.add_argument("--public-page", action="store_true", default=_env_flag("HIGGS_PUBLIC_PAGE") or on_spaces,
                   help="with --api-key, serve the page without a login: visitors generate within the public "
                        "limits and cannot change the library (default on Spaces) (env HIGGS_PUBLIC_PAGE=1)")
    p.add_argument("--max-batch", type=int, default=int(env.get("HIGGS_MAX_BATCH") or 16),
                   help="most takes decoded together (visitors, API requests, the Takes control); 1 runs one take "
                        "at a time (env HIGGS_MAX_BATCH)")
    p.add_argument("--queue-size", type=int, default=int(env.get("HIGGS_QUEUE_SIZE") or 64),
                   help="page requests that may wait for the GPU; beyond it a visitor is asked to try again in a "
                        "minute (env HIGGS_QUEUE_SIZE; docs/SPACES.md lists every limit)")
    p.add_argument("--visitor-concurrency", type=int, default=int(env.get("HIGGS_VISITOR_CONCURRENCY") or 2),
                   help="takes one visitor of a public page may have running at once; free slots go round robin "
                        "across visitors, the owner first (env HIGGS_VISITOR_CONCURRENCY; docs/SPACES.md)")
    p.add_argument("--visitor-queue", type=int, default=int(env.get("HIGGS_VISITOR_QUEUE") or 4),
                   help="takes one visitor may have waiting besides those; more are refused with a sentence "
                        "(env HIGGS_VISITOR_QUEUE)")
    p.add_argument("--public-max-chars", type=int, default=int(env.get("HIGGS_PUBLIC_MAX_CHARS") or 1000),
                   help="longest text a visitor of a public page may speak at once (env HIGGS_PUBLIC_MAX_CHARS)")
    p.add_argument("--public-max-seconds", type=int, default=int(env.get("HIGGS_PUBLIC_MAX_SECONDS") or 60),
                   help="longest take a visitor of a public page may make (env HIGGS_PUBLIC_MAX_SECONDS)")
    p.add_argument("--public-upload-mb", type=int, default=int(env.get("HIGGS_PUBLIC_UPLOAD_MB") or 100),
                   help="megabytes a visitor of a public page may upload in two hours, as long as Gradio keeps an "
                        "upload (env HIGGS_PUBLIC_UPLOAD_MB; all visitors together: 2 GB; studio/api/uploads.py)")
    p.add_argument("--voices-dir", default=env.get("HIGGS_VOICES_DIR"), help="where saved voices live")
    p.add_argument("--voices-presets", default=env.get("HIGGS_VOICE_PRESETS") or _bundled_presets(),
                   help="the owner's preset voices, read-only for everyone: a folder with config.json "
                        "({name: {transcript, audio_file}}) and its wavs (env HIGGS_VOICE_PRESETS; default "
                        "presets/voices/ when it has a config.json)")
    p.add_argument("--private-voices", action="store_true", default=_env_flag("HIGGS_PRIVATE_VOICES") or on_spaces,
                   help="voices saved on the page belong to their visitor and live in the visitor's browser; the "
                        "shared library is the owner's, through the API (default on Spaces) "
                        "(env HIGGS_PRIVATE_VOICES=1; docs/SPACES.md)")
    p.add_argument("--asr", default=env.get("HIGGS_ASR"),
                   help="transcribe reference clips when the transcript box is empty: auto (whisper-large-v3-turbo "
                        "on a GPU, whisper-base on CPU), none, or a model id or folder (env HIGGS_ASR; default auto, "
                        "none with --demo, which downloads nothing)")
    p.add_argument("--retry-wer", type=float, default=float(env.get("HIGGS_RETRY_WER") or 0.25),
                   help="listen and retry, with ASR on: a long take's or project's segment whose transcript's word "
                        "error rate is above this is generated again with the next seed (env HIGGS_RETRY_WER; "
                        "default 0.25)")
    p.add_argument("--retry-max", type=int, default=int(env.get("HIGGS_RETRY_MAX") or 2),
                   help="most times a segment heard wrong is generated again; the best attempt is kept (env "
                        "HIGGS_RETRY_MAX; default 2; 0: measure the WER only)")
    p.add_argument("--max-input-chars", type=int, default=int(env.get("HIGGS_MAX_INPUT_CHARS") or 0) or None,
                   help="longest `input` /v1/audio/speech takes as one long take, planned into segments "
                        "(default 100,000; env HIGGS_MAX_INPUT_CHARS)")
    p.add_argument("--projects-dir", default=env.get("HIGGS_PROJECTS_DIR"),
                   help="where projects (books, their rendered segments and jobs) live (env HIGGS_PROJECTS_DIR; "
                        "default projects/ in the studio's folder, /data/higgs-studio/projects on a Space)")
    p.add_argument("--project-max-chars", type=int, default=int(env.get("HIGGS_PROJECT_MAX_CHARS") or 2_000_000),
                   help="most characters one project holds (env HIGGS_PROJECT_MAX_CHARS)")
    p.add_argument("--project-max-chapters", type=int, default=int(env.get("HIGGS_PROJECT_MAX_CHAPTERS") or 500),
                   help="most chapters one project holds (env HIGGS_PROJECT_MAX_CHAPTERS)")
    p.add_argument("--project-max-upload-mb", type=int, default=int(env.get("HIGGS_PROJECT_MAX_UPLOAD_MB") or 50),
                   help="largest book file (.txt, .md, .epub) a project is created from (env "
                        "HIGGS_PROJECT_MAX_UPLOAD_MB)")
    p.add_argument("--remote", default=env.get("HIGGS_REMOTE"),
                   help="drive a running speech server (another Higgs Studio, SGLang-Omni, vLLM-Omni) at this URL "
                        "instead of a local model (env HIGGS_REMOTE; its key in HIGGS_REMOTE_API_KEY; docs/SCALING.md)")
    p.add_argument("--remote-model", default=env.get("HIGGS_REMOTE_MODEL"),
                   help="the model name to ask the --remote server for (env HIGGS_REMOTE_MODEL; default the first "
                        "one its /v1/models lists)")
    p.add_argument("--remote-concurrency", type=int, default=int(env.get("HIGGS_REMOTE_CONCURRENCY") or 0) or None,
                   help="most takes sent to the --remote server at once, which batches them (env "
                        "HIGGS_REMOTE_CONCURRENCY; default what the server reports, else 16)")
    p.add_argument("--wyoming", default=env.get("HIGGS_WYOMING"),
                   help="also serve Home Assistant's Wyoming protocol at this address, e.g. tcp://0.0.0.0:10200, "
                        "on the same engine and line (env HIGGS_WYOMING; no authentication: keep it on the home "
                        "network; docs/WYOMING.md)")
    p.add_argument("--voice-alias", action="append", metavar="NAME=VOICE",
                   help="what a voice name chat clients send speaks with, e.g. alloy=Narrator (a saved voice) or "
                        "nova=\"Calm narrator\" (a style preset); repeatable, or comma-separated. Unset names keep "
                        "the built-in table (docs/API.md, \"Voice aliases\") (env HIGGS_VOICE_ALIASES, used when "
                        "no flag is given)")
    args = p.parse_args(argv)
    if args.voice_alias is None:
        args.voice_alias = [env["HIGGS_VOICE_ALIASES"]] if env.get("HIGGS_VOICE_ALIASES") else []
    return args


def _bundled_presets() -> str | None:
    folder = Path(__file__).resolve().parent / "presets" / "voices"
    return str(folder) if (folder / "config.json").is_file() else None


def load_voices(args: argparse.Namespace, engine):
    """The voice catalog: the owner's library, the preset voices (encoded once, cached) and, with
    --private-voices, the registry of visitors' private voices. Exits with one sentence on a bad presets folder."""
    from studio.voices import VoiceError, VoiceLibrary
    from studio.voices.catalog import VoiceCatalog
    from studio.voices.presets import PresetVoices
    from studio.voices.private import PrivateVoices

    presets = None
    if args.voices_presets:
        # A remote engine has no codec here: its voices travel as clips, so there is nothing to encode.
        encode = None if engine.is_remote else engine.encode_codes
        try:
            presets = PresetVoices(args.voices_presets, encode=encode)
        except (VoiceError, OSError) as exc:
            sys.exit(f"Cannot load the preset voices in {args.voices_presets}: {exc}")
        print(f"Preset voices: {', '.join(v.name for v in presets.list())}", flush=True)
    return VoiceCatalog(VoiceLibrary(args.voices_dir), presets=presets,
                        private=PrivateVoices() if args.private_voices else None)


def load_aliases(args: argparse.Namespace, voices, presets):
    """The voice names chat clients send → voices and styles (studio/voices/aliases.py), every --voice-alias target
    checked now; exits with one sentence on a bad one."""
    from studio.voices.aliases import VoiceAliases

    try:
        aliases = VoiceAliases.build(args.voice_alias, voices=voices, presets=presets)
    except ValueError as exc:
        sys.exit(f"Cannot start the studio: {exc}")
    configured = [f"{a.name}={a.shown}" for a in aliases.list() if a.configured]
    if configured:
        print(f"Voice aliases: {', '.join(configured)}", flush=True)
    return aliases


def start_projects(args: argparse.Namespace, service, listener=None):
    """The projects library and its render worker (which resumes every unfinished job now, listening with
    `listener`, studio/audio/listen.py), or (None, None) with a remote engine: a project's segments are rendered in
    process. Exits with one sentence on a bad folder or limit."""
    if service.engine.is_remote:
        print("Projects are off: they render in process, and this studio drives a remote server.", flush=True)
        return None, None
    from studio.projects.importing import Limits
    from studio.projects.jobs import JobRunner
    from studio.projects.library import Projects
    from studio.projects.store import Store
    from studio.voices.store import studio_dir

    if min(args.project_max_chars, args.project_max_chapters, args.project_max_upload_mb) < 1:
        sys.exit("Cannot start the studio: --project-max-chars, --project-max-chapters and --project-max-upload-mb "
                 "must be at least 1.")
    folder = Path(args.projects_dir).expanduser() if args.projects_dir else studio_dir("HIGGS_PROJECTS_DIR", "projects")
    try:
        store = Store(folder)
    except (OSError, sqlite3.Error) as exc:
        sys.exit(f"Cannot open the projects folder {folder}: {exc}. Pick another with --projects-dir.")
    limits = Limits(max_chars=args.project_max_chars, max_chapters=args.project_max_chapters,
                    max_bytes=args.project_max_upload_mb * 2 ** 20)
    projects = Projects(store, service, limits=limits)
    runner = JobRunner(projects, service, listener=listener)
    runner.start()
    print(f"Projects: {folder}", flush=True)
    return projects, runner


def configure_spaces(data: Path = Path("/data")) -> None:
    """On Hugging Face Spaces keep downloads on the persistent volume so restarts don't re-fetch 9 GB."""
    if os.environ.get("SPACE_ID") and data.is_dir():
        os.environ.setdefault("HF_HOME", str(data / ".huggingface"))


def load_engine(args: argparse.Namespace):
    """The engine (or a remote client with the same interface); exits with one clear sentence on failure."""
    if args.remote:
        from engine.remote import RemoteEngine
        try:
            engine = RemoteEngine(args.remote, api_key=os.environ.get("HIGGS_REMOTE_API_KEY"), model=args.remote_model,
                                  concurrency=args.remote_concurrency)
        except ValueError as exc:
            sys.exit(f"Cannot use --remote: {exc}")
        info = engine.info
        print(f"Remote: {info.remote_kind} at {engine.shown_url}, model {info.checkpoint}, "
              f"{info.max_batch} takes at once", flush=True)
        return engine

    from engine.checkpoint import CheckpointError
    from engine.cpu import tune_threads
    from engine.generate import Engine

    if args.demo:
        from engine.demo import demo_checkpoint
        source = demo_checkpoint()
    else:
        source = args.checkpoint
    from studio.takes import zerogpu

    # ZeroGPU attaches the GPU only inside decorated calls; the cubin path's per-process context and graph
    # capture would be paid on each of them, so the torch path runs there (studio/takes/zerogpu.py).
    backend = "torch" if zerogpu.active() else "auto"
    if args.retrust:
        from engine.backends import trust
        trust.RETRUST = True
    print(f"Loading {source} (device={args.device}, precision={args.precision}) …", flush=True)
    t0 = time.perf_counter()
    try:
        engine = Engine.load(source, device=args.device, precision=args.precision, backend=backend,
                             max_batch=args.max_batch)
    except CheckpointError as exc:
        sys.exit(f"\nCannot load the checkpoint: {exc}\n\nTo try the studio without it: python app.py --demo")
    except (ValueError, RuntimeError) as exc:  # device / precision / backend not available here
        sys.exit(f"\nCannot start the engine: {exc}")
    tune_threads(engine)
    print(f"Loaded in {time.perf_counter() - t0:.1f} s: {engine.info.device} · {engine.info.precision}"
          f" · {engine.info.backend}" + (" · DEMO (random weights, the audio is noise)"
                                         if engine.info.demo else ""), flush=True)
    return zerogpu.wrap(engine)


def warm_up(engine) -> None:
    """One short take so the first user's TTFA doesn't include lazy initialisation (allocator, kernels)."""
    t0 = time.perf_counter()
    try:
        for _ in engine.generate_stream("Warm up.", seed=0, max_frames=8):
            pass
    except Exception as exc:  # a failed warm-up is not fatal: the first request will show the real error
        logging.getLogger("higgs.studio").warning("warm-up failed: %s", exc)
        return
    print(f"Warmed up in {time.perf_counter() - t0:.1f} s", flush=True)


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    args = parse_args(argv)
    configure_spaces()
    from studio.takes import zerogpu
    zerogpu.active()  # on ZeroGPU, `spaces` is imported before anything can initialise CUDA
    engine = load_engine(args)
    if not engine.is_remote and not zerogpu.active():  # on ZeroGPU the GPU is not ours yet
        warm_up(engine)

    from engine.config import FRAME_RATE
    from studio.api import MAX_UPLOAD_BYTES
    from studio.api.access import Access, friendly_queue_full, host_guard
    from studio.audio.asr import Transcriber
    from studio.audio.listen import Listener
    from studio.takes.limits import MAX_INPUT_CHARS, TakeLimits
    from studio.takes.service import StudioService
    from studio.text.presets import PresetStore
    from studio.text.pronounce import DictionaryStore
    from studio.views.page import Page, launch_kwargs
    from studio.voices import MAX_IMPORT_BYTES
    from studio.voices.warm import warm_voices

    voices = load_voices(args, engine)
    presets = PresetStore(voices.root / "presets.json")
    aliases = load_aliases(args, voices, presets)
    try:
        limits = TakeLimits(max_input_chars=args.max_input_chars or MAX_INPUT_CHARS, public_max_chars=args.public_max_chars,
                            public_max_frames=args.public_max_seconds * FRAME_RATE, max_queue=args.queue_size)
        service = StudioService(engine, voices, presets, aliases=aliases, visitor_concurrency=args.visitor_concurrency,
                                visitor_queue=args.visitor_queue, limits=limits,
                                dictionary=DictionaryStore(voices.root / "dictionary.json"))
        if args.public_upload_mb < 1:
            raise ValueError(f"a visitor's uploads must be allowed at least 1 MB, not {args.public_upload_mb}")
    except ValueError as exc:
        sys.exit(f"Cannot start the studio: {exc} (--visitor-concurrency, --visitor-queue, --max-input-chars, "
                 "--public-max-chars, --public-max-seconds, --public-upload-mb, --queue-size)")
    warm_voices(service)  # saved voices' prompt prefixes, in the background after any real take's prefill
    asr = Transcriber.from_flag(args.asr or ("none" if args.demo else "auto"), zerogpu=zerogpu.active())
    try:
        listener = Listener(asr, above=args.retry_wer, retries=args.retry_max)
    except ValueError as exc:
        sys.exit(f"Cannot start the studio: {exc}")
    service.listener = listener
    projects, runner = start_projects(args, service, listener)
    access = Access(args.api_key, public_page=args.public_page)
    page = Page(service, access, private_voices=voices.private, transcriber=asr, projects=projects, runner=runner,
                listener=listener)
    if not page.streaming:
        print("ffmpeg is not on PATH: takes play when complete instead of streaming, and mp3/opus/aac downloads are "
              "off. Install ffmpeg (e.g. `apt-get install ffmpeg`) for live streaming.", flush=True)
    demo = page.build()
    from studio.api import mcp
    # The documented endpoints (gradio_client, the page's "Use via API"), also MCP tools with --mcp; added before
    # launch. They hold each caller to its rights: a visitor gets the public limits and a fair share.
    mcp.register(demo, service, access=access, projects=projects, runner=runner)
    demo.queue(default_concurrency_limit=1, max_size=args.queue_size)
    friendly_queue_full(demo)
    # Gradio refuses uploads over this as they arrive: the largest legitimate one is a voice bundle, or on a
    # public page (where only the owner may import, and not from the page) a reference clip.
    max_upload = MAX_UPLOAD_BYTES if access.api_key and access.public_page else MAX_IMPORT_BYTES
    from studio import api
    from studio.api.uploads import refuse_url_files, upload_budget
    from studio.views import assets

    refuse_url_files()  # nor does Gradio fetch a file input given as an address, of any size, for anyone

    @contextlib.asynccontextmanager
    async def our_routes(app):
        # launch() builds a new FastAPI app each time, so our routes go on the one it serves; in its lifespan,
        # which uvicorn runs before it opens the port, so no request ever meets the app without them.
        api.register(app, service, access=access, max_input_chars=limits.max_input_chars,
                     transcriber=asr, projects=projects, runner=runner, page_tokens=page.player.check_token,
                     listener=listener)
        page.player.mount(app, access=access)  # the page's WebAudio stream route (studio/views/live.py)
        access.bearer_login(app)  # the key passes the page's login too: gradio_client and MCP's file URLs
        assets.mount(app)  # the page's static files (studio/static/): the live player's AudioWorklet
        # What start-up built (the model, the page, ~600,000 objects) lives as long as the process: frozen out of
        # the garbage collector's reach, a full collection no longer walks it, which held the event loop for
        # 0.2-1.2 s at a time on a busy 2-core machine.
        gc.collect()
        gc.freeze()
        yield

    try:
        demo.launch(server_name=args.host, server_port=args.port, share=args.share, mcp_server=args.mcp,
                    prevent_thread_lock=True, show_error=False, allowed_paths=[str(page.out_dir)], quiet=True,
                    max_file_size=max_upload, **access.launch_kwargs(), **launch_kwargs(),
                    app_kwargs={"middleware": host_guard(args.host, args.api_key, args.allowed_hosts.split(","),
                                                         args.share)
                                + upload_budget(access, max_upload, args.public_upload_mb << 20),
                                "lifespan": our_routes})
    except OSError as exc:
        sys.exit(f"Cannot listen on {args.host}:{args.port} ({exc}). Pick another port with --port or PORT.")
    # quiet=True: Gradio's own lines end with a hint to set share=True, which --share already offers.
    print(f"Studio page: {demo.local_url}", flush=True)
    print(f"OpenAI-compatible API: POST {demo.local_url.rstrip('/')}/v1/audio/speech"
          + (" (Bearer key required)" if args.api_key else ""), flush=True)
    if not args.api_key and args.host not in ("127.0.0.1", "localhost", "::1"):
        print(f"No API key and listening on {args.host}: whoever reaches this port can change the voice library. "
              "Set --api-key (HIGGS_API_KEY) to keep that to yourself (docs/SECURITY.md).", flush=True)
    if args.api_key:
        print("The page " + ("is public: visitors generate within the public limits; the library is managed with "
                             "the key" if args.public_page else "asks for a login: any name, the key as password"),
              flush=True)
    if args.mcp:
        print(f"MCP server: {demo.local_url.rstrip('/')}/gradio_api/mcp/", flush=True)
    wyoming = start_wyoming(args.wyoming, service)
    try:
        demo.block_thread()
    finally:
        if wyoming is not None:
            wyoming.stop()
        if runner is not None:
            runner.stop()
        service.close()


def start_wyoming(uri: str | None, service):
    """The Wyoming server beside the page and the API (its own thread), or None without --wyoming; exits
    with one sentence when the address is bad or taken."""
    if not uri:
        return None
    from studio.api.wyoming import WyomingServer
    try:
        server = WyomingServer(service, uri)
        server.start()
    except (ValueError, OSError) as exc:
        sys.exit(f"Cannot serve Wyoming at {uri}: {exc}. Pick another address with --wyoming or HIGGS_WYOMING.")
    print(f"Wyoming (Home Assistant): {uri}", flush=True)
    return server


if __name__ == "__main__":
    main()
