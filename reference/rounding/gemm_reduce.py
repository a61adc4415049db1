"""The GEMMs' and the reduce's rounding points, one function per choice: when the FP8 GEMMs apply
the scales, where and in what precision the router weight multiplies, and how the reduce sums.

Citations: vLLM 0.33.0 (csrc/ paths are its CUDA sources, others files of its wheel), Liger-Kernel
0.8.5 (liger_kernel/ops/fused_moe*.py), lmdeploy 0.18.0 (lmdeploy/pytorch/kernels/cuda/). The
menus' names are diffmoe.problem.numerics's. The dequantisers and `expert_gemm` live here because
the `dequantize_first` choice is built from them; reference/moe.py re-exports them.

Owns the GEMM, router-weight and reduce choice functions, the dequantisers and the routed GEMM.
Must not import peers/, Triton or the harness's oracles.
"""

from __future__ import annotations

from typing import Callable

import torch

from diffmoe.problem.config import QUANT_BLOCK

# blocked_fp8.py (lmdeploy), fused_moe_blocked_fp8_kernel: tl.maximum(a_scale * b_scale, 1e-12)
RATIO_SCALE_FLOOR = 1e-12
# csrc/moe/moe_align_sum_kernels.cu (vLLM): moe_sum has bf16-accumulating kernels for these K only
BF16_SUM_TOPK = (2, 3, 4)


def dequantize_activation(codes: torch.Tensor, scale: torch.Tensor, quant: str,
                          dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """float32 (or `dtype`) values of [R, C] codes."""
    if quant == "fp8-block":
        scale = scale.repeat_interleave(QUANT_BLOCK, dim=1)  # [R, C]
    return codes.to(dtype) * scale.to(dtype)  # [R, C]


def dequantize_weight(w: torch.Tensor, scale: torch.Tensor | None, quant: str,
                      dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """float32 (or `dtype`) values of [L, N, Kd] weights (bf16 weights are upcast)."""
    if quant == "bf16":
        return w.to(dtype)  # [L, N, Kd]
    if quant == "fp8-tensor":
        scale = scale[:, None, None]  # [L, 1, 1]
    elif quant == "fp8-token":
        scale = scale[:, :, None]  # [L, N, 1]
    else:
        n, kd = w.shape[1:]
        scale = scale.repeat_interleave(QUANT_BLOCK, 1).repeat_interleave(QUANT_BLOCK, 2)[:, :n, :kd]  # [L, N, Kd]
    return w.to(dtype) * scale.to(dtype)  # [L, N, Kd]


ExpertGemm = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, str], torch.Tensor]


def expert_gemm(a: torch.Tensor, local_ids: torch.Tensor, w: torch.Tensor,
                scales: tuple[torch.Tensor, torch.Tensor, str] | None = None,
                fp8_gemm: ExpertGemm | None = None) -> torch.Tensor:
    """out[r] = a[r] @ w[local_ids[r]].T in float32; rows of non-local experts (-1) stay zero.
    With scales (a_scale, w_scale, quant), a and w are FP8 codes, multiplied as a kernel does:
    `fp8_gemm(a_rows, a_scale_rows, w_e, w_scale_e, quant)`."""
    out = torch.zeros(a.shape[0], w.shape[1], dtype=torch.float32, device=a.device)  # [R, N]
    for e in range(w.shape[0]):
        rows = (local_ids == e).nonzero().flatten()  # routed rows of expert e
        if scales is None:
            out[rows] = a[rows] @ w[e].T  # [rows, N]
        else:
            a_scale, w_scale, quant = scales
            row_scale = a_scale if quant == "fp8-tensor" else a_scale[rows]  # one scale, or one per row
            out[rows] = fp8_gemm(a[rows], row_scale, w[e], w_scale[e], quant)
    return out


# ---- fp8_gemm: (codes [R, K], a_scale, local ids [R], weight codes [L, N, K], w_scale, quant) -> [R, N] fp32


def gemm_dequantize_first(a: torch.Tensor, a_scale: torch.Tensor, local_ids: torch.Tensor, w: torch.Tensor,
                          w_scale: torch.Tensor, quant: str) -> torch.Tensor:
    """Every code dequantised to float32 (code * scale), then the float32 GEMM: diffmoe's (DESIGN.md);
    the shipped kernels' grouped GEMM."""
    return expert_gemm(dequantize_activation(a, a_scale, quant), local_ids, dequantize_weight(w, w_scale, quant))


def _scales_after_dot(a: torch.Tensor, a_scale: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor,
                      quant: str) -> torch.Tensor:
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


def gemm_scales_after_dot(a: torch.Tensor, a_scale: torch.Tensor, local_ids: torch.Tensor, w: torch.Tensor,
                          w_scale: torch.Tensor, quant: str) -> torch.Tensor:
    """The codes' products summed in float32, then `accumulator * a_scale * b_scale` (per tensor,
    per token and channel), or per 128-wide K block `accumulator += dot * a_scale * b_scale`
    (fp8-block): vLLM 0.33's fused_moe_kernel (model_executor/layers/fused_moe/fused_moe.py). An Inf
    scale then meets the dot, not each code: 448 * Inf is Inf where dequantising first makes 0 * Inf = NaN."""
    return expert_gemm(a, local_ids, w, (a_scale, w_scale, quant), _scales_after_dot)


def _ratio_rescaled(a: torch.Tensor, a_scale: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor,
                    quant: str) -> torch.Tensor:
    af, wf = a.float(), w.float()
    n, blocks = wf.shape[0], af.shape[1] // QUANT_BLOCK
    w_cols = w_scale.repeat_interleave(QUANT_BLOCK, dim=0)[:n]  # [N, K/128]: each column's block scales

    def block_scale(kb: int) -> torch.Tensor:  # [R, N]: a_scale * b_scale of K block kb (1 past the last)
        if kb >= blocks:
            return torch.ones(af.shape[0], n, dtype=torch.float32, device=af.device)
        s = a_scale[:, kb : kb + 1] * w_cols[:, kb].reshape(1, -1)
        return s if kb == 0 else s.clamp_min(RATIO_SCALE_FLOOR)

    acc = torch.zeros(af.shape[0], n, dtype=torch.float32, device=af.device)
    scale = block_scale(0)
    for kb in range(blocks):
        cols = slice(kb * QUANT_BLOCK, (kb + 1) * QUANT_BLOCK)
        following = block_scale(kb + 1)
        acc = (acc + af[:, cols] @ wf[:, cols].T) * (scale / following)
        scale = following
    return acc * scale  # the scale past the last block is 1


def gemm_ratio_rescaled(a: torch.Tensor, a_scale: torch.Tensor, local_ids: torch.Tensor, w: torch.Tensor,
                        w_scale: torch.Tensor, quant: str) -> torch.Tensor:
    """Per 128-wide K block the codes' dot is added to the float32 accumulator, which is then
    multiplied by this block's `a_scale * b_scale` over the next block's (floored at 1e-12 from the
    second block on, 1 past the last): a Horner sum, never a dequantised code. lmdeploy 0.18's
    fused_moe_blocked_fp8_kernel and its compact twin (moe/blocked_fp8.py); fp8-block only."""
    return expert_gemm(a, local_ids, w, (a_scale, w_scale, quant), _ratio_rescaled)


# ---- router_weight: (down rows [T, K, H] bf16, weights [T, K]) -> the rows the reduce sums -------------
# WEIGHS_IN_DOWN_GEMM names the choices under which the down GEMM itself multiplies by the weight.


def weight_down_gemm(rows: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """The down GEMM's float32 product times the float32 weight, before its bf16 rounding; the
    reduce sums the rows as they are. diffmoe's (DESIGN.md); vLLM 0.33's fused_moe_kernel
    (MUL_ROUTED_WEIGHT on the down GEMM)."""
    return rows


def weight_reduce_fp32(rows: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Unweighted bf16 down rows; the reduce sums float32(w) * float32(row), unrounded: Liger 0.8.5
    (`_fused_down_proj_kernel` stores Y unweighted, `_token_gather_weighted_sum_kernel` weighs)."""
    return weights.float()[:, :, None] * rows.float()


def weight_reduce_bf16(rows: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Unweighted bf16 down rows; the reduce multiplies each by its weight cast to bf16, each product
    rounded to bf16: lmdeploy 0.18's `_moe_reduce_kernel` (moe/fused_moe.py, fp32_acc off)."""
    return (rows.float() * weights.to(torch.bfloat16).float()[:, :, None]).to(torch.bfloat16)


WEIGHS_IN_DOWN_GEMM = frozenset({"down_gemm"})


# ---- input_weight: (hidden states [T, H] bf16, weights [T, 1]) -> bf16 ---------------------------------------


def input_weight_fp32(x: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """bf16(x * w), w float32: diffmoe's."""
    return (x.float() * weights).to(torch.bfloat16)


def input_weight_bf16(x: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """bf16(x * bf16(w)): the weight itself cast to bf16 first, vLLM 0.33's prepare with the weight on
    the input (model_executor/layers/fused_moe/prepare_finalize/no_dp_ep.py: a1.mul_(topk_weights.to(a1.dtype)))."""
    return (x.float() * weights.to(torch.bfloat16).float()).to(torch.bfloat16)


# ---- reduce: rows [T, K, H] (bf16, or float32 products) -> [T, H] bf16 ---------------------------------------


def reduce_fp32(rows: torch.Tensor) -> torch.Tensor:
    """A float32 sum in k order from the first row, rounded once: diffmoe's (the shipped reduce kernel)."""
    acc = rows[:, 0].float()  # [T, H]
    for j in range(1, rows.shape[1]):
        acc = acc + rows[:, j].float()
    return acc.to(torch.bfloat16)


def reduce_fp32_from_zero(rows: torch.Tensor) -> torch.Tensor:
    """float32 adds in k order from the sum's identity +0, rounded once: vLLM 0.33's moe_sum for K
    outside 2..4 (at::sum_out); Liger 0.8.5's gather-sum. Starting from +0 is what makes it differ
    from summing from the first row: a token whose K rows are all -0.0 (an all-zero token's down
    rows) sums to +0.0 (measured: vLLM 0.33 at K = 1 on an all-zero token, 258 of 512 outputs)."""
    acc = torch.zeros_like(rows[:, 0], dtype=torch.float32)  # [T, H], +0
    for j in range(rows.shape[1]):
        acc = acc + rows[:, j].float()
    return acc.to(torch.bfloat16)


def reduce_bf16(rows: torch.Tensor) -> torch.Tensor:
    """A bf16 sum from the first row, left to right, each add rounded: lmdeploy 0.18's
    `_moe_reduce_kernel` (a bf16 `tl.sum` in the order of Triton's in-thread lowering;
    diffmoe.interpreter.fixes, bf16_reduce, computes it so)."""
    acc = rows[:, 0].to(torch.bfloat16)  # [T, H]
    for j in range(1, rows.shape[1]):
        acc = (acc.float() + rows[:, j].float()).to(torch.bfloat16)
    return acc


def reduce_bf16_from_zero(rows: torch.Tensor) -> torch.Tensor:
    """`scalar_t x = 0; x += input[k]` in k order, every add rounded to bf16: vLLM 0.33's moe_sum_kernel
    (csrc/moe/moe_align_sum_kernels.cu)."""
    acc = torch.zeros_like(rows[:, 0], dtype=torch.bfloat16)  # [T, H], +0
    for j in range(rows.shape[1]):
        acc = (acc.float() + rows[:, j].float()).to(torch.bfloat16)
    return acc


def reduce_bf16_k2_to_4(rows: torch.Tensor) -> torch.Tensor:
    """vLLM 0.33's moe_sum: its bf16-accumulating kernel for K = 2..4 (reduce_bf16_from_zero), at::sum_out
    for other K (reduce_fp32_from_zero; csrc/moe/moe_align_sum_kernels.cu)."""
    return reduce_bf16_from_zero(rows) if rows.shape[1] in BF16_SUM_TOPK else reduce_fp32_from_zero(rows)


def reduce_fp32_from_zero_past_k2(rows: torch.Tensor) -> torch.Tensor:
    """SGLang's combine over top-k (fused_moe.py, CUDA branch): at K = 2 `torch.add` of the two rows,
    at K = 1 the down GEMM's own store (both from the first row: reduce_fp32), above a float32 sum
    from +0 (torch.sum, sgl_kernel's moe_sum_reduce; reduce_fp32_from_zero). The start only shows on
    a token whose rows are all -0.0 (seen in the false-alarm campaign on zero rows at K = 3 and 6)."""
    return reduce_fp32(rows) if rows.shape[1] <= 2 else reduce_fp32_from_zero(rows)
