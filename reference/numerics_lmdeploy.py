"""The reference's `lmdeploy` numerics profile: lmdeploy 0.18.0's blocked-FP8 fused MoE, one function per point.

reference/moe.py computes diffmoe's own numerics. Under `numerics="lmdeploy"` (fp8-block only:
the one scheme lmdeploy's fused_moe_blocked_fp8 runs) it calls these at the points where
lmdeploy's kernels (lmdeploy/pytorch/kernels/cuda/ of the 0.18.0 wheel, the files `diffmoe
peers fetch lmdeploy` keeps) round differently. The facts:

  * blocked_gemm_fp8.py, `_quant_fp8_kernel` (both quantisations, 1x128 groups): the group amax
    is taken in bf16 and floored at 1e-6 in float32 (a zero group's scale is float32(1e-6) / 448's
    product form, measured against lmdeploy's), a NaN dropped from it (its tl.max), then `scale = amax * (1 / 448)` (the float32
    reciprocal, a product) and `codes = cast(clamp(x * (448 / amax), -448, 448))`, a NaN code -448 (tl.clamp's
    fminf(fmaxf(NaN, -448), 448), measured: reference/numerics.clamp_cast);
  * moe/blocked_fp8.py, `fused_moe_blocked_fp8_kernel` (and its compact twin): per 128-wide K
    block the dot of the codes is added to the float32 accumulator, which is then multiplied by
    the ratio of this block's scale to the next one's (`a_scale * b_scale`, floored at 1e-12
    from the second block on, 1 past the last): a Horner sum, never a dequantised code;
  * activation.py, `_silu_and_mul_kernel`: `gate / (1 + exp(-gate))` in float32, rounded to
    bf16, times `up` in bf16 (one more rounding);
  * the down GEMM's rows are unweighted; moe/fused_moe.py, `_moe_reduce_kernel` (fp32_acc off):
    the router weight cast to bf16, each product with its row rounded to bf16, the K products
    summed in bf16 left to right, each add rounded (a bf16 `tl.sum`).

Where lmdeploy's code runs on a GPU, `448 / amax` is CUDA's approximate division; the profile
follows IEEE (the interpreter's and the doctor-verified division of diffmoe's own kernels).

Owns the lmdeploy profile's rounding points. Must not import peers/ (the adapter is judged
against these), Triton or the harness's oracles.
"""

from __future__ import annotations

import torch

from diffmoe.problem.config import QUANT_BLOCK
from diffmoe.problem.vocabulary import FP8_MAX

from .numerics import amax as nan_dropping_amax
from .numerics import clamp_cast

PROFILE = "lmdeploy"
AMAX_FLOOR = 1e-6  # _quant_fp8_kernel: tl.maximum(a_max, 1e-6): float32 (the scalar promotes the bf16 amax)
SCALE_FLOOR = 1e-12  # fused_moe_blocked_fp8_kernel: tl.maximum(a_scale * b_scale, 1e-12)


def quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The 1x128-group quantisation of a [R, C] bf16 activation: (codes [R, C] fp8, scales [R, C/128])."""
    groups = x.reshape(x.shape[0], x.shape[1] // QUANT_BLOCK, QUANT_BLOCK)  # [R, C/128, 128] bf16; R may be 0
    amax = nan_dropping_amax(groups, dim=2).squeeze(2).clamp_min(AMAX_FLOOR)  # [R, C/128]
    scale = amax * torch.tensor(1.0 / FP8_MAX, dtype=torch.float32)  # [R, C/128], a product
    rscale = torch.full_like(amax, FP8_MAX) / amax  # [R, C/128], 448 / amax
    codes = clamp_cast(groups.float() * rscale[:, :, None], -FP8_MAX)  # [R, C/128, 128], a NaN -> -448
    return codes.reshape(x.shape), scale


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """[R, 2I] bf16 -> [R, I] bf16: silu by division in float32, rounded, times up, rounded."""
    i = gate_up.shape[1] // 2
    gate = gate_up[:, :i].float()
    silu = (gate / (1.0 + torch.exp(-gate))).to(torch.bfloat16)
    return (silu.float() * gate_up[:, i:].float()).to(torch.bfloat16)


def blocked_gemm(a: torch.Tensor, a_scale: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor) -> torch.Tensor:
    """One expert's blocked-FP8 GEMM: a [R, K] codes, a_scale [R, K/128], w [N, K] codes, w_scale
    [N/128, K/128]: [R, N] float32, by the kernel's ratio-rescaled accumulation."""
    af, wf = a.float(), w.float()
    n, blocks = wf.shape[0], af.shape[1] // QUANT_BLOCK
    w_cols = w_scale.repeat_interleave(QUANT_BLOCK, dim=0)[:n]  # [N, K/128]: each column's block scales

    def block_scale(kb: int) -> torch.Tensor:  # [R, N]: a_scale * b_scale of K block kb (1 past the last)
        if kb >= blocks:
            return torch.ones(af.shape[0], n, dtype=torch.float32, device=af.device)
        s = a_scale[:, kb : kb + 1] * w_cols[:, kb].reshape(1, -1)
        return s if kb == 0 else s.clamp_min(SCALE_FLOOR)

    acc = torch.zeros(af.shape[0], n, dtype=torch.float32, device=af.device)
    scale = block_scale(0)
    for kb in range(blocks):
        cols = slice(kb * QUANT_BLOCK, (kb + 1) * QUANT_BLOCK)
        following = block_scale(kb + 1)
        acc = (acc + af[:, cols] @ wf[:, cols].T) * (scale / following)
        scale = following
    return acc * scale  # the scale past the last block is 1


def weighted_sum(per_token: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """moe_reduce: per_token [T, K, H] bf16 unweighted rows, weights [T, K]: each row times its
    bf16 weight rounded to bf16, the K products summed left to right in bf16, each add rounded
    (tl.sum of bf16 in the order of Triton's in-thread lowering; diffmoe.interpreter.fixes,
    bf16_reduce, computes it so): [T, H] bf16."""
    products = (per_token.float() * weights.to(torch.bfloat16).float()[:, :, None]).to(torch.bfloat16)  # [T, K, H]
    acc = products[:, 0]  # [T, H] bf16
    for j in range(1, products.shape[1]):
        acc = (acc.float() + products[:, j].float()).to(torch.bfloat16)  # one bf16 add, rounded
    return acc
