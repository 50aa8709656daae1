"""Compile every `KernelSpec` ahead of time into committed cubins, with no GPU and no driver.

    python -m kernels.build                   # all kernels, all archs -> kernels/cubin/<target>/
    python -m kernels.build --arch 90         # one arch
    python -m kernels.build --check           # rebuild what changed since the committed build, compare
    python -m kernels.build --check --full    # rebuild everything into a temp dir, compare

Triton 3.9 compiles to cubin without a driver (KERNELS.md §1). Two settings make the result
reproducible: TRITON_DEFAULT_FP_FUSION=1 pins FMA contraction (its default flips in 3.10) and
TRITON_DISABLE_LINE_INFO=1 keeps the checkout path out of the cubin, so a rebuild anywhere is
byte-identical and `--check` can compare sha256 values.

Each manifest records, per kernel module, a hash of its source and of every module it depends on (the
`kernels.*` and same-package modules it imports, transitively, and the build inputs: this script, the
manifest format, the spec). `--check` trusts the committed cubins of a module whose hash, Triton version
and ptxas are unchanged (their files are still verified against the manifest's sha256) and rebuilds only
the others; `--full` rebuilds everything, which also catches a cubin and manifest entry edited together.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import importlib.util
import os
import shutil
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from kernels import manifest as mf
from kernels.spec import ARCHS, KernelSpec

os.environ["TRITON_DEFAULT_FP_FUSION"] = "1"
os.environ["TRITON_DISABLE_LINE_INFO"] = "1"
# A repo-local cache (gitignored) makes an unchanged rebuild take seconds; the cache key covers the
# source, options, target and Triton version, so a hit is the same cubin a fresh compile would give.
os.environ.setdefault("TRITON_CACHE_DIR", str(Path(__file__).resolve().parents[1] / ".triton_cache"))


def _triton_ptxas() -> str | None:
    spec = importlib.util.find_spec("triton")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(spec.submodule_search_locations[0]) / "backends" / "nvidia" / "bin" / "ptxas"
    return str(path) if path.exists() else None


# One CUDA 12.9 ptxas for every arch. Triton compiles sm_90+ with its bundled 13.x `ptxas-blackwell`,
# whose cubins (ELF ABI 8) need an R580 driver that many H100/H200 hosts, cloud images and Spaces lack
# (R550-R570); 12.9's cubins load on any R525+ driver (sm_120a: R570+, the first driver for that GPU).
# Triton's wheel ships ptxas 12.9.86 as `bin/ptxas`, so no extra package is needed; TRITON_PTXAS_PATH /
# TRITON_PTXAS_BLACKWELL_PATH set by the caller (e.g. pip's nvidia-cuda-nvcc-cu12) take precedence.
if _triton_ptxas():
    os.environ.setdefault("TRITON_PTXAS_BLACKWELL_PATH", os.environ.get("TRITON_PTXAS_PATH", _triton_ptxas()))

# Op-family modules, in the order the decode step uses them.
KERNEL_MODULES = tuple(f"kernels.{m}" for m in
                       ("norm", "gemv", "rope_kv", "attention", "mlp", "head", "sampler", "gemm", "fused", "batch",
                        "splitk"))


# What every cubin depends on besides its kernel sources: the compile options, the manifest format, the spec.
BUILD_INPUTS = ("kernels.build", "kernels.manifest", "kernels.spec")


def _source_path(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        raise SystemExit(f"kernel module {name} not found")
    return Path(spec.origin)


def _imports(name: str) -> set[str]:
    """The modules `name` imports that can hold kernel code it uses: kernels.* and its own package's."""
    packages = {"kernels", name.split(".")[0]}
    found = set()
    for node in ast.walk(ast.parse(_source_path(name).read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names}   # `from kernels import common`
    out = set()
    for dep in found:
        if dep.split(".")[0] not in packages or dep == name:
            continue
        try:
            spec = importlib.util.find_spec(dep)
        except ModuleNotFoundError:
            continue
        if spec is not None and spec.origin and spec.origin.endswith(".py") and not spec.origin.endswith("__init__.py"):
            out.add(dep)
    return out


def dependencies(name: str) -> list[str]:
    """`name`, every module it imports transitively (see `_imports`) and BUILD_INPUTS, sorted."""
    seen, todo = set(), [name, *BUILD_INPUTS]
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo += sorted(_imports(m))
    return sorted(seen)


def source_hash(name: str) -> str:
    """sha256 over the source text of `name` and of its dependencies, read from disk."""
    return mf.sha256(b"".join(f"{m}\n".encode() + _source_path(m).read_bytes() + b"\0"
                              for m in dependencies(name)))


def collect(modules=KERNEL_MODULES) -> dict[str, list[KernelSpec]]:
    """module name -> its KERNELS list. A module that does not exist is an error, not a silent skip."""
    out = {}
    for name in modules:
        if importlib.util.find_spec(name) is None:
            raise SystemExit(f"kernel module {name} not found")
        specs = getattr(importlib.import_module(name), "KERNELS", None)
        if not isinstance(specs, list) or not all(isinstance(s, KernelSpec) for s in specs):
            raise SystemExit(f"{name} must end with `KERNELS = [KernelSpec(...), ...]`")
        out[name] = specs
    names = [s.name for specs in out.values() for s in specs]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise SystemExit(f"duplicate KernelSpec names: {dupes}")
    return out


def _ast_source(spec: KernelSpec):
    from triton.compiler import ASTSource

    fn = spec.fn
    signature, attrs = {}, {}
    for i, arg in enumerate(fn.arg_names):
        if arg in spec.constexprs:
            signature[arg] = "constexpr"
        elif arg in spec.signature:
            signature[arg] = spec.signature[arg]
            if arg in spec.divisibility_16:
                attrs[(i,)] = [["tt.divisibility", 16]]
        else:
            raise SystemExit(f"{spec.name}: parameter {arg!r} of {fn.__name__} is in neither signature nor constexprs")
    unknown_div = set(spec.divisibility_16) - set(spec.signature)
    if unknown_div:
        raise SystemExit(f"{spec.name}: divisibility_16 names unknown parameters {sorted(unknown_div)}")
    extra = set(spec.signature) - set(fn.arg_names)
    if extra or list(spec.signature) != [a for a in fn.arg_names if a in spec.signature]:
        raise SystemExit(f"{spec.name}: signature keys must be {fn.__name__}'s non-constexpr parameters in order "
                         f"(unknown: {sorted(extra)})")
    return ASTSource(fn=fn, signature=signature, constexprs=dict(spec.constexprs), attrs=attrs)


def compile_spec(spec: KernelSpec, module: str, cc: int) -> tuple[bytes, mf.KernelEntry]:
    import triton
    from triton.backends.compiler import GPUTarget

    k = triton.compile(_ast_source(spec), target=GPUTarget("cuda", cc, 32),
                       options=dict(num_warps=spec.num_warps, num_stages=spec.num_stages,
                                    **({} if spec.maxnreg_for(cc) is None else {"maxnreg": spec.maxnreg_for(cc)})))
    md = k.metadata
    if md.launch_cooperative_grid or md.launch_pdl or md.tensordesc_meta or md.tmem_size:
        raise SystemExit(f"{spec.name} sm_{cc}: needs cooperative/PDL/TMA/TMEM launch support the runtime lacks")
    cubin = k.asm["cubin"]
    _abi, static_shared = mf.cubin_elf(cubin, md.name)
    entry = mf.KernelEntry(
        name=spec.name, symbol=md.name, cubin=f"{spec.name}.cubin", sha256=mf.sha256(cubin), module=module,
        num_warps=md.num_warps, num_stages=md.num_stages, num_ctas=md.num_ctas, shared=md.shared,
        static_shared=static_shared,
        global_scratch_size=md.global_scratch_size, global_scratch_align=md.global_scratch_align,
        profile_scratch_size=md.profile_scratch_size, profile_scratch_align=md.profile_scratch_align,
        constexprs={k: (v if isinstance(v, (bool, int, float)) else str(v)) for k, v in spec.constexprs.items()},
        params=mf.make_params(spec.signature), divisibility_16=tuple(spec.divisibility_16))
    return cubin, entry


def _worker_init() -> None:
    os.environ["TRITON_INTERPRET"] = "0"


def _compile_job(module: str, spec_name: str, cc: int):
    spec = next(s for s in importlib.import_module(module).KERNELS if s.name == spec_name)
    t0 = time.perf_counter()
    cubin, entry = compile_spec(spec, module, cc)
    return cc, cubin, entry, time.perf_counter() - t0


def toolchain(cc: int, cubins: list[bytes]) -> mf.Toolchain:
    """The ptxas Triton used for `cc`, the cubins' ELF ABI, and the oldest driver that loads them."""
    from triton.backends.nvidia.compiler import get_ptxas

    version = get_ptxas(cc).version
    abis = {mf.cubin_elf(c, "")[0] for c in cubins} or {0}
    if len(abis) > 1:
        raise SystemExit(f"{mf.TARGETS[cc]}: cubins with mixed ELF ABI versions {sorted(abis)}")
    need = mf.min_driver_cuda(cc, version)
    return mf.Toolchain(ptxas=version, elf_abi=abis.pop(), min_driver_cuda=need, min_driver=mf.DRIVER_FOR_CUDA[need])


def build(out_root: Path, archs=ARCHS, modules=KERNEL_MODULES, jobs: int | None = None,
          log=print) -> dict[int, mf.Manifest]:
    """Compile all specs of `modules` for `archs` and write `<out_root>/<target>/` (replacing it)."""
    import triton

    by_module = collect(modules)
    jobs_list = [(m, s.name, cc) for m, specs in by_module.items() for s in specs for cc in s.archs if cc in archs]
    jobs = jobs or min(len(jobs_list), os.cpu_count() or 1) or 1
    results: dict[int, list] = {cc: [] for cc in archs}
    # Compile in fresh processes: a caller that imported the kernel modules under TRITON_INTERPRET=1
    # (the CPU test session) holds InterpretedFunctions, which Triton's compiler cannot take.
    import multiprocessing

    with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn"), initializer=_worker_init) as pool:
        done = list(pool.map(_compile_job, *zip(*jobs_list))) if jobs_list else []
    for cc, cubin, entry, secs in done:
        results[cc].append((cubin, entry))
        log(f"  {mf.TARGETS[cc]:8s} {entry.name:32s} {len(cubin):7d} B  shared {entry.shared:6d}  {secs:5.2f} s")
    sources = {m: source_hash(m) for m in by_module}
    manifests = {}
    for cc in archs:
        d = Path(out_root) / mf.TARGETS[cc]
        if d.exists():
            shutil.rmtree(d)
        d.mkdir(parents=True)
        for cubin, entry in results[cc]:
            (d / entry.cubin).write_bytes(cubin)
        m = mf.Manifest(cc=cc, target=mf.TARGETS[cc], triton=triton.__version__, sources=sources,
                        kernels={e.name: e for _, e in results[cc]}, root=d,
                        toolchain=toolchain(cc, [cubin for cubin, _ in results[cc]]))
        (d / mf.MANIFEST).write_text(m.to_json())
        manifests[cc] = m
    return manifests


def _compare(old: mf.Manifest, fresh: mf.Manifest, modules, problems: list[str]) -> None:
    """Append a line per difference between the committed and the fresh entries of `modules`."""
    target = fresh.target
    for m in sorted(modules):
        if old.sources.get(m) != fresh.sources.get(m):
            problems.append(f"{target}: {m} changed since the cubins were built")
    names = {n for n, e in fresh.kernels.items() if e.module in modules}
    names |= {n for n, e in old.kernels.items() if e.module in modules}
    for name in sorted(names):
        a, b = old.kernels.get(name), fresh.kernels.get(name)
        if a is None or b is None:
            problems.append(f"{target}/{name}: {'not committed' if a is None else 'no longer built'}")
        elif a != b:
            what = [f for f in a.__dataclass_fields__ if getattr(a, f) != getattr(b, f)]
            problems.append(f"{target}/{name}: differs in {', '.join(what)}")


def check(committed: Path = mf.CUBIN_DIR, archs=ARCHS, modules=KERNEL_MODULES, jobs=None, log=print,
          full: bool = False) -> list[str]:
    """One line per difference between the committed tree and a fresh build (empty = in sync).

    By default only the modules whose source hash (with dependencies), Triton version or ptxas differ from
    the committed manifest are rebuilt; `full` rebuilds every module."""
    import triton
    from triton.backends.nvidia.compiler import get_ptxas

    by_module = collect(modules)
    problems, olds, stale = [], {}, {}
    for cc in archs:
        target = mf.TARGETS[cc]
        if not (Path(committed) / target / mf.MANIFEST).exists():
            problems.append(f"{target}: no committed manifest")
            continue
        try:
            old = olds[cc] = mf.load(cc, Path(committed))      # also verifies every cubin's sha256
        except mf.ManifestError as exc:
            problems.append(str(exc))
            continue
        gone = sorted(set(old.sources) - set(by_module))
        problems += [f"{target}: {m} has committed cubins but is no longer a kernel module" for m in gone]
        if full or old.triton != triton.__version__ or old.toolchain.ptxas != get_ptxas(cc).version:
            stale[cc] = set(by_module)
        else:
            stale[cc] = {m for m in by_module if old.sources.get(m) != source_hash(m)}
    rebuild = sorted(set().union(*stale.values())) if stale else []
    log(f"rebuilding {len(rebuild)} of {len(by_module)} kernel modules: {', '.join(rebuild) or 'none'}")
    if not rebuild:
        return problems
    with tempfile.TemporaryDirectory() as tmp:
        ccs = tuple(cc for cc in archs if stale.get(cc))
        build(Path(tmp), ccs, tuple(rebuild), jobs, log=lambda *_: None)
        for cc in ccs:
            fresh, old = mf.load(cc, Path(tmp)), olds[cc]
            before = len(problems)
            _compare(old, fresh, stale[cc], problems)
            if len(problems) == before and full and fresh.toolchain != old.toolchain:
                problems.append(f"{fresh.target}: toolchain differs ({old.toolchain} vs {fresh.toolchain})")
            if len(problems) == before and old.triton != fresh.triton:
                problems.append(f"{fresh.target}: built with triton {old.triton}, this is {fresh.triton}")
    return problems


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kernels.build", description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", default=",".join(map(str, ARCHS)), help="comma-separated compute capabilities")
    ap.add_argument("--check", action="store_true",
                    help="rebuild the kernel modules changed since the committed build and compare")
    ap.add_argument("--full", action="store_true", help="with --check: rebuild every kernel module")
    ap.add_argument("--out", type=Path, default=mf.CUBIN_DIR)
    ap.add_argument("--jobs", type=int, default=None, help="parallel compiles (default: CPU count)")
    args = ap.parse_args(argv)
    archs = tuple(int(a) for a in args.arch.split(","))
    unknown = [a for a in archs if a not in mf.TARGETS]
    if unknown:
        ap.error(f"unsupported arch {unknown}; choose from {sorted(mf.TARGETS)}")
    t0 = time.perf_counter()
    if args.check:
        problems = check(args.out, archs, jobs=args.jobs, full=args.full)
        for p in problems:
            print("STALE", p)
        print(f"{'OK' if not problems else 'FAIL'}: committed cubins {'match' if not problems else 'differ from'} "
              f"a {'full' if args.full else 'changed-modules'} rebuild ({time.perf_counter() - t0:.1f} s)")
        return 1 if problems else 0
    manifests = build(args.out, archs, jobs=args.jobs)
    total = sum((m.root / e.cubin).stat().st_size for m in manifests.values() for e in m.kernels.values())
    n = sum(len(m.kernels) for m in manifests.values())
    print(f"built {n} cubins ({total / 1024:.0f} KiB) into {args.out} in {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
