"""make_problem: deterministic from the seed, routing invariants exact, values bounded."""

import pytest
import torch

from diffmoe.config import MoEConfig
from diffmoe.edge_cases import edge_cases
from diffmoe.problem import make_problem
from diffmoe.vocabulary import FP8_MAX, weight_scale_shape

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
    assert int(p.topk_ids.min()) >= 0 and int(p.topk_ids.max()) < e
    for row in p.topk_ids.tolist():
        assert len(set(row)) == k  # distinct experts per token
    counts = torch.bincount(p.topk_ids.flatten().long(), minlength=e)
    assert int(counts.sum()) == t * k
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

    from diffmoe.config import MoEConfig
    from diffmoe.problem import make_problem, settle_uncomputed_rows
    from diffmoe.vocabulary import Buffers
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
