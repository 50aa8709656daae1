"""Does this machine's NVIDIA driver fit what we run on it: torch's CUDA build, and the committed cubins?

Pure functions over a driver probe (`kernels.runtime.probe_driver`: ctypes, no torch) and a torch module,
so every case is tested on the CPU with both monkeypatched. The answer is one paragraph a user can act
on: the GPU, the driver, torch's CUDA version, why they do not fit, and the one command that fixes it.
"""

from __future__ import annotations

# Minimum Linux driver for each CUDA toolkit (major, minor), from NVIDIA's CUDA Toolkit Release Notes,
# Table 3 "CUDA Toolkit and Corresponding Driver Versions" (the GA release of each toolkit).
MIN_DRIVER = {(12, 0): "525.60.13", (12, 1): "530.30.02", (12, 2): "535.54.03", (12, 3): "545.23.06",
              (12, 4): "550.54.14", (12, 5): "555.42.02", (12, 6): "560.28.03", (12, 8): "570.26",
              (12, 9): "575.51.03", (13, 0): "580.65.06"}

# CUDA builds torch publishes per release at https://download.pytorch.org/whl/<tag> (pytorch/pytorch
# RELEASE.md, "Release Compatibility Matrix"; pytorch.org/get-started/previous-versions). cu126 / cu128 /
# cu130 is the set of the 2.9-2.11 releases; it was not re-checked for 2.13 from the offline build machine,
# so compare it with that matrix when torch's pin moves.
TORCH_VERSION = "2.13.0"
TORCH_CUDA_BUILDS = ((13, 0), (12, 8), (12, 6))
TORCH_INDEX = "https://download.pytorch.org/whl/"

CPU_OVERRIDE = ("To run on the CPU anyway (a 4B model is several times slower than real time there), "
                "pass `--device cpu` (Engine.load(device=\"cpu\")); that skips this check.")


def cuda_version(text_or_int) -> tuple[int, int] | None:
    """(major, minor) from torch's "12.8" or the driver API's 12080; None for no CUDA."""
    if text_or_int in (None, "", 0):
        return None
    if isinstance(text_or_int, int):
        return text_or_int // 1000, text_or_int % 1000 // 10
    major, minor = str(text_or_int).split(".")[:2]
    return int(major), int(minor)


def _v(cuda: tuple[int, int] | None) -> str:
    return "none" if cuda is None else f"{cuda[0]}.{cuda[1]}"


def min_driver(cuda: tuple[int, int]) -> str:
    """The driver a CUDA build needs. Within a major version, CUDA's minor-version compatibility lets a
    12.x build run on the major's first driver (R525 for 12, R580 for 13), except for PTX JIT; we name
    the toolkit's own driver, which is what torch's `is_available()` needs for every feature."""
    if cuda in MIN_DRIVER:
        return MIN_DRIVER[cuda]
    older = [k for k in MIN_DRIVER if k <= cuda]
    return MIN_DRIVER[max(older)] if older else MIN_DRIVER[min(MIN_DRIVER)]


def torch_build_for(driver_cuda: tuple[int, int] | None) -> tuple[int, int] | None:
    """The newest torch CUDA build this driver runs: the newest build not newer than the driver's CUDA,
    else (same major, minor-version compatibility) the oldest build of the driver's major."""
    if driver_cuda is None:
        return None
    fits = [b for b in TORCH_CUDA_BUILDS if b <= driver_cuda]
    if fits:
        return max(fits)
    same_major = [b for b in TORCH_CUDA_BUILDS if b[0] == driver_cuda[0]]
    return min(same_major) if same_major else None


def install_line(build: tuple[int, int]) -> str:
    return f"pip install torch=={TORCH_VERSION} --index-url {TORCH_INDEX}cu{build[0]}{build[1]}"


def arch_in_build(cc: int, arch_list: list[str]) -> bool:
    """Can a torch built for `arch_list` (torch.cuda.get_arch_list()) run on compute capability `cc`?
    SASS for sm_XY runs on the same major with minor >= Y; PTX compute_XY is JIT-compiled for any cc >= XY."""
    for a in arch_list:
        kind, _, num = a.partition("_")
        num = num.rstrip("af")
        if not num.isdigit():
            continue
        built = int(num)
        if kind == "sm" and built // 10 == cc // 10 and built <= cc:
            return True
        if kind == "compute" and built <= cc:
            return True
    return False


def torch_mismatch(probe, torch) -> str | None:
    """None when there is no NVIDIA GPU (nothing to say) or torch can use the one there is; otherwise
    one paragraph naming the GPU, the driver, torch's CUDA version, why they do not fit, and the fix."""
    if not probe.ok:
        return None
    driver_cuda = cuda_version(probe.driver_cuda)
    built_cuda = cuda_version(torch.version.cuda)
    archs = list(torch.cuda.get_arch_list()) if built_cuda else []
    if built_cuda is None:
        why = "this torch build has no CUDA (a CPU-only wheel)"
    elif not torch.cuda.is_available():
        if driver_cuda is None or driver_cuda < built_cuda:
            why = (f"the driver is older than torch's CUDA {_v(built_cuda)} needs "
                   f"(driver {min_driver(built_cuda)} or newer)")
        else:
            why = "torch could not initialise CUDA on it (is CUDA_VISIBLE_DEVICES hiding it?)"
    elif not arch_in_build(probe.cc, archs):
        why = (f"compute capability {probe.cc // 10}.{probe.cc % 10} is not in this torch build "
               f"(built for {', '.join(archs) or 'no GPU architectures'})")
    else:
        return None
    driver = f"driver {probe.driver}" if probe.driver else "a driver"
    gpu = (f"{probe.name or 'An NVIDIA GPU'} (compute capability {probe.cc // 10}.{probe.cc % 10}, {driver} "
           f"supporting CUDA {_v(driver_cuda)})")
    head = f"{gpu} is present, but torch {torch.__version__} (CUDA {_v(built_cuda)}) cannot use it: {why}."
    build = torch_build_for(driver_cuda)
    if build is None:
        fix = (f"No torch {TORCH_VERSION} build runs on this driver: update the NVIDIA driver to "
               f"{min_driver(min(TORCH_CUDA_BUILDS))} or newer, then `{install_line(min(TORCH_CUDA_BUILDS))}`.")
    else:
        fix = f"Install the build that fits this driver: `{install_line(build)}`."
        if build == built_cuda and why.startswith("compute capability"):
            fix = (f"No torch {TORCH_VERSION} build for this driver includes that GPU: update the NVIDIA driver "
                   f"to {min_driver(max(TORCH_CUDA_BUILDS))} or newer, then "
                   f"`{install_line(max(TORCH_CUDA_BUILDS))}`.")
    return f"{head} {fix} {CPU_OVERRIDE}"


def cubin_driver_problem(gpu: str, driver_cuda: int | None, needs_cuda: int, needs_driver: str,
                         target: str) -> str | None:
    """One sentence when the driver is older than the committed cubins for `target` need (the manifest's
    `min_driver_cuda`, from the ptxas that built them); None when it is new enough."""
    if driver_cuda is not None and driver_cuda >= needs_cuda:
        return None
    has = "an unknown driver" if driver_cuda is None else f"a driver supporting CUDA {_v(cuda_version(driver_cuda))}"
    return (f"{gpu} has {has}, but the {target} cubins need driver {needs_driver} or newer "
            f"(CUDA {_v(cuda_version(needs_cuda))}); update the NVIDIA driver, or use backend='torch'")
