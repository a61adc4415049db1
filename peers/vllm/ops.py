"""vLLM's compiled CUDA ops, in torch: what `vllm._custom_ops` (and fp8_utils' group quant) compute.

vLLM's MoE files (run by peers/vllm/core.py from each release's wheel) call compiled ops that have no
Python fallback in vLLM: moe_align_block_size, moe_sum, silu_and_mul, scaled_fp8_quant,
silu_and_mul_per_block_quant and per_token_group_quant_fp8. These are diffmoe's own torch
versions, each following the vLLM source it names below, each reported as a launch through the
run's `OpReporter` (ACTIVE_REPORTER). peers/vllm/standins.py puts them where vLLM imports them.

CUDA numerics followed (vLLM csrc; the points where they differ from diffmoe's reference, and
the facts the reference's vllm profile follows too, reference/rounding/, without importing these):
  * silu_and_mul (csrc/activation_kernels.cu): silu(g) = g / (1 + exp(-g)) in float32, rounded
    to bf16, times `up` in bf16 arithmetic (float product rounded to bf16);
  * moe_sum (csrc/moe/moe_align_sum_kernels.cu): K = 2, 3, 4 accumulate in bf16 (each add
    rounded), other K sum via at::sum_out;
  * scaled_fp8_quant (csrc/quantization/w8a8/fp8/common.cu): dynamic per tensor: scale =
    amax / 448 with no floor, codes = x * (1 / scale); dynamic per token: scale = max(amax /
    448, 1 / (448 * 512)), codes = x / scale; amax drops NaN (fmaxf), the clamp
    fmaxf(-448, fminf(x, 448)) turns NaN into +448;
  * per-token-group quant (csrc/quantization/w8a8/fp8/per_token_group_quant.cu): scale =
    max(amax, 1e-10) / 448, codes = fminf(fmaxf(x / scale, -448), 448) (NaN -> -448);
  * silu_and_mul_per_block_quant (csrc/quantization/fused_kernels/, the fused silu+block quant):
    silu(g) * up in float32, never rounded to bf16, scale = max(amax / 448, 1 / (448 * 512)),
    codes = x / scale;
  * moe_align_block_size (csrc/moe/moe_align_sum_kernels.cu): per expert, its routed rows in
    ascending order, padded to the block size with the pad id TK; one expert id per block; ids
    below 0 or at least num_experts (and, given the map, remote ones) skipped;
  * moe_sum, pad-aware form (vLLM 0.31+): skipped slots add nothing.

Each op's arithmetic is the adapter kit's (diffmoe/adapters/kit/standins.py) with vLLM's conventions
as its parameters; this module keeps vLLM's signatures, buffers and launch reporting.

Owns vLLM's compiled ops' signatures, the conventions they pass the kit, and the reporting hook they
call. Must not hold vLLM source: every line here is diffmoe's own.
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import Callable

import torch

from diffmoe.adapters.kit import standins
from diffmoe.adapters.kit.standins import FP8, GROUP_EPS, MIN_SCALING_FACTOR
from diffmoe.problem.vocabulary import FP8_MAX, over_fp8_max  # amax / 448 as CUDA's IEEE division rounds it

# ---- reporting: the adapter's run sets this; each op asks it for stage and names ------------


class OpReporter:
    """What a run of the adapter supplies: `launch(op, tensors, compute)` names the op's tensors
    (vocabulary names and stage, from the run's phase) and reports it around `compute()`."""

    def launch(self, op: str, kernel: str, grid: tuple[int, ...], tensors: dict[str, torch.Tensor],
               compute: Callable[[], None]) -> None:  # pragma: no cover - interface
        compute()


ACTIVE_REPORTER: ContextVar[OpReporter | None] = ContextVar("diffmoe_vllm_reporter", default=None)


def _launch(op: str, grid: tuple[int, ...], tensors: dict[str, torch.Tensor], compute: Callable[[], None]) -> None:
    reporter = ACTIVE_REPORTER.get()
    if reporter is None:
        compute()
    else:
        reporter.launch(op, f"vllm._C.{op} (diffmoe torch stand-in)", grid, tensors, compute)


# ---- the compiled ops, in torch ---------------------------------------------------------------


def _amax_dropping_nan(x: torch.Tensor, dim=None, keepdim: bool = False) -> torch.Tensor:
    """max |x| as fmaxf(acc, fabsf(v)) from 0: NaN operands are dropped."""
    return standins.amax(x, dim, keepdim, nan="drop")


def _clamp_min_first(x: torch.Tensor) -> torch.Tensor:
    """fmaxf(-448, fminf(x, 448)): NaN -> +448 (scaled_fp8_conversion)."""
    return standins.fp8_clamp(x, FP8_MAX)


def moe_align_block_size(topk_ids, num_experts, block_size, sorted_token_ids, experts_ids, num_tokens_post_pad,
                         expert_map=None, scatter_idx=None) -> None:
    """csrc/moe/moe_align_sum_kernels.cu (moe_align_block_size_kernel, its small-batch variant and
    count_and_sort_expert_tokens_kernel): every entry of sorted_token_ids first holds the sentinel
    topk_ids.numel(); a slot whose id is below 0 or at least num_experts is skipped (neither
    counted nor placed), and with `expert_map` (vLLM 0.31+: ignore_invalid_experts) so is one the
    map sends to -1, the others counted under their local id; each expert's slots are padded to
    a multiple of block_size, one expert id per block; the blocks past the total hold 0. (The
    revision of that file read tests only `expert_id >= num_experts` in its count and sort
    loops; the skip of ids below 0 is the stated fact of the museum's exhibit, docs/museum.md, "A museum
    of real vLLM bugs".)"""
    if scatter_idx is not None:
        raise NotImplementedError("moe_align_block_size stand-in: scatter_idx is not supported")
    def compute():  # "Fill remaining expert_ids with 0": blocks past the total hold 0
        standins.moe_align_block_size(topk_ids, num_experts, block_size, sorted_token_ids, experts_ids,
                                      num_tokens_post_pad, invalid="skip", expert_map=expert_map, blocks_past_total=0)

    tensors = {"topk_ids": topk_ids, "sorted_token_ids": sorted_token_ids, "expert_ids": experts_ids,
               "num_tokens_post_padded": num_tokens_post_pad}
    if expert_map is not None:
        tensors["expert_map"] = expert_map
    _launch("moe_align_block_size", (1,), tensors, compute)


def moe_sum(input: torch.Tensor, output: torch.Tensor, topk_ids=None, expert_map=None) -> None:
    """csrc/moe/moe_align_sum_kernels.cu, moe_sum_kernel: the two-argument call sums all top-k
    rows of each token, whatever wrote them (no pad awareness): K = 2, 3, 4 as `scalar_t x = 0;
    x += input[k]` (every add rounded to bf16), other K via at::sum_out. Given topk_ids and
    expert_map (vLLM 0.31+, the op's schema in csrc/moe/torch_bindings.cpp: "pad-aware reduce
    that skips (token, expert) slots that were never actually computed (unrouted, or routed to
    an expert not owned by this rank)"), a slot the alignment skips (standins.slot_experts) adds
    nothing; the others add in k order as above."""
    if (topk_ids is None) != (expert_map is None):
        raise NotImplementedError("moe_sum stand-in: topk_ids and expert_map come together (the pad-aware form) or not at all")
    topk = input.shape[1]

    def compute():  # a skipped slot adds nothing; K = 2, 3, 4: scalar_t x = 0; x += input[k], every add rounded
        skip = None
        if expert_map is not None:
            skip = standins.slot_experts(topk_ids.reshape(-1).long(), expert_map.numel(), expert_map).view(-1, topk) < 0
        standins.moe_sum(input, output, precision="bf16_k2_to_4", skip=skip)

    tensors = {"input": input, "output": output}
    if expert_map is not None:
        tensors.update(topk_ids=topk_ids, expert_map=expert_map)
    _launch("moe_sum", (input.shape[0],), tensors, compute)


def silu_and_mul(out: torch.Tensor, x: torch.Tensor) -> None:

    def compute():  # silu_kernel returns scalar_t, times up as scalar_t * scalar_t
        standins.silu_and_mul(x, out, rounding="silu_to_bf16")

    _launch("silu_and_mul", (x.shape[0],), {"input": x, "output": out}, compute)


def scaled_fp8_quant(input, scale=None, num_token_padding=None, scale_ub=None, use_per_token_if_dynamic=False,
                     output=None, group_shape=None):
    assert input.ndim == 2
    if num_token_padding or scale_ub is not None or group_shape is not None:
        raise NotImplementedError("scaled_fp8_quant stand-in: padding, scale_ub and group_shape are not supported")
    if output is None:
        output = torch.empty(input.shape, device=input.device, dtype=FP8)
    static = scale is not None
    if not static:
        rows = input.shape[0] if use_per_token_if_dynamic else 1
        scale = torch.empty((rows, 1) if use_per_token_if_dynamic else (1,), device=input.device, dtype=torch.float32)

    def compute():
        if static:
            standins.quant_tensor(input, output, scale, static=True, codes="reciprocal")
        elif use_per_token_if_dynamic:  # scale = max(amax / 448, min_scaling_factor), codes = x / scale
            standins.quant_token(input, output, scale, codes="divide", floor=MIN_SCALING_FACTOR)
        else:  # atomicMaxFloat(scale, amax / 448): no floor; reciprocal, then multiply
            standins.quant_tensor(input, output, scale, static=False, codes="reciprocal")

    op = "static_scaled_fp8_quant" if static else (
        "dynamic_per_token_scaled_fp8_quant" if use_per_token_if_dynamic else "dynamic_scaled_fp8_quant")
    _launch(op, (input.shape[0],), {"input": input, "output": output, "scale": scale}, compute)
    return output, scale


def per_token_group_quant_fp8(x, group_size, eps=GROUP_EPS, dtype=None, column_major_scales=False,
                              tma_aligned_scales=False, out_q=None, use_ue8m0=None):
    if column_major_scales or tma_aligned_scales or use_ue8m0:
        raise NotImplementedError("per_token_group_quant_fp8 stand-in: column-major, TMA-aligned and UE8M0 scales "
                                  "are not supported")
    assert x.shape[-1] % group_size == 0 and x.stride(-1) == 1
    x_q = out_q if out_q is not None else torch.empty(x.shape, device=x.device, dtype=dtype or FP8)
    x_s = torch.empty(x.shape[:-1] + (x.shape[-1] // group_size,), device=x.device, dtype=torch.float32)

    def compute():  # local_absmax = eps first; fminf(fmaxf(x / scale, -448), 448): NaN -> -448
        standins.quant_group(x, group_size, x_q, x_s, scale_rule="divide", codes="divide", eps=eps, nan_code=-FP8_MAX)

    _launch("per_token_group_fp8_quant", (x.numel() // group_size,), {"input": x, "output": x_q, "scale": x_s}, compute)
    return x_q, x_s


def silu_and_mul_per_block_quant(input, group_size, quant_dtype, scale_ub=None, is_scale_transposed=False):
    assert input.ndim == 2 and input.shape[-1] % 2 == 0
    if scale_ub is not None or is_scale_transposed:
        raise NotImplementedError("silu_and_mul_per_block_quant stand-in: scale_ub and transposed scales are not supported")
    tokens, hidden = input.shape[0], input.shape[-1] // 2
    output = torch.empty((tokens, hidden), device=input.device, dtype=quant_dtype)
    scales = torch.empty((tokens, hidden // group_size), device=input.device, dtype=torch.float32)

    def compute():
        gate, up = input[:, :hidden].float(), input[:, hidden:].float()
        result = gate * (1.0 / (1.0 + torch.exp(-gate))) * up  # float32 throughout
        groups = result.reshape(tokens, hidden // group_size, group_size)
        s = torch.clamp_min(over_fp8_max(_amax_dropping_nan(groups, dim=-1, keepdim=True)), MIN_SCALING_FACTOR)
        scales.copy_(s.squeeze(-1))
        output.copy_(_clamp_min_first(groups / s).reshape(tokens, hidden).to(quant_dtype))

    _launch("silu_and_mul_per_block_quant", (tokens, hidden // group_size),
            {"input": input, "output": output, "scale": scales}, compute)
    return output, scales
