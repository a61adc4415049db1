"""The FP8 quantisation's rounding points, one function per choice: the amax, the scale and its
floor, how codes are made, the +-448 clamp and NaN coding, and the fused activation + quant.

A quantisation works on scaling units (reference/moe.py's quantize_activation composes them):
`units` is [R, U, S] float32, U units of S elements per row (per tensor: [1, 1, R*C]; per token:
[R, 1, C]; per 1x128 group: [R, C/128, 128]); an amax is [R, U, 1]. Citations: csrc/ paths are vLLM
0.33.0's CUDA sources (not in its wheel; read there), other vLLM paths are files of the 0.33.0
wheel; lmdeploy's are lmdeploy/pytorch/kernels/cuda/ of the 0.18.0 wheel (`diffmoe peers fetch
lmdeploy` keeps them). The menus' names are diffmoe.problem.numerics's.

Owns the quantisation's choice functions and their constants. Must not import peers/ (the peers'
torch stand-ins of the same ops are judged against these, not borrowed), Triton or the harness's
oracles.
"""

from __future__ import annotations

from typing import Callable

import torch

from diffmoe.problem.config import QUANT_BLOCK
from diffmoe.problem.vocabulary import FP8_DTYPE, FP8_MAX, over_fp8_max

# csrc/quantization/w8a8/fp8/common.cuh, min_scaling_factor<c10::Float8_e4m3fn>: 1 / (448 * 512); DESIGN.md's
# per-token floor, diffmoe's per-tensor one too
MIN_SCALE = 1.0 / (FP8_MAX * 512.0)
# model_executor/layers/quantization/utils/fp8_utils.py, per_token_group_quant_fp8(eps=1e-10)
GROUP_AMAX_FLOOR = 1e-10
# blocked_gemm_fp8.py, _quant_fp8_kernel: tl.maximum(a_max, 1e-6), float32 (the scalar promotes the bf16 amax)
LMDEPLOY_AMAX_FLOOR = 1e-6


# ---- amax ------------------------------------------------------------------------------------------


def amax_propagate_nan(units: torch.Tensor) -> torch.Tensor:
    """max |x| by torch's amax: a NaN makes its unit's amax NaN, hence its scale and every code in
    it (DESIGN.md's numerics, reference/moe.py's docstring). An Inf makes it Inf."""
    return units.abs().amax(dim=2, keepdim=True)


def amax_drop_nan(units: torch.Tensor) -> torch.Tensor:
    """max |x| as `fmaxf(acc, fabsf(v))` from 0: CUDA's fmaxf returns the other operand, so a NaN
    is dropped; an Inf stays. vLLM 0.33's every dynamic quant (csrc/quantization/w8a8/fp8/common.cu,
    per_token_group_quant.cu, the fused silu + block quant); lmdeploy 0.18's `_quant_fp8_kernel`
    (blocked_gemm_fp8.py, tl.max)."""
    a = units.abs()
    a = torch.where(torch.isnan(a), torch.zeros_like(a), a)  # not nan_to_num: that also turns Inf into the largest float
    return a.amax(dim=2, keepdim=True)


# ---- the scale and its floor: amax [R, U, 1] -> (scale, the amax the codes may divide by) ---------


def scale_min_scale(amax: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """scale = max(amax / 448, 1 / (448 * 512)): the floored scale of vLLM's per-token quant
    (csrc/quantization/w8a8/fp8/common.cu, dynamic_per_token_scaled_fp8_quant) and its fused silu
    + block quant; DESIGN.md's per-token (and diffmoe's per-tensor) rule. amax / 448 is a correctly
    rounded division (vocabulary.over_fp8_max)."""
    return over_fp8_max(amax).clamp_min(MIN_SCALE), amax


def scale_min_amax(amax: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """scale = max(amax, 1e-10) / 448: the amax floored before the division, vLLM's
    per_token_group_quant_fp8 (csrc/quantization/w8a8/fp8/per_token_group_quant.cu: local_absmax
    starts at eps; model_executor/layers/quantization/utils/fp8_utils.py, eps=1e-10)."""
    floored = amax.clamp_min(GROUP_AMAX_FLOOR)
    return over_fp8_max(floored), floored


def scale_no_floor(amax: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """scale = amax / 448, no floor (an all-zero unit has scale 0): vLLM's dynamic per-tensor quant
    (csrc/quantization/w8a8/fp8/common.cu, dynamic_scaled_fp8_quant: atomicMaxFloat of amax / 448);
    SGLang 0.5.23's per-token quant (DESIGN.md)."""
    return over_fp8_max(amax), amax


def scale_min_amax_product(amax: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """scale = max(amax, 1e-6) * float32(1 / 448), a product with the rounded reciprocal, not a
    division: lmdeploy 0.18's `_quant_fp8_kernel` (blocked_gemm_fp8.py; a zero group's scale is
    float32(1e-6) times it, measured against lmdeploy's)."""
    floored = amax.clamp_min(LMDEPLOY_AMAX_FLOOR)
    return floored * torch.tensor(1.0 / FP8_MAX, dtype=torch.float32), floored


def scale_min_amax_product_1e10(amax: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """scale = max(amax, 1e-10) * float32(1 / 448), the product of min_amax_product with the group
    quants' 1e-10 floor: SGLang 0.5.23's and 0.5.20's per-token-group quant
    (kernels/jit/csrc/gemm/per_token_group_quant.cuh: amax = max(amax, 1e-10f), raw_scale = amax *
    kMaxValueInv; a zero group's scale is 1e-10 / 448, measured by the false-alarm campaign)."""
    floored = amax.clamp_min(GROUP_AMAX_FLOOR)
    return floored * torch.tensor(1.0 / FP8_MAX, dtype=torch.float32), floored


# ---- the codes before the clamp: units, scale, the floored amax -> float32 ------------------------


def codes_divide(units: torch.Tensor, scale: torch.Tensor, amax: torch.Tensor) -> torch.Tensor:
    """x / scale: vLLM's per-token and per-group quants (common.cu, per_token_group_quant.cu) and its
    fused silu + block quant; DESIGN.md's rule."""
    return units / scale


def codes_reciprocal(units: torch.Tensor, scale: torch.Tensor, amax: torch.Tensor) -> torch.Tensor:
    """x * (1 / scale), the reciprocal rounded to float32 first: vLLM's per-tensor
    scaled_fp8_quant_kernel (csrc/quantization/w8a8/fp8/common.cu); SGLang 0.5.23's FP8 quants
    (DESIGN.md: 1-6 codes per call land one e4m3 step from x / scale)."""
    return units * (1.0 / scale)


def codes_reciprocal_amax(units: torch.Tensor, scale: torch.Tensor, amax: torch.Tensor) -> torch.Tensor:
    """x * (448 / amax), the amax as the scale choice floored it: lmdeploy 0.18's `_quant_fp8_kernel`
    (blocked_gemm_fp8.py; on a GPU 448 / amax is CUDA's approximate division, followed here as IEEE,
    the interpreter's)."""
    return units * (torch.full_like(amax, FP8_MAX) / amax)


# ---- the +-448 clamp and the e4m3 cast: what a NaN becomes -------------------------------------------


def clamp_cast(x: torch.Tensor, nan_code: float) -> torch.Tensor:
    """clamp(x, -448, 448) cast to e4m3 (round to nearest even), a NaN becoming `nan_code`."""
    clamped = x.clamp(-FP8_MAX, FP8_MAX)
    return torch.where(torch.isnan(x), torch.full_like(x, nan_code), clamped).to(FP8_DTYPE)


def nan_code_nan(values: torch.Tensor) -> torch.Tensor:
    """torch's clamp keeps a NaN and the cast gives e4m3fn's NaN code: DESIGN.md's numerics (a NaN
    input's unit is NaN throughout, reference/moe.py's docstring)."""
    return values.clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)


def nan_code_pos_max(values: torch.Tensor) -> torch.Tensor:
    """fmaxf(-448, fminf(x, 448)): a NaN becomes +448. vLLM's scaled_fp8_quant and per-token quant
    (csrc/quantization/w8a8/fp8/common.cuh) and its fused silu + block quant."""
    return clamp_cast(values, FP8_MAX)


def nan_code_neg_max(values: torch.Tensor) -> torch.Tensor:
    """fminf(fmaxf(x, -448), 448): a NaN becomes -448. vLLM's per_token_group_quant.cu; lmdeploy 0.18's
    `_quant_fp8_kernel` (tl.clamp, measured)."""
    return clamp_cast(values, -FP8_MAX)


# ---- the fused activation + quant: (gate_up [R, 2I], quant, limit, the chain) -> (codes, scales) ------


def fused_chain(gate_up: torch.Tensor, quant: str, limit: float | None,
                chain: Callable[[], tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
    """What the unfused chain computes: the profile's bf16 activation, then its quantisation, so the
    fused and unfused flags give the same quanted_down_input bit for bit (DESIGN.md; the metamorphic
    oracle's invariant). lmdeploy 0.18 and vLLM's non-block schemes have no fused op: the same."""
    return chain()


def fused_fp32_block(gate_up: torch.Tensor, quant: str, limit: float | None,
                     chain: Callable[[], tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
    """vLLM's one fused op for fp8-block without a SwiGLU limit (ops.silu_and_mul_per_block_quant,
    called from model_executor/layers/fused_moe/experts/triton_moe.py; csrc/quantization/fused_kernels/):
    silu(gate) = gate * (1 / (1 + exp(-gate))), the reciprocal rounded first, times up, all in float32
    (never rounded to bf16); NaN-dropping amax, scale = max(amax / 448, 1 / (448 * 512)), codes = x /
    scale, a NaN becoming +448. Other schemes, or with a limit (vLLM 0.31+ then runs the clamped
    silu_and_mul and the group quant), the chain."""
    if quant != "fp8-block" or limit is not None:
        return chain()
    i = gate_up.shape[1] // 2
    gate, up = gate_up[:, :i].float(), gate_up[:, i:].float()
    act = gate * (1.0 / (1.0 + torch.exp(-gate))) * up  # [R, I] fp32, never rounded to bf16
    groups = act.reshape(act.shape[0], i // QUANT_BLOCK, QUANT_BLOCK)  # [R, I/128, 128]; R may be 0
    scale, floored = scale_min_scale(amax_drop_nan(groups))  # [R, I/128, 1]
    return nan_code_pos_max(codes_divide(groups, scale, floored)).reshape(act.shape), scale.squeeze(2)
