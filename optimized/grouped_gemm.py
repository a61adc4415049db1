"""Launcher of the grouped GEMM (both MoE GEMMs) over the aligned layout.

Owns checking, carving and launching the GEMM. Must not hold jit code (kernels/).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton

from diffmoe.problem.vocabulary import Buffers

from .backend import BackendTraits
from .kernels.grouped_gemm_kernel import SCALE_BF16, SCALE_BLOCK, SCALE_CHANNEL, SCALE_TENSOR, grouped_gemm_kernel
from .launch import LaunchContext, launch
from .tiles import Tiles

SCALE_MODES = {"bf16": SCALE_BF16.value, "fp8-tensor": SCALE_TENSOR.value, "fp8-token": SCALE_CHANNEL.value, "fp8-block": SCALE_BLOCK.value}


@dataclass
class AlignedLayout:
    sorted_token_ids: torch.Tensor  # [EM] int32
    expert_ids: torch.Tensor  # [blocks] int32
    num_tokens_post_padded: torch.Tensor  # [1] int32
    blocks: int  # BLOCK_M blocks in use
    block_m: int

    def named(self) -> dict[str, torch.Tensor]:
        return {
            Buffers.SORTED_TOKEN_IDS: self.sorted_token_ids,
            Buffers.EXPERT_IDS: self.expert_ids,
            Buffers.NUM_TOKENS_POST_PADDED: self.num_tokens_post_padded,
        }


def _strides(t: torch.Tensor | None, dims: int) -> tuple[int, ...]:
    """Strides padded with zeros (a missing dimension broadcasts)."""
    if t is None:
        return (0,) * dims
    s = tuple(t.stride())
    return s + (0,) * (dims - len(s))


def run_grouped_gemm(
    ctx: LaunchContext,
    tiles: Tiles,
    traits: BackendTraits,
    *,
    stage: str,
    quant: str,
    a: tuple[str, torch.Tensor],  # [rows_a, Kd] fp8 codes or bf16
    a_scale: tuple[str, torch.Tensor] | None,  # fp32 activation scales
    w: tuple[str, torch.Tensor],  # [L, N, Kd]
    w_scale: tuple[str, torch.Tensor] | None,  # fp32 weight scales
    out: tuple[str, torch.Tensor],  # [TK, N] bf16
    layout: AlignedLayout,
    topk_weights: tuple[str, torch.Tensor],  # [TK] fp32
    a_row_div: int,  # K for the gate-up GEMM (A rows are tokens), 1 for the down GEMM
    mul_router_weight: bool,
    router_weight_on_a: bool = False,
    weight_quant: str | None = None,
) -> None:
    # (1) constraints
    (a_name, a_t), (w_name, w_t), (out_name, out_t) = a, w, out
    if w_t.dim() != 3 or a_t.dim() != 2 or out_t.dim() != 2:
        raise ValueError(f"expected {a_name} [rows, Kd], {w_name} [L, N, Kd], {out_name} [TK, N]")
    n, kd = w_t.shape[1], w_t.shape[2]
    if a_t.shape[1] != kd or out_t.shape[1] != n:
        raise ValueError(f"shape mismatch: {a_name} {tuple(a_t.shape)}, {w_name} {tuple(w_t.shape)}, {out_name} {tuple(out_t.shape)}")
    if quant != "bf16" and (a_scale is None or w_scale is None):
        raise ValueError(f"quant={quant!r} needs activation and weight scales")
    if layout.block_m != tiles.block_m:
        raise ValueError(f"layout padded to {layout.block_m} rows, kernel tiles use BLOCK_M={tiles.block_m}")

    # (2) views
    a_s = a_scale[1] if a_scale else a_t
    w_s = w_scale[1] if w_scale else a_t
    num_n_blocks = triton.cdiv(n, tiles.block_n)
    programs = layout.blocks * num_n_blocks
    # weights at another granularity than the activations' scheme (per-tensor weights beside per-token
    # activations): the channel mode, whose [L] weight scale broadcasts over N by its zero stride
    mixed = weight_quant is not None and weight_quant != quant
    if mixed and "fp8-block" in (quant, weight_quant):
        raise ValueError(f"weight_quant={weight_quant!r} with quant={quant!r}: blocks pair with 1x128 groups only")
    scale_mode = SCALE_MODES["fp8-token"] if mixed else SCALE_MODES[quant]
    a_scale_strides = _strides(a_scale[1] if a_scale else None, 2)
    w_scale_strides = _strides(w_scale[1] if w_scale else None, 3)
    if quant == "fp8-tensor":
        a_scale_strides = (0, 0)
    reads = {a_name: a_t, w_name: w_t, **layout.named()}
    if a_scale:
        reads[a_scale[0]] = a_s
    if w_scale:
        reads[w_scale[0]] = w_s
    if mul_router_weight or router_weight_on_a:
        reads[topk_weights[0]] = topk_weights[1]

    # (3) launch
    launch(
        ctx, grouped_gemm_kernel, programs, stage=stage, reads=reads, writes={out_name: out_t},
        a_ptr=a_t, b_ptr=w_t, c_ptr=out_t, a_scale_ptr=a_s, b_scale_ptr=w_s,
        topk_weights_ptr=topk_weights[1],
        sorted_token_ids_ptr=layout.sorted_token_ids, expert_ids_ptr=layout.expert_ids,
        num_tokens_post_padded_ptr=layout.num_tokens_post_padded,
        N=n, Kd=kd, num_valid_rows=out_t.shape[0], A_ROW_DIV=a_row_div, num_n_blocks=num_n_blocks,
        stride_am=a_t.stride(0), stride_ak=a_t.stride(1),
        stride_be=w_t.stride(0), stride_bn=w_t.stride(1), stride_bk=w_t.stride(2),
        stride_cm=out_t.stride(0), stride_cn=out_t.stride(1),
        stride_asm=a_scale_strides[0], stride_ask=a_scale_strides[1],
        stride_bse=w_scale_strides[0], stride_bsn=w_scale_strides[1], stride_bsk=w_scale_strides[2],
        SCALE_MODE=scale_mode, MUL_ROUTER_WEIGHT=mul_router_weight, ROUTER_WEIGHT_ON_A=router_weight_on_a,
        UPCAST_BF16_DOT=traits.upcast_bf16_dot and quant == "bf16", SOFTWARE_BF16=traits.software_bf16_cast,
        # the backend whose FP8 casts need software rounding also misreads the NaN code
        DECODE_FP8=traits.software_fp8_cast and quant != "bf16", FP8_IMPRECISE_ACC=tiles.fp8_imprecise_acc,
        BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n, BLOCK_K=tiles.block_k,
        num_warps=tiles.gemm_warps, num_stages=tiles.gemm_stages,
    )
