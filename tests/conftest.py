"""Shared fixtures. `../shared/parity` sits beside the clone in CI, not in a user's fresh clone: tests
that read it skip with the reason when it is absent."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

# Kernel tests run Triton's CPU interpreter. Triton decides when a module is imported whether its
# @triton.jit functions are interpreted, so the variable must be set before any test imports kernels/;
# the ahead-of-time cubin build runs in subprocesses with it switched off (kernels/build.py).
os.environ.setdefault("TRITON_INTERPRET", "1")
# Two test workers share the CI machine's two cores. torch's OpenMP threads spin while they wait for one another,
# and beside the other worker one of them is often off its core: its sibling then spins away that worker's time.
# Passive waiting puts a waiting thread to sleep instead; thread counts and results are unchanged. libgomp reads
# the variable when torch loads it, so it is set before any test imports torch (workers and the studios they
# start inherit it). Beside a process running torch on its two threads, as the other worker does:
# tests/test_engine.py 41 s → 15 s, tests/test_quant.py 47-54 s → 28 s; alone, test_engine.py 15.5 s → 15.3 s.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# Saved voices' kept prompt prefixes (studio/voices/warm.py) go to one folder per test run, never the user's cache.
if "HIGGS_STUDIO_PREFIXES" not in os.environ:
    import tempfile

    os.environ["HIGGS_STUDIO_PREFIXES"] = tempfile.mkdtemp(prefix="higgs-prefixes-")

import pytest  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("HIGGS_SHARED", REPO.parent / "shared"))
PARITY = SHARED / "parity"
ARTIFACTS = REPO / "artifacts"


def pytest_report_header(config):
    """The CPU the suite ran on: float kernels differ between CPU kinds (AVX-512 with or without bf16,
    AVX2), so every equality claim in this suite must hold on each, and a failure report names which."""
    from engine.cpu import cpu_facts

    facts = cpu_facts()
    return (f"cpu: {facts['cpu']} ({', '.join(facts['isa']) or 'no AVX'}), torch kernels {facts['kernels']}, "
            f"native bf16 {facts['native_bf16']}, {os.cpu_count()} cores")


# CI sets HIGGS_REQUIRE_PARITY=1 (.ci/run): there a missing fixture fails the run instead of skipping
# the parity tier silently. A user's fresh clone still skips, with the reason.
REQUIRE_PARITY = os.environ.get("HIGGS_REQUIRE_PARITY") == "1"


def parity_missing(what: str) -> None:
    """Skip (fresh clone) or fail (CI) because the parity fixture `what` is absent."""
    message = f"parity fixture not found at {what} (it ships beside the repo in CI, not in a fresh clone)"
    if REQUIRE_PARITY:
        pytest.fail(f"{message}; HIGGS_REQUIRE_PARITY=1 makes this a failure")
    pytest.skip(message)


@pytest.fixture(scope="session")
def parity_dir() -> Path:
    if not (PARITY / "tiny_checkpoint" / "model.safetensors").exists():
        parity_missing(str(PARITY))
    return PARITY


@pytest.fixture(scope="session")
def artifacts_dir() -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    return ARTIFACTS


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory) -> Path:
    """A tiny random checkpoint with its codec in the real layout (engine.demo, so no parity fixture is
    needed), written once per session for the tests that build engines of their own on it."""
    from engine.demo import write_tiny_checkpoint

    return write_tiny_checkpoint(tmp_path_factory.mktemp("tiny") / "ckpt", seed=5)


@pytest.fixture(scope="session")
def demo_cache(tmp_path_factory) -> Path:
    """A studio cache (HIGGS_STUDIO_CACHE) that already holds the demo checkpoint and the reference tokenizer,
    for the subprocesses that run `--demo` (`python -m engine say`): in an empty cache each would build both
    again (~9 s). A copy of this process's own, so no subprocess writes to the user's cache."""
    from engine.demo import demo_checkpoint, reference_tokenizer_path

    root = tmp_path_factory.mktemp("higgs-cache")
    checkpoint = demo_checkpoint()
    shutil.copytree(checkpoint, root / checkpoint.name)
    shutil.copy2(reference_tokenizer_path(), root)
    return root


@pytest.fixture(scope="session")
def shared_engine():
    """The one factory of in-process engines: `shared_engine(checkpoint=None, *, device="cpu", precision="auto",
    max_batch=16)` is `Engine.load` of `checkpoint` (None: the demo checkpoint behind `--demo`) with these
    settings, loaded once per test process and shared by every file that asks for the same. A load costs ~2 s
    here (the tokenizer, the codec) and an engine's first take ~1 s of warm-up, once instead of once per file.
    Sharing changes no claim: a take's codes depend neither on its company nor on what ran before (batch
    invariance), and a prefix is reused only by a prompt that starts with it, so each file builds its own voices
    and prompts. A test about a cold engine (nothing in its prefix cache) loads one of its own."""
    from engine.demo import demo_checkpoint
    from engine.device import resolve_device
    from engine.generate import DEFAULT_MAX_BATCH, Engine

    built = {}

    def engine(checkpoint=None, *, device="cpu", precision="auto", max_batch=DEFAULT_MAX_BATCH):
        root = Path(checkpoint if checkpoint is not None else demo_checkpoint()).resolve()
        key = (root, str(resolve_device(device)), precision, max_batch)
        if key not in built:
            built[key] = Engine.load(root, device=device, precision=precision, max_batch=max_batch)
        return built[key]

    return engine


@pytest.fixture(scope="session")
def interp_take(parity_dir) -> dict:
    """The cubin backend's greedy take under the interpreter beside the torch reference (tests/interp_step.py):
    minutes of interpreter time, built once for tests/test_kernels_step.py and tests/test_kernels_v2_step.py."""
    from tests.interp_step import greedy_take

    return greedy_take(parity_dir)


# ------------------------------------------------------------------------------------------ torch threads
# A file marked `demo_threads` runs the demo engine in process as the app runs it: one torch thread
# (engine.cpu.tune_threads: the demo is all small ops, where OpenMP's threads cost more than they save).
# Beside the second test worker on the 2-core CI machine a 20k-character long take took 17.0 s with torch's two
# threads, 7.1 s with one. Every other test keeps torch's own count, so what the CPU paths claim (batch
# invariance, parity) is checked with the threads a big model runs with. The count is set when a file starts,
# before its own fixtures (autouse comes first in its scope), so the threads its engines start take it up.
_TORCH_THREADS: list[int] = []


@pytest.fixture(scope="module", autouse=True)
def torch_threads(request):
    import torch

    if not _TORCH_THREADS:
        _TORCH_THREADS.append(torch.get_num_threads())
    want = 1 if request.node.get_closest_marker("demo_threads") else _TORCH_THREADS[0]
    if torch.get_num_threads() != want:
        torch.set_num_threads(want)


# ------------------------------------------------------------------------------------------ the browser
# Debian's Chromium (apt-get install chromium), driven by Playwright: CI never runs `playwright install`.
# --no-sandbox: root in CI; the background-networking flags stop Chromium's calls home, which this machine's
# closed network refuses many at a time; autoplay: the live player starts without a click on the page.
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--autoplay-policy=no-user-gesture-required", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@pytest.fixture(scope="module")
def chromium():
    """Headless Chromium (a Playwright `Browser`) for one file; skips with the reason when Chromium or
    Playwright is missing. Not one per session: while Playwright's sync API is open its thread has a running
    event loop, and a later file's `asyncio.run` would refuse to start (a launch costs ~1 s)."""
    if not CHROMIUM.exists():
        pytest.skip(f"Debian chromium is not installed at {CHROMIUM} (apt-get install chromium)")
    pytest.importorskip("playwright.sync_api", reason="playwright (python) is not installed")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


# ------------------------------------------------------------------------------------------ shared studios

# Started once per test process for the files that only need one running. Files share a studio's voice
# library: a test counts only the voices it saved.

@pytest.fixture(scope="session")
def demo_studio(tmp_path_factory):
    """`app.py --demo`, no key: the owner's page as a local user sees it."""
    from tests.studio_server import shared_studio

    yield from shared_studio(tmp_path_factory)


@pytest.fixture(scope="session")
def keyed_studio(tmp_path_factory):
    """`app.py --demo --mcp --api-key SECRET`: the owner's API, page (behind a login) and MCP tools."""
    from tests.studio_server import KEY, shared_studio

    yield from shared_studio(tmp_path_factory, "--mcp", "--api-key", KEY)


@pytest.fixture(scope="session")
def public_studio(tmp_path_factory):
    """`app.py --demo --api-key SECRET --public-page`: a Space's public page."""
    from tests.studio_server import KEY, shared_studio

    yield from shared_studio(tmp_path_factory, "--api-key", KEY, "--public-page")


@pytest.fixture(scope="session")
def space_studio(tmp_path_factory):
    """`app.py --demo --api-key SECRET --public-page --private-voices`, started as a Space starts: visitors keep
    their voices in their browsers, and every file the server writes lands under its `root`."""
    from tests.studio_server import KEY, shared_studio

    yield from shared_studio(tmp_path_factory, "--api-key", KEY, "--public-page", "--private-voices", contained=True)


# ------------------------------------------------------------------------------------------ two workers
# `--dist loadgroup` (pyproject.toml) hands each worker whole groups. A file is a group of its own, so its
# module-scoped servers and models are built once; the files that use one of these session fixtures join one
# group, so it is built once in all.
SHARED_FIXTURES = ("demo_studio", "keyed_studio", "public_studio", "space_studio", "interp_take")
# The files (or groups, named by one file) that ran longest on the 2-core CI machine (`--durations`), longest
# first. They are handed out first: a long file handed out last keeps one worker busy while the other has
# nothing left to do.
LONGEST_FIRST = ("test_self_check.py", "test_cubin_batch.py", "test_security.py", "test_cubin_backend.py",
                 "test_live_player.py", "test_kernels_v2_step.py", "test_kernels_build.py", "test_quant.py",
                 "test_kernels_step.py", "test_studio_browser.py", "test_projects_view.py", "test_torch_graph.py",
                 "test_gpu_check.py", "test_codec.py", "test_engine.py", "test_batch.py", "test_scheduler_faults.py",
                 "test_wyoming.py", "test_speech_ws.py", "test_remote_servers.py", "test_spaces_browser.py",
                 "test_longform_api.py", "test_projects_kill.py", "test_app.py", "test_longform_cli.py",
                 "test_projects.py", "test_projects_finish.py", "test_captions.py", "test_cli.py", "test_dictionary.py",
                 "test_loudness.py", "test_zerogpu.py")


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the xdist_group marks
def pytest_collection_modifyitems(config, items):
    if not config.getoption("loadgroup", default=False):  # set in the workers of `--dist loadgroup`
        return
    links: dict[str, str] = {}  # union-find over file names and shared fixture names

    def root(name: str) -> str:
        while links.get(name, name) != name:
            name = links[name]
        return name

    for item in items:
        for fixture in SHARED_FIXTURES:
            if fixture in item.fixturenames:
                a, b = root(item.path.name), root(fixture)
                links[max(a, b)] = min(a, b)
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    first: dict[str, int] = {}  # a group's place: that of its longest file
    for n, item in enumerate(items):
        group = root(item.path.name)
        first[group] = min(first.get(group, len(rank) + n), rank.get(item.path.name, len(rank) + n))
    for item in items:
        item.add_marker(pytest.mark.xdist_group(root(item.path.name)))
    items.sort(key=lambda item: first[root(item.path.name)])  # stable: a file keeps its order
