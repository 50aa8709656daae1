"""Delay pattern, SGLang-Omni stop rule, repeat guard and length cap (SPEC D5)."""

import json

import pytest
import torch

from engine.delay import MAX_ROWS, StopRule, apply_delay, default_max_frames, undelay

BOC, EOC = 1024, 1025


def test_apply_delay_layout():
    codes = torch.arange(3 * 8).reshape(3, 8)
    rows = apply_delay(codes, BOC, EOC)
    assert rows.shape == (10, 8)
    for r in range(10):
        for k in range(8):
            want = BOC if r < k else (codes[r - k, k].item() if r < k + 3 else EOC)
            assert rows[r, k].item() == want


def test_undelay_inverts_apply_delay():
    codes = torch.randint(0, 1024, (17, 8))
    assert torch.equal(undelay(apply_delay(codes, BOC, EOC)), codes)


def test_undelay_maps_specials_to_zero_not_clamp():
    rows = torch.full((9, 8), 5)
    rows[0, 0] = EOC
    rows[1, 1] = BOC
    rows[2, 0] = -3
    frames = undelay(rows)
    assert frames.shape == (2, 8)
    assert frames[0, 0] == 0 and frames[0, 1] == 0 and frames[1, 0] == 5


def test_undelay_short_input_is_empty():
    assert undelay(torch.zeros(5, 8, dtype=torch.long)).shape == (0, 8)


def test_apply_delay_rejects_wrong_rank():
    with pytest.raises(ValueError, match="frames, codebooks"):
        apply_delay(torch.zeros(8), BOC, EOC)


def scripted_logits(step, overrides):
    logits = torch.zeros(8, 1026)
    for c in range(8):
        logits[c, (10 * c + step) % 1000] = 5.0
        logits[c, BOC] = 4.0
    for o in overrides:
        if o["step"] == step:
            logits[o["codebook"], o["code"]] = 9.0
    return logits


def test_stop_traces(parity_dir):
    cases = json.loads((parity_dir / "stop_trace.json").read_text())["cases"]
    assert len(cases) == 5
    for case in cases:
        rule = StopRule(max_frames=case["max_rows"] - 7, repeat_guard=None)
        while not rule.done:
            rule.push(scripted_logits(rule.step, case["overrides"]).argmax(-1).tolist())
        reason = {"eoc": "eoc", "max_frames": "row_cap"}[rule.stop_reason]
        assert reason == case["stopped_by"], case["name"]
        assert rule.rows == case["rows"], case["name"]
        assert len(rule.rows) == case["num_rows"], case["name"]
        frames = undelay(rule.rows)
        assert frames.tolist() == case["frames"], case["name"]
        assert rule.complete_frames == case["num_frames"], case["name"]


def test_eoc_inside_window_is_a_code():
    rule = StopRule(repeat_guard=None)
    for s in range(8):
        row = rule.push([EOC] * 8)
        assert row[s + 1:] == [BOC] * (7 - s)
    assert not rule.done
    rule.push([EOC] + [1] * 7)  # step 8: honoured
    for _ in range(5):
        rule.push([3] * 8)
        assert not rule.done
    rule.push([3] * 8)
    assert rule.stop_reason == "eoc" and len(rule.rows) == 15 and rule.complete_frames == 8


def test_repeat_guard_stops_on_identical_frames():
    rule = StopRule(repeat_guard=4)
    while not rule.done:
        rule.push([7] * 8)
    # frame t is complete at row t+7; 4 identical frames → 11 rows
    assert rule.stop_reason == "repeat_guard" and len(rule.rows) == 11
    assert undelay(rule.rows).tolist() == [[7] * 8] * 4


def test_repeat_guard_disabled_and_varied_codes():
    rule = StopRule(repeat_guard=None, max_frames=50)
    while not rule.done:
        rule.push([7] * 8)
    assert rule.stop_reason == "max_frames" and len(rule.rows) == 57
    rule = StopRule(repeat_guard=3, max_frames=30)
    while not rule.done:
        rule.push([rule.step % 2] * 8)
    assert rule.stop_reason == "max_frames"


def test_max_frames_and_guard_validation():
    with pytest.raises(ValueError, match="max_frames"):
        StopRule(max_frames=0)
    with pytest.raises(ValueError, match="repeat_guard"):
        StopRule(repeat_guard=1)


def test_default_max_frames():
    assert default_max_frames("Hi.") == 100  # a few seconds minimum (4 s × 25 fps)
    long = default_max_frames("word " * 100)  # 500 chars ≈ 33 s of speech, allowed 3×
    assert 2000 < long <= MAX_ROWS - 7
    assert default_max_frames("x" * 100000) == MAX_ROWS - 7
    assert default_max_frames("<|emotion:elation|>Hi.") == default_max_frames("Hi.")
