"""Run as a script, in a process of its own: OpenBLAS reads OPENBLAS_CORETYPE once, when numpy
loads it, so each BLAS configuration needs a fresh process (tests/interpreter/test_interpreter_speed.py
starts one with the variable set and one without).

It multiplies the tile shapes the GEMM kernels use (BLOCK_M 16/32/64 by BLOCK_K 128 by BLOCK_N
128/256, optimized/tiles.py) at scales 1e-3, 1 and 1e4, in an interpreted Triton kernel's
float32 `tl.dot` and in numpy directly, each with numpy's BLAS on one thread and on two, and
prints one JSON object: how many of the 18 products differ between one thread and two

- "numpy": numpy itself (a property of the BLAS build and its configuration);
- "triton": an interpreted kernel under triton's own interpreter (which keeps numpy's threads),
  its dots computed row by row (diffmoe.interpreter.dot_rows, which stays when the fast path is
  uninstalled: a gemv per row, not numpy's gemm of the whole tile);
- "fast_path": the same kernel under diffmoe's interpreter fast path (which pins one thread);

and "fast_vs_triton": how many differ between the fast path and triton's own interpreter run
with the BLAS configuration the fast path uses (one thread). The product claims fast_path == 0
and fast_vs_triton == 0 on every configuration; numpy and triton are measured, not claimed.
"""

from __future__ import annotations

import json
import os

os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

import optimized  # noqa: E402,F401 - installs the interpreter fast path
from diffmoe.interpreter import fast_path as interpreter_speed  # noqa: E402

SHAPES = [(m, 128, n) for m in (16, 32, 64) for n in (128, 256)]
SCALES = (1e-3, 1.0, 1e4)


@triton.jit
def tile_dot_kernel(
    # Pointers
    a_ptr, b_ptr, c_ptr,
    # Meta-parameters
    BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """Grid (1,): the one program multiplies a [BLOCK_M, BLOCK_K] by a [BLOCK_K, BLOCK_N] tile,
    both contiguous, into c in float32."""
    offs_m = tl.arange(0, BLOCK_M)
    offs_k = tl.arange(0, BLOCK_K)
    offs_n = tl.arange(0, BLOCK_N)
    a = tl.load(a_ptr + offs_m[:, None] * BLOCK_K + offs_k[None, :])
    b = tl.load(b_ptr + offs_k[:, None] * BLOCK_N + offs_n[None, :])
    tl.store(c_ptr + offs_m[:, None] * BLOCK_N + offs_n[None, :], tl.dot(a, b, input_precision="ieee"))


def _bits_differ(x: torch.Tensor, y: torch.Tensor) -> bool:
    return not torch.equal(x.view(torch.int32), y.view(torch.int32))


def main() -> dict:
    threads = interpreter_speed.numpy_blas_threads()
    if threads is None:
        return {"openblas": False}
    _, put = threads
    generator = torch.Generator().manual_seed(0)
    counts = {"numpy": 0, "triton": 0, "fast_path": 0, "fast_vs_triton": 0}
    for m, k, n in SHAPES:
        for scale in SCALES:
            a = torch.randn(m, k, generator=generator) * scale
            b = torch.randn(k, n, generator=generator) * scale

            def kernel() -> torch.Tensor:
                c = torch.empty(m, n)
                tile_dot_kernel[(1,)](a, b, c, m, k, n)
                return c

            def numpy() -> torch.Tensor:
                return torch.from_numpy(a.numpy() @ b.numpy())

            by_threads = {}
            for count in (2, 1):
                put(count)
                by_threads[count] = {"numpy": numpy(), "fast_path": kernel()}
                interpreter_speed.uninstall()
                try:
                    by_threads[count]["triton"] = kernel()
                finally:
                    interpreter_speed.install()
            for name in ("numpy", "triton", "fast_path"):
                counts[name] += _bits_differ(by_threads[1][name], by_threads[2][name])
            counts["fast_vs_triton"] += _bits_differ(by_threads[1]["fast_path"], by_threads[1]["triton"])
    return {"openblas": True, "products": len(SHAPES) * len(SCALES), **counts,
            "OPENBLAS_CORETYPE": os.environ.get("OPENBLAS_CORETYPE")}


if __name__ == "__main__":
    print(json.dumps(main()))
