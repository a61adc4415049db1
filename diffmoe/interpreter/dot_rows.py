"""The interpreter's `tl.dot` computed one output row at a time: a row's bits never depend on the
other rows of the tile.

Under `TRITON_INTERPRET=1` triton 3.9's `InterpreterBuilder.create_dot` multiplies the whole
[M, K] tile by the [K, N] tile with one `np.matmul`, i.e. one BLAS gemm. A gemm may accumulate a
row in an order chosen from the row's place in the product and from M: OpenBLAS's Haswell
kernels do (`OPENBLAS_CORETYPE=Haswell OPENBLAS_L2_SIZE=512`, which machines of this kind set on
some processors). Measured here (numpy 2.4's bundled OpenBLAS, one thread, bf16-valued float32
operands): of the 32 rows of a 32x128 @ 128x256 product, 20 changed bits when the same row sat
at another place of the tile, and 5 of the first 17 rows changed when the product had 17 rows
instead of 32; with the variables unset, none. On a GPU a tile's row is computed from that row
and the B tile alone, so the interpreter's dependence on the neighbours was a property of the
interpreter, not of the kernel: the batch-invariance oracle reported the shipped kernel (a bf16
gate/up element of T=70 moved 1 ulp at row 87 of a 141-token batch; issue 33).

`install()` wraps `create_dot` so that the product is `np.matmul(a[..., :, None, :],
b[..., None, :, :])`: a stack of M one-row products, each of which numpy runs as its own BLAS
gemv of that row (or its own loop where the operands are not BLAS-able), so the reduction order
of a row is fixed by K, N and the row's own values, whatever M or the other rows hold. Triton's
own method still does everything else (the operand conversions, the accumulator add), on the
same values, so the only change is which BLAS routine sums each row. The cost: a one-row gemv
per row instead of one gemm, 1.5x to 2x the product's time on the kernels' tile shapes (27 us ->
49 us for 32x128 @ 128x256, one thread), lost in a check's interpretation: measured 2026-12-05
on this 2-core machine (process seconds, medians of 3, alternating in one process), the cheap
check of bench/ab_interpreter_speed.py's three configs took 1.96 s with whole-tile dots and
1.93 s row by row, a default check of T=16 E=8 K=2 H=I=128 fp8-token fused 0.545 s and 0.538 s:
no difference above the noise (`TRITON_INTERPRET=1 .venv/bin/python bench/ab_dot_rows.py --rounds 3`).

The correcting fixes (diffmoe.interpreter.fixes) are installed on top of it and compute their
bf16 and fp8 dots with the same `matmul_by_rows`, so the kernels' float32 software paths (which
reach this wrapper) and the fixed dots stay bitwise equal; `fixes.suspended()` brings triton's
defective conversions back, not the row dependence (no software path models that).

Pinned to the Triton release it was read from (diffmoe.interpreter.fixes.SUPPORTED_TRITON: the
fixes check the method's signature before they install it). Imports Triton only in `install()`.

Owns the row-by-row product and the wrapper of `InterpreterBuilder.create_dot` beneath the
fixes. Must not change a dot's operands, conversions or accumulator handling.
"""

from __future__ import annotations

import threading

_lock = threading.Lock()
_original = None  # triton's own create_dot while the wrapper is installed
_wrapper = None  # the wrapper installed


def matmul_by_rows(a, b, dtype):
    """a [..., M, K] @ b [..., K, N] in `dtype`, each output row computed from its own row of `a`
    and `b` alone (one BLAS gemv, or numpy's own loop, per row)."""
    import numpy as np

    return np.matmul(np.expand_dims(a, -2), np.expand_dims(b, -3), dtype=dtype).squeeze(-2)


def install() -> bool:
    """Wrap triton's `InterpreterBuilder.create_dot` (idempotent, thread-safe); True when the
    wrapper is in place. The caller has checked the triton release and the method's signature."""
    global _original, _wrapper
    with _lock:
        if _original is not None:
            return True
        import numpy as np
        from triton.runtime import interpreter

        builder, handle = interpreter.InterpreterBuilder, interpreter.TensorHandle
        original = builder.__dict__["create_dot"]

        def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
            # a stack of one-row products: [..., M, 1, K] @ [..., 1, K, N] + [..., M, 1, N]
            out = original(self, handle(np.expand_dims(a.data, -2), a.dtype.scalar),
                           handle(np.expand_dims(b.data, -3), b.dtype.scalar),
                           handle(np.expand_dims(d.data, -2), d.dtype.scalar), input_precision, max_num_imprecise_acc)
            return handle(out.data.squeeze(-2), out.dtype.scalar)

        create_dot.__wrapped__ = original
        builder.create_dot = create_dot
        _original, _wrapper = original, create_dot
        return True


def installed() -> bool:
    return _original is not None


def uninstall() -> None:
    """Put triton's own create_dot back (a test shows the row dependence with it). Only while the
    wrapper is the class's method, i.e. with the fixes uninstalled or suspended."""
    global _original, _wrapper
    with _lock:
        if _original is None:
            return
        from triton.runtime import interpreter

        if interpreter.InterpreterBuilder.__dict__["create_dot"] is not _wrapper:
            raise RuntimeError("create_dot is wrapped by the interpreter fixes: uninstall them first")
        interpreter.InterpreterBuilder.create_dot = _original
        _original, _wrapper = None, None
