"""What the test files share, one definition each: numeric comparisons, test clips and WAV bytes, the voice
library's stand-in codec, waiting and child processes, the page's events (by HTTP and in Chromium), projects
over a job runner, and the kernels' inputs, manifests and SASS. Test files import from here (or take a fixture
from tests/conftest.py), never from one another. torch is imported where it is used, so a subprocess that only
wants a clip starts without it."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import time
from contextlib import contextmanager
from functools import cache
from pathlib import Path

import httpx
import numpy as np
import pytest
import soundfile as sf

from engine.config import SAMPLE_RATE, SAMPLES_PER_FRAME
from kernels import manifest as mf
from studio.voices import Consent


# ------------------------------------------------------------------------------------------ numbers
def rel_err(x, ref) -> float:
    """max|x − ref| / max|ref|, the parity fixture's metric (engine.model.rel_error)."""
    from engine.model import rel_error

    return rel_error(x, ref)


def cosine(a, b) -> float:
    """Cosine similarity of two tensors of any shape, in float64."""
    import torch.nn.functional as F

    return float(F.cosine_similarity(a.double().flatten(), b.double().flatten(), dim=0))


def random_codes(frames: int, seed: int):
    """Codec codes [frames, 8] in 0..1023 (a LongTensor), deterministic for a seed."""
    import torch

    return torch.randint(0, 1024, (frames, 8), generator=torch.Generator().manual_seed(seed))


# ------------------------------------------------------------------------------------------ test clips
def tone(seconds: float, *, rate: int = SAMPLE_RATE, pitch: float = 440.0, amplitude: float = 0.4,
         tremolo: float = 0.0) -> np.ndarray:
    """A sine of `pitch` Hz, float32 at `rate`; with `tremolo` its level swings by that fraction at 3 Hz, a
    syllable rate (amplitude × (1 − tremolo + tremolo · sin 2π·3t)): enough of a voice for the codec."""
    t = np.arange(int(seconds * rate)) / rate
    return (amplitude * np.sin(2 * np.pi * pitch * t) * (1 - tremolo + tremolo * np.sin(2 * np.pi * 3 * t))
            ).astype(np.float32)


def speech_clip(seconds: float = 2.0, rate: int = 16000, *, pitch: float = 140.0,
                seed: int = 0) -> tuple[int, np.ndarray]:
    """A speech-like (sr, int16 samples) tuple as Gradio gives it: harmonics of a wobbling pitch under a
    syllable envelope, a little noise; `pitch`/`seed` make distinct voices."""
    t = np.arange(int(seconds * rate)) / rate
    phase = 2 * np.pi * np.cumsum(pitch + 15 * np.sin(2 * np.pi * 0.8 * t)) / rate
    x = sum(np.sin(k * phase) / k for k in range(1, 5)) * (0.6 + 0.4 * np.sin(2 * np.pi * 3.5 * t))
    x = x + np.random.default_rng(seed).normal(0, 0.01, len(t))
    return rate, (0.4 * x / np.max(np.abs(x)) * 32767).astype(np.int16)


def wav_bytes(samples: np.ndarray, rate: int, subtype: str = "PCM_16") -> bytes:
    """`samples` as the bytes of a WAV file."""
    buf = io.BytesIO()
    sf.write(buf, samples, rate, format="WAV", subtype=subtype)
    return buf.getvalue()


def clip_bytes(seconds: float = 2.0, *, pitch: float = 150.0, rate: int = 16000, tremolo: float = 0.4) -> bytes:
    """A voice sample as a client uploads it: a WAV (PCM-16) of `tone`."""
    return wav_bytes(tone(seconds, rate=rate, pitch=pitch, tremolo=tremolo), rate)


def espeak_clip(path: Path, text: str) -> Path:
    """`text` spoken by espeak-ng into the WAV file `path` (22.05 kHz): synthetic speech a transcriber and the
    codec take for a voice. Skips when espeak-ng is not installed."""
    espeak = shutil.which("espeak-ng")
    if espeak is None:
        pytest.skip("espeak-ng is not installed (apt-get install espeak-ng)")
    subprocess.run([espeak, "-w", str(path), text], check=True, capture_output=True, timeout=60)
    return path


# ------------------------------------------------------------------------------------------ the voice library
CONSENT = Consent("Test Runner", "This is my own voice.")


def fake_encode(calls: list | None = None):
    """Stands in for the codec: codes derived from the audio, [frames, 8], values < 1024; each call's sample
    count is appended to `calls`."""
    def encode(wav: np.ndarray) -> np.ndarray:
        assert wav.dtype == np.float32 and len(wav) % SAMPLES_PER_FRAME == 0
        if calls is not None:
            calls.append(len(wav))
        frames = wav.reshape(-1, SAMPLES_PER_FRAME)
        base = (np.abs(frames).mean(axis=1) * 5000).astype(np.int64) % 1024
        return (base[:, None] + np.arange(8)[None, :]) % 1024
    return encode


# ------------------------------------------------------------------------------------------ waiting, processes
def wait_for(condition, seconds: float = 15.0) -> bool:
    """Poll `condition` every 50 ms until it holds (True) or `seconds` pass (False)."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def take_in_thread(engine, out, i: int, prompt, params, cancel=None):
    """`engine.predict(prompt, params)` in a thread; its codes, or the exception it raised, land in out[i]."""
    import threading

    def run():
        try:
            out[i] = engine.predict(prompt=prompt, params=params, cancel=cancel)
        except Exception as exc:  # the assertion is on what the caller got
            out[i] = exc
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def held_pair(engine, start, out, cancel) -> list:
    """Takes 0 and 1 (`start(engine, i, out[, cancel])`) submitted while the scheduler is held, so they join
    its line together and decode from the same first step; their threads."""
    with engine.scheduler.held():
        threads = [start(engine, 0, out), start(engine, 1, out, cancel)]
        assert wait_for(lambda: len(engine.scheduler.waiting) >= 2, 30)
    return threads


def ffmpeg_children() -> list[int]:
    """Pids of this process's ffmpeg children, zombies included (a zombie keeps its /proc entry)."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        name, rest = text[text.index("(") + 1:text.rindex(")")], text[text.rindex(")") + 2:].split()
        if name == "ffmpeg" and int(rest[1]) == os.getpid():
            pids.append(int(stat.parent.name))
    return pids


# ------------------------------------------------------------------------------------------ orders
def request(**kw):
    """An `Order` (studio/takes/order.py) from flat keywords: the sampling ones go into its `params`."""
    from dataclasses import fields

    from engine.types import SamplingParams
    from studio.takes.order import Order

    params = SamplingParams.of(**{k: kw.pop(k) for k in list(kw) if k in {f.name for f in fields(SamplingParams)}})
    return Order(params=params, **kw)


# ------------------------------------------------------------------------------------------ the page
def gen_args(text, **kw):
    """The page's Generate handler's arguments by name: `text` with the page's defaults, `kw` on top."""
    args = {"text": text, "style": "", "voice": "", "clip": None, "clip_text": "", "temperature": 0.8, "top_p": 0.8,
            "top_k": 30, "seed": 5, "max_frames": 0, "repeat_guard": 32, "takes_n": 1, "takes": [], "request": None}
    args.update(kw)
    return args


def run_event(client: httpx.Client, fn_index: int, data: list, *, headers: dict | None = None,
              event_data=None) -> tuple[int, dict | None]:
    """One Gradio event through the queue by `fn_index`: (HTTP status of the join, the completion message)."""
    session = os.urandom(6).hex()
    r = client.post("/gradio_api/queue/join", headers=headers,
                    json={"data": data, "fn_index": fn_index, "session_hash": session, "event_data": event_data})
    if r.status_code != 200:
        return r.status_code, None
    with client.stream("GET", "/gradio_api/queue/data", params={"session_hash": session}, headers=headers,
                       timeout=120) as stream:
        for line in stream.iter_lines():
            if line.startswith("data:"):
                message = json.loads(line[5:])
                if message.get("msg") == "process_completed":
                    return 200, message
    raise AssertionError(f"event {fn_index} never completed")


def events(config: dict) -> dict[str, int]:
    """The page's events by their function name (Gradio's api_name for private events) → fn_index."""
    return {dep["api_name"]: i for i, dep in enumerate(config["dependencies"]) if dep.get("api_name")}


def refused(message: dict | None) -> str:
    """The error sentence of an event's completion message that must have failed."""
    assert message is not None and message["success"] is False, message
    return message["output"]["error"]


# What the page's status lines say: a take that does not end says where it stopped.
TAKE_STATUS = """() => Object.fromEntries(['m-state', 'metrics-note', 'live-state', 'live-note']
    .map((id) => [id, document.getElementById(id)?.innerText]))"""


def wait_take_done(pg, timeout_ms=180_000):
    """Wait until the studio page `pg` (Playwright) shows its take done or stopped."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    try:
        pg.wait_for_function("() => ['done', 'stopped'].includes(document.querySelector('#m-state')?.innerText)",
                             timeout=timeout_ms)
    except PlaywrightTimeout:
        raise AssertionError(f"the take did not end in {timeout_ms / 1000:.0f} s: {pg.evaluate(TAKE_STATUS)}") from None


# ------------------------------------------------------------------------------------------ projects
def store_released_without(folder: Path, table: str, column: str):
    """The projects store in `folder` as the release before `column` left it (its `table` without it), opened
    again by today's `Store`: what an upgrade finds."""
    import sqlite3

    from studio.projects.store import Store

    Store(folder).close()
    db = sqlite3.connect(folder / "projects.sqlite3")
    db.execute(f'ALTER TABLE {table} DROP COLUMN "{column}"')
    db.close()
    return Store(folder)


PROJECT_SETTINGS = {"seed": 11, "max_frames": 12}  # a project's takes: reproducible and short


@contextmanager
def running_projects(service, folder: Path):
    """(the projects library, its started job runner) over a store in `folder`; stopped and closed after."""
    from studio.projects.importing import Limits
    from studio.projects.jobs import JobRunner
    from studio.projects.library import Projects
    from studio.projects.store import Store

    store = Store(folder)
    projects = Projects(store, service, limits=Limits(max_chars=5000, max_chapters=8, max_bytes=200_000))
    runner = JobRunner(projects, service)
    runner.start()
    try:
        yield projects, runner
    finally:
        runner.stop()
        store.close()


def wait_job(runner, job_id, states=("done", "failed", "cancelled"), timeout=60):
    """The job's view once it is in one of `states` (it fails the test after `timeout` seconds)."""
    deadline = time.monotonic() + timeout
    while (view := runner.view(job_id))["state"] not in states:
        assert time.monotonic() < deadline, view
        time.sleep(0.05)
    return view


def projects_client(service, studio, key=None):
    """A test client of the HTTP API over `studio` (`running_projects`' pair), behind `key` if given."""
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from studio import api

    projects, runner = studio
    app = FastAPI()
    api.register(app, service, api_key=key, projects=projects, runner=runner)
    return TestClient(app)


# ------------------------------------------------------------------------------------------ kernels
def nan_like(shape, dtype=None):
    """A tensor of NaNs (bf16 unless `dtype`): an output the kernel must overwrite everywhere."""
    import torch

    return torch.full(shape, float("nan"), dtype=dtype or torch.bfloat16)


def gemv_weights(n: int, k: int, fp8: bool):
    """(w, w_scale) of a random [n, k] weight: bf16 with no scale, or FP8 with its per-channel scales."""
    import torch

    from kernels import ops

    w = torch.randn(n, k) * 0.05
    if not fp8:
        return w.to(torch.bfloat16), None
    return ops.quantize_weight_fp8(w)


def gemv_reference(x, w, w_scale=None, x_scale=None, residual=None):
    """float64 y = x·wᵀ (· scales), rounded to bf16, + residual rounded to bf16 — gemv_kernel's contract."""
    import torch

    y = w.double() @ x.double()
    if w_scale is not None:
        y = y * w_scale.double()
    if x_scale is not None:
        y = y * x_scale.double()
    if residual is not None:
        y = y.to(torch.bfloat16).double() + residual.double()
    return y


SAMPLING_CASES = [
    # (temperature, top_k, top_p)
    (0.8, 30, 0.8),       # the product defaults
    (1.0, 0, 1.0),        # plain softmax sampling
    (0.7, 50, 1.0),       # top-k only
    (1.3, 0, 0.9),        # top-p only
    (0.5, 1, 1.0),        # top-k 1
    (1.0, 2000, 0.0),     # top-k disabled (≥ vocab), top-p 0 keeps exactly one
    (1.0, -1, 0.999),
]

# Takes decoded side by side by the batched sampler.
SAMPLER_TAKES = [
    # (temperature, top_k, top_p, seed, step, countdown, done)
    (0.8, 30, 0.8, 2 ** 63 + 12345, 8, -1, 0),    # the defaults; a seed above 2^63
    (0.0, 30, 0.8, 7, 3, -1, 0),                   # greedy, inside the delay window
    (1.3, 0, 0.9, 99, 40, 3, 0),                   # top-p only, in the EOC tail
    (0.7, 50, 1.0, 2 ** 40 + 1, 17, -1, 0),        # top-k only
    (1.0, 2000, 0.999, 5, 120, 1, 0),              # tail ending at this step
]


def scripted_logits(step, overrides):
    """The logits of the sglang trace fixture at `step`: one clear winner per codebook, `overrides` on top."""
    import torch

    logits = torch.zeros(8, 1026)
    for c in range(8):
        logits[c, (10 * c + step) % 1000] = 5.0
        logits[c, 1024] = 4.0
    for o in overrides:
        if o["step"] == step:
            logits[o["codebook"], o["code"]] = 9.0
    return logits


class BrokenJit:
    """Stands in for ops.gemv_kernel / ops.gemm_kernel with one fault. Both take (x/a, W, W_SCALE, x/a
    scale, R, out, ...) positionally, so the fault is applied by position."""

    W, W_SCALE, OUT = 1, 2, 5

    def __init__(self, jit, fault: str):
        self.jit, self.fault = jit, fault

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            args = list(args)
            if self.fault == "transposed":  # the kernel reads the weight in the other layout
                args[self.W] = args[self.W].t().contiguous().view(args[self.W].shape)
            if self.fault == "scale16" and kwargs.get("HAS_W_SCALE"):
                args[self.W_SCALE] = args[self.W_SCALE] * 16
            self.jit[grid](*args, **kwargs)
            if self.fault == "zeroed":
                args[self.OUT].zero_()
        return launch


# ------------------------------------------------------------------------------------------ manifests, SASS
# The toolchain the test manifests record.
TOOLCHAIN = mf.Toolchain(ptxas="12.9", elf_abi=7, min_driver_cuda=12000, min_driver="525.60.13")


def kernel_entry(signature: dict[str, str], **kw) -> mf.KernelEntry:
    """A manifest entry for a kernel with `signature`; `kw` overrides its fields."""
    base = dict(name="k", symbol="k", cubin="k.cubin", sha256="0" * 64, module="m", num_warps=4, num_stages=3,
                num_ctas=1, shared=0, static_shared=0, global_scratch_size=0, global_scratch_align=1,
                profile_scratch_size=0, profile_scratch_align=1, constexprs={}, params=mf.make_params(signature))
    return mf.KernelEntry(**{**base, **kw})


def one_kernel_root(root: Path, entry: mf.KernelEntry) -> Path:
    """A committed-cubin folder for sm_120a under `root` holding the one kernel `entry` names ("scale")."""
    d = root / "sm_120a"
    d.mkdir()
    (d / "scale.cubin").write_bytes(b"ELF")
    (d / mf.MANIFEST).write_text(mf.Manifest(cc=120, target="sm_120a", triton="3.9.0", sources={},
                                             kernels={"scale": entry}, root=d, toolchain=TOOLCHAIN).to_json())
    return d


def committed_cubins(prefix: str = "") -> list[tuple[int, str]]:
    """(arch, kernel name) of every committed cubin whose name starts with `prefix` (the SASS tests' inputs)."""
    out = []
    for cc, target in mf.TARGETS.items():
        if (mf.CUBIN_DIR / target / mf.MANIFEST).exists():
            out += [(cc, name) for name in mf.load(cc).kernels if name.startswith(prefix)]
    return out


@cache
def _cuobjdump_tools() -> tuple[str, dict]:
    """cuobjdump (pip nvidia-cuda-cuobjdump 13.x, else the one in Triton's wheel) and an environment
    whose PATH finds Triton's nvdisasm, which `cuobjdump -sass` runs."""
    triton = pytest.importorskip("triton", reason="Triton is not installed (pip install -r requirements-dev.txt)")
    triton_bin = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    candidates = []
    try:
        import nvidia

        candidates += [Path(p) / "cu13" / "bin" / "cuobjdump" for p in nvidia.__path__]
    except ImportError:
        pass
    candidates.append(triton_bin / "cuobjdump")
    exe = next((str(c) for c in candidates if c.exists()), None) or shutil.which("cuobjdump")
    if exe is None:
        pytest.skip("no cuobjdump (pip install nvidia-cuda-cuobjdump)")
    env = dict(os.environ, PATH=f"{triton_bin}{os.pathsep}{os.environ.get('PATH', '')}")
    return exe, env


@cache
def _cuobjdump(flag: str, cubin: Path, digest: str) -> str:
    exe, env = _cuobjdump_tools()
    out = subprocess.run([exe, flag, str(cubin)], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


def cuobjdump(flag: str, cubin: Path) -> str:
    """Output of `cuobjdump <flag> <cubin>`, cached per file content (the large sampler takes seconds)."""
    return _cuobjdump(flag, cubin, mf.sha256(cubin.read_bytes()))


def sass_ops(cubin: Path) -> list[str]:
    """The opcodes of the cubin's SASS, in order."""
    return re.findall(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.x]+)", cuobjdump("-sass", cubin))


SASS_LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.x]+)\s*([^;]*);")


def sass_instructions(cubin) -> list[tuple[int, str, str]]:
    """(address, opcode, operands) of every SASS instruction."""
    return [(int(a, 16), op, args.strip()) for a, _, op, args in SASS_LINE.findall(cuobjdump("-sass", cubin))]
