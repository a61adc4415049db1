"""make_problem: deterministic from the seed, routing invariants exact, values bounded."""
# The invariants, with the MoE-model features: exactly `dropped_slots` ids are -1 (any slot,
# repeated within a token), the others distinct per token and in [0, E); with S shared experts
# every token's last S slots not dropped hold E-S..E-1 in order with weight SHARED_EXPERT_WEIGHT,
# and its routed slots pick among the first E-S experts.

import pytest
import torch

from diffmoe.problem.config import SHARED_EXPERT_WEIGHT, MoEConfig
from diffmoe.problem.edge_cases import edge_cases
from diffmoe.problem.inputs import make_problem
from diffmoe.problem.vocabulary import FP8_MAX, weight_scale_shape

SCHEMES = ["bf16", "fp8-tensor", "fp8-token", "fp8-block"]


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8)


@pytest.mark.parametrize("quant", SCHEMES)
def test_same_config_gives_bitwise_same_problem(quant):
    cfg = MoEConfig(num_tokens=9, num_experts=5, topk=2, quant=quant, seed=11)
    a, b = make_problem(cfg), make_problem(cfg)
    for name, tensor in a.inputs().items():
        assert torch.equal(_bits(tensor), _bits(b.inputs()[name])), name


def test_different_seed_gives_different_problem():
    a = make_problem(MoEConfig(seed=1))
    b = make_problem(MoEConfig(seed=2))
    assert not torch.equal(a.hidden_states, b.hidden_states)


CASES = {f"{q}/{label}": cfg for q in SCHEMES for label, cfg in edge_cases(q).items()}


@pytest.mark.parametrize("config", CASES.values(), ids=CASES.keys())
def test_routing_invariants(config):
    p = make_problem(config)
    t, e, k = p.num_tokens, config.num_experts, config.topk
    assert p.topk_ids.shape == (t, k) and p.topk_ids.dtype == torch.int32
    assert p.topk_weights.shape == (t, k) and p.topk_weights.dtype == torch.float32
    routed = p.topk_ids >= 0  # [T, K]
    assert int((~routed).sum()) == config.dropped_slots and torch.all(p.topk_ids[~routed] == -1)
    assert int(p.topk_ids.max()) < e
    s = config.shared_experts
    for row, kept in zip(p.topk_ids.tolist(), routed.tolist()):
        ids = [i for i, r in zip(row, kept) if r]
        assert len(set(ids)) == len(ids)  # distinct experts per token
        assert all(i < e - s for i, r in zip(row[: k - s], kept) if r)  # routed slots: routed experts only
        assert all(i == e - s + j for j, (i, r) in enumerate(zip(row[k - s:], kept[k - s:])) if r)
    assert torch.all(p.topk_weights[:, k - s:] == SHARED_EXPERT_WEIGHT)
    counts = torch.bincount(p.topk_ids[routed].long(), minlength=e)
    assert int(counts.sum()) == t * k - config.dropped_slots
    assert torch.all(p.topk_weights > 0)
    if config.skew == "one-expert":
        assert int(counts[0]) == t
    if config.skew == "empty-experts":
        assert int((counts == 0).sum()) >= 1


@pytest.mark.parametrize("quant", SCHEMES[1:])
def test_weight_codes_and_scales_are_consistent(quant):
    cfg = MoEConfig(num_tokens=2, num_experts=3, topk=1, hidden=256, inter=128, quant=quant)
    p = make_problem(cfg)
    L = cfg.num_local_experts
    assert p.w1.dtype == torch.float8_e4m3fn and p.w1.shape == (L, 2 * cfg.inter, cfg.hidden)
    assert p.w2.shape == (L, cfg.hidden, cfg.inter)
    assert tuple(p.w1_scale.shape) == weight_scale_shape(cfg, L, 2 * cfg.inter, cfg.hidden)
    codes = p.w1.float()
    assert torch.isfinite(codes).all() and codes.abs().max() <= FP8_MAX
    # every scale block uses its full range: amax / scale rounds to 448 exactly
    assert codes.abs().max() == FP8_MAX


def test_expert_map_shrinks_the_weights_to_local_experts():
    cfg = MoEConfig(num_experts=6, topk=2, expert_map=(0, -1, 1, -1, 2, -1))
    p = make_problem(cfg)
    assert p.w1.shape[0] == 3 and p.expert_map.tolist() == [0, -1, 1, -1, 2, -1]


def test_uncomputed_rows_take_the_references_values_and_computed_rows_keep_theirs():
    """Under an expert map the rows of remote (and unrouted) slots carry no value: settling gives
    them the reference's, so no oracle judges them; a wrong value in a computed row stays."""
    import torch

    from diffmoe.problem.config import MoEConfig
    from diffmoe.problem.inputs import make_problem, settle_uncomputed_rows
    from diffmoe.problem.vocabulary import Buffers
    from reference import reference_moe

    config = MoEConfig(num_tokens=4, num_experts=4, topk=2, hidden=128, inter=128, expert_map=(0, 1, -1, -1))
    problem = make_problem(config)
    slots = problem.computed_slots()
    ids = problem.topk_ids.flatten()
    assert slots.tolist() == [bool(0 <= int(i) < 2) for i in ids] and not slots.all() and slots.any()
    ref = reference_moe(problem).intermediates
    down = torch.full_like(ref[Buffers.DOWN_OUTPUT], float("nan"))  # nothing written anywhere
    settle_uncomputed_rows(problem, ref, {Buffers.DOWN_OUTPUT: down})
    assert torch.equal(down[~slots], ref[Buffers.DOWN_OUTPUT][~slots])
    assert torch.isnan(down[slots]).all()  # the computed rows are still judged as they are
