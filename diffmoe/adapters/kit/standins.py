"""Torch versions of the CUDA ops fused-MoE kernels call, held to each op's stated facts, with the
conventions kernels differ in as parameters. An adapter puts them where its package imports the
compiled op (a stand-in module, or a name in a stub's values) and reports them as launches.

Conventions, and who uses which (each adapter cites the source it read):
  * alignment (`moe_align_block_size`): every entry of sorted ids first holds the sentinel
    topk_ids.numel(); each expert's routed slots in ascending order, padded to a multiple of the
    block size; one expert id per block. `invalid`: 'skip' (vLLM: an id outside [0, E), or one
    the expert map sends to -1, is neither counted nor placed) or 'bucket' (SGLang's +1 bucket:
    ids are shifted by one, bucket 0 holds the -1 ids, sorted first, its blocks carry expert
    id -1). `blocks_past_total`: the value the expert ids past the padded total get (vLLM: 0),
    or None (SGLang: left unwritten);
  * FP8 quantisation (`quant_tensor`, `quant_token`, `quant_group`): the scale is amax / 448 as
    CUDA's IEEE division rounds it (`scale_rule='divide'`) or amax * (1 / 448) ('product'), with a
    floor on the scale (`min_scale`) or on the amax (`min_amax`) or none; codes x / scale
    ('divide'), x * (1 / scale) ('reciprocal') or x * (448 / amax) ('reciprocal_amax'); a zero
    scale gives 0 codes (`zero_scale_codes=0.0`, SGLang's per-token kernel) or whatever the
    arithmetic gives (None); the amax drops NaN (fmaxf from 0) or propagates it; the +-448
    clamp turns NaN into `nan_code` (+448 or -448 by the order of fminf/fmaxf);
  * `silu_and_mul`: silu(g) = g / (1 + exp(-g)) in float32, times up in float32, rounded to the
    output once ('once') or silu rounded to the output dtype first ('silu_to_bf16'); rows
    `skip_rows` left unwritten (SGLang's expert filter);
  * `moe_sum`: the sum over top-k in float32 rounded once ('fp32'), or, for K = 2, 3, 4, every
    add rounded to the output dtype ('bf16_k2_to_4', vLLM's moe_sum); times `scale` in float32.

Owns the ops' arithmetic. Must not report launches (the adapter does) nor import an
implementation; keeps vLLM's stand-ins (peers/vllm/ops.py) bit for bit.
"""

from __future__ import annotations

import torch

from diffmoe.problem.vocabulary import FP8_MAX, over_fp8_max  # amax / 448 as CUDA's IEEE division rounds it

FP8 = torch.float8_e4m3fn
MIN_SCALING_FACTOR = 1.0 / (FP8_MAX * 512.0)  # csrc min_scaling_factor<c10::Float8_e4m3fn> (vLLM, per token)
GROUP_EPS = 1e-10  # the per-token-group quants' amax floor (vLLM and SGLang)


def amax(x: torch.Tensor, dim=None, keepdim: bool = False, nan: str = "drop") -> torch.Tensor:
    """max |x| in float32: `nan='drop'` as fmaxf(acc, fabsf(v)) from 0 (a NaN operand is dropped),
    'propagate' as torch's amax."""
    a = x.float().abs()
    if nan == "drop":
        a = torch.where(torch.isnan(a), torch.zeros_like(a), a)  # not nan_to_num: that also turns Inf into the largest float
    elif nan != "propagate":
        raise ValueError(f"nan must be 'drop' or 'propagate', got {nan!r}")
    return a.amax() if dim is None else a.amax(dim=dim, keepdim=keepdim)


def fp8_clamp(x: torch.Tensor, nan_code: float) -> torch.Tensor:
    """The +-448 clamp before the e4m3 cast; a NaN becomes `nan_code` (+448: fmaxf(-448, fminf(x,
    448)); -448: fminf(fmaxf(x, -448), 448))."""
    return torch.where(torch.isnan(x), torch.full_like(x, nan_code), x.clamp(-FP8_MAX, FP8_MAX))


def _scale(a: torch.Tensor, scale_rule: str, floor: str | None, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(scale, the amax the codes see) from an amax."""
    if floor == "min_amax":
        a = torch.clamp_min(a, eps)
    if scale_rule == "divide":
        s = over_fp8_max(a)
    elif scale_rule == "product":
        s = a * torch.tensor(1.0 / FP8_MAX, dtype=torch.float32)
    else:
        raise ValueError(f"scale_rule must be 'divide' or 'product', got {scale_rule!r}")
    if floor == "min_scale":
        s = torch.clamp_min(s, eps)
    elif floor not in (None, "min_amax"):
        raise ValueError(f"floor must be None, 'min_scale' or 'min_amax', got {floor!r}")
    return s, a


def _codes(x: torch.Tensor, s: torch.Tensor, a: torch.Tensor, codes: str, zero_scale_codes: float | None) -> torch.Tensor:
    if codes == "divide":
        q = x / s
    elif codes == "reciprocal":
        q = x * (1.0 / s)
    elif codes == "reciprocal_amax":
        q = x * (torch.full_like(a, FP8_MAX) / a)
    else:
        raise ValueError(f"codes must be 'divide', 'reciprocal' or 'reciprocal_amax', got {codes!r}")
    if zero_scale_codes is not None:
        q = torch.where(s == 0, torch.full_like(q, zero_scale_codes), q)
    return q


def quant_tensor(x: torch.Tensor, output: torch.Tensor, scale: torch.Tensor, *, static: bool, codes: str = "reciprocal",
                 nan: str = "drop", nan_code: float = FP8_MAX) -> None:
    """Per-tensor FP8: a static `scale` as given, else amax / 448 (no floor) written into `scale`."""
    xf = x.float()
    if static:
        if scale.numel() != 1:
            raise NotImplementedError("per-tensor quant stand-in: only a one-element static scale is supported")
        s = scale.reshape(())
    else:
        s = over_fp8_max(amax(xf, nan=nan))  # atomicMax(scale, amax / 448): no floor
        scale.copy_(s.reshape(scale.shape))
    output.copy_(fp8_clamp(_codes(xf, s, s, codes, None), nan_code).to(output.dtype))


def quant_token(x: torch.Tensor, output: torch.Tensor, scale: torch.Tensor, *, codes: str, floor: float | None,
                nan: str = "drop", nan_code: float = FP8_MAX, zero_scale_codes: float | None = None) -> None:
    """Per-token dynamic FP8 of a 2-D `x`: scale = amax / 448, at least `floor` when given."""
    xf = x.float()
    s, a = _scale(amax(xf, dim=1, keepdim=True, nan=nan), "divide", None if floor is None else "min_scale", floor or 0.0)
    scale.copy_(s.reshape(scale.shape))
    output.copy_(fp8_clamp(_codes(xf, s, a, codes, zero_scale_codes), nan_code).to(output.dtype))


def quant_group(x: torch.Tensor, group_size: int, output: torch.Tensor, scale: torch.Tensor, *, scale_rule: str = "divide",
                codes: str = "divide", eps: float = GROUP_EPS, nan: str = "drop", nan_code: float = -FP8_MAX) -> None:
    """Per-token-group (1 x group_size) FP8, row-major float32 scales [..., groups]: the amax floored
    at `eps`, then the scale by `scale_rule` and the codes by `codes`."""
    g = x.float().reshape(*x.shape[:-1], x.shape[-1] // group_size, group_size)
    s, a = _scale(amax(g, dim=-1, keepdim=True, nan=nan), scale_rule, "min_amax", eps)
    scale.copy_(s.squeeze(-1))
    output.copy_(fp8_clamp(_codes(g, s, a, codes, None), nan_code).reshape(x.shape).to(output.dtype))


def slot_experts(flat: torch.Tensor, num_experts: int, expert_map: torch.Tensor | None) -> torch.Tensor:
    """Each routed slot's expert as the CUDA ops count it, -1 for an id below 0 or at least
    `num_experts`, or (given a map) one the map sends to -1; else the map's local id."""
    valid = (flat >= 0) & (flat < num_experts)
    experts = torch.where(valid, flat, torch.full_like(flat, -1))
    if expert_map is not None:
        mapped = expert_map.long()[experts.clamp_min(0)]
        experts = torch.where(valid, mapped, experts)
    return experts


def moe_align_block_size(topk_ids: torch.Tensor, num_experts: int, block_size: int, sorted_token_ids: torch.Tensor,
                         expert_ids: torch.Tensor, num_tokens_post_pad: torch.Tensor, *, invalid: str = "skip",
                         expert_map: torch.Tensor | None = None, blocks_past_total: int | None = 0) -> None:
    """The aligned layout (module docstring): `num_experts` real experts, `invalid` 'skip' or
    'bucket' (then the ids must lie in [-1, num_experts - 1], SGLang's stated contract)."""
    flat = topk_ids.reshape(-1).long()
    numel = flat.numel()
    if invalid == "skip":
        experts = slot_experts(flat, num_experts, expert_map)
        placed = (experts >= 0).nonzero().flatten()  # the slots the op places, ascending
        buckets, first, nbuckets = experts[placed], 0, num_experts
    elif invalid == "bucket":
        if expert_map is not None:
            raise NotImplementedError("moe_align_block_size stand-in: the +1 bucket takes no expert map")
        if numel and (int(flat.min()) < -1 or int(flat.max()) >= num_experts):
            raise ValueError(f"topk_ids must lie in [-1, {num_experts - 1}] for the +1-bucket alignment")
        placed = torch.arange(numel, device=flat.device)
        buckets, first, nbuckets = flat + 1, -1, num_experts + 1
    else:
        raise ValueError(f"invalid must be 'skip' or 'bucket', got {invalid!r}")
    counts = torch.bincount(buckets, minlength=nbuckets)[:nbuckets]
    padded = (counts + block_size - 1) // block_size * block_size
    starts = torch.cumsum(padded, 0) - padded  # first padded row of each bucket
    order = torch.sort(buckets, stable=True).indices  # placed slots grouped by bucket, ascending within one
    sorted_buckets = buckets[order]
    rank = torch.arange(buckets.numel(), device=flat.device) - (torch.cumsum(counts, 0) - counts)[sorted_buckets]
    sorted_token_ids.fill_(numel)
    sorted_token_ids[starts[sorted_buckets] + rank] = placed[order].to(sorted_token_ids.dtype)
    if blocks_past_total is not None:
        expert_ids.fill_(blocks_past_total)
    blocks = torch.repeat_interleave(torch.arange(nbuckets, device=flat.device) + first, padded // block_size)
    expert_ids[: blocks.numel()] = blocks.to(expert_ids.dtype)
    num_tokens_post_pad.view(-1)[:1].fill_(int(padded.sum()))


def silu_and_mul(x: torch.Tensor, out: torch.Tensor, *, rounding: str = "once", skip_rows: torch.Tensor | None = None) -> None:
    """out = silu(x[..., :I]) * x[..., I:], silu = g / (1 + exp(-g)) in float32 (module docstring)."""
    d = x.shape[-1] // 2
    g = x[..., :d].float()
    silu = g / (1.0 + torch.exp(-g))
    if rounding == "silu_to_bf16":
        silu = silu.to(x.dtype).float()  # silu_kernel returns scalar_t
    elif rounding != "once":
        raise ValueError(f"rounding must be 'once' or 'silu_to_bf16', got {rounding!r}")
    result = (silu * x[..., d:].float()).to(out.dtype)
    if skip_rows is None:
        out.copy_(result)
    else:
        keep = ~skip_rows.reshape(-1)
        out.view(-1, d)[keep] = result.view(-1, d)[keep]


def moe_sum(input: torch.Tensor, output: torch.Tensor, *, precision: str = "fp32", scale: float = 1.0,
            skip: torch.Tensor | None = None) -> None:
    """output[t] = scale * sum over k of input[t, k] (module docstring); `skip` [T, K]: slots that add nothing."""
    rows = input if skip is None else input.masked_fill(skip[:, :, None], 0)  # x + 0 is x
    topk = input.shape[1]
    if precision == "bf16_k2_to_4" and 2 <= topk <= 4:
        acc = torch.zeros(output.shape, dtype=output.dtype, device=output.device)
        for k in range(topk):  # scalar_t x = 0; x += input[k]: every add rounded to bf16
            acc = (acc.float() + rows[:, k].float()).to(output.dtype)
        output.copy_(acc)
    elif precision == "bf16_k2_to_4":
        torch.sum(rows, dim=1, out=output)  # other K: at::sum_out
    elif precision == "fp32":
        total = rows.float().sum(dim=1)
        output.copy_(total if scale == 1.0 else total * scale)
    else:
        raise ValueError(f"precision must be 'fp32' or 'bf16_k2_to_4', got {precision!r}")
