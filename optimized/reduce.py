"""Launcher of the top-k reduction: output[t] = sum_k down_output[t*K + k].

Must not hold jit code (kernels/).
"""

from __future__ import annotations

import torch
import triton

from .backend import BackendTraits
from .kernels.reduce_kernel import moe_reduce_kernel
from .launch import LaunchContext, launch
from .tiles import Tiles


def run_reduce(
    ctx: LaunchContext,
    tiles: Tiles,
    traits: BackendTraits,
    *,
    stage: str,
    down: tuple[str, torch.Tensor],  # [TK, H] bf16
    out: tuple[str, torch.Tensor],  # [T, H] bf16
    topk: int,
    routed_scaling_factor: float | None = None,
) -> None:
    (down_name, down_t), (out_name, out_t) = down, out
    t, h = out_t.shape
    if down_t.shape != (t * topk, h):
        raise ValueError(f"{down_name} must be [{t * topk}, {h}] for {out_name} [{t}, {h}] and K={topk}, got {tuple(down_t.shape)}")
    num_h_blocks = triton.cdiv(h, tiles.reduce_cols)
    programs = triton.cdiv(t, tiles.reduce_tokens) * num_h_blocks
    launch(
        ctx, moe_reduce_kernel, programs, stage=stage, reads={down_name: down_t}, writes={out_name: out_t},
        down_ptr=down_t, out_ptr=out_t, T=t, H=h, TOPK=topk, num_h_blocks=num_h_blocks,
        routed_scaling_factor=1.0 if routed_scaling_factor is None else routed_scaling_factor,
        ROUTED_SCALE=routed_scaling_factor is not None,
        stride_dm=down_t.stride(0), stride_dh=down_t.stride(1),
        stride_om=out_t.stride(0), stride_oh=out_t.stride(1),
        SOFTWARE_BF16=traits.software_bf16_cast,
        BLOCK_T=tiles.reduce_tokens, BLOCK_H=tiles.reduce_cols,
    )
