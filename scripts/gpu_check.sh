#!/usr/bin/env bash
# The device check, one command on an NVIDIA machine (docs/GPU_CHECK.md): the quick pass (the headline
# ms/frame for fp8 and bf16), then every cubin for this GPU against the references, a full-size
# random-weight model through graph replay vs eager torch, and the benchmark; one table. It always ends
# with figures or a reason: a step that fails is a FAIL row (printed, and appended to DIR/rows.jsonl with
# --out DIR), never an early exit. Exit 0 = all PASS, 1 = a FAIL, 2 = no usable GPU, driver or Python
# (the reason is the row).
#
#   scripts/gpu_check.sh [--quick] [--out DIR] [--install]  # --install: pip the cubin loader first, if missing
#   scripts/gpu_check.sh --engine [--checkpoint PATH] [--out DIR]  # the studio's engine; a real checkpoint's FP8
#   scripts/gpu_check.sh --cpu-selftest --out DIR            # no GPU: the plumbing (CI runs this)
#
# PYTHON names the interpreter; python3 by default (GPU images often have no `python`).
set -uo pipefail   # no -e: a failed step is a row, and the check still runs
PY=${PYTHON:-python3}
RUN_TIMEOUT_S=480  # the backstop over the sections' own budgets (470 s in all, bench/gpu_check.py)
PIP_TIMEOUT_S=300  # one pip install, a PyCUDA build from source included

out="" checkpoint="" install=0 args=()
while [ $# -gt 0 ]; do
    case $1 in
        --install) install=1 ;;
        --out) out=${2-}; shift ;;
        --out=*) out=${1#--out=} ;;
        --checkpoint) checkpoint=${2-}; shift ;;
        --checkpoint=*) checkpoint=${1#--checkpoint=} ;;
        *) args+=("$1") ;;
    esac
    shift
done
case $out in "" | /*) ;; *) out=$PWD/$out ;; esac   # DIR and PATH are the caller's, not the repository's
case $checkpoint in "" | /*) ;; *) checkpoint=$PWD/$checkpoint ;; esac
[ -n "$out" ] && args+=(--out "$out")
[ -n "$checkpoint" ] && args+=(--checkpoint "$checkpoint")
case $0 in */*) cd "${0%/*}/.." || exit 2 ;; *) cd .. || exit 2 ;; esac

json() {   # a JSON string (bash only: this runs where Python may not)
    local s=${1//\\/\\\\}
    s=${s//\"/\\\"}
    printf '"%s"' "${s//[[:cntrl:]]/ }"
}

row() {    # section item value status: print it as the check does, and append it to DIR/rows.jsonl
    printf '[%-4s] %s | %s | %s\n' "$4" "$1" "$2" "$3"
    if [ -n "$out" ]; then
        printf '{"section": %s, "item": %s, "value": %s, "limit": "", "status": %s}\n' \
            "$(json "$1")" "$(json "$2")" "$(json "$3")" "$(json "$4")" >> "$out/rows.jsonl"
    fi
}

rows_in_file() {
    local n=0 line
    if [ -n "$out" ] && [ -f "$out/rows.jsonl" ]; then
        while IFS= read -r line; do n=$((n + 1)); done < "$out/rows.jsonl"
    fi
    echo "$n"
}

last_line() {   # the last non-empty line of a file
    local line last=""
    if [ -f "$1" ]; then
        while IFS= read -r line; do [ -n "$line" ] && last=$line; done < "$1"
    fi
    printf '%s' "$last"
}

# `timeout` and `tee` are coreutils; where one is missing the check runs without it.
LIMIT="timeout --foreground -k 10"   # --foreground: in our process group, so a group kill reaches the check
command -v timeout >/dev/null 2>&1 || LIMIT=no_limit
no_limit() { shift; "$@"; }

if [ -n "$out" ]; then
    if ! { mkdir -p "$out" && : > "$out/rows.jsonl" && : > "$out/stderr.txt"; }; then
        echo "cannot write $out/rows.jsonl" >&2
        exit 2
    fi
fi

pip_install() {   # what, then pip's arguments: one row either way
    local what=$1 log rc
    shift
    log=$($LIMIT "$PIP_TIMEOUT_S" $PY -m pip install --quiet --timeout 5 --retries 0 "$@" 2>&1)
    rc=$?
    if [ $rc -eq 0 ]; then
        row install "$what" "installed: $*" INFO
    else
        row install "$what" "pip install $* failed (exit $rc): ${log##*$'\n'}" FAIL
    fi
}

if [ "$install" = 1 ]; then
    # PyCUDA builds from source against the CUDA headers, so only where nvcc is; cuda-core's binary wheels
    # load the same cubins without it.
    if ! $PY -c "import pycuda" >/dev/null 2>&1 && command -v nvcc >/dev/null 2>&1; then
        nvcc=$(readlink -f "$(command -v nvcc)")
        export CUDA_ROOT=${CUDA_ROOT:-${nvcc%/bin/nvcc}}
        export PATH="$CUDA_ROOT/bin:$PATH"
        pip_install pycuda pycuda
    fi
    # cuda-bindings is built per CUDA major: 12.x for R525-R579 drivers, 13.x for R580+ only. Install the
    # major this driver runs, also over an installed one that does not fit (pip's default resolves to 13.x).
    if need=$($PY -c "
from kernels.runtime import bindings_problem, bindings_requirements, package_version, probe_driver
p = probe_driver()
core, bindings = package_version('cuda-core'), package_version('cuda-bindings')
if p.ok and (not core or bindings_problem(p.driver_cuda, bindings)):
    print(' '.join(bindings_requirements(p.driver_cuda)))" 2>&1); then
        read -ra reqs <<< "$need"
        [ ${#reqs[@]} -gt 0 ] && pip_install cuda-core "${reqs[@]}"
    else
        row install cuda-core "could not tell which cuda-bindings this driver needs: ${need##*$'\n'}" FAIL
    fi
fi

# The check. It writes its own rows (no GPU or driver: one row saying why, exit 2); the rows below are for
# what it cannot say itself: a Python that does not start, a crash before its first row, the backstop.
before=$(rows_in_file)
if [ -n "$out" ] && command -v tee >/dev/null 2>&1; then
    $LIMIT "$RUN_TIMEOUT_S" $PY -m bench.gpu_check --append "${args[@]}" 2> >(tee -a "$out/stderr.txt" >&2)
    rc=$?
    wait   # for tee (the last process substitution): then the last of stderr is in the file
elif [ -n "$out" ]; then
    $LIMIT "$RUN_TIMEOUT_S" $PY -m bench.gpu_check --append "${args[@]}" 2>> "$out/stderr.txt"
    rc=$?
else
    $LIMIT "$RUN_TIMEOUT_S" $PY -m bench.gpu_check "${args[@]}"
    rc=$?
fi
case $rc in
    0 | 1 | 2)
        if [ -n "$out" ] && [ "$(rows_in_file)" = "$before" ]; then
            row setup "bench.gpu_check" "ended with exit $rc before its first row: $(last_line "$out/stderr.txt")" FAIL
            [ $rc -eq 0 ] && rc=1
        fi ;;
    124) row run timeout "stopped by the ${RUN_TIMEOUT_S} s backstop (the rows so far are above)" FAIL; rc=1 ;;
    126 | 127) row setup python "'$PY' cannot run here (exit $rc); set PYTHON to a Python 3 with torch" FAIL; rc=2 ;;
    *) row run exit "bench.gpu_check ended with exit $rc (a signal, or killed after the backstop)" FAIL; rc=1 ;;
esac
exit $rc
