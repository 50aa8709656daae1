#!/usr/bin/env bash
# The device check, one command on an NVIDIA machine (docs/GPU_CHECK.md): installs the loader if needed,
# then runs every cubin for this GPU against the references, a full-size random-weight model through
# graph replay vs eager torch, and the benchmark; prints one table. Exit 0 = all PASS, 1 = a FAIL,
# 2 = no usable GPU (the reason is printed).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}

# The plumbing on any machine (CI): sections, per-section isolation, JSON lines; no GPU, no install.
if [ "${1:-}" = "--cpu-selftest" ]; then
    exec $PY -m bench.gpu_check "$@"
fi

# No driver or no GPU: say why and stop before installing anything (ctypes probe, never hangs). A GPU
# that this torch cannot use (CPU-only build, driver too old for its CUDA, arch not in the build) gets the
# same paragraph as Engine.load, with the pip line that fits the driver.
$PY -c "
import sys
from kernels.runtime import probe_driver, torch_cannot_use_gpu
p = probe_driver()
if not p.ok:
    sys.exit(print('no GPU check possible here:', p.reason) or 2)
why = torch_cannot_use_gpu()
sys.exit(print(why) or 2) if why else None"

# PyCUDA is the product's loader; it builds from source against the CUDA headers. Where that fails
# (no toolkit), cuda-core's binary wheels load the same cubins.
if ! $PY -c "import pycuda" 2>/dev/null; then
    if command -v nvcc >/dev/null 2>&1; then
        export CUDA_ROOT=${CUDA_ROOT:-$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")}
        export PATH="$CUDA_ROOT/bin:$PATH"
        timeout 300 $PY -m pip install --quiet pycuda || echo "note: PyCUDA did not build; using cuda-core"
    fi
fi
# cuda-bindings is built per CUDA major: 12.x for R525-R579 drivers, 13.x for R580+ only. Install the
# major this driver runs, also over an installed one that does not fit (pip's default resolves to 13.x).
$PY -c "import pycuda" 2>/dev/null || timeout 120 $PY -c "
import subprocess, sys
from kernels.runtime import bindings_problem, bindings_requirements, package_version, probe_driver
p = probe_driver()
if package_version('cuda-core') and not bindings_problem(p.driver_cuda, package_version('cuda-bindings')):
    sys.exit(0)
sys.exit(subprocess.call([sys.executable, '-m', 'pip', 'install', '--quiet', *bindings_requirements(p.driver_cuda)]))"

exec timeout 480 $PY -m bench.gpu_check "$@"
