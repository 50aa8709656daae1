"""`python -m tests.interp_python -m MODULE ARGS...`: run MODULE as `python -m` would, with the speed-ups
of Triton's interpreter that the test processes have (tests/interp_rounding.py `speed_ups`: the same
arithmetic, about a third less time). A test that runs a script through a subprocess passes this as the
script's interpreter (`PYTHON=...`), so the subprocess gets those, and only those:
the interpreter's own rounding is left as the script meets it on any machine. The module runs under the
interpreter: TRITON_INTERPRET is set before triton is imported (Triton's own @jit helpers, tl.sum and the
like, are interpreted only if it is set when triton.language is first imported)."""

from __future__ import annotations

import os
import runpy
import sys


def main() -> None:
    if len(sys.argv) < 3 or sys.argv[1] != "-m":
        sys.exit("usage: python -m tests.interp_python -m MODULE [ARGS...]")
    module = sys.argv[2]
    os.environ.setdefault("TRITON_INTERPRET", "1")
    from tests import interp_rounding

    interp_rounding.speed_ups()
    sys.argv = [module, *sys.argv[3:]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
