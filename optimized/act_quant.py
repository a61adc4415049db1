"""Launchers of the row kernel: input quant, activation, down-input quant, fused act+quant.

Must not hold jit code (kernels/).
"""

from __future__ import annotations

import torch
import triton

from diffmoe.problem.config import QUANT_BLOCK
from diffmoe.problem.vocabulary import Buffers

from .backend import BackendTraits
from .kernels.act_quant_kernel import (
    PASS_AMAX,
    PASS_QUANTIZE,
    PASS_SINGLE,
    SCALE_GROUP,
    SCALE_NONE,
    SCALE_TENSOR,
    SCALE_TOKEN,
    act_quant_kernel,
)
from .launch import LaunchContext, launch
from .tiles import Tiles

SCALE_MODES = {None: SCALE_NONE.value, "fp8-tensor": SCALE_TENSOR.value, "fp8-token": SCALE_TOKEN.value, "fp8-block": SCALE_GROUP.value}


def row_programs(rows: int, tiles: Tiles) -> int:
    return triton.cdiv(rows, tiles.rows_per_program)


def run_row_stage(
    ctx: LaunchContext,
    tiles: Tiles,
    traits: BackendTraits,
    *,
    stage: str,
    x: tuple[str, torch.Tensor],  # [R, C] bf16, or [R, 2C] gate|up when apply_activation
    apply_activation: bool,
    quant: str | None,  # fp8 scheme, or None for the activation alone
    act_out: tuple[str, torch.Tensor] | None = None,  # [R, C] bf16
    codes_out: tuple[str, torch.Tensor] | None = None,  # [R, C] fp8
    scales_out: tuple[str, torch.Tensor] | None = None,  # fp32, activation_scale_shape
    row_weight: tuple[str, torch.Tensor] | None = None,  # [R] fp32
    amax_partials: torch.Tensor | None = None,  # [>= programs] fp32 scratch, per-tensor only
    software_fp8: bool | None = None,
    swiglu_limit: float | None = None,  # SwiGLU clamp of the activation (apply_activation only)
) -> None:
    # (1) constraints
    x_name, x_t = x
    if x_t.dim() != 2:
        raise ValueError(f"{x_name} must be 2-D [R, C], got shape {tuple(x_t.shape)}")
    rows = x_t.shape[0]
    cols = x_t.shape[1] // 2 if apply_activation else x_t.shape[1]
    if quant == "fp8-block" and cols % QUANT_BLOCK:
        raise ValueError(f"fp8-block quantises 1x{QUANT_BLOCK} groups: columns must be a multiple of {QUANT_BLOCK}, got {cols}")
    if quant is None and act_out is None:
        raise ValueError("a row stage without quantisation must store the activation")
    if quant is not None and (codes_out is None or scales_out is None):
        raise ValueError("a quantising row stage needs codes_out and scales_out")
    programs = row_programs(rows, tiles)
    if quant == "fp8-tensor" and (amax_partials is None or amax_partials.numel() < programs):
        raise ValueError(f"per-tensor quantisation needs {programs} amax partials")
    software_fp8 = traits.software_fp8_cast if software_fp8 is None else software_fp8

    # (2) views and placeholders
    dummy = x_t  # never dereferenced where the matching switch is off
    act_t = act_out[1] if act_out else dummy
    codes_t = codes_out[1] if codes_out else dummy
    scales_t = scales_out[1] if scales_out else dummy
    weight_t = row_weight[1] if row_weight else dummy
    partials_t = amax_partials if amax_partials is not None else dummy
    scale_strides = (0, 0)
    if quant in ("fp8-token", "fp8-block"):
        scale_strides = (scales_t.stride(0), scales_t.stride(1))
    reads = {x_name: x_t}
    if row_weight:
        reads[row_weight[0]] = weight_t
    writes = dict(named for named in (act_out, codes_out, scales_out) if named)
    common = dict(
        x_ptr=x_t, row_weight_ptr=weight_t, act_ptr=act_t, q_ptr=codes_t, scale_ptr=scales_t,
        partial_amax_ptr=partials_t,
        R=rows, C=cols, num_programs=programs, swiglu_limit=0.0 if swiglu_limit is None else swiglu_limit,
        stride_xr=x_t.stride(0), stride_xc=x_t.stride(1),
        stride_ar=act_t.stride(0) if act_out else 0, stride_ac=act_t.stride(1) if act_out else 0,
        stride_qr=codes_t.stride(0) if codes_out else 0, stride_qc=codes_t.stride(1) if codes_out else 0,
        stride_sr=scale_strides[0], stride_sc=scale_strides[1],
        APPLY_ACTIVATION=apply_activation, ROW_WEIGHT=row_weight is not None,
        SWIGLU_CLAMP=apply_activation and swiglu_limit is not None,
        STORE_ACTIVATION=act_out is not None, SCALE_MODE=SCALE_MODES[quant],
        SOFTWARE_BF16=traits.software_bf16_cast, SOFTWARE_FP8=software_fp8,
        BLOCK_R=tiles.rows_per_program, BLOCK_C=tiles.cols_per_step,
        BLOCK_P=tiles.amax_partials_per_step,
    )

    # (3) launch: per-tensor needs the global amax first
    if quant == "fp8-tensor":
        partial_writes = {Buffers.AMAX_PARTIALS: partials_t[:programs]}
        launch(ctx, act_quant_kernel, programs, stage=stage, reads=reads, writes=partial_writes, **common, PASS=PASS_AMAX.value)
        reads = {**reads, **partial_writes}
        launch(ctx, act_quant_kernel, programs, stage=stage, reads=reads, writes=writes, **common, PASS=PASS_QUANTIZE.value)
    else:
        launch(ctx, act_quant_kernel, programs, stage=stage, reads=reads, writes=writes, **common, PASS=PASS_SINGLE.value)
