"""What a kernel source file declares so that `kernels/build.py` can compile it ahead of time and
`kernels/runtime.py` can launch the resulting cubin with the right parameter list.

Each op-family file (`kernels/norm.py`, `kernels/gemv.py`, ...) ends with `KERNELS = [KernelSpec(...), ...]`:
one entry per compiled variant (dtype, tile). Importing a kernel file must not need a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# Target archs: Ada (RTX 4090), Hopper (H100/H200; Triton emits sm_90a), Blackwell consumer (RTX 5090; sm_120a).
ARCHS = (89, 90, 120)


@dataclass(frozen=True)
class KernelSpec:
    """One compiled variant of a `@triton.jit` function.

    `signature` maps every non-constexpr parameter, in order, to its Triton type ("*bf16", "*fp8e4nv",
    "*fp32", "*i64", "i32", "fp32", ...). `constexprs` fixes the tile sizes and switches; they are baked
    into the cubin and do not appear in its parameter list. `archs` lists the compute capabilities this
    variant is built for (FP8 variants need tensor-core FP8: all three targets have it).
    """

    name: str
    fn: object
    signature: dict[str, str]
    constexprs: dict[str, int | bool] = field(default_factory=dict)
    num_warps: int = 4
    num_stages: int = 3
    archs: tuple[int, ...] = ARCHS
    divisibility_16: tuple[str, ...] = ()  # pointer / int params known to be multiples of 16 (alignment hints)
    # ptxas' register cap (.maxnreg). Without one, ptxas may spill a value to stay under an occupancy
    # step it guesses from registers alone; a kernel whose occupancy is set by shared memory or its grid
    # states its budget here instead. Compile-only: it is baked into the cubin. A dict gives it per arch
    # (compute capability -> cap; an arch not listed is uncapped), for kernels where one cap spills on
    # one arch and not on another.
    maxnreg: int | dict[int, int] | None = None

    def maxnreg_for(self, cc: int) -> int | None:
        return self.maxnreg.get(cc) if isinstance(self.maxnreg, dict) else self.maxnreg

    @property
    def params(self) -> list[str]:
        """The parameter names a launcher passes, in order (before Triton's two hidden scratch pointers)."""
        return list(self.signature)
