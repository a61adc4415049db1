"""Sum of each token's K routed rows.

Grid: (cdiv(T, BLOCK_T) * cdiv(H, BLOCK_H),). Program p owns output tile (token block,
column block): it reads rows t*K .. t*K+K-1 of those columns of down_output and writes the
tile of output. The sum runs in float32 in k order 0..K-1, as the reference's does, so the
result is bitwise the reference's given the same down_output. With ROUTED_SCALE the float32 sum
is multiplied by the float32 routed_scaling_factor before its one rounding (the reference's rule).

Owns the reduce kernel. Must not allocate or carve: the launcher does.
"""

import triton
import triton.language as tl

from .numerics import bf16_to_f32, to_bf16
from .program_order import logical_program_id


@triton.jit
def moe_reduce_kernel(
    # Pointers
    down_ptr,  # [TK, H] bf16, row t*K + k
    out_ptr,  # [T, H] bf16
    order_ptr,  # [num_programs] int32 program order (REORDER)
    # Dimensions
    T,
    H,
    TOPK,
    num_h_blocks,
    routed_scaling_factor,  # fp32, read when ROUTED_SCALE
    # Strides
    stride_dm, stride_dh,
    stride_om, stride_oh,
    # Meta-parameters
    SOFTWARE_BF16: tl.constexpr,
    ROUTED_SCALE: tl.constexpr,
    REORDER: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    pid = logical_program_id(order_ptr, REORDER)
    pid_t = pid // num_h_blocks
    pid_h = pid % num_h_blocks
    tokens = (pid_t * BLOCK_T + tl.arange(0, BLOCK_T)).to(tl.int64)
    cols = pid_h * BLOCK_H + tl.arange(0, BLOCK_H)
    mask = (tokens < T)[:, None] & (cols < H)[None, :]
    first = down_ptr + (tokens * TOPK)[:, None] * stride_dm + cols[None, :] * stride_dh
    acc = bf16_to_f32(tl.load(first, mask=mask, other=0.0), SOFTWARE_BF16)
    for k in range(1, TOPK):
        acc += bf16_to_f32(tl.load(first + k * stride_dm, mask=mask, other=0.0), SOFTWARE_BF16)
    if ROUTED_SCALE:
        acc = acc * routed_scaling_factor
    tl.store(out_ptr + tokens[:, None] * stride_om + cols[None, :] * stride_oh, to_bf16(acc, SOFTWARE_BF16), mask=mask)
