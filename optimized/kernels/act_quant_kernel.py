"""One row kernel for every element-wise stage: input quantisation, the unfused activation,
the unfused down-input quantisation and the fused act+quant ("situ quant"), chosen by
constexpr switches so there is one kernel to trust, not four near-copies.

Grid: (cdiv(R, BLOCK_R),) over rows. Program p owns rows [p*BLOCK_R, (p+1)*BLOCK_R): it reads
those rows of x (for the activation, the gate half and the up half), writes the same rows of
the activation and/or the codes, and their scales. Per-tensor quantisation needs the global
amax first, so it runs as two launches: PASS_AMAX stores one partial amax per program,
PASS_QUANTIZE reduces the partials and quantises (program 0 also stores the scale).

Non-finite values follow the reference (reference/moe.py): a NaN anywhere in a scaling unit
makes its amax, scale and codes NaN; an Inf makes the scale Inf and the Inf element's code
NaN. Triton's max reduction and tl.maximum/tl.minimum drop a NaN operand by default (a
NaN amax would become the largest finite value, a NaN code -448), hence `_nan_max` and
`propagate_nan=ALL` below; and the software e4m3 rounding and the unpatched interpreter's cast
both lose NaN, hence the NaN code written by bits in `_quantize_tile` on the software path (the
native cast, CUDA's or the fixed interpreter's, diffmoe.interpreter.fixes, writes it itself).

Owns the row kernel. Must not allocate or carve: the launchers do.
"""

import triton
import triton.language as tl

from .numerics import E4M3_MAX, bf16_to_f32, silu, to_bf16, to_e4m3
from .program_order import logical_program_id

# SCALE_MODE values
SCALE_NONE = tl.constexpr(0)  # activation only, no quantisation
SCALE_TENSOR = tl.constexpr(1)
SCALE_TOKEN = tl.constexpr(2)
SCALE_GROUP = tl.constexpr(3)  # 1 x GROUP columns; BLOCK_C must equal the group size
# PASS values
PASS_SINGLE = tl.constexpr(0)
PASS_AMAX = tl.constexpr(1)
PASS_QUANTIZE = tl.constexpr(2)

# Every division is tl.math.div_rn: CUDA compiles a plain float32 `/` to the approximate
# div.full.f32, and the codes and scales must be the correctly rounded ones on every backend.
# vLLM's floors: per-tensor/per-token scale >= 1 / (448 * 512); group amax >= 1e-10.
TOKEN_SCALE_FLOOR = tl.constexpr(1.0 / (448.0 * 512.0))
GROUP_AMAX_FLOOR = tl.constexpr(1e-10)
# A per-tensor partial amax holding a NaN is stored as -inf, a value no amax (>= 0) takes:
# the partials reduction then ignores slots no program wrote (NaN garbage, as the default max
# does) and still sees a real NaN.
NAN_PARTIAL = tl.constexpr(float("-inf"))
E4M3_NAN_BITS = tl.constexpr(0x7F)  # the e4m3fn NaN magnitude (S.1111.111), as torch writes it
# NaN is written inline as float("nan"), never as a constexpr global: Triton compares the copies
# of each global a jit function uses with `!=`, NaN never equals itself, and every real (CUDA)
# compile then fails in `cache_key` (tests/backend/test_compile_gate.py holds every kernel module to it).


@triton.jit
def _nan_max(x, axis: tl.constexpr):
    """max over `axis` that returns NaN where a NaN is present, as torch.amax does."""
    largest = tl.max(x, axis=axis)
    has_nan = tl.max((x != x).to(tl.int32), axis=axis) > 0
    return tl.where(has_nan, float("nan"), largest)


@triton.jit
def _load_values(
    x_ptr, row_weight_ptr, rows, row_mask, cols, mask, C, stride_xr, stride_xc, swiglu_limit,
    APPLY_ACTIVATION: tl.constexpr, ROW_WEIGHT: tl.constexpr, SWIGLU_CLAMP: tl.constexpr, SOFTWARE_BF16: tl.constexpr,
):
    """A [BLOCK_R, BLOCK_C] tile of the values to store or quantise: float32 holding bf16 values."""
    x_tile = x_ptr + rows[:, None] * stride_xr + cols[None, :] * stride_xc
    if APPLY_ACTIVATION:
        gate = bf16_to_f32(tl.load(x_tile, mask=mask, other=0.0), SOFTWARE_BF16)
        up = bf16_to_f32(tl.load(x_tile + C * stride_xc, mask=mask, other=0.0), SOFTWARE_BF16)
        if SWIGLU_CLAMP:
            # gate <= limit, -limit <= up <= limit (the reference's clamps; NaN kept as torch.clamp keeps it)
            gate = tl.minimum(gate, swiglu_limit, propagate_nan=tl.PropagateNan.ALL)
            up = tl.minimum(tl.maximum(up, -swiglu_limit, propagate_nan=tl.PropagateNan.ALL), swiglu_limit,
                            propagate_nan=tl.PropagateNan.ALL)
        # the activation is a bf16 tensor by definition, fused or not: round before quantising
        v = bf16_to_f32(to_bf16(silu(gate) * up, SOFTWARE_BF16), SOFTWARE_BF16)
    else:
        v = bf16_to_f32(tl.load(x_tile, mask=mask, other=0.0), SOFTWARE_BF16)
        if ROW_WEIGHT:
            w = tl.load(row_weight_ptr + rows, mask=row_mask, other=0.0)
            v = bf16_to_f32(to_bf16(v * w[:, None], SOFTWARE_BF16), SOFTWARE_BF16)
    return v


@triton.jit
def _quantize_tile(v, scale, SOFTWARE_FP8: tl.constexpr):
    """codes of a tile given one scale per row ([BLOCK_R] broadcast over columns)."""
    q = tl.math.div_rn(v, scale[:, None])
    q = tl.minimum(tl.maximum(q, -E4M3_MAX, propagate_nan=tl.PropagateNan.ALL), E4M3_MAX,
                   propagate_nan=tl.PropagateNan.ALL)
    codes = to_e4m3(q, SOFTWARE_FP8)
    if SOFTWARE_FP8:
        # The software rounding can carry a NaN's payload into the sign bit (a zero) and the
        # unpatched interpreter's cast does not produce the NaN code; write it by bits, sign kept
        # as torch's cast keeps it. CUDA's cast and the fixed interpreter's already give NaN.
        sign = ((q.to(tl.uint32, bitcast=True) >> 24) & 0x80).to(tl.uint8)
        bits = tl.where(q != q, sign | E4M3_NAN_BITS, codes.to(tl.uint8, bitcast=True))
        codes = bits.to(tl.float8e4nv, bitcast=True)
    return codes


@triton.jit
def act_quant_kernel(
    # Pointers
    x_ptr,  # [R, C] bf16 input, or [R, 2C] bf16 gate|up when APPLY_ACTIVATION
    row_weight_ptr,  # [R] fp32 router weight per row (ROW_WEIGHT)
    act_ptr,  # [R, C] bf16 activation out (STORE_ACTIVATION)
    q_ptr,  # [R, C] fp8 e4m3fn codes out
    scale_ptr,  # fp32 scales out: [1] tensor, [R, 1] token, [R, C / BLOCK_C] group
    partial_amax_ptr,  # [num_programs] fp32 per-program amax (>= 0), -inf for a NaN (per-tensor passes)
    order_ptr,  # [num_programs] int32 program order (REORDER)
    # Dimensions
    R,
    C,
    num_programs,
    swiglu_limit,  # fp32 SwiGLU clamp limit (SWIGLU_CLAMP)
    # Strides
    stride_xr, stride_xc,
    stride_ar, stride_ac,
    stride_qr, stride_qc,
    stride_sr, stride_sc,
    # Meta-parameters
    APPLY_ACTIVATION: tl.constexpr,
    ROW_WEIGHT: tl.constexpr,
    SWIGLU_CLAMP: tl.constexpr,  # clamp gate and up by swiglu_limit before silu(gate) * up
    STORE_ACTIVATION: tl.constexpr,
    SCALE_MODE: tl.constexpr,
    PASS: tl.constexpr,
    SOFTWARE_BF16: tl.constexpr,
    SOFTWARE_FP8: tl.constexpr,
    REORDER: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_C: tl.constexpr,
    BLOCK_P: tl.constexpr,  # amax partials reduced per step (per-tensor quantisation)
):
    pid = logical_program_id(order_ptr, REORDER)
    rows = pid * BLOCK_R + tl.arange(0, BLOCK_R)
    row_mask = rows < R
    rows = rows.to(tl.int64)
    offs_c = tl.arange(0, BLOCK_C)

    if SCALE_MODE == SCALE_NONE:
        for c0 in range(0, C, BLOCK_C):
            cols = c0 + offs_c
            mask = row_mask[:, None] & (cols < C)[None, :]
            v = _load_values(x_ptr, row_weight_ptr, rows, row_mask, cols, mask, C, stride_xr, stride_xc, swiglu_limit,
                             APPLY_ACTIVATION, ROW_WEIGHT, SWIGLU_CLAMP, SOFTWARE_BF16)
            tl.store(act_ptr + rows[:, None] * stride_ar + cols[None, :] * stride_ac, to_bf16(v, SOFTWARE_BF16), mask=mask)
    elif SCALE_MODE == SCALE_GROUP:
        for c0 in range(0, C, BLOCK_C):
            cols = c0 + offs_c
            mask = row_mask[:, None] & (cols < C)[None, :]
            v = _load_values(x_ptr, row_weight_ptr, rows, row_mask, cols, mask, C, stride_xr, stride_xc, swiglu_limit,
                             APPLY_ACTIVATION, ROW_WEIGHT, SWIGLU_CLAMP, SOFTWARE_BF16)
            scale = tl.math.div_rn(tl.maximum(_nan_max(tl.abs(v), 1), GROUP_AMAX_FLOOR, propagate_nan=tl.PropagateNan.ALL), E4M3_MAX)
            q = _quantize_tile(v, scale, SOFTWARE_FP8)
            tl.store(q_ptr + rows[:, None] * stride_qr + cols[None, :] * stride_qc, q, mask=mask)
            tl.store(scale_ptr + rows * stride_sr + (c0 // BLOCK_C) * stride_sc, scale, mask=row_mask)
            if STORE_ACTIVATION:
                tl.store(act_ptr + rows[:, None] * stride_ar + cols[None, :] * stride_ac, to_bf16(v, SOFTWARE_BF16), mask=mask)
    else:
        if PASS != PASS_QUANTIZE:
            amax = tl.zeros([BLOCK_R], dtype=tl.float32)
            for c0 in range(0, C, BLOCK_C):
                cols = c0 + offs_c
                mask = row_mask[:, None] & (cols < C)[None, :]
                v = _load_values(x_ptr, row_weight_ptr, rows, row_mask, cols, mask, C, stride_xr, stride_xc, swiglu_limit,
                                 APPLY_ACTIVATION, ROW_WEIGHT, SWIGLU_CLAMP, SOFTWARE_BF16)
                amax = tl.maximum(amax, _nan_max(tl.abs(v), 1), propagate_nan=tl.PropagateNan.ALL)
        if PASS == PASS_AMAX:
            block_amax = _nan_max(amax, 0)
            tl.store(partial_amax_ptr + pid, tl.where(block_amax != block_amax, NAN_PARTIAL, block_amax))
        else:
            if SCALE_MODE == SCALE_TENSOR:
                # every program reduces all partials, BLOCK_P at a time: a fixed width, so a growing
                # batch neither recompiles nor spills (max and min are exact in any order)
                offs_p = tl.arange(0, BLOCK_P)
                largest = tl.zeros([BLOCK_P], dtype=tl.float32)
                smallest = tl.zeros([BLOCK_P], dtype=tl.float32)
                for p0 in range(0, num_programs, BLOCK_P):
                    p_mask = p0 + offs_p < num_programs
                    partials = tl.load(partial_amax_ptr + p0 + offs_p, mask=p_mask, other=0.0)
                    largest = tl.maximum(largest, partials)
                    smallest = tl.minimum(smallest, partials)
                saw_nan = tl.min(smallest, axis=0) == NAN_PARTIAL
                tensor_amax = tl.where(saw_nan, float("nan"), tl.max(largest, axis=0))
                tensor_scale = tl.maximum(tl.math.div_rn(tensor_amax, E4M3_MAX), TOKEN_SCALE_FLOOR, propagate_nan=tl.PropagateNan.ALL)
                scale = tl.zeros([BLOCK_R], dtype=tl.float32) + tensor_scale
                if pid == 0:
                    tl.store(scale_ptr, tensor_scale)
            else:
                scale = tl.maximum(tl.math.div_rn(amax, E4M3_MAX), TOKEN_SCALE_FLOOR, propagate_nan=tl.PropagateNan.ALL)  # [BLOCK_R]
                tl.store(scale_ptr + rows * stride_sr, scale, mask=row_mask)
            for c0 in range(0, C, BLOCK_C):
                cols = c0 + offs_c
                mask = row_mask[:, None] & (cols < C)[None, :]
                v = _load_values(x_ptr, row_weight_ptr, rows, row_mask, cols, mask, C, stride_xr, stride_xc, swiglu_limit,
                                 APPLY_ACTIVATION, ROW_WEIGHT, SWIGLU_CLAMP, SOFTWARE_BF16)
                q = _quantize_tile(v, scale, SOFTWARE_FP8)
                tl.store(q_ptr + rows[:, None] * stride_qr + cols[None, :] * stride_qc, q, mask=mask)
                if STORE_ACTIVATION:
                    tl.store(act_ptr + rows[:, None] * stride_ar + cols[None, :] * stride_ac, to_bf16(v, SOFTWARE_BF16), mask=mask)
