"""Ahead-of-time cubin build: determinism, manifests against the cubins' own parameter tables, and
SASS checks (tensor-core instructions, wide loads, no spills) — all without a GPU.

Two sets of cubins are checked: the small kernels of `tests/kernel_fixture.py`, built here into a
temp dir (they prove the checks themselves catch what they claim to), and the committed
`kernels/cubin/<target>/` built from the product kernels.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kernels import manifest as mf
from tests.helpers import committed_cubins, cuobjdump, sass_ops

pytest.importorskip("triton", reason="Triton is not installed (pip install -r requirements-dev.txt)")

REPO = Path(__file__).resolve().parents[1]
FIXTURE = ("tests.kernel_fixture",)


def kparam_info(cubin: Path) -> list[tuple[int, int]]:
    """(offset, size) per parameter ordinal from the cubin's EIATTR_KPARAM_INFO."""
    rows = re.findall(r"Ordinal\s*:\s*0x([0-9a-f]+)\s+Offset\s*:\s*0x([0-9a-f]+)\s+Size\s*:\s*0x([0-9a-f]+)",
                      cuobjdump("-elf", cubin))
    table = {int(o, 16): (int(off, 16), int(s, 16)) for o, off, s in rows}
    assert sorted(table) == list(range(len(table))), f"gaps in KPARAM_INFO ordinals: {sorted(table)}"
    return [table[i] for i in range(len(table))]


WIDE_LOAD = re.compile(r"^LDG\..*\.(128|256)$|^LDGSTS\..*\.128$")
SPILL = re.compile(r"^(STL|LDL)(\.|$)")


def tensor_core_ops(ops: list[str], prefix: str) -> list[str]:
    return [o for o in ops if o.startswith(prefix)]


def assert_no_spills(cubin: Path) -> None:
    """No stack frame and no local memory (`cuobjdump -res-usage`): a register spill needs one of them. The
    SASS (half a second of nvdisasm per cubin) is read only to name the spilling instructions."""
    usage = cuobjdump("-res-usage", cubin)
    if not (re.search(r"STACK:0\b", usage) and re.search(r"LOCAL:0\b", usage)):
        spills = [o for o in sass_ops(cubin) if SPILL.match(o)]
        pytest.fail(f"{cubin.name} uses local memory (spills: {spills[:4]}): {usage}")


def test_the_spill_check_reads_the_stack_frame_and_local_memory(monkeypatch):
    """assert_no_spills on cuobjdump's resource lines (no cubin needed): a stack frame or local memory fails,
    naming the spilling instructions from the SASS."""
    module = sys.modules[__name__]
    usage = {"clean": "Function k:\n REG:40 STACK:0 SHARED:0 LOCAL:0 CONSTANT[0]:904 TEXTURE:0 SURFACE:0 SAMPLER:0",
             "stack": "Function k:\n REG:255 STACK:48 SHARED:0 LOCAL:0 CONSTANT[0]:904",
             "local": "Function k:\n REG:255 STACK:0 SHARED:0 LOCAL:16 CONSTANT[0]:904"}
    monkeypatch.setattr(module, "cuobjdump", lambda flag, cubin: usage[cubin.stem])
    monkeypatch.setattr(module, "sass_ops", lambda cubin: ["FFMA", "STL.64", "LDL.64"])
    assert_no_spills(Path("clean.cubin"))
    for kind in ("stack", "local"):
        with pytest.raises(pytest.fail.Exception, match=r"uses local memory \(spills: \['STL.64', 'LDL.64'\]\)"):
            assert_no_spills(Path(f"{kind}.cubin"))


def expected_mma(kind: str, target: str) -> str:
    """SASS matrix op a tensor-core kernel must contain: Hopper uses warpgroup GMMA (64-row tiles),
    Ada and consumer Blackwell the warp-level mma.sync forms (KERNELS.md §1c)."""
    hopper = target == "sm_90a"
    return {"fp8": "QGMMA" if hopper else "QMMA.16832.F32.E4M3.E4M3",
            "bf16": "HGMMA" if hopper else "HMMA.16816.F32.BF16"}[kind]


# ---------------------------------------------------------------------------------------------
# Fixture kernels: the machinery itself

@pytest.fixture(scope="module")
def fixture_build(tmp_path_factory) -> Path:
    from kernels import build

    out = tmp_path_factory.mktemp("cubin")
    build.build(out, modules=FIXTURE, jobs=1, log=lambda *_: None)
    return out


def test_fixture_build_is_deterministic(fixture_build, tmp_path, monkeypatch):
    from kernels import build

    # A cold compile into a fresh cache: the bytes must not depend on cache state or paths.
    monkeypatch.setenv("TRITON_ALWAYS_COMPILE", "1")
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "cache"))
    build.build(tmp_path / "again", modules=FIXTURE, jobs=1, log=lambda *_: None)
    for cc, target in mf.TARGETS.items():
        a = (fixture_build / target / mf.MANIFEST).read_text()
        assert a == (tmp_path / "again" / target / mf.MANIFEST).read_text()
        assert mf.load(cc, fixture_build).kernels


def test_fixture_manifest_matches_cubin_param_table(fixture_build):
    for cc in mf.TARGETS:
        m = mf.load(cc, fixture_build)
        for e in m.kernels.values():
            ours = [(p.offset, p.size) for p in e.params]
            assert kparam_info(m.root / e.cubin) == ours, (m.target, e.name)
            assert e.params[-2].name == "global_scratch" and e.params[-1].name == "profile_scratch"


def test_fixture_mixed_scalars_pack_natively(fixture_build):
    e = mf.load(90, fixture_build).kernels["fixture_scale"]
    # X, Out (8+8), alpha f32 @16, n i32 @20, seed i64 @24 (8-aligned), then the two scratch pointers.
    assert [(p.name, p.offset, p.size) for p in e.params] == [
        ("X", 0, 8), ("Out", 8, 8), ("alpha", 16, 4), ("n", 20, 4), ("seed", 24, 8),
        ("global_scratch", 32, 8), ("profile_scratch", 40, 8)]
    assert e.struct_format == "PPfiqPP"


@pytest.mark.parametrize("target", sorted(mf.TARGETS.values()))
def test_fixture_sass(fixture_build, target):
    d = fixture_build / target
    fp8 = sass_ops(d / "fixture_gemm_fp8.cubin")
    bf16 = sass_ops(d / "fixture_gemm_bf16.cubin")
    assert tensor_core_ops(fp8, expected_mma("fp8", target)), f"{target} fp8 GEMM has no {expected_mma('fp8', target)}"
    assert tensor_core_ops(bf16, expected_mma("bf16", target)), target
    # The check must discriminate: the bf16 GEMM has no fp8 MMA and vice versa.
    assert not tensor_core_ops(bf16, expected_mma("fp8", target))
    assert not tensor_core_ops(fp8, expected_mma("bf16", target))
    gemv = sass_ops(d / "fixture_gemv_bf16.cubin")
    assert any(WIDE_LOAD.match(o) for o in gemv), f"{target} GEMV has no 128-bit loads: {sorted(set(gemv))}"
    for cubin in d.glob("*.cubin"):
        assert_no_spills(cubin)


def test_fixture_check_detects_stale_cubins(fixture_build, tmp_path):
    from kernels import build

    committed = tmp_path / "committed"
    shutil.copytree(fixture_build, committed)
    assert build.check(committed, modules=FIXTURE, jobs=1, full=True) == []
    m = mf.load(89, committed)
    tampered = m.kernels["fixture_scale"]
    (m.root / tampered.cubin).write_bytes(b"\0" * 16)
    # A cubin swapped without its manifest entry: caught by the hashes alone, nothing rebuilt.
    problems = build.check(committed, archs=(89,), modules=FIXTURE, jobs=1)
    assert len(problems) == 1 and "fixture_scale.cubin does not match its sha256 in the manifest" in problems[0]
    # ... and with its entry edited to match, which only the full rebuild can see.
    text = (m.root / mf.MANIFEST).read_text().replace(tampered.sha256, mf.sha256(b"\0" * 16))
    (m.root / mf.MANIFEST).write_text(text)
    assert build.check(committed, archs=(89,), modules=FIXTURE, jobs=1) == []
    problems = build.check(committed, archs=(89,), modules=FIXTURE, jobs=1, full=True)
    assert problems == ["sm_89/fixture_scale: differs in sha256"], problems


HELPER = """import triton
import triton.language as tl


@triton.jit
def twice(x):
    return x * 2.0
"""

KERNEL = """import triton
import triton.language as tl

from {pkg}.helper import twice
from kernels.spec import KernelSpec


@triton.jit
def scale_kernel(X, Y, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(Y + i, twice(tl.load(X + i, mask=i < n)), mask=i < n)


KERNELS = [KernelSpec(name="scale", fn=scale_kernel, signature={{"X": "*fp32", "Y": "*fp32", "n": "i32"}},
                      constexprs=dict(BLOCK=128), archs=(89,))]
"""


def test_check_rebuilds_only_changed_modules_and_fails_on_a_stale_cubin(tmp_path, monkeypatch):
    """The default check trusts a module whose source hash (its imports included) is unchanged, and
    rebuilds one whose source or a helper it imports changed: the cubin built before the edit is then
    reported stale."""
    from kernels import build

    pkg = f"stalecheck_{os.getpid()}"
    (tmp_path / pkg).mkdir()
    (tmp_path / pkg / "__init__.py").write_text("")
    (tmp_path / pkg / "helper.py").write_text(HELPER)
    (tmp_path / pkg / "kern.py").write_text(KERNEL.format(pkg=pkg))
    monkeypatch.syspath_prepend(str(tmp_path))
    modules = (f"{pkg}.kern",)
    assert f"{pkg}.helper" in build.dependencies(modules[0])
    committed = tmp_path / "committed"
    build.build(committed, archs=(89,), modules=modules, jobs=1, log=lambda *_: None)

    log = []
    assert build.check(committed, archs=(89,), modules=modules, jobs=1, log=log.append) == []
    assert log == ["rebuilding 0 of 1 kernel modules: none"]

    (tmp_path / pkg / "helper.py").write_text(HELPER.replace("x * 2.0", "x * 3.0"))   # the helper, not the kernel
    for name in (modules[0], f"{pkg}.helper"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    log.clear()
    problems = build.check(committed, archs=(89,), modules=modules, jobs=1, log=log.append)
    assert log == [f"rebuilding 1 of 1 kernel modules: {modules[0]}"]
    assert problems == [f"sm_89: {modules[0]} changed since the cubins were built", "sm_89/scale: differs in sha256"]


def test_product_kernel_hashes_cover_the_helpers_they_inline():
    from kernels import build

    deps = build.dependencies("kernels.splitk")
    assert {"kernels.gemv", "kernels.common", *build.BUILD_INPUTS} <= set(deps)
    assert {"kernels.attention", "kernels.gemv"} <= set(build.dependencies("kernels.fused"))
    assert "kernels.sampler" in build.dependencies("kernels.batch")


def test_manifest_load_reports_missing_and_unsupported(tmp_path):
    with pytest.raises(mf.ManifestError, match="compute capability 8.0"):
        mf.load(80, tmp_path)
    with pytest.raises(mf.ManifestError, match="python -m kernels.build"):
        mf.load(90, tmp_path)


# ---------------------------------------------------------------------------------------------
# Committed product cubins

COMMITTED = committed_cubins()
needs_committed = pytest.mark.skipif(not COMMITTED, reason="no committed cubins yet (python -m kernels.build)")


# Kernels that spilled when last built, with ptxas' stack bytes (cuobjdump -res-usage). Each is an
# expected failure until its tile/warps are fixed; strict, so a fixed kernel must leave this list.
KNOWN_SPILLS: dict[tuple[int, str], int] = {}


def _spill_mark(cc, name):
    if (cc, name) in KNOWN_SPILLS:
        return pytest.param(cc, name, marks=pytest.mark.xfail(
            strict=True, reason=f"known spill: {KNOWN_SPILLS[cc, name]} B of stack on {mf.TARGETS[cc]}"))
    return pytest.param(cc, name)


@needs_committed
@pytest.mark.parametrize("cc,name", COMMITTED)
def test_committed_param_table(cc, name):
    m = mf.load(cc)
    e = m.kernels[name]
    assert kparam_info(m.root / e.cubin) == [(p.offset, p.size) for p in e.params], (m.target, name)


@needs_committed
@pytest.mark.parametrize("cc,name", [_spill_mark(cc, n) for cc, n in COMMITTED])
def test_committed_no_spills(cc, name):
    m = mf.load(cc)
    assert_no_spills(m.root / m.kernels[name].cubin)


def _kind(name: str) -> str | None:
    """Which SASS property a product kernel must show, from its spec name: W8A8 GEMMs multiply fp8 x fp8
    on tensor cores; BF16 and weight-only W8A16 GEMMs (fp8 weights upcast in registers) use BF16 MMA."""
    if "gemm" in name:
        return "fp8" if ("w8a8" in name or "fp8" in name) else "bf16"
    return "gemv" if "gemv" in name else None


@needs_committed
@pytest.mark.parametrize("cc,name", [(cc, n) for cc, n in COMMITTED if _kind(n)])
def test_committed_sass(cc, name):
    m = mf.load(cc)
    ops = sass_ops(m.root / m.kernels[name].cubin)
    kind = _kind(name)
    if kind == "gemv":
        assert any(WIDE_LOAD.match(o) for o in ops), f"{m.target}/{name}: no 128-bit loads: {sorted(set(ops))}"
    else:
        assert tensor_core_ops(ops, expected_mma(kind, m.target)), f"{m.target}/{name}: no {expected_mma(kind, m.target)}"


def elf_shared_sections(cubin: Path) -> dict[str, int]:
    """Section name -> size of every .nv.shared.* section, from `cuobjdump -elf`'s section table."""
    rows = re.findall(r"^\s*[0-9a-f]+\s+[0-9a-f]+\s+([0-9a-f]+)\s.*NOBITS.*\s(\.nv\.shared\.\S+)$",
                      cuobjdump("-elf", cubin), re.MULTILINE)
    return {name: int(size, 16) for size, name in rows}


@needs_committed
@pytest.mark.parametrize("cc,name", COMMITTED)
def test_committed_static_shared_memory(cc, name):
    """The manifest's static shared memory is what cuobjdump reports for the kernel (SHARED) plus ptxas'
    reserved sections, and static + dynamic over 48 KiB is flagged for the loader's opt-in."""
    m = mf.load(cc)
    e = m.kernels[name]
    cubin = m.root / e.cubin
    shared = int(re.search(r"SHARED:(\d+)", cuobjdump("-res-usage", cubin)).group(1))
    sections = elf_shared_sections(cubin)
    reserved = sum(v for k, v in sections.items() if k.startswith(".nv.shared.reserved."))
    assert sections.get(f".nv.shared.{e.symbol}", 0) == shared
    assert e.static_shared == shared + reserved, (m.target, name, sections)
    assert e.needs_smem_opt_in == (e.shared + e.static_shared > 48 * 1024)


# The driver each target must load on (the aim of the cubin toolchain): R570 is the first driver for the
# RTX 5090 (sm_120a needs a 12.8 ptxas at least), and Ada/Hopper cubins load on any CUDA 12 driver.
DRIVER_TARGETS = {89: 12000, 90: 12000, 120: 12080}


@needs_committed
@pytest.mark.parametrize("cc", sorted({cc for cc, _ in COMMITTED}))
def test_committed_toolchain_meets_driver_targets(cc):
    m = mf.load(cc)
    t = m.toolchain
    assert t.ptxas.startswith("12.") and tuple(map(int, t.ptxas.split(".")[:2])) >= (12, 8), t
    assert t.min_driver_cuda <= DRIVER_TARGETS[cc] and t.min_driver_cuda == mf.min_driver_cuda(cc, t.ptxas), t
    assert t.min_driver == mf.DRIVER_FOR_CUDA[t.min_driver_cuda]
    # the ELF ABI each cubin carries matches the manifest: 7 for Ada/Hopper from a 12.x ptxas (13.x writes 8,
    # which needs R580); Blackwell cubins are ABI 8 from any ptxas that knows them
    assert t.elf_abi == (8 if cc >= 100 else 7)
    for e in m.kernels.values():
        assert mf.cubin_elf(m.cubin_bytes(e.name), e.symbol)[0] == t.elf_abi


@needs_committed
def test_committed_cubins_are_up_to_date():
    """`python -m kernels.build --check`: every kernel module whose source hash (with the modules it imports
    and the build inputs), Triton version or ptxas differs from the committed manifest is rebuilt and
    compared; the others' cubins are verified against the manifest's sha256. HIGGS_FULL_CUBIN_CHECK=1 makes
    it `--check --full`, a rebuild of every cubin (60-120 s on 2 cores with a cold Triton cache)."""
    full = ["--full"] if os.environ.get("HIGGS_FULL_CUBIN_CHECK") == "1" else []
    out = subprocess.run([sys.executable, "-m", "kernels.build", "--check", *full], cwd=REPO, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr


def test_fixture_launcher_buffer_matches_cubin_param_table(fixture_build):
    """What the PyCUDA launcher sends (Packed.buffer) puts each argument at the offset and size the
    cubin's EIATTR_KPARAM_INFO declares: sentinel values are read back from those byte ranges."""
    import struct

    import torch

    from kernels.packing import pack_args

    dtypes = {"*bf16": torch.bfloat16, "*fp32": torch.float32, "*fp8e4nv": torch.float8_e4m3fn}
    for cc in mf.TARGETS:
        m = mf.load(cc, fixture_build)
        for e in m.kernels.values():
            args, expect = [], []
            for i, p in enumerate(e.user_params):
                if p.type.startswith("*"):
                    t = torch.empty(4, dtype=dtypes[p.type])
                    args.append(t)
                    expect.append(t.data_ptr())
                elif p.type == "fp32":
                    args.append(1.5 + i)
                    expect.append(1.5 + i)
                else:  # multiples of 16: some parameters are compiled with that divisibility hint
                    args.append(16 * (100 + i))
                    expect.append(16 * (100 + i))
            packed = pack_args(e, args, scratch=(0xAAAA0000, 0xBBBB0000), device_type="cpu")
            buf = packed.buffer()
            table = kparam_info(m.root / e.cubin)
            assert len(buf) >= table[-1][0] + table[-1][1]
            for (off, size), code, value in zip(table, packed.format, expect + [0xAAAA0000, 0xBBBB0000]):
                assert struct.calcsize("@" + code) == size
                assert struct.unpack_from("@" + code, buf, off)[0] == value, (m.target, e.name, off)
