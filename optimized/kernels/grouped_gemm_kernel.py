"""Grouped GEMM over the aligned layout: both MoE GEMMs, every quant scheme, one kernel.

Grid: (num_m_blocks * cdiv(N, BLOCK_N),). Program p owns output tile (pid_m, pid_n): the
BLOCK_M routed rows listed in sorted_token_ids[pid_m*BLOCK_M : (pid_m+1)*BLOCK_M] (all of
one expert, padded with the sentinel TK) times columns [pid_n*BLOCK_N, (pid_n+1)*BLOCK_N).
It reads those rows of A (row r of the gate-up GEMM reads token r // K: A_ROW_DIV = K; the
down GEMM reads row r: A_ROW_DIV = 1), the expert's weight rows, and writes its tile of C at
the routed rows. Blocks past num_tokens_post_padded exit at once; blocks of an expert that
is not local (-1) write zeros, as vLLM does under an expert map.

Scaling (SCALE_MODE): 0 bf16 x bf16, no scales; 1 per-tensor activation scale [1] and one
weight scale per expert [L]; 2 per-token activation scales [rows, 1] and per-output-channel
weight scales [L, N]; 3 1x128 activation groups [rows, Kd/128] and 128x128 weight blocks
[L, N/128, Kd/128], applied per BLOCK_K = 128 step. Modes 1 and 2 scale after accumulation.

DECODE_FP8 and UPCAST_BF16_DOT (backends whose dot probes find a defect): FP8 operands are
decoded to float32 by bits, bf16 operands widened by bit shifts, and multiplied with an IEEE
float32 dot. Unpatched, triton 3.9's interpreter widens FP8 reading the e4m3fn NaN code as
+-480 (a NaN activation, reference/moe.py: NaN or Inf inputs give NaN codes, would come out
finite) and multiplies bf16 operands as raw integers. diffmoe.interpreter.fixes fixes both dots
at the interpreter, computing exactly these float32 dots (same operands, same numpy matmul: same
bits), so on the interpreter the switches are off and the plain dot runs. Products of two e4m3
values are exact in float32 and the sum is the same float32 accumulation, so finite results do
not change with the switch.

Owns the GEMM kernel. Must not allocate or carve: the launcher does.
"""

import triton
import triton.language as tl

from .numerics import E4M3_SUBNORMAL_STEP, bf16_to_f32, to_bf16
from .program_order import logical_program_id

SCALE_BF16 = tl.constexpr(0)
SCALE_TENSOR = tl.constexpr(1)
SCALE_CHANNEL = tl.constexpr(2)
SCALE_BLOCK = tl.constexpr(3)
WEIGHT_BLOCK = tl.constexpr(128)  # 128x128 weight blocks of fp8-block
E4M3_EXPONENT_BIAS_DELTA = tl.constexpr(127 - 7)  # float32 bias minus e4m3 bias


@triton.jit
def e4m3_to_f32(x):
    """float8_e4m3fn -> float32 by bits: exact for every code, NaN codes (S.1111.111) to NaN."""
    bits = x.to(tl.uint8, bitcast=True).to(tl.uint32)
    exponent = (bits >> 3) & 0xF
    mantissa = bits & 0x7
    normal = (((exponent + E4M3_EXPONENT_BIAS_DELTA) << 23) | (mantissa << 20)).to(tl.float32, bitcast=True)
    magnitude = tl.where(exponent == 0, mantissa.to(tl.float32) * E4M3_SUBNORMAL_STEP, normal)
    value = (magnitude.to(tl.uint32, bitcast=True) | ((bits & 0x80) << 24)).to(tl.float32, bitcast=True)
    return tl.where((bits & 0x7F) == 0x7F, float("nan"), value)


@triton.jit
def grouped_gemm_kernel(
    # Pointers
    a_ptr,  # [rows_a, Kd] fp8 codes or bf16
    b_ptr,  # [L, N, Kd] fp8 codes or bf16 weights
    c_ptr,  # [TK, N] bf16 out, row = routed row
    a_scale_ptr,  # fp32 activation scales (SCALE_MODE)
    b_scale_ptr,  # fp32 weight scales (SCALE_MODE)
    topk_weights_ptr,  # [TK] fp32 router weight per routed row
    sorted_token_ids_ptr,  # [EM] int32 routed rows grouped by expert, sentinel TK
    expert_ids_ptr,  # [EM / BLOCK_M] int32 local expert of each block, -1 if not local
    num_tokens_post_padded_ptr,  # [1] int32 rows in use in sorted_token_ids
    order_ptr,  # [num_programs] int32 program order (REORDER)
    # Dimensions
    N,
    Kd,
    num_valid_rows,  # TK
    A_ROW_DIV,
    num_n_blocks,
    # Strides
    stride_am, stride_ak,
    stride_be, stride_bn, stride_bk,
    stride_cm, stride_cn,
    stride_asm, stride_ask,
    stride_bse, stride_bsn, stride_bsk,
    # Meta-parameters
    SCALE_MODE: tl.constexpr,
    MUL_ROUTER_WEIGHT: tl.constexpr,  # multiply the routed row's weight in the epilogue
    ROUTER_WEIGHT_ON_A: tl.constexpr,  # bf16 scheme, router_weight='input': scale A rows first
    UPCAST_BF16_DOT: tl.constexpr,  # bf16 x bf16 dot through float32 (a backend whose bf16 dot probe fails)
    DECODE_FP8: tl.constexpr,  # fp8 x fp8 dot through float32 decoded by bits (a backend misreading e4m3 NaN)
    SOFTWARE_BF16: tl.constexpr,
    FP8_IMPRECISE_ACC: tl.constexpr,  # K elements wgmma may accumulate before float32 (0: exact)
    REORDER: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    pid = logical_program_id(order_ptr, REORDER)
    pid_m = pid // num_n_blocks
    pid_n = pid % num_n_blocks
    if pid_m * BLOCK_M >= tl.load(num_tokens_post_padded_ptr):
        return

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rows = tl.load(sorted_token_ids_ptr + offs_m).to(tl.int64)  # [BLOCK_M] routed rows
    row_mask = rows < num_valid_rows
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    c_tile = c_ptr + rows[:, None] * stride_cm + offs_n[None, :] * stride_cn
    c_mask = row_mask[:, None] & n_mask[None, :]

    expert = tl.load(expert_ids_ptr + pid_m).to(tl.int64)
    if expert == -1:
        tl.store(c_tile, tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.bfloat16), mask=c_mask)
        return

    a_rows = rows // A_ROW_DIV
    offs_k = tl.arange(0, BLOCK_K)
    a_tile = a_ptr + a_rows[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_tile = b_ptr + expert * stride_be + offs_n[None, :] * stride_bn + offs_k[:, None] * stride_bk
    if ROUTER_WEIGHT_ON_A:
        a_weight = tl.load(topk_weights_ptr + rows, mask=row_mask, other=0.0)

    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, Kd, BLOCK_K):
        k_mask = offs_k < Kd - k0
        a = tl.load(a_tile, mask=row_mask[:, None] & k_mask[None, :], other=0.0)  # [BLOCK_M, BLOCK_K]
        b = tl.load(b_tile, mask=k_mask[:, None] & n_mask[None, :], other=0.0)  # [BLOCK_K, BLOCK_N]
        if ROUTER_WEIGHT_ON_A:
            a = to_bf16(bf16_to_f32(a, SOFTWARE_BF16) * a_weight[:, None], SOFTWARE_BF16)
        if UPCAST_BF16_DOT:
            partial = tl.dot(bf16_to_f32(a, SOFTWARE_BF16), bf16_to_f32(b, SOFTWARE_BF16), input_precision="ieee")
        elif DECODE_FP8:
            partial = tl.dot(e4m3_to_f32(a), e4m3_to_f32(b), input_precision="ieee")
        else:
            # one BLOCK_K step per dot, added to the float32 `acc` below: with FP8_IMPRECISE_ACC =
            # BLOCK_K = 128 Hopper's wgmma accumulates one K block in the tensor core's reduced-precision
            # accumulator and the sum is promoted to float32 once per block (DeepSeek-V3's interval);
            # 0 asks for exact float32 accumulation, which sm_90 grants only through mma.sync
            partial = tl.dot(a, b, max_num_imprecise_acc=FP8_IMPRECISE_ACC)
        if SCALE_MODE == SCALE_BLOCK:
            k_block = k0 // WEIGHT_BLOCK
            a_s = tl.load(a_scale_ptr + a_rows * stride_asm + k_block * stride_ask, mask=row_mask, other=0.0)
            b_s = tl.load(
                b_scale_ptr + expert * stride_bse + (offs_n // WEIGHT_BLOCK) * stride_bsn + k_block * stride_bsk,
                mask=n_mask, other=0.0,
            )
            acc += partial * a_s[:, None] * b_s[None, :]
        else:
            acc += partial
        a_tile += BLOCK_K * stride_ak
        b_tile += BLOCK_K * stride_bk

    if SCALE_MODE == SCALE_TENSOR:
        acc = acc * tl.load(a_scale_ptr) * tl.load(b_scale_ptr + expert * stride_bse)
    elif SCALE_MODE == SCALE_CHANNEL:
        a_s = tl.load(a_scale_ptr + a_rows * stride_asm, mask=row_mask, other=0.0)
        b_s = tl.load(b_scale_ptr + expert * stride_bse + offs_n * stride_bsn, mask=n_mask, other=0.0)
        acc = acc * a_s[:, None] * b_s[None, :]
    if MUL_ROUTER_WEIGHT:
        acc = acc * tl.load(topk_weights_ptr + rows, mask=row_mask, other=0.0)[:, None]
    tl.store(c_tile, to_bf16(acc, SOFTWARE_BF16), mask=c_mask)
