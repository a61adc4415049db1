"""Align: routed rows sorted by expert and padded per expert to BLOCK_M (torch ops).

Layout (vLLM's): sorted_token_ids holds flat routed-row indices t*K + k grouped by global
expert id in ascending order, each expert's segment padded with the sentinel TK to a
multiple of BLOCK_M; expert_ids holds the local expert of each BLOCK_M block (-1 where the
expert map says the expert is not local); num_tokens_post_padded is the padded length.
Dropped slots (topk_ids -1) are sorted last, into one more segment whose blocks are -1 like a
remote expert's: the GEMMs store zeros there, as the reference's exact zeros of a dropped slot.
The buffers are allocated once for the largest batch and written in place.

Owns the aligned layout's torch ops. Must not allocate outside the views it is given.
"""

from __future__ import annotations

import torch


def max_padded_rows(routed_rows: int, num_experts: int, block_m: int) -> int:
    """Upper bound of the padded length: every non-empty expert (and the dropped slots' segment)
    adds at most BLOCK_M - 1 rows."""
    return routed_rows + min(num_experts + 1, routed_rows) * (block_m - 1)


def max_blocks(routed_rows: int, num_experts: int, block_m: int) -> int:
    # sum over experts of ceil(c_e / BLOCK_M) <= floor(TK / BLOCK_M) + (non-empty experts), the
    # dropped slots' segment counted as one more expert
    return routed_rows // block_m + min(num_experts + 1, routed_rows)


def align_routed_rows(
    topk_ids: torch.Tensor,  # [T, K] int32 global expert ids, -1 for a dropped slot
    expert_map: torch.Tensor | None,  # [E] int32 global -> local or -1
    num_experts: int,
    block_m: int,
    sorted_token_ids: torch.Tensor,  # [>= max_padded_rows] int32 out
    expert_ids: torch.Tensor,  # [>= max_blocks] int32 out
    num_tokens_post_padded: torch.Tensor,  # [1] int32 out
) -> int:
    """Fill the aligned layout in place; returns the number of BLOCK_M blocks in use."""
    flat = topk_ids.flatten().long()  # [TK]
    flat = torch.where(flat < 0, num_experts, flat)  # [TK]: a dropped slot joins segment E, sorted last
    routed = flat.numel()
    counts = torch.bincount(flat, minlength=num_experts + 1)  # [E + 1]
    padded = (counts + block_m - 1) // block_m * block_m  # [E]
    padded_start = torch.cumsum(padded, 0) - padded  # [E] first slot of each expert
    count_start = torch.cumsum(counts, 0) - counts  # [E] first rank of each expert in sorted order
    order = torch.argsort(flat, stable=True)  # [TK] routed rows by expert, ascending within
    experts_sorted = flat[order]  # [TK]
    rank = torch.arange(routed, device=flat.device) - count_start[experts_sorted]
    total = int(padded.sum())
    sorted_token_ids[:total].fill_(routed)
    sorted_token_ids[padded_start[experts_sorted] + rank] = order.to(torch.int32)
    blocks = total // block_m
    local = torch.arange(num_experts, device=flat.device) if expert_map is None else expert_map.long()  # [E]
    local = torch.cat([local, local.new_full((1,), -1)])  # [E + 1]: the dropped slots' blocks run no expert
    block_expert = local[torch.repeat_interleave(torch.arange(num_experts + 1, device=flat.device), padded // block_m)]
    expert_ids[:blocks] = block_expert.to(torch.int32)
    num_tokens_post_padded.fill_(total)
    return blocks
