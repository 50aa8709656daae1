"""engine/types.py: one set of sampling defaults and limits, one validation, 63-bit seeds everywhere (drawn
ones below 2**31), and the `SpeechEngine` interface both engines implement."""

import json
import subprocess
import sys

import httpx
import numpy as np
import pytest

from engine.types import (DEFAULT_REPEAT_GUARD, DEFAULT_TEMPERATURE, DEFAULT_TOP_K, DEFAULT_TOP_P, MAX_FRAMES,
                          MAX_SEED, MAX_TEMPERATURE, SEED_LIMIT, SamplingParams, SpeechEngine)
from tests.conftest import REPO


def test_defaults_are_the_products():
    p = SamplingParams()
    assert (p.temperature, p.top_k, p.top_p, p.repeat_guard) == (0.8, 30, 0.8, 32)
    assert (DEFAULT_TEMPERATURE, DEFAULT_TOP_K, DEFAULT_TOP_P, DEFAULT_REPEAT_GUARD) == (0.8, 30, 0.8, 32)
    assert p.seed is None and p.max_frames is None


@pytest.mark.parametrize("bad", [dict(seed=2 ** 63), dict(seed=-1), dict(seed=1.5), dict(temperature=-0.1),
                                 dict(temperature=float("nan")), dict(temperature=2.5), dict(top_k=-1), dict(top_k=2.5), dict(top_k=True),
                                 dict(top_p=0), dict(top_p=1.5), dict(max_frames=0), dict(max_frames=2.0),
                                 dict(max_frames=MAX_FRAMES + 1), dict(repeat_guard=1)])
def test_one_validation_with_sentences(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        SamplingParams(**bad)


def test_seeds_are_63_bit_and_options_merge():
    assert SamplingParams(seed=MAX_SEED).seed == 2 ** 63 - 1 == SEED_LIMIT - 1
    assert SamplingParams(seed=np.int64(5)).seed == 5 and type(SamplingParams(seed=np.int64(5)).seed) is int
    drawn = SamplingParams().resolved()
    assert 0 <= drawn.seed < 2 ** 31 and drawn.resolved() is drawn  # drawn seeds stay exact in the browser
    merged = SamplingParams.of(SamplingParams(temperature=0.5, seed=3), top_k=5)
    assert (merged.temperature, merged.top_k, merged.seed) == (0.5, 5, 3)
    with pytest.raises(TypeError, match="tempreature"):
        SamplingParams.of(tempreature=1.0)


def test_the_limits_are_inclusive():
    edge = SamplingParams(temperature=MAX_TEMPERATURE, top_k=0, top_p=1.0, max_frames=MAX_FRAMES, repeat_guard=2)
    assert (edge.temperature, edge.max_frames) == (2.0, 8192)


def test_studio_and_voice_library_accept_the_same_seeds():
    from studio.voices.model import VoiceError, clean_seed
    assert clean_seed(MAX_SEED) == MAX_SEED
    with pytest.raises(VoiceError, match="2\\*\\*63"):
        clean_seed(SEED_LIMIT)


def test_both_engines_are_speech_engines(parity_dir):
    from engine.generate import Engine
    from engine.remote import RemoteEngine
    engine = Engine.load(parity_dir / "tiny_checkpoint", device="cpu", precision="fp32")
    remote = RemoteEngine("http://s", transport=httpx.MockTransport(lambda r: httpx.Response(404)))
    assert isinstance(engine, SpeechEngine) and isinstance(remote, SpeechEngine)


def test_remote_takes_params_and_does_not_load_torch():
    from engine.remote import RemoteEngine
    seen = []

    def handler(request):
        if request.url.path != "/v1/audio/speech":  # the client's questions about the server: none answered
            return httpx.Response(404)
        seen.append(request.content)
        return httpx.Response(200, content=b"\0\0" * 960, headers={"content-type": "audio/pcm"})

    remote = RemoteEngine("http://s", transport=httpx.MockTransport(handler))
    list(remote.generate_stream("Hi.", params=SamplingParams(temperature=0.3, top_k=7, seed=9, repeat_guard=None)))
    body = json.loads(seen[0])
    # the params' sampling fields travel; `repeat_guard` is this studio's own field, sent only to a studio
    assert (body["temperature"], body["top_k"], body["seed"]) == (0.3, 7, 9) and "repeat_guard" not in body
    code = "import sys, engine.remote, engine.types; sys.exit('torch' in sys.modules or 'engine.generate' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], cwd=REPO).returncode == 0
