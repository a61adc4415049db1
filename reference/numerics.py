"""The reference's `vllm` numerics profile: vLLM 0.33.0's rounding points, one function each.

reference/moe.py computes diffmoe's own numerics (its docstring). Under `numerics="vllm"` it
calls these instead at the points where vLLM's compiled ops round differently. Each follows
the vLLM source it names: csrc/ paths are vLLM 0.33.0's CUDA sources (not in the wheel; read
there), Python paths are files of the 0.33.0 wheel. The facts, in short:

  * every dynamic FP8 amax is a chain of fmaxf from 0 (or from eps), which drops NaN;
  * the clamp before the e4m3 cast is fmaxf(-448, fminf(x, 448)) in scaled_fp8_quant and the
    fused op (NaN -> +448), fminf(fmaxf(x, -448), 448) in the per-token-group quant (NaN -> -448);
  * per tensor: scale = amax / 448 with no floor, codes = x * (1 / scale); per token: scale =
    max(amax / 448, 1 / (448 * 512)), codes = x / scale; per 1x128 group: scale = max(amax,
    1e-10) / 448, codes = x / scale; the fused silu + 128-block quant: silu(gate) * up in float32
    (never rounded to bf16; silu by the reciprocal of 1 + exp(-gate)), scale = max(amax / 448,
    1 / (448 * 512)), codes = x / scale;
  * silu_and_mul rounds silu(gate) to bf16, then the product with `up` to bf16;
  * the FP8 GEMMs sum the codes' products and apply the scales to the float32 sum (after the
    K loop, or per 128-wide K block), where diffmoe dequantises every code first;
  * the router weight on the input is cast to bf16 before the bf16 multiply;
  * moe_sum accumulates K = 2..4 rows in bf16, each add rounded; other K keep diffmoe's float32
    sum (at::sum_out accumulates bf16 in float32).

Owns the vllm profile's rounding points (and the division by 448 both profiles share). Must not import peers/ (the peer's torch stand-ins of
the same ops are judged against these, not borrowed), Triton or the harness's oracles.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from diffmoe.problem.config import QUANT_BLOCK
from diffmoe.problem.vocabulary import FP8_DTYPE, FP8_MAX, over_fp8_max

PROFILE = "vllm"
# csrc/quantization/w8a8/fp8/common.cuh, min_scaling_factor<c10::Float8_e4m3fn>: 1 / (448 * 512)
MIN_SCALING_FACTOR = 1.0 / (FP8_MAX * 512.0)
# model_executor/layers/quantization/utils/fp8_utils.py, per_token_group_quant_fp8(eps=1e-10)
GROUP_EPS = 1e-10
# csrc/moe/moe_align_sum_kernels.cu: moe_sum has bf16-accumulating kernels for these K only
BF16_SUM_TOPK = (2, 3, 4)


def amax(x: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """max |x| as vLLM's reductions take it, fmaxf(acc, fabsf(v)) from 0: a NaN operand is
    dropped (CUDA's fmaxf returns the other operand). The amax of no element is 0."""
    a = x.float().abs()
    a = torch.where(torch.isnan(a), torch.zeros_like(a), a)  # not nan_to_num: that also turns Inf into the largest float
    if dim is None:
        return a.amax() if a.numel() else a.new_zeros(())
    return a.amax(dim=dim, keepdim=True)


def clamp_cast(x: torch.Tensor, nan_code: float) -> torch.Tensor:
    """clamp(x, -448, 448) cast to e4m3 (round to nearest even), a NaN becoming `nan_code`: what
    fmaxf/fminf make of it, +448 for fmaxf(-448, fminf(x, 448)), -448 for fminf(fmaxf(x, -448), 448)."""
    clamped = x.clamp(-FP8_MAX, FP8_MAX)
    return torch.where(torch.isnan(x), torch.full_like(x, nan_code), clamped).to(FP8_DTYPE)


def quantize(x: torch.Tensor, quant: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Dynamic FP8 quantisation of a [R, C] activation as vLLM's moe_kernel_quantize_input
    (model_executor/layers/fused_moe/utils.py, _fp8_quantize) calls it: (codes, scales)."""
    xf = x.float()  # [R, C]
    if quant == "fp8-tensor":
        # csrc/quantization/w8a8/fp8/common.cu, dynamic_scaled_fp8_quant: atomicMaxFloat of
        # amax / 448, no floor; scaled_fp8_quant_kernel multiplies by the reciprocal
        scale = over_fp8_max(amax(xf)).reshape(1)  # [1]
        return clamp_cast(xf * (1.0 / scale), FP8_MAX), scale
    if quant == "fp8-token":
        # common.cu, dynamic_per_token_scaled_fp8_quant: floored scale, x / scale
        scale = over_fp8_max(amax(xf, dim=1)).clamp_min(MIN_SCALING_FACTOR)  # [R, 1]
        return clamp_cast(xf / scale, FP8_MAX), scale
    if quant == "fp8-block":
        # csrc/quantization/w8a8/fp8/per_token_group_quant.cu: local_absmax starts at eps
        groups = xf.reshape(xf.shape[0], xf.shape[1] // QUANT_BLOCK, QUANT_BLOCK)  # [R, C/128, 128]; R may be 0
        scale = over_fp8_max(amax(groups, dim=2).clamp_min(GROUP_EPS))  # [R, C/128, 1]
        return clamp_cast(groups / scale, -FP8_MAX).reshape(xf.shape), scale.squeeze(2)
    raise ValueError(f"quant must be an fp8 scheme, got {quant!r}")


def silu_and_mul(gate_up: torch.Tensor, limit: float | None = None) -> torch.Tensor:
    """csrc/activation_kernels.cu, silu_and_mul: silu_kernel returns scalar_t (silu rounded to
    bf16), and scalar_t * scalar_t rounds the product: [R, 2I] -> [R, I] bf16. With a SwiGLU
    limit, as fused_moe/utils.py's swiglu_limit_func takes it on the path the adapter runs
    (_swiglu_limit_torch: the bf16 gate clamped to max=limit and up to [-limit, limit], then
    F.silu(gate) * up, each op rounding to bf16: the same two roundings)."""
    i = gate_up.shape[1] // 2
    gate, up = gate_up[:, :i], gate_up[:, i:]
    if limit is not None:
        gate, up = gate.clamp(max=limit), up.clamp(-limit, limit)  # bf16 clamps; NaN stays NaN
    silu = F.silu(gate.float()).to(torch.bfloat16)
    return (silu.float() * up.float()).to(torch.bfloat16)


def silu_and_mul_per_block_quant(gate_up: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The fused silu + 128-block quant TritonExperts.apply calls for fp8-block
    (ops.silu_and_mul_per_block_quant, model_executor/layers/fused_moe/experts/triton_moe.py;
    csrc/quantization/fused_kernels/): silu(gate) = gate * (1 / (1 + exp(-gate))), the
    reciprocal rounded first, times up, all in float32; scale = max(amax / 448, 1 / (448 * 512)),
    codes = x / scale, a NaN becoming +448: (codes [R, I], scales [R, I/128])."""
    i = gate_up.shape[1] // 2
    gate, up = gate_up[:, :i].float(), gate_up[:, i:].float()
    act = gate * (1.0 / (1.0 + torch.exp(-gate))) * up  # [R, I] fp32, never rounded to bf16
    groups = act.reshape(act.shape[0], i // QUANT_BLOCK, QUANT_BLOCK)  # [R, I/128, 128]; R may be 0
    scale = over_fp8_max(amax(groups, dim=2)).clamp_min(MIN_SCALING_FACTOR)  # [R, I/128, 1]
    return clamp_cast(groups / scale, FP8_MAX).reshape(act.shape), scale.squeeze(2)


def fp8_gemm(a: torch.Tensor, a_scale: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor, quant: str) -> torch.Tensor:
    """One expert's FP8 GEMM as fused_moe_kernel (model_executor/layers/fused_moe/fused_moe.py)
    dequantises it: the codes' products summed in float32, then `accumulator * a_scale * b_scale`
    (per tensor, per token and channel), or per 128-wide K block `accumulator += dot * a_scale *
    b_scale` (fp8-block); a [R, K] codes, a_scale [1] / [R, 1] / [R, K/128], w [N, K] codes,
    w_scale [] / [N] / [N/128, K/128]: [R, N] float32. An Inf scale then meets the dot, not each
    code: 448 * Inf is Inf where dequantising first makes 0 * Inf = NaN."""
    af, wf = a.float(), w.float()
    if quant != "fp8-block":
        return af @ wf.T * a_scale * w_scale.reshape(1, -1)
    n = wf.shape[0]
    w_cols = w_scale.repeat_interleave(QUANT_BLOCK, dim=0)[:n]  # [N, K/128]
    acc = torch.zeros(af.shape[0], n, dtype=torch.float32, device=af.device)
    for kb in range(af.shape[1] // QUANT_BLOCK):
        cols = slice(kb * QUANT_BLOCK, (kb + 1) * QUANT_BLOCK)
        acc = acc + af[:, cols] @ wf[:, cols].T * a_scale[:, kb : kb + 1] * w_cols[:, kb].reshape(1, -1)
    return acc


def weighted_input(x: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """model_executor/layers/fused_moe/prepare_finalize/no_dp_ep.py, prepare with the router
    weight on the input (K = 1): a1.mul_(topk_weights.to(a1.dtype)), the weight cast to bf16
    and the product rounded to bf16: [T, H] bf16."""
    return (x.float() * weights.to(torch.bfloat16).float()).to(torch.bfloat16)


def sum_from_zero(per_token: torch.Tensor) -> torch.Tensor:
    """moe_sum for the other K (at::sum_out): float32 adds in k order from the sum's identity +0,
    rounded once: [T, K, H] -> [T, H] bf16. Starting from +0 is what makes it differ from summing
    from the first row: a token whose K rows are all -0.0 (an all-zero token's down rows) sums
    to +0.0 (measured: vLLM 0.33 at K = 1 on an all-zero token, 258 of 512 outputs)."""
    acc = torch.zeros_like(per_token[:, 0], dtype=torch.float32)  # [T, H], +0
    for j in range(per_token.shape[1]):
        acc = acc + per_token[:, j].float()
    return acc.to(torch.bfloat16)


def moe_sum(per_token: torch.Tensor) -> torch.Tensor:
    """csrc/moe/moe_align_sum_kernels.cu, moe_sum_kernel for K = 2..4 (BF16_SUM_TOPK): `scalar_t
    x = 0; x += input[k]` in k order, every add rounded to bf16: [T, K, H] -> [T, H] bf16."""
    acc = torch.zeros_like(per_token[:, 0], dtype=torch.bfloat16)  # [T, H], +0
    for j in range(per_token.shape[1]):
        acc = (acc.float() + per_token[:, j].float()).to(torch.bfloat16)
    return acc
