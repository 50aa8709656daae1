"""Higgs Audio v2 codec: frames of 8 codes ↔ 24 kHz audio (see `model.Codec`)."""

from .model import Codec
from .random import random_codec_state_dict, tiny_codec_config
from .stream import StreamDecoder

__all__ = ["Codec", "StreamDecoder", "random_codec_state_dict", "tiny_codec_config"]
