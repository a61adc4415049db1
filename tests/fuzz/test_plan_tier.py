"""The plan tier (diffmoe.fuzz.plan_tier): it catches and shrinks the legacy planner's bug, stays quiet
on the fixed planner, catches a planted undersized plan through the fit rule, is reproducible,
its sampler covers the documented domain with valid configs, and its arguments are checked."""

import itertools

import pytest

from diffmoe.problem.config import MAX_PROBLEM_BYTES, MAX_ROUTED_ROWS, QUANT_SCHEMES, MoEConfig
from diffmoe.contract import Placement, WorkspacePlan
from diffmoe.fuzz.plan_tier import (
    PHASE_GENERATE, PLAN_MAX_EXPERTS, PLAN_MAX_SIZE, PLAN_MAX_TOPK, PlanFuzzOutcome, fuzz_plans, judge_config,
    plan_configs,
)
from diffmoe.findings import Oracles
from diffmoe.problem.vocabulary import Buffers
from optimized import make_implementation, plan_workspaces

FIXED_EXAMPLES = 20_000


def test_legacy_planner_is_caught_and_shrunk_to_the_minimal_fused_config():
    outcome = fuzz_plans(max_examples=10_000, seed=0, planner="legacy")
    assert not outcome.passed and not outcome.interrupted
    c = outcome.report.config
    assert (c.num_tokens, c.num_experts, c.topk, c.hidden, c.inter) == (1, 1, 1, 16, 16)
    assert (c.quant, c.fused, c.planner, c.output, c.router_weight) == ("fp8-tensor", True, "legacy", "separate", "down")
    assert c.expert_map is None and c.call_tokens is None
    first = outcome.report.findings[0]
    assert first.oracle == Oracles.STATIC_ALIASING
    assert first.buffers == [Buffers.GATE_UP_OUTPUT, Buffers.QUANTED_DOWN_INPUT]
    assert outcome.report.oracles == [Oracles.STATIC_ALIASING, Oracles.CONTRACT]
    assert outcome.shrink_examples > 0 and outcome.seconds_to_first_failure is not None
    d = outcome.to_dict()
    assert d["passed"] is False and d["report"]["config"]["fused"] is True


@pytest.mark.parametrize("seed", range(1, 5))
def test_legacy_planner_shrinks_to_the_same_config_from_other_seeds(seed):
    outcome = fuzz_plans(max_examples=10_000, seed=seed, planner=None)
    c = outcome.report.config
    assert (c.num_tokens, c.num_experts, c.topk, c.hidden, c.inter, c.quant, c.fused) == (1, 1, 1, 16, 16, "fp8-tensor", True)
    assert c.planner == "legacy"


def test_fixed_planner_is_quiet():
    outcome = fuzz_plans(max_examples=FIXED_EXAMPLES, seed=0, planner="fixed")
    assert outcome.passed, outcome.report.render()
    assert outcome.examples == FIXED_EXAMPLES and outcome.shrink_examples == 0
    assert outcome.seconds_to_first_failure is None and outcome.to_dict()["report"] is None


def _undersized(config, num_tokens):
    """A mutant plan: the right placements, but ws2 declared one byte short of its largest one."""
    plan = plan_workspaces(config, num_tokens)
    ws1, ws2 = plan.workspace_bytes
    return WorkspacePlan(plan.planner, plan.buffer_list, plan.placements, plan.stages, (ws1, max(0, ws2 - 1)))


def undersized_factory(config):
    return make_implementation(config)


undersized_factory.plan_workspaces = _undersized


def test_an_undersized_plan_is_caught_by_the_fit_rule():
    outcome = fuzz_plans(max_examples=1000, seed=0, implementation=undersized_factory, implementation_name="mutant")
    assert not outcome.passed
    first = outcome.report.findings[0]
    assert first.oracle == Oracles.CONTRACT and "has" in first.message
    assert outcome.report.implementation == "mutant"
    c = outcome.report.config
    assert (c.num_tokens, c.num_experts, c.topk) == (1, 1, 1)


def _offset_factory(config):
    return make_implementation(config)


def _shifted(config, num_tokens):
    """A mutant whose down_output sits past the declared workspace: a placement beyond capacity."""
    plan = plan_workspaces(config, num_tokens)
    moved = tuple(Placement(p.buffer, p.workspace, 64, p.nbytes) if p.buffer == Buffers.DOWN_OUTPUT else p
                  for p in plan.placements)
    return WorkspacePlan(plan.planner, plan.buffer_list, moved, plan.stages, plan.workspace_bytes)


_offset_factory.plan_workspaces = _shifted


def test_a_placement_past_the_workspace_is_caught():
    outcome = fuzz_plans(max_examples=1000, seed=3, implementation=_offset_factory)
    assert not outcome.passed
    assert outcome.report.findings[0].oracle == Oracles.CONTRACT
    assert Buffers.DOWN_OUTPUT in outcome.report.findings[0].buffers


def _threshold_plan(config, num_tokens):
    """A mutant that undersizes ws1 only from T >= 1000 with E >= 37: the shrinker must stop there."""
    plan = plan_workspaces(config, num_tokens)
    if num_tokens >= 1000 and config.num_experts >= 37:
        ws1, ws2 = plan.workspace_bytes
        return WorkspacePlan(plan.planner, plan.buffer_list, plan.placements, plan.stages, (ws1 - 1, ws2))
    return plan


def _threshold_factory(config):
    return make_implementation(config)


_threshold_factory.plan_workspaces = _threshold_plan


def test_the_shrinker_stops_at_a_threshold():
    outcome = fuzz_plans(max_examples=20_000, seed=0, implementation=_threshold_factory)
    c = outcome.report.config
    assert (c.num_tokens, c.num_experts, c.topk, c.hidden, c.inter) == (1000, 37, 1, 16, 16)
    assert (c.quant, c.fused, c.expert_map, c.call_tokens, c.output) == ("fp8-tensor", False, None, None, "separate")
    assert outcome.report.findings[0].oracle == Oracles.CONTRACT


def test_capacity_is_the_max_batch_plan():
    """A call plan smaller than the max-T plan fits; judge_config passes the max-T capacity."""
    config = MoEConfig(num_tokens=64, num_experts=4, topk=2, hidden=256, inter=256, call_tokens=5)
    assert judge_config(plan_workspaces, config) == []


def test_same_seed_same_sequence_and_outcome():
    a = list(itertools.islice(plan_configs(7, None), 500))
    b = list(itertools.islice(plan_configs(7, None), 500))
    assert a == b
    assert a != list(itertools.islice(plan_configs(8, None), 500))
    one, two = (fuzz_plans(max_examples=5000, seed=11, planner=None) for _ in range(2))
    assert one.report.config == two.report.config
    assert one.examples == two.examples and one.shrink_examples == two.shrink_examples
    assert [f.to_dict() for f in one.report.findings] == [f.to_dict() for f in two.report.findings]


def test_the_sampler_draws_valid_configs_covering_the_domain():
    configs = list(itertools.islice(plan_configs(0, None), 20_000))
    for c in configs:
        c.validate()  # the sampler builds with MoEConfig.unchecked: this is its check
        assert MoEConfig.from_dict(c.to_dict()) == c  # every field known, none missing
        assert c.routed_rows <= MAX_ROUTED_ROWS and c.estimated_bytes <= MAX_PROBLEM_BYTES
        assert 1 <= c.num_experts <= PLAN_MAX_EXPERTS and 1 <= c.topk <= min(c.num_experts, PLAN_MAX_TOPK)
        assert c.hidden <= PLAN_MAX_SIZE and c.inter <= PLAN_MAX_SIZE
        assert c.seed == 0 and c.skew == "uniform"
        if c.call_tokens is not None:
            assert 1 <= c.call_tokens < c.num_tokens
    assert any(c.num_tokens > 4096 for c in configs)
    assert any(c.num_tokens == 65536 for c in configs)
    assert any(c.num_experts > 64 for c in configs)
    assert {c.quant for c in configs} == set(QUANT_SCHEMES)
    assert any(c.expert_map is not None for c in configs)
    assert any(c.expert_map is not None and -1 in c.expert_map for c in configs)
    assert any(c.topk == c.num_experts and c.num_experts > 1 for c in configs)
    assert any(c.topk == PLAN_MAX_TOPK for c in configs)
    assert any(c.call_tokens is not None for c in configs)
    assert {c.planner for c in configs} == {"fixed", "legacy"}
    assert {c.output for c in configs} == {"separate", "workspace"}
    assert any(c.router_weight == "input" for c in configs)
    assert any(c.fused for c in configs) and not any(c.fused for c in configs if c.quant == "bf16")
    assert any(c.hidden % 2 and c.quant != "fp8-block" for c in configs)
    assert all(c.hidden % 128 == 0 and c.inter % 128 == 0 for c in configs if c.quant == "fp8-block")
    assert {c.planner for c in itertools.islice(plan_configs(0, "fixed"), 1000)} == {"fixed"}


@pytest.mark.parametrize(
    ("kwargs", "error", "text"),
    [
        ({"max_examples": 0, "seed": 0}, ValueError, "max_examples must be in"),
        ({"max_examples": "5", "seed": 0}, TypeError, "max_examples must be an int"),
        ({"max_examples": 5, "seed": -1}, ValueError, "seed must be in"),
        ({"max_examples": 5, "seed": None}, TypeError, "seed must be an int"),
        ({"max_examples": 5, "seed": 0, "planner": "clever"}, ValueError, "planner must be None or one of"),
        ({"max_examples": 5, "seed": 0, "implementation": 3}, TypeError, "implementation must be"),
        ({"max_examples": 5, "seed": 0, "implementation_name": 3}, TypeError, "implementation_name must be"),
        ({"max_examples": 5, "seed": 0, "progress": "yes"}, TypeError, "progress must be"),
        ({"max_examples": 5, "seed": 0, "time_budget": 0}, ValueError, "time_budget must be"),
        ({"max_examples": 5, "seed": 0, "time_budget": float("nan")}, ValueError, "time_budget must be"),
        ({"max_examples": 5, "seed": 0, "time_budget": True}, ValueError, "time_budget must be"),
    ],
)
def test_bad_arguments_raise_clear_errors(kwargs, error, text):
    with pytest.raises(error, match=text):
        fuzz_plans(**kwargs)


def test_a_factory_without_a_cheap_plan_is_refused():
    def planless(config):
        return make_implementation(config)

    with pytest.raises(ValueError, match="declares no cheap plan.*plan_workspaces"):
        fuzz_plans(max_examples=5, seed=0, implementation=planless)


def test_progress_is_called_sparingly_and_interrupt_keeps_the_smallest_failure():
    calls = []
    outcome = fuzz_plans(max_examples=200, seed=0, progress=lambda *a: calls.append(a))
    assert outcome.passed and len(calls) <= 2
    assert all(phase == PHASE_GENERATE for _, phase, _, _ in calls)

    def interrupt(*args):
        raise KeyboardInterrupt

    def slow_plan(config, num_tokens):
        import time

        time.sleep(0.001)
        return plan_workspaces(config, num_tokens)

    def slow_factory(config):
        return make_implementation(config)

    slow_factory.plan_workspaces = slow_plan
    outcome = fuzz_plans(max_examples=100_000, seed=0, implementation=slow_factory, progress=interrupt)
    assert outcome.interrupted and isinstance(outcome, PlanFuzzOutcome) and outcome.examples < 100_000


def test_interrupt_during_shrink_keeps_the_smallest_failure_so_far():
    """Ctrl-C in the shrink (here: raised by the plan a few calls after the first failure)."""
    from diffmoe.oracles.static_aliasing import check_static_aliasing

    state = {"failed": False, "after": 0}

    def interrupting_plan(config, num_tokens):
        if state["failed"]:
            state["after"] += 1
            if state["after"] == 3:
                raise KeyboardInterrupt
        plan = plan_workspaces(config, num_tokens)
        state["failed"] = state["failed"] or bool(check_static_aliasing(plan))
        return plan

    def factory(config):
        return make_implementation(config)

    factory.plan_workspaces = interrupting_plan
    outcome = fuzz_plans(max_examples=10_000, seed=0, planner="legacy", implementation=factory)
    assert outcome.interrupted
    assert outcome.report is not None and outcome.report.findings[0].oracle == Oracles.STATIC_ALIASING
    assert outcome.report.config.fused and outcome.shrink_examples >= 1


def test_time_budget_stops_the_search_with_a_note():
    outcome = fuzz_plans(max_examples=10**8, seed=0, time_budget=0.2)
    assert outcome.passed and outcome.examples < 10**8
    assert any("time_budget" in note for note in outcome.notes)


def _overlapping(config, num_tokens):
    """A planted overlap: from T >= 17 (past the first row block), down_output is placed over
    activation_output, which the down GEMM reads while it writes down_output."""
    plan = plan_workspaces(config, num_tokens)
    if num_tokens < 17:
        return plan
    act = next(p for p in plan.placements if p.buffer == Buffers.ACTIVATION_OUTPUT) if any(
        p.buffer == Buffers.ACTIVATION_OUTPUT for p in plan.placements) else None
    if act is None:
        return plan
    moved = tuple(Placement(p.buffer, act.workspace, act.offset, min(p.nbytes, act.nbytes))
                  if p.buffer == Buffers.DOWN_OUTPUT else p for p in plan.placements)
    return WorkspacePlan(plan.planner, plan.buffer_list, moved, plan.stages, plan.workspace_bytes)


def overlap_factory(config):
    return make_implementation(config)


overlap_factory.plan_workspaces = _overlapping


def test_the_plan_tier_draws_within_field_bounds_and_finds_a_planted_overlap():
    """Issue 48 item 5: with `--quant bf16 --unfused` the plan tier drew its own domain, so the CLI
    switched it off; it now draws within the bounds, and shrinks within them."""
    from diffmoe.fuzz.bounds import FieldBounds

    bounds = FieldBounds({}, {"quant": ("bf16",), "fused": (False,)})
    assert all(c.quant == "bf16" and not c.fused for c in itertools.islice(plan_configs(0, "fixed", bounds), 300))
    outcome = fuzz_plans(max_examples=1000, seed=0, implementation=overlap_factory, bounds=bounds)
    assert not outcome.passed and outcome.report.findings[0].oracle == Oracles.STATIC_ALIASING
    c = outcome.report.config
    assert (c.quant, c.fused, c.num_tokens) == ("bf16", False, 17)  # shrunk within the bounds, to the threshold


def test_waived_plan_findings_are_searched_past():
    from diffmoe.fuzz.waivers import Waivers

    outcome = fuzz_plans(max_examples=300, seed=0, implementation=overlap_factory,
                         waive=Waivers(["static-aliasing", "contract"]))
    assert outcome.passed


def test_cli_fuzz_with_field_bounds_keeps_the_plan_tier(capsys):
    from diffmoe.frontends.cli import main

    code = main(["fuzz", "--impl", "test_plan_tier:overlap_factory", "--quant", "bf16", "--unfused", "--seed", "0"])
    out, err = capsys.readouterr()
    assert code == 1 and "no plan tier" not in err
    assert out.startswith("plan tier (seed 0): ") and "static-aliasing" in out
