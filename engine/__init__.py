"""Higgs Audio v3 TTS engine: text → prompt → delayed rows → frames → 24 kHz waveform.

`from engine import Engine` is the public entry point (see docs/ARCHITECTURE.md). Names are imported
lazily so `import engine.config` (and the kernels' build tools) do not pay for torch and the codec.
"""

_EXPORTS = {"Engine": "generate", "Chunk": "types", "Metrics": "types", "SamplingParams": "types",
            "EngineInfo": "types", "SpeechEngine": "types", "Prompt": "prompt", "VoiceRef": "prompt",
            "load_checkpoint": "checkpoint"}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        import importlib
        return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module 'engine' has no attribute {name!r}")
