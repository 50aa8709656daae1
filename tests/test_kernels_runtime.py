"""The cubin runtime on a machine without a GPU: the driver probe answers quickly with a reason and
never hangs, manifests load and validate, and launch arguments are packed as the manifest says."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from kernels import manifest as mf
from kernels import packing, runtime
from tests.helpers import TOOLCHAIN, kernel_entry, one_kernel_root

REPO = Path(__file__).resolve().parents[1]


def test_available_without_driver_is_fast_and_clear():
    """Run in a fresh interpreter with a hard timeout: a hang here is exactly the failure we guard against."""
    code = "from kernels import runtime; ok, why = runtime.available(); print(ok); print(why)"
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    ok, why = out.stdout.splitlines()[:2]
    if ok == "True":
        pytest.skip(f"this machine has a usable GPU: {why}")
    assert why and "Traceback" not in out.stderr
    assert time.perf_counter() - t0 < 30
    if not Path("/usr/lib/x86_64-linux-gnu/libcuda.so.1").exists() and shutil.which("nvidia-smi") is None:
        assert "libcuda.so.1" in why


def test_available_names_a_stub_driver(tmp_path):
    """A stub libcuda (as CUDA toolkits ship for linking) must read as "no driver", not as a crash."""
    if shutil.which("gcc") is None:
        pytest.skip("gcc not installed")
    src = tmp_path / "stub.c"
    src.write_text("int cuInit(unsigned f) { return 34; }\n")
    lib = tmp_path / "libcuda.so.1"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(lib), str(src)], check=True, timeout=60)
    code = "from kernels import runtime; print(runtime.available()[1])"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60,
                         env={"LD_LIBRARY_PATH": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    assert "stub library" in out.stdout


@pytest.mark.parametrize("cc,text", [(80, "8.0"), (100, "10.0"), (121, "12.1")])
def test_available_refuses_unsupported_arch(monkeypatch, cc, text):
    monkeypatch.setattr(runtime, "probe_driver", lambda device=0: runtime.Probe(True, "", cc=cc, name="Some GPU"))
    runtime._available.cache_clear()
    try:
        ok, why = runtime.available()
    finally:
        runtime._available.cache_clear()
    assert not ok
    assert f"compute capability {text}" in why and "Some GPU" in why


def test_available_needs_cuda_torch(monkeypatch, tmp_path):
    """With a supported GPU and a manifest but a CPU torch build, the reason says so."""
    (tmp_path / "sm_90a").mkdir()
    (tmp_path / "sm_90a" / mf.MANIFEST).write_text(json.dumps(
        {"schema": mf.SCHEMA, "cc": 90, "target": "sm_90a", "triton": "3.9.0", "sources": {}, "kernels": {},
         "toolchain": dict(TOOLCHAIN.__dict__)}))
    monkeypatch.setattr(runtime, "probe_driver", lambda device=0: runtime.Probe(True, "", cc=90, name="NVIDIA H200",
                                                                                driver_cuda=12080))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    runtime._available.cache_clear()
    try:
        ok, why = runtime.available(root=tmp_path)
    finally:
        runtime._available.cache_clear()
    assert not ok and "no CUDA" in why and "NVIDIA H200" in why


def test_cubin_kernels_without_gpu_raises_the_reason():
    ok, why = runtime.available()
    if ok:
        pytest.skip("GPU present")
    with pytest.raises(RuntimeError, match="cubin kernels unavailable"):
        runtime.CubinKernels()


def test_manifest_validation_catches_bad_layout_and_hash(tmp_path):
    e = kernel_entry({"X": "*fp32", "n": "i32"}, sha256=mf.sha256(b"cubin"))
    d = tmp_path / "sm_89"
    d.mkdir()
    (d / "k.cubin").write_bytes(b"cubin")
    m = mf.Manifest(cc=89, target="sm_89", triton="3.9.0", sources={}, kernels={"k": e}, root=d,
                    toolchain=TOOLCHAIN)
    (d / mf.MANIFEST).write_text(m.to_json())
    assert mf.load(89, tmp_path).kernels["k"] == e
    (d / "k.cubin").write_bytes(b"other")
    with pytest.raises(mf.ManifestError, match="does not match its sha256"):
        mf.load(89, tmp_path)
    (d / "k.cubin").write_bytes(b"cubin")
    doc = json.loads((d / mf.MANIFEST).read_text())
    doc["kernels"]["k"]["params"][1]["offset"] = 12
    (d / mf.MANIFEST).write_text(json.dumps(doc))
    with pytest.raises(mf.ManifestError, match="native packing"):
        mf.load(89, tmp_path)
    doc["kernels"]["k"]["params"] = doc["kernels"]["k"]["params"][:2]
    doc["kernels"]["k"]["params"][1]["offset"] = 8
    (d / mf.MANIFEST).write_text(json.dumps(doc))
    with pytest.raises(mf.ManifestError, match="must end with"):
        mf.load(89, tmp_path)


def test_pack_args_types_and_errors():
    e = kernel_entry({"X": "*bf16", "W": "*fp8e4nv", "R": "*bf16", "alpha": "fp32", "n": "i32", "seed": "i64"})
    x = torch.zeros(8, dtype=torch.bfloat16)
    w = torch.zeros(8, dtype=torch.float8_e4m3fn)
    p = packing.pack_args(e, (x, w, None, 0.5, 7, 2**40), device_type="cpu")
    assert p.values == [x.data_ptr(), w.data_ptr(), 0, 0.5, 7, 2**40, 0, 0]
    assert p.format == "PPPfiqPP"
    assert len(p.buffer()) == e.params[-1].offset + 8
    with pytest.raises(TypeError, match="expects float8_e4m3fn"):
        packing.pack_args(e, (x, x, None, 0.5, 7, 1), device_type="cpu")
    with pytest.raises(TypeError, match="takes 6 arguments"):
        packing.pack_args(e, (x, w), device_type="cpu")
    with pytest.raises(OverflowError, match="does not fit i32"):
        packing.pack_args(e, (x, w, None, 0.5, 2**31, 1), device_type="cpu")
    with pytest.raises(TypeError, match="needs an int"):
        packing.pack_args(e, (x, w, None, 0.5, 7.0, 1), device_type="cpu")
    with pytest.raises(TypeError, match="expected a cuda tensor"):
        packing.pack_args(e, (x, w, None, 0.5, 7, 1))


class RecordingLoader:
    """Stands in for PyCUDA / cuda-core: records what would be launched."""

    name = "recording"
    device_type = "cpu"
    stream = None

    def __init__(self):
        self.loaded, self.launches = [], []

    def load(self, cubin, entry):
        self.loaded.append((entry.symbol, len(cubin)))
        return entry.name

    def launch(self, handle, grid, block, shared, packed):
        self.launches.append((handle, grid, block, shared, packed.values))


def test_cubin_kernels_launch_path_with_recording_loader(tmp_path):
    sig = {"X": "*fp32", "Out": "*fp32", "n": "i32"}
    e = kernel_entry(sig, name="scale", symbol="scale_kernel", cubin="scale.cubin", sha256=mf.sha256(b"ELF"),
               shared=73728, num_warps=8, global_scratch_size=16)
    one_kernel_root(tmp_path, e)
    loader = RecordingLoader()
    k = runtime.CubinKernels(loader=loader, root=tmp_path, cc=120)
    assert loader.loaded == [("scale_kernel", 3)] and "scale" in k
    x, y = torch.ones(4), torch.empty(4)
    k.launch("scale", (3, 2), x, y, 4)
    handle, grid, block, shared, values = loader.launches[0]
    assert (handle, grid, block, shared) == ("scale", (3, 2, 1), (256, 1, 1), 73728)
    # global scratch: grid (6 programs) x 16 B allocated once; profile scratch stays null
    assert values[:3] == [x.data_ptr(), y.data_ptr(), 4] and values[3] != 0 and values[4] == 0
    scratch = values[3]
    k.launch("scale", 5, x, y, 4)
    assert loader.launches[1][4][3] == scratch  # smaller grid reuses the buffer
    with pytest.raises(KeyError, match="no cubin named 'nope' for sm_120a"):
        k.launch("nope", 1)


def test_committed_manifests_load_and_pack():
    """Every committed kernel's parameter list packs into the buffer its manifest describes."""
    found = False
    for cc, target in mf.TARGETS.items():
        if not (mf.CUBIN_DIR / target / mf.MANIFEST).exists():
            continue
        found = True
        m = mf.load(cc)
        for e in m.kernels.values():
            assert mf.validate_entry(e) == []
            assert len(struct_buffer(e)) == e.params[-1].offset + e.params[-1].size
    if not found:
        pytest.skip("no committed cubins yet (python -m kernels.build)")


def struct_buffer(e: mf.KernelEntry) -> bytes:
    import struct

    return struct.pack("@" + e.struct_format, *[0.0 if c in "fd" else 0 for c in e.struct_format])


def test_runtime_imports_no_gpu_library():
    """Importing the runtime must not import PyCUDA or cuda.core (that is what could hang)."""
    code = textwrap.dedent("""
        import sys
        from kernels import runtime
        runtime.available()
        print(sorted(m for m in sys.modules if m.startswith(("pycuda", "cuda."))))
    """)
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_device_check_cpu_selftest():
    """`python -m kernels.check --cpu-selftest`: manifests, packing, case coverage, references, table."""
    out = subprocess.run([sys.executable, "-m", "kernels.check", "--cpu-selftest"], cwd=REPO, capture_output=True,
                         text=True, timeout=120)
    assert "| runtime.available()" in out.stdout and "reference" in out.stdout, out.stdout + out.stderr
    if not (mf.CUBIN_DIR / "sm_90a" / mf.MANIFEST).exists():
        pytest.skip("no committed cubins")
    assert out.returncode == 0 and "ALL PASS" in out.stdout, out.stdout + out.stderr


def test_gpu_check_without_gpu_says_why():
    ok, _ = runtime.available()
    if ok:
        pytest.skip("GPU present")
    out = subprocess.run(["bash", "scripts/gpu_check.sh"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "no GPU check possible here" in out.stdout, out.stdout + out.stderr
