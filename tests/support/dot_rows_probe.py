"""Run as a script, in a process of its own: OpenBLAS reads OPENBLAS_CORETYPE once, when numpy
loads it (tests/interpreter/test_interpreter_dot_rows.py starts one with OPENBLAS_CORETYPE=Haswell
OPENBLAS_L2_SIZE=512 and one without).

An interpreted kernel multiplies a [BLOCK_M, 128] tile by a [128, BLOCK_N] tile (the GEMM
kernels' shapes, optimized/tiles.py) in float32 `tl.dot`, then the same tile with its rows
rotated, and with only its first rows; it counts the rows whose bits moved, with the row-by-row
dot (diffmoe.interpreter.dot_rows) and with triton's own whole-tile dot, and prints one JSON
object: {"rows": rows compared, "dot_rows": moves with it, "triton": moves without it}.
"""

from __future__ import annotations

import json
import os

os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402

import optimized  # noqa: E402,F401 - installs the interpreter fixes and the row-by-row dot beneath them
from diffmoe.interpreter import dot_rows, fixes  # noqa: E402

# the tile shapes and the one-tile kernel of the BLAS-threads probe: one kernel, two probes
from blas_threads_probe import SHAPES, tile_dot_kernel  # noqa: E402


def dot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    m, k = a.shape
    c = torch.empty(m, b.shape[1])
    tile_dot_kernel[(1,)](a.contiguous(), b, c, m, k, b.shape[1])
    return c


def moved_rows() -> int:
    """Rows of the products whose bits differ when the row sits elsewhere or the tile is shorter."""
    generator = torch.Generator().manual_seed(0)
    moved = 0
    for m, k, n in SHAPES:
        a = torch.randn(m, k, generator=generator).bfloat16().float()  # bf16 values, as the kernels' operands
        b = torch.randn(k, n, generator=generator).bfloat16().float()
        whole = dot(a, b)
        shift = m // 2 + 1
        rotated = dot(torch.roll(a, shift, 0), b).roll(-shift, 0)
        half = dot(a[: m // 2], b)  # a power-of-two row count: tl.arange needs one
        for i in range(m):
            same = torch.equal(whole[i].view(torch.int32), rotated[i].view(torch.int32))
            if i < m // 2:
                same = same and torch.equal(whole[i].view(torch.int32), half[i].view(torch.int32))
            moved += not same
    return moved


def main() -> dict:
    with_rows = moved_rows()
    with fixes.suspended(gated=True):
        dot_rows.uninstall()
        try:
            without = moved_rows()
        finally:
            dot_rows.install()
    return {"rows": sum(m for m, _, _ in SHAPES), "dot_rows": with_rows, "triton": without,
            "OPENBLAS_CORETYPE": os.environ.get("OPENBLAS_CORETYPE")}


if __name__ == "__main__":
    print(json.dumps(main()))
