"""The device check's engine sections (bench/gpu_engine.py) without a GPU: the gap-free rate over streams'
chunk arrivals, the calibration rows, and the engine pass's sections. The engine section itself runs in
the CPU self-test (tests/test_gpu_check.py)."""

import re
from argparse import Namespace
from pathlib import Path

import pytest
import torch

from bench import gpu_check, gpu_engine
from engine.backends.calibration import Calibration


def test_a_stream_in_real_time_or_ahead_of_it_is_gap_free_whenever_its_first_chunk_came():
    assert gpu_engine.worst_lag([5.0, 5.5, 6.0], [0.5, 0.5, 0.5]) == 0.0      # the first chunk's wait is TTFA
    assert gpu_engine.worst_lag([0.0, 0.1, 0.2, 2.9], [1.0] * 4) == 0.0      # the buffer covers a late chunk
    assert gpu_engine.gap_free_rate([([5.0, 5.5, 6.0], [0.5] * 3), ([0.0, 0.1, 0.2, 2.9], [1.0] * 4)]) == 1.0


def test_lateness_accumulates_and_more_than_the_tolerance_is_a_gap():
    assert gpu_engine.worst_lag([0.0, 1.15], [1.0, 1.0]) == pytest.approx(0.15)
    assert gpu_engine.worst_lag([0.0, 1.0625], [1.0, 1.0]) == 0.0625            # one 62 ms stall: no gap yet
    # two 62 ms stalls: 125 ms behind real time by the third chunk
    assert gpu_engine.worst_lag([0.0, 1.0625, 2.125], [1.0, 1.0, 1.0]) == 0.125
    streams = [([0.0, 1.0625], [1.0, 1.0]), ([0.0, 1.0625, 2.125], [1.0] * 3), ([], []), ([0.0, 1.25], [1.0, 1.0])]
    assert gpu_engine.gap_free_rate(streams) == 0.25                           # no chunk at all is a gap too
    assert gpu_engine.gap_free_rate(streams, tolerance_s=0.25) == 0.75         # the tolerance is inclusive
    assert gpu_engine.gap_free_rate([]) == 0.0


def test_calibration_rows_give_the_summary_each_kinds_rates_and_one_row_per_layer():
    kinds = ("text", "voice clone", "long context")
    # layer 0: every scale set by the long context; layer 1: qkv and gate_up by the clone, down by the text
    amax = torch.tensor([[[1.0, 1.0, 1.0], [1.0, 1.0, 5.0]],
                         [[1.0, 1.0, 1.0], [3.0, 3.0, 1.0]],
                         [[2.0, 2.0, 2.0], [1.0, 1.0, 1.0]]])
    values = torch.full((3, 2, 3), 1000)
    underflow = torch.zeros(3, 2, 3, dtype=torch.long)
    underflow[2, 1, 2] = 30   # the long context: 30 of its 1000 values at layer 1's down input round to zero
    calib = Calibration(kinds=kinds, positions=(37, 300, 2048), amax=amax, scales=amax.amax(0) * 2 / 448,
                        values=values, saturated=torch.zeros(3, 2, 3, dtype=torch.long), underflow=underflow)
    assert calib.set_by() == {"text": 1, "voice clone": 2, "long context": 3}
    rows = list(gpu_engine.calibration_rows("checkpoint", calib, per_layer=True))
    assert rows[0].item == "FP8 calibration" and rows[0].value == (
        "calibrated on text (37 positions), voice clone (300 positions), long context (2048 positions); scales "
        "set by text 1, voice clone 2, long context 3 of 6; saturation max 0.000% (layer 0 qkv), underflow max "
        "1.000% (layer 1 down)")
    assert [r.item for r in rows[1:4]] == [f"FP8 rates on the {k} prompt" for k in kinds]
    assert rows[3].value == "saturation max 0.000%, underflow mean 0.500%, max 3.000%"
    assert rows[5].item == "FP8 layer 1: saturation / underflow"
    assert rows[5].value == "qkv 0.000% / 0.000% | gate_up 0.000% / 0.000% | down 0.000% / 1.000%"
    assert len(list(gpu_engine.calibration_rows("engine", calib, per_layer=False))) == 4


def test_the_engine_pass_lists_its_sections_within_the_run_budget():
    """--engine runs the driver rows, the manifest and the engine; --checkpoint adds the real checkpoint's
    section. Listing them loads nothing."""
    plain = gpu_check.gpu_sections(Namespace(quick=False, steps=200, engine=True, checkpoint=None))
    assert [s.name for s in plain] == ["preflight", "cubins", "engine"]
    real = gpu_check.gpu_sections(Namespace(quick=False, steps=200, engine=True, checkpoint=Path("/ckpt")))
    assert [s.name for s in real] == ["preflight", "cubins", "engine", "checkpoint"]
    script = (Path(__file__).resolve().parents[1] / "scripts" / "gpu_check.sh").read_text()
    timeout_s = int(re.search(r"^RUN_TIMEOUT_S=(\d+)", script, re.MULTILINE).group(1))
    assert sum(s.budget_s for s in real) <= timeout_s - 10


def test_the_engine_sections_yield_their_rows_as_they_make_them():
    import inspect

    makers = [gpu_engine.engine_rows, gpu_engine.streams_rows, gpu_engine.checkpoint_rows,
              gpu_engine.calibration_rows]
    assert [f.__name__ for f in makers if not inspect.isgeneratorfunction(f)] == []


def test_the_held_out_prompts_are_one_of_each_kind_and_none_is_calibrated_on():
    from engine.backends import calibration as cal
    from engine.demo import TINY_DIMS

    held = gpu_engine.held_out_prompts(TINY_DIMS)
    assert [p.kind for p in held] == list(cal.CALIBRATION_PROMPTS)
    assert [len(p.decode) for p in held] == [gpu_engine.HELD_OUT_STEPS] * 3
    assert len(held[1].ref_rows) == gpu_engine.HELD_OUT_FRAMES + 7 and held[2].positions == gpu_engine.HELD_OUT_POSITIONS
    calibrated = cal.calibration_prompts(TINY_DIMS, 4096, cal.CALIBRATION_DECODE_STEPS)
    assert not any(torch.equal(h.ids, c.ids) for h in held for c in calibrated)
    assert held[1].ref_rows.shape != calibrated[1].ref_rows.shape   # 10 s of reference audio against 6 s
