"""Small numeric helpers the tests share (one definition each)."""

import torch
import torch.nn.functional as F

from engine.model import rel_error as rel_err  # max|x − ref| / max|ref|, the parity fixture's metric


def cosine(a, b) -> float:
    """Cosine similarity of two tensors of any shape, in float64."""
    return float(F.cosine_similarity(a.double().flatten(), b.double().flatten(), dim=0))


def random_codes(frames: int, seed: int) -> torch.Tensor:
    """Codec codes [frames, 8] in 0..1023, deterministic for a seed."""
    return torch.randint(0, 1024, (frames, 8), generator=torch.Generator().manual_seed(seed))


__all__ = ["cosine", "rel_err", "random_codes"]
