"""Rounding and activation helpers shared by every kernel (jit code only).

Why software rounding exists (../shared/DESIGN.md, "Facts measured here"): triton 3.9's
interpreter, unpatched, gets float32 -> float8_e4m3fn wrong (mantissa carry dropped, ties away
from zero: ~2.6% of random values), truncates float32 -> bfloat16 (~50% one ulp off) and mangles
bf16 subnormals on the way to float32. Rounding the float32 value onto the target grid first,
with integer ops or an exact float trick, and moving bf16 bits by hand, makes the result exact
on every backend.

Where those defects are fixed: at the interpreter, once (diffmoe.interpreter.fixes, installed by
optimized.launch before any launch), exactly and bit for bit as the software paths below compute
(tests/interpreter/test_interpreter_fixes.py). The conformance probes then find the native casts right, so
the software switches are off on the interpreter too and the kernels run as on CUDA, where the
native casts are round-to-nearest-even already. The switches (SOFTWARE_ROUNDING here, chosen by
optimized.backend from the probes) remain for any backend whose probes still find a defect: a
Triton version the interpreter fixes refuse to patch (they are pinned to 3.9's internals), or a
GPU (the compile gate's "safe" variant keeps them compiling).

Owns the numerics helpers. Must not read memory: pointers are the kernels'.
"""

import triton
import triton.language as tl

E4M3_MAX = tl.constexpr(448.0)  # largest finite float8_e4m3fn
E4M3_MIN_NORMAL = tl.constexpr(0.015625)  # 2^-6; below it e4m3 codes are multiples of 2^-9
E4M3_SUBNORMAL_SCALE = tl.constexpr(512.0)  # 2^9
# Multiplying by 2^-9 is exact where dividing by 2^9 would compile to CUDA's approximate
# div.full.f32 (the compile gate counts those in the PTX: there are none).
E4M3_SUBNORMAL_STEP = tl.constexpr(2.0**-9)  # e4m3 subnormals are multiples of 2^-9
# 1.5 * 2^23: adding it to |v| < 2^22 leaves no fraction bits, so float32 round-to-nearest-
# even rounds v to an integer; subtracting it back is exact.
ROUND_TO_INT_MAGIC = tl.constexpr(12582912.0)


@triton.jit
def round_to_bf16_grid(x):
    """float32 -> float32 holding the nearest bfloat16 (ties to even), by integer ops."""
    bits = x.to(tl.uint32, bitcast=True)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    # a NaN with a full payload would carry into the sign or exponent: keep it a quiet NaN
    rounded = tl.where(x != x, (bits & 0xFFFF0000) | 0x00400000, rounded)
    return rounded.to(tl.float32, bitcast=True)


@triton.jit
def round_to_e4m3_grid(x):
    """float32 with |x| <= 448 -> float32 holding the nearest e4m3fn value (ties to even)."""
    bits = x.to(tl.uint32, bitcast=True)
    # normal range: keep 3 of 23 mantissa bits, carrying into the exponent as needed
    normal = ((bits + 0x7FFFF + ((bits >> 20) & 1)) & 0xFFF00000).to(tl.float32, bitcast=True)
    # subnormal range: multiples of 2^-9; scaling by 2^9 is exact, the magic add rounds.
    # Work on |x| and put the sign bit back, so that values rounding to zero keep it (-0.0).
    scaled = tl.abs(x) * E4M3_SUBNORMAL_SCALE
    magnitude = ((scaled + ROUND_TO_INT_MAGIC) - ROUND_TO_INT_MAGIC) * E4M3_SUBNORMAL_STEP
    subnormal = (magnitude.to(tl.uint32, bitcast=True) | (bits & 0x80000000)).to(tl.float32, bitcast=True)
    return tl.where(tl.abs(x) < E4M3_MIN_NORMAL, subnormal, normal)


@triton.jit
def to_bf16(x, SOFTWARE_ROUNDING: tl.constexpr):
    """float32 -> bfloat16, round to nearest even. The software path also moves the bits itself:
    the interpreter's float conversion mangles subnormals even of values already on the grid."""
    if SOFTWARE_ROUNDING:
        bits = round_to_bf16_grid(x).to(tl.uint32, bitcast=True)
        return (bits >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)
    return x.to(tl.bfloat16)


@triton.jit
def bf16_to_f32(x, SOFTWARE_ROUNDING: tl.constexpr):
    """bfloat16 -> float32 (exact); by bit moves on the software path, for the same subnormal defect."""
    if SOFTWARE_ROUNDING:
        return (x.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)
    return x.to(tl.float32)


@triton.jit
def to_e4m3(x, SOFTWARE_ROUNDING: tl.constexpr):
    """Saturating cast to float8_e4m3fn (clamping is the caller's; x is already within +-448)."""
    if SOFTWARE_ROUNDING:
        x = round_to_e4m3_grid(x)
    return x.to(tl.float8e4nv)


@triton.jit
def silu(x):
    """x * sigmoid(x) in float32; its exp differs from torch's by an ulp on some inputs.

    The division is div_rn: a plain `/` compiles to the approximate div.full.f32 on CUDA (seen
    in the sm_90 PTX by `diffmoe compile-check`), which would add its own error on top of exp's.
    Under the interpreter both are numpy's correctly rounded division: same bits.
    """
    return tl.math.div_rn(x, 1.0 + tl.exp(-x))
