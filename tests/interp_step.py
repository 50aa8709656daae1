"""The greedy take of the cubin backend's step under Triton's CPU interpreter, on the tiny parity checkpoint,
beside a plain torch reference step that rounds to bf16 where the kernels store bf16: the expensive setup
(minutes of interpreter time) that tests/test_kernels_step.py and tests/test_kernels_v2_step.py both check,
built once per session by the `interp_take` fixture (tests/conftest.py)."""

from __future__ import annotations

import json
import math
from contextlib import contextmanager

import torch
import torch.nn.functional as F

from engine.backends.cubin import CubinBackend
from engine.checkpoint import load_checkpoint
from engine.config import Dims
from kernels import ops
from tests import interp_rounding

interp_rounding.install()

BF16 = torch.bfloat16
STEPS = 20      # greedy BF16 rows
FP8_STEPS = 8   # FP8 logits, teacher-forced on the first BF16 rows
MAX_LEN = 64
# Interpreter cost grows with programs × loop steps, not FLOPs. The head's 8208 rows take 513 programs with the
# production 16-row tile (~7 s per launch here), GEMVs 8 rows per program, and 16 decode-attention splits are
# mostly empty at these lengths; the production tilings are covered by test_kernels_interp (and the v2
# kernels' by test_kernels_fused), so the take runs the same kernels with fewer, larger programs.
FAST_TILES = {"HEAD_TILES": dict(BLOCK_N=2048, BLOCK_K=64), "DECODE_TILES": dict(NUM_SPLITS=4),
              "GEMV_TILES": {"bf16": dict(BLOCK_N=64, BLOCK_K=256), "fp8": dict(BLOCK_N=64, BLOCK_K=512)}}


@contextmanager
def fast_tiles():
    """`ops` with FAST_TILES (the v1 GEMVs' and the v2 GEMVs' alike), restored afterwards."""
    saved = {name: dict(getattr(ops, name)) for name in [*FAST_TILES, "GEMV2_TILES"]}
    for name, tiles in FAST_TILES.items():
        getattr(ops, name).update(tiles)
    ops.GEMV2_TILES.update(FAST_TILES["GEMV_TILES"])
    try:
        yield
    finally:
        for name, tiles in saved.items():
            getattr(ops, name).update(tiles)


def r(t):
    """Round to bf16 values (kept in fp32): what storing a tensor in bf16 does."""
    return t.to(BF16).float()


class Weights:
    """The tiny checkpoint for the torch reference, in kernel layout: fused qkv and gate_up, bf16."""

    def __init__(self, root):
        from safetensors.torch import load_file

        self.dims = Dims.from_file(root / "config.json")
        sd = load_file(str(root / "model.safetensors"))
        b = lambda k: sd[k].to(BF16).contiguous()  # noqa: E731
        self.layers = []
        for i in range(self.dims.layers):
            p = f"body.layers.{i}."
            self.layers.append(dict(
                qkv=torch.cat([b(p + f"self_attn.{n}_proj.weight") for n in "qkv"]).contiguous(),
                o=b(p + "self_attn.o_proj.weight"),
                gate_up=torch.cat([b(p + "mlp.gate_proj.weight"), b(p + "mlp.up_proj.weight")]).contiguous(),
                down=b(p + "mlp.down_proj.weight"),
                in_norm=b(p + "input_layernorm.weight"), post_norm=b(p + "post_attention_layernorm.weight"),
                q_norm=b(p + "self_attn.q_norm.weight"), k_norm=b(p + "self_attn.k_norm.weight")))
        self.norm = b("body.norm.weight")
        self.audio = b("tied.embedding.modality_embeddings.0.embedding.weight")
        self.text = sd["tied.embedding.text_embedding.weight"].to(BF16)


class TorchReference:
    """Plain torch step with the kernels' storage points (bf16) and fp32 math in between."""

    def __init__(self, w: Weights):
        d = w.dims
        self.w, self.d = w, d
        self.k = torch.zeros(d.layers, d.kv_heads, MAX_LEN, d.head_dim)
        self.v = torch.zeros(d.layers, d.kv_heads, MAX_LEN, d.head_dim)
        cos, sin = ops.rope_tables(d.rope_theta, d.head_dim, MAX_LEN)
        self.cos, self.sin = cos.float(), sin.float()

    def _norm(self, x, w):
        return r(x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.d.rms_eps) * w.float())

    def _rope(self, t, pos):
        half = t.shape[-1] // 2
        rot = torch.cat([-t[..., half:], t[..., :half]], -1)
        return r(t * self.cos[pos][:, None] + rot * self.sin[pos][:, None])

    def forward(self, x, start):
        d, n = self.d, x.shape[0]
        x = x.float()
        pos = torch.arange(start, start + n)
        group = d.heads // d.kv_heads
        for i, lw in enumerate(self.w.layers):
            hn = self._norm(x, lw["in_norm"])
            qkv = r(hn @ lw["qkv"].float().T).view(n, -1, d.head_dim)
            q = self._rope(self._norm(qkv[:, :d.heads], lw["q_norm"]), pos)
            k = self._rope(self._norm(qkv[:, d.heads:d.heads + d.kv_heads], lw["k_norm"]), pos)
            self.k[i, :, start:start + n] = k.transpose(0, 1)
            self.v[i, :, start:start + n] = qkv[:, d.heads + d.kv_heads:].transpose(0, 1)
            keys = self.k[i, :, :start + n].repeat_interleave(group, 0)       # [heads, T, D]
            vals = self.v[i, :, :start + n].repeat_interleave(group, 0)
            scores = torch.einsum("nhd,htd->hnt", q, keys) / math.sqrt(d.head_dim)
            causal = torch.arange(start + n)[None, :] <= pos[:, None]
            p = torch.softmax(scores.masked_fill(~causal, float("-inf")), -1)
            a = r(torch.einsum("hnt,htd->nhd", p, vals)).reshape(n, -1)
            x = r(r(a @ lw["o"].float().T) + x)
            hn2 = self._norm(x, lw["post_norm"])
            gu = r(hn2 @ lw["gate_up"].float().T)
            g, u = gu.chunk(2, -1)
            act = r(F.silu(g) * u)
            x = r(r(act @ lw["down"].float().T) + x)
        return (self._norm(x[-1], self.w.norm) @ self.w.audio.float().T).view(d.codebooks, d.codebook_vocab)


def embed_row(w, row):
    d = w.dims
    return r(w.audio[torch.as_tensor(row) + d.codebook_vocab * torch.arange(d.codebooks)].float().sum(0))


def greedy_take(parity_dir) -> dict:
    """Prefill, then STEPS greedy rows through the BF16 backend's device-sampling loop (sampler kernel, fused
    embedding, the default step), each step's logits beside the reference's fed the reference's own rows;
    then FP8 v1 and v2 teacher-forced on the BF16 rows. Lists of logits start with the prefill's."""
    root = parity_dir / "tiny_checkpoint"
    with fast_tiles():
        w = Weights(root)
        ckpt = load_checkpoint(root, progress=False)
        d = ckpt.dims
        prompt = json.loads((parity_dir / "zero_shot.json").read_text())
        ids = torch.tensor(prompt["prompt_ids"])
        ref = TorchReference(w)
        be = CubinBackend(d, ckpt.backbone, ops=ops, device="cpu", precision="bf16", max_len=MAX_LEN)
        take = dict(w=w, prompt=prompt, parity_dir=parity_dir, kern=[be.prefill(ids, None, 0)],
                    ref=[ref.forward(w.text[ids].float(), 0)], kern_rows=[], ref_rows=[])
        n0 = len(ids)
        # Each rows(1) samples a row on the device (the sampler kernel, which also writes the next input
        # embedding) and runs the step that feeds it.
        be.begin(take["kern"][0], n0, seed=0, temperature=0.0, top_k=0, top_p=1.0, max_rows=STEPS)
        for s in range(STEPS):
            ref_row = take["ref"][-1].argmax(-1)
            ref_row[s + 1:] = d.boc
            take["ref_rows"].append(ref_row.tolist())
            rows, _ = be.rows(1)
            take["kern_rows"].append(rows[0].tolist())
            take["kern"].append(be.logits.view(d.codebooks, d.codebook_vocab).clone())
            take["ref"].append(ref.forward(embed_row(w, ref_row)[None], n0 + s))
        take["x_next"], take["ref_x_next"] = be.x_row.view(-1), embed_row(w, take["ref_rows"][-1])

        # FP8: each backend calibrates its static activation scales on its built-in prompt (2 decode steps
        # instead of 16: the interpreter is slow), then runs teacher-forced on the BF16 rows.
        for variant in ("v1", "v2"):
            be8 = CubinBackend(d, ckpt.backbone, ops=ops, device="cpu", precision="fp8", max_len=MAX_LEN,
                               calibration_steps=2, variant=variant)
            logits = [be8.prefill(ids, None, 0)]
            for s in range(FP8_STEPS - 1):
                logits.append(be8.decode(torch.tensor(take["kern_rows"][s]), n0 + s))
            take[f"fp8_{variant}"] = logits
    return take
