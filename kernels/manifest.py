"""The on-disk contract between `kernels/build.py` (writes) and `kernels/runtime.py` (reads):
`kernels/cubin/<target>/<name>.cubin` plus one `manifest.json` per target.

Everything here is plain Python (no Triton, no torch, no driver), so CI can validate the committed
manifests and the launcher's argument packing on a machine without a GPU.
"""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import dataclass
from pathlib import Path

CUBIN_DIR = Path(__file__).resolve().parent / "cubin"
MANIFEST = "manifest.json"
SCHEMA = 2

# Triton emits the arch-specific targets for Hopper and consumer Blackwell (KERNELS.md §1e), so an
# sm_90a cubin loads only on CC 9.0 and an sm_120a cubin only on CC 12.0 (not on 12.1).
TARGETS = {89: "sm_89", 90: "sm_90a", 120: "sm_120a"}

# Triton appends two u64 pointers to every kernel's parameter list (driver.c: num_params = num_args + 2).
HIDDEN_PARAMS = ("global_scratch", "profile_scratch")

# Triton signature type -> `struct` code. PyCUDA packs launch arguments with native alignment
# (`pycuda._pvt_struct`), exactly like Python's `struct` in "@" mode, so these codes also give the
# byte offsets the driver sees; tests compare them with the cubin's own EIATTR_KPARAM_INFO.
SCALAR_CODES = {"i32": "i", "u32": "I", "i64": "q", "u64": "Q", "fp32": "f", "fp64": "d"}
POINTER_CODE = "P"

# Above this much shared memory per block (static + dynamic) a kernel must opt in with
# CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES before its launch, or the launch fails.
SMEM_OPT_IN = 48 * 1024

# The first CUDA (driver API version) that knows each arch, and the driver release that ships it (CUDA
# Toolkit Release Notes, Table 3). A cubin also needs a driver of its ptxas' major version: within one
# major, CUDA's minor-version compatibility loads cubins from a newer 12.x ptxas on any R525+ driver.
ARCH_FIRST_CUDA = {89: 11080, 90: 12000, 120: 12080}
DRIVER_FOR_CUDA = {11080: "520.61.05", 12000: "525.60.13", 12080: "570.26", 13000: "580.65.06"}


class ManifestError(ValueError):
    """A committed manifest or cubin is missing, stale or inconsistent."""


def type_code(triton_type: str) -> str:
    if triton_type.startswith("*"):
        return POINTER_CODE
    try:
        return SCALAR_CODES[triton_type]
    except KeyError:
        raise ManifestError(f"parameter type {triton_type!r} has no launcher packing; "
                            f"use a pointer or one of {sorted(SCALAR_CODES)}") from None


def layout(types: list[str]) -> list[tuple[int, int]]:
    """(offset, size) of each parameter in the packed argument buffer, native alignment."""
    out, fmt = [], "@"
    for t in types:
        code = type_code(t)
        size = struct.calcsize("@" + code)
        end = struct.calcsize(fmt + code)
        out.append((end - size, size))
        fmt += code
    return out


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class Param:
    name: str
    type: str      # Triton type; the hidden scratch pointers are "*u8"
    offset: int
    size: int


@dataclass(frozen=True)
class KernelEntry:
    """One cubin: what a launcher needs to call it, and where it came from."""

    name: str              # KernelSpec.name, what ops launch by
    symbol: str            # the cubin's entry symbol
    cubin: str             # file name beside the manifest
    sha256: str
    module: str            # the Python module holding the @triton.jit source
    num_warps: int
    num_stages: int
    num_ctas: int
    shared: int            # dynamic shared memory bytes (sharedMemBytes at launch)
    static_shared: int     # static shared memory bytes, read from the cubin's .nv.shared.* sections
    global_scratch_size: int
    global_scratch_align: int
    profile_scratch_size: int
    profile_scratch_align: int
    constexprs: dict
    params: tuple[Param, ...]
    divisibility_16: tuple[str, ...] = ()   # params the cubin assumes are multiples of 16 (bytes for pointers)

    @property
    def block(self) -> tuple[int, int, int]:
        return (32 * self.num_warps, 1, 1)

    @property
    def needs_smem_opt_in(self) -> bool:
        """Static + dynamic shared memory above 48 KiB: the launcher must raise the dynamic limit first."""
        return self.shared + self.static_shared > SMEM_OPT_IN

    @property
    def user_params(self) -> tuple[Param, ...]:
        return self.params[:-len(HIDDEN_PARAMS)]

    @property
    def struct_format(self) -> str:
        return "".join(type_code(p.type) for p in self.params)

    def to_json(self) -> dict:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__ if k != "params"}
        d["params"] = [p.__dict__ for p in self.params]
        d["divisibility_16"] = list(self.divisibility_16)
        return d

    @classmethod
    def from_json(cls, d: dict) -> KernelEntry:
        d = dict(d)
        d["params"] = tuple(Param(**p) for p in d["params"])
        d["divisibility_16"] = tuple(d.get("divisibility_16", ()))
        return cls(**d)


@dataclass(frozen=True)
class Toolchain:
    """What built one target's cubins, and the driver they need."""

    ptxas: str             # e.g. "12.9.86"
    elf_abi: int           # the cubins' ELF ABI version (e_ident[EI_ABIVERSION]): 7 from 12.x ptxas, 8 from 13.x
    min_driver_cuda: int   # cuDriverGetVersion must be at least this (e.g. 12080)
    min_driver: str        # the first driver release with that CUDA (e.g. "570.26")


@dataclass(frozen=True)
class Manifest:
    cc: int
    target: str
    triton: str
    sources: dict          # module -> sha256 of its source and its dependencies (kernels/build.py)
    kernels: dict          # spec name -> KernelEntry
    root: Path
    toolchain: Toolchain

    def cubin_bytes(self, name: str) -> bytes:
        return (self.root / self.kernels[name].cubin).read_bytes()

    def to_json(self) -> str:
        doc = {"schema": SCHEMA, "cc": self.cc, "target": self.target, "triton": self.triton,
               "toolchain": dict(self.toolchain.__dict__),
               "sources": dict(sorted(self.sources.items())),
               "kernels": {n: self.kernels[n].to_json() for n in sorted(self.kernels)}}
        return json.dumps(doc, indent=1, sort_keys=True) + "\n"


def cubin_elf(cubin: bytes, symbol: str) -> tuple[int, int]:
    """(ELF ABI version, static shared memory bytes of `symbol`) read from a cubin's ELF64 header and
    section table: `.nv.shared.<symbol>` plus ptxas' `.nv.shared.reserved.*` (what `cuobjdump -res-usage`
    reports as SHARED, and the reserved bytes it leaves out but the block still occupies)."""
    if cubin[:4] != b"\x7fELF" or cubin[4] != 2:
        raise ManifestError(f"{symbol}: not an ELF64 cubin")
    abi = cubin[8]
    shoff, = struct.unpack_from("<Q", cubin, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", cubin, 0x3A)

    def section(i):
        name, _type, _flags, _addr, _off, size = struct.unpack_from("<IIQQQQ", cubin, shoff + i * shentsize)
        return name, size

    strtab_off, = struct.unpack_from("<Q", cubin, shoff + shstrndx * shentsize + 0x18)
    static = 0
    for i in range(shnum):
        name_off, size = section(i)
        end = cubin.index(b"\0", strtab_off + name_off)
        name = cubin[strtab_off + name_off:end].decode()
        if name == f".nv.shared.{symbol}" or name.startswith(".nv.shared.reserved."):
            static += size
    return abi, static


def min_driver_cuda(cc: int, ptxas_version: str) -> int:
    """The oldest driver (as cuDriverGetVersion reports it) that loads `cc` cubins from this ptxas."""
    major = int(ptxas_version.split(".")[0])
    return max(ARCH_FIRST_CUDA[cc], major * 1000)


def make_params(signature: dict[str, str]) -> tuple[Param, ...]:
    names = list(signature) + list(HIDDEN_PARAMS)
    types = list(signature.values()) + ["*u8"] * len(HIDDEN_PARAMS)
    return tuple(Param(n, t, off, size) for n, t, (off, size) in zip(names, types, layout(types)))


def validate_entry(e: KernelEntry) -> list[str]:
    """Internal consistency of one entry (no file access)."""
    problems = []
    names = tuple(p.name for p in e.params[-len(HIDDEN_PARAMS):])
    if names != HIDDEN_PARAMS:
        problems.append(f"{e.name}: parameter list must end with {HIDDEN_PARAMS}, ends with {names}")
    expect = layout([p.type for p in e.params])
    got = [(p.offset, p.size) for p in e.params]
    if got != expect:
        problems.append(f"{e.name}: parameter offsets {got} differ from native packing {expect}")
    if e.num_ctas != 1:
        problems.append(f"{e.name}: num_ctas={e.num_ctas} (clusters) is not supported by the launcher")
    return problems


def load(cc: int, root: Path = CUBIN_DIR, *, verify_hashes: bool = True) -> Manifest:
    """Read and validate `<root>/<target>/manifest.json`; raise ManifestError with one clear sentence."""
    if cc not in TARGETS:
        raise ManifestError(f"no cubins are built for compute capability {cc // 10}.{cc % 10} "
                            f"(built for {', '.join(f'{c // 10}.{c % 10}' for c in TARGETS)})")
    target = TARGETS[cc]
    path = Path(root) / target / MANIFEST
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise ManifestError(f"{path} is missing; run `python -m kernels.build`") from None
    except json.JSONDecodeError as exc:
        raise ManifestError(f"{path} is not valid JSON: {exc}") from None
    if doc.get("schema") != SCHEMA or doc.get("cc") != cc or doc.get("target") != target:
        raise ManifestError(f"{path} has schema/cc/target {doc.get('schema')}/{doc.get('cc')}/{doc.get('target')}, "
                            f"expected {SCHEMA}/{cc}/{target}; rebuild with `python -m kernels.build`")
    kernels = {n: KernelEntry.from_json(d) for n, d in doc["kernels"].items()}
    problems = [p for e in kernels.values() for p in validate_entry(e)]
    for e in kernels.values():
        f = path.parent / e.cubin
        if not f.exists():
            problems.append(f"{e.name}: {f} is missing")
        elif verify_hashes and sha256(f.read_bytes()) != e.sha256:
            problems.append(f"{e.name}: {f.name} does not match its sha256 in the manifest")
    if problems:
        raise ManifestError(f"{path}: " + "; ".join(problems))
    return Manifest(cc=cc, target=target, triton=doc["triton"], sources=doc["sources"], kernels=kernels,
                    root=path.parent, toolchain=Toolchain(**doc["toolchain"]))
