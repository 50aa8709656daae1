"""The benchmark scripts run (tiny sizes) and their prechecks hold. They assert no timings: benchmarks
print tables; these machines are shared and noisy."""

from __future__ import annotations

import torch

from bench import cpu
from bench.common import Table, decode_weight_bytes
from engine.demo import random_backbone
from engine.config import FULL_SIZE
from engine.model import HiggsModel, rel_error


def test_transformers_twin_matches_engine_logits():
    """The side-by-side comparison is only meaningful if both implementations compute the same thing."""
    dims = cpu.SMOKE
    model = HiggsModel.from_state_dict(dims, random_backbone(dims, seed=3, names="internal"), max_len=64)
    twin = cpu.TwinRunner(model, cpu.transformers_twin(model))
    prompt = torch.arange(100, 112)
    assert rel_error(model.prefill(prompt, None, 0), twin.prefill(prompt)) < 1e-4
    row = torch.tensor([5, 1024, 1024, 1024, 1024, 1024, 1024, 1024])
    assert rel_error(model.decode(row, 12), twin.decode(row, 12)) < 1e-4
    # and the twin really is a different computation on the same tensors, not the same module
    assert twin.twin.layers[0].self_attn.q_proj.weight.data_ptr() == model.layers[0].self_attn.q_proj.weight.data_ptr()


def test_decode_weight_bytes_full_size():
    # 36 layers × (attention 2·4096·2560 + 2·1024·2560, MLP 3·9728·2560) + head 8208·2560, in bf16
    per_layer = 2560 * (2 * 4096 + 2 * 1024) + 3 * 2560 * 9728
    assert decode_weight_bytes(FULL_SIZE, 2) == 2 * (36 * per_layer + 8208 * 2560)
    assert 7.2e9 < decode_weight_bytes(FULL_SIZE, 2) < 7.4e9
    # the fp8 GPU path: 1-byte layer matrices, the head kept in bf16
    assert decode_weight_bytes(FULL_SIZE, 1, head_bytes_per_weight=2) == 36 * per_layer + 2 * 8208 * 2560


def test_cpu_bench_smoke_prints_tables(capsys):
    assert cpu.main(["--smoke"]) == 0
    out = capsys.readouterr().out
    assert "### Backbone decode step" in out and "ratio transformers / engine" in out
    assert "precheck: smoke: logits max rel err" in out
    assert "### Codec" in out and "decode, streamed" in out and "encode" in out
    assert "### End to end" in out


def test_table_markdown():
    text = Table("t", ["a", "b"], [[1.23456, "x"], [12345.6, 2]]).markdown()
    assert text.splitlines()[2] == "| a | b |" and "| 1.23 | x |" in text and "| 12346 | 2 |" in text


def test_cpu_bench_batch_section_smoke(capsys):
    assert cpu.main(["--smoke", "--only", "batch"]) == 0
    out = capsys.readouterr().out
    assert "### Batched takes, smoke fp32" in out and "frames/s (all takes)" in out and ("| 1, padded to " in out or "| 1, no padding" in out)
    lines = [line for line in out.splitlines() if line.startswith("| smoke fp32 | ")]
    assert [line.split(" | ")[1] for line in lines[:4]] == ["1", "2", "4", "8"]
    assert lines[3].split(" | ")[-1].strip(" |") == "8"  # the eight takes really ran as one batch


def test_cpu_bench_precision_section_smoke(capsys, tmp_path):
    """The precision section on the smoke size: a checkpoint written in the real layout, loaded as bf16,
    int8 and int4, timed and compared, and the int8 load probed in a fresh process."""
    assert cpu.main(["--smoke", "--only", "precision", "--precision-dir", str(tmp_path / "ckpt")]) == 0
    out = capsys.readouterr().out
    assert "### CPU precisions at full size" in out and "### Fidelity against bf16" in out and "peak RSS GB" in out
    speed = {line.split(" | ")[0].strip("| "): line for line in out.splitlines() if line.startswith(("| bf16 |", "| int8 |", "| int4 |"))}
    assert set(speed) == {"bf16", "int8", "int4"}
    probe = [line for line in out.splitlines() if line.startswith("| int8 | ") and line.endswith("| int8 |")]
    assert len(probe) == 1 and float(probe[0].split(" | ")[1]) > 0  # the fresh-process load ran int8


def test_cpu_bench_step_section_smoke(capsys):
    """The step section: bf16 and int8 side by side, each step beside its GEMV-only time, prefill at 40 and
    300 tokens, first audio zero-shot and for a saved voice cold and warm, and the peak RSS."""
    assert cpu.main(["--smoke", "--only", "step"]) == 0
    out = capsys.readouterr().out
    assert "### Decode step and prefill" in out and "GEMV-only ms c=1" in out and "prefill 300 tok ms" in out
    assert "### Time to first audio" in out and "saved voice warm ms" in out and "peak RSS of this process" in out
    first_audio = [line for line in out.splitlines() if line.startswith(("| bf16 |", "| int8 |"))][-2:]
    assert [line.split(" | ")[0] for line in first_audio] == ["| bf16", "| int8"]
    assert all(int(line.split(" | ")[5]) > 20 for line in first_audio)  # the clip's prefix was kept


def test_prefill_gemm_bench_smoke_prints_its_table_and_int_mm_exactness(capsys):
    from bench import prefill_gemm

    assert prefill_gemm.main(["--smoke", "--rows", "16"]) == 0
    out = capsys.readouterr().out
    assert "| one layer |" in out and "| ÷ bf16 |" in out and "torch._int_mm W8A8" in out
    assert "torch._int_mm against the exact integer product" in out
