"""The torch stand-ins for vLLM's compiled ops (peers/vllm/ops.py) against the facts of the CUDA
ops they follow (vLLM csrc, cited in each op's docstring): what the alignment skips and pads
with, that the two-argument moe_sum is a plain sum of the top-k rows whatever they hold, that the
pad-aware form skips exactly what the alignment skipped, and that the fused silu + block quant
takes no clamp. A stand-in smarter than the op would hide a bug; one dumber would invent one.
"""

from __future__ import annotations

import pytest
import torch

from peers.vllm import ops as vllm_ops


def align(topk_ids, num_experts, block_size=4, expert_map=None):
    numel = topk_ids.numel()
    padded = numel + num_experts * (block_size - 1)
    sorted_ids = torch.full((padded,), -7, dtype=torch.int32)
    expert_ids = torch.full((-(padded // -block_size),), -7, dtype=torch.int32)
    total = torch.empty(1, dtype=torch.int32)
    vllm_ops.moe_align_block_size(topk_ids, num_experts, block_size, sorted_ids, expert_ids, total, expert_map)
    return sorted_ids, expert_ids, int(total)


def test_align_groups_each_experts_slots_and_pads_with_the_sentinel_numel():
    ids = torch.tensor([[1, 0], [0, 1], [1, 0]], dtype=torch.int32)
    sorted_ids, expert_ids, total = align(ids, num_experts=2)
    assert total == 8  # 3 slots per expert, padded to 4
    assert sorted_ids[:8].tolist() == [1, 2, 5, 6, 0, 3, 4, 6]  # expert 0's slots, pad, expert 1's, pad
    assert expert_ids[:2].tolist() == [0, 1]
    assert set(sorted_ids[8:].tolist()) == {6} and set(expert_ids[2:].tolist()) == {0}  # the tail: numel, 0


def test_align_skips_ids_below_zero_and_at_least_num_experts():
    ids = torch.tensor([[0, -1], [2, 1]], dtype=torch.int32)  # -1 unrouted, 2 >= num_experts
    sorted_ids, _, total = align(ids, num_experts=2)
    assert total == 8
    placed = [i for i in sorted_ids.tolist() if i != ids.numel()]
    assert placed == [0, 3]  # slots 1 and 2 never placed: no GEMM writes their rows


def test_align_with_the_map_drops_remote_slots_and_counts_local_ids():
    ids = torch.tensor([[3, 0], [2, 1]], dtype=torch.int32)
    expert_map = torch.tensor([-1, 0, 1, -1], dtype=torch.int32)  # experts 1, 2 local (ids 0, 1)
    sorted_ids, expert_ids, total = align(ids, num_experts=4, expert_map=expert_map)
    assert total == 8 and expert_ids[:2].tolist() == [0, 1]
    assert [i for i in sorted_ids.tolist() if i != 4] == [3, 2]  # slot 3 (expert 1 = local 0), slot 2 (local 1)


def test_the_two_argument_moe_sum_adds_every_top_k_row_whatever_it_holds():
    rows = torch.tensor([[[1.0, 2.0], [float("nan"), 4.0]]], dtype=torch.bfloat16)  # a stale NaN row
    out = torch.empty(1, 2, dtype=torch.bfloat16)
    vllm_ops.moe_sum(rows, out)
    assert torch.isnan(out[0, 0]) and out[0, 1].item() == 6.0


def test_the_pad_aware_moe_sum_skips_what_the_alignment_skips_and_nothing_else():
    rows = torch.tensor([[[1.0, 2.0], [float("nan"), 4.0], [8.0, 8.0]],
                         [[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]]], dtype=torch.bfloat16)
    ids = torch.tensor([[1, 3, -1], [1, 2, 0]], dtype=torch.int32)
    expert_map = torch.tensor([0, 1, 2, -1], dtype=torch.int32)  # expert 3 remote
    out = torch.empty(2, 2, dtype=torch.bfloat16)
    vllm_ops.moe_sum(rows, out, ids, expert_map)
    assert out.tolist() == [[1.0, 2.0], [6.0, 6.0]]  # remote and -1 slots add nothing; local ones all add


def test_moe_sum_rounds_every_add_to_bf16_for_k_up_to_4():
    rows = torch.tensor([[[256.0], [0.5], [0.5]]], dtype=torch.bfloat16)  # 256 + 0.5 rounds back to 256
    out = torch.empty(1, 1, dtype=torch.bfloat16)
    vllm_ops.moe_sum(rows, out)
    assert out.item() == 256.0 != float(rows.float().sum())


def test_silu_and_mul_rounds_silu_to_bf16_before_the_multiply():
    x = torch.randn(64, 256, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    out = torch.empty(64, 128, dtype=torch.bfloat16)
    vllm_ops.silu_and_mul(out, x)
    g, up = x[:, :128].float(), x[:, 128:].float()
    silu_bf16 = (g / (1 + torch.exp(-g))).to(torch.bfloat16).float()
    assert torch.equal(out, (silu_bf16 * up).to(torch.bfloat16))


def test_the_fused_silu_block_quant_takes_no_clamp():
    x = torch.full((1, 256), 20.0, dtype=torch.bfloat16)  # gate and up far above any clamp limit
    with pytest.raises(TypeError):
        vllm_ops.silu_and_mul_per_block_quant(x, 128, vllm_ops.FP8, clamp_limit=7.0)
    codes, scales = vllm_ops.silu_and_mul_per_block_quant(x, 128, vllm_ops.FP8)
    got = codes.float() * scales.repeat_interleave(128, dim=1)
    assert torch.allclose(got, torch.full_like(got, 20.0 * 20.0), rtol=0.07)  # silu(20) * 20, unclamped


def test_the_amax_drops_nan_but_keeps_inf():
    """fmaxf(acc, fabsf(v)) from 0: a NaN operand is dropped, an Inf wins (nan_to_num would have
    made it the largest float, a scale no CUDA op computes)."""
    from peers.vllm import ops as vllm_ops
    from reference.rounding.quant import amax_drop_nan  # the vllm profile's amax choice

    x = torch.tensor([[1.0, float("nan"), -float("inf"), 3.0]])
    for amax in (vllm_ops._amax_dropping_nan(x), amax_drop_nan(x[None])):
        assert amax.item() == float("inf")
    assert amax_drop_nan(torch.tensor([[[1.0, float("nan")]]])).item() == 1.0


DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", DEVICES)
def test_the_quant_stand_ins_divide_amax_by_448_as_cudas_ieee_division_does(device):
    """amax / 448 correctly rounded (the float64 quotient rounded once), as the CUDA ops' `/`
    gives it: torch on CUDA multiplies by a Python scalar's reciprocal, one ulp high for 3.40625,
    so on a GPU this fails without diffmoe.problem.vocabulary.over_fp8_max."""
    amax = torch.tensor(3.40625)
    want = (amax.double() / 448).float()
    assert want != amax * (1 / 448)
    x = torch.zeros(1, 128)
    x[0, 0] = amax
    x = x.to(device)
    _, per_token = vllm_ops.scaled_fp8_quant(x, use_per_token_if_dynamic=True)
    _, per_tensor = vllm_ops.scaled_fp8_quant(x)
    _, per_group = vllm_ops.per_token_group_quant_fp8(x, 128, dtype=torch.float8_e4m3fn)
    for scale in (per_token, per_tensor, per_group):
        assert scale.flatten()[0].cpu() == want
