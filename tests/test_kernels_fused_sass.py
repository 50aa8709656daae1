"""SASS checks of the v2 GEMVs (kernels/fused.py) in the committed cubins, per arch, without a GPU.

The check of the weight stream, defined on `cuobjdump -sass` text:
  * the main loop is the backward-branch loop (a `BRA` to a lower address, body = its target up to it)
    with the most FFMA instructions;
  * in that body, find the first accumulating FFMA (`FFMA Rd, Ra, Rb, Rd`: the `acc += w·x` that
    consumes the weight tile);
  * count the 128-bit global loads (`LDG.E.128`, ...) issued before it whose address register does not
    hold a value an earlier load in the body wrote (so none waits on another load's data; a register
    rewritten by arithmetic since is free again); it must be ≥ 4:
    four independent 16-byte loads in flight per thread before the accumulation waits for any of them.
    (The count includes the input chunk's own 128-bit load where there is one; the weight tile alone
    is 64 bytes, four loads, per thread and loop step.)
The v1 GEMV (kernels/gemv.py) is checked too and must fail it (its weight loads wait behind the x
load and two barriers), which proves the check can fail. No spills and 128-bit loads for every committed
kernel are checked by tests/test_kernels_build.py.
"""

from __future__ import annotations

import re

import pytest

from kernels import manifest as mf
from tests.helpers import committed_cubins, sass_instructions

pytest.importorskip("triton", reason="Triton is not installed (pip install -r requirements-dev.txt)")

MIN_LOADS_IN_FLIGHT = 4
WIDE = re.compile(r"^LDG\.E(\.\w+)*\.128$")


def main_loop(ins):
    """The body of the backward-branch loop (a BRA, possibly predicated or uniform, to a lower address)
    with the most FFMA instructions."""
    loops = []
    for i, (addr, op, args) in enumerate(ins):
        target = re.search(r"0x([0-9a-f]+)\s*$", args)
        if op.startswith("BRA") and target and int(target.group(1), 16) < addr:
            start = int(target.group(1), 16)
            loops.append([x for x in ins[:i + 1] if x[0] >= start])
    assert loops, "no loop in the kernel"
    return max(loops, key=lambda body: sum(op == "FFMA" for _, op, _ in body))


def accumulates(op: str, args: str) -> bool:
    """`FFMA Rd, Ra, Rb, Rd`: the `acc += w·x` form (the prologue's arithmetic never adds into its
    own destination: its FFMAs add constants or other registers)."""
    regs = re.findall(r"-?\|?(R\d+|RZ|[-\d.e+]+)\|?", args.replace(".reuse", ""))
    return op == "FFMA" and len(regs) == 4 and regs[0] == regs[3] and regs[0].startswith("R")


def loads_in_flight(cubin) -> int:
    """Independent 128-bit global loads issued in the main loop before its first accumulating FFMA."""
    count, loaded = 0, set()
    for _, op, args in main_loop(sass_instructions(cubin)):
        if accumulates(op, args):
            break
        regs = re.findall(r"\bR(\d+)", args)
        if op.startswith("LDG"):
            addr = re.search(r"\[R(\d+)", args)
            if WIDE.match(op) and not (addr and addr.group(1) in loaded):
                count += 1
            loaded.update(str(int(regs[0]) + k) for k in range(4 if op.endswith(".128") else 2))
        elif regs and not op.startswith(("ST", "BAR", "BRA", "RED", "ATOM")):
            loaded.difference_update(str(int(regs[0]) + k) for k in range(2))   # rewritten: no longer loaded
    return count




V2 = committed_cubins("gemv2_")


@pytest.mark.skipif(not V2, reason="no committed v2 cubins (python -m kernels.build)")
@pytest.mark.parametrize("cc,name", V2)
def test_v2_gemv_keeps_four_weight_loads_in_flight(cc, name):
    m = mf.load(cc)
    n = loads_in_flight(m.root / m.kernels[name].cubin)
    assert n >= MIN_LOADS_IN_FLIGHT, f"{m.target}/{name}: {n} independent 128-bit loads before the first FFMA"


@pytest.mark.skipif(not committed_cubins("gemv_w8a8"), reason="no committed cubins")
def test_the_check_fails_on_the_v1_gemv():
    for cc in mf.TARGETS:
        m = mf.load(cc)
        assert loads_in_flight(m.root / m.kernels["gemv_w8a8"].cubin) < MIN_LOADS_IN_FLIGHT, m.target


ATTN = committed_cubins("decode_attn_fused_")


@pytest.mark.skipif(not ATTN, reason="no committed v2 cubins (python -m kernels.build)")
@pytest.mark.parametrize("cc,name", ATTN)
def test_fused_attention_takes_one_ticket_per_cta_after_a_release_fence(cc, name):
    """The combine's ticket: one `ATOMG.E.ADD` in the kernel, with a GPU-scope `MEMBAR` just before it, so
    every partial this CTA stored (ordered by the barrier before it) is visible before the counter moves.
    Read by hand on sm_90a, not asserted here: a branch lets only thread 0 reach the atomic, `CCTL.IVALL`
    follows it, and the ticket reaches the other threads through shared memory and a barrier."""
    m = mf.load(cc)
    ins = sass_instructions(m.root / m.kernels[name].cubin)
    atoms = [i for i, (_, op, _) in enumerate(ins) if op.startswith("ATOMG")]
    assert len(atoms) == 1 and ins[atoms[0]][1].startswith("ATOMG.E.ADD"), [ins[i][1] for i in atoms]
    before = [op for _, op, _ in ins[max(0, atoms[0] - 6):atoms[0]]]
    assert any(op.startswith("MEMBAR") and op.endswith(".GPU") for op in before), (m.target, before)


SPLITK = committed_cubins("gemv3_")


@pytest.mark.skipif(not SPLITK, reason="no committed v3 cubins (python -m kernels.build)")
@pytest.mark.parametrize("cc,name", SPLITK)
def test_splitk_gemv_streams_and_takes_one_ticket_after_a_release_fence(cc, name):
    """The v3 GEMVs (kernels/splitk.py) keep v2's four loads in flight per split, and their reduction
    ticket is the fused attention's: one integer `ATOMG.E.ADD` behind a GPU-scope `MEMBAR`, no float atomics."""
    m = mf.load(cc)
    cubin = m.root / m.kernels[name].cubin
    assert loads_in_flight(cubin) >= MIN_LOADS_IN_FLIGHT
    ins = sass_instructions(cubin)
    atoms = [i for i, (_, op, _) in enumerate(ins) if op.startswith(("ATOM", "RED"))]
    assert len(atoms) == 1 and ins[atoms[0]][1].startswith("ATOMG.E.ADD") and ".F32" not in ins[atoms[0]][1]
    before = [op for _, op, _ in ins[max(0, atoms[0] - 6):atoms[0]]]
    assert any(op.startswith("MEMBAR") and op.endswith(".GPU") for op in before), (m.target, before)


GEMVS = V2 + SPLITK


def weight_loads_per_step(entry) -> int:
    """128-bit weight loads per thread per loop step, from the tile: BLOCK_N × BLOCK_K weights over the
    CTA's threads, 16 bytes a load."""
    w = next(p for p in entry.user_params if p.name == "W")
    size = 1 if w.type == "*fp8e4nv" else 2
    return entry.constexprs["BLOCK_N"] * entry.constexprs["BLOCK_K"] * size // (32 * entry.num_warps * 16)


@pytest.mark.skipif(not GEMVS, reason="no committed v2/v3 cubins (python -m kernels.build)")
@pytest.mark.parametrize("cc,name", GEMVS)
def test_the_loads_in_flight_are_the_weight_tiles(cc, name):
    """`loads_in_flight` also counts the input chunk's 128-bit loads (x, the norm weight, gate / up). The
    weight loads among them are at least the count less every 128-bit load of the loop body that is not a
    weight load (the body's 128-bit loads less the tile's weight loads per step): that bound must reach
    four too, i.e. the whole 64-byte weight tile is requested before the first accumulation."""
    m = mf.load(cc)
    e = m.kernels[name]
    cubin = m.root / e.cubin
    per_step = weight_loads_per_step(e)
    wide = sum(bool(WIDE.match(op)) for _, op, _ in main_loop(sass_instructions(cubin)))
    assert per_step == MIN_LOADS_IN_FLIGHT and wide >= per_step, (m.target, name, per_step, wide)
    assert loads_in_flight(cubin) - (wide - per_step) >= MIN_LOADS_IN_FLIGHT, (m.target, name)
