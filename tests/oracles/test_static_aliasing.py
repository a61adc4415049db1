"""Static aliasing: the legacy fused plan is flagged for every T, the fixed plan never is;
liveness rules checked on hand-made plans; workspace fit."""

import itertools

import pytest

from diffmoe.problem.config import QUANT_SCHEMES, MoEConfig
from diffmoe.contract import Placement, WorkspacePlan
from diffmoe.oracles.static_aliasing import check_static_aliasing, check_workspace_fit, live_ranges
from diffmoe.findings import ByteRange, Oracles
from diffmoe.problem.vocabulary import Buffers, Stages, StageSpec, buffer_spec
from optimized.workspace_planner import plan_workspaces

TOKEN_COUNTS = (1, 2, 3, 5, 8, 16, 63, 64, 100, 257, 1024)
EXPERTS_TOPK = ((1, 1), (4, 2), (8, 3), (16, 8))
SIZES = {"any": ((128, 128), (256, 384), (512, 128), (97, 45), (1, 1)), "fp8-block": ((128, 128), (256, 384), (512, 128))}


def _switches():
    for quant, output, planner in itertools.product(QUANT_SCHEMES, ("separate", "workspace"), ("fixed", "legacy")):
        for fused in ((False, True) if quant != "bf16" else (False,)):
            yield dict(quant=quant, fused=fused, planner=planner, output=output)


def _configs(switches):
    sizes = SIZES.get(switches["quant"], SIZES["any"])
    for (experts, topk), (hidden, inter) in itertools.product(EXPERTS_TOPK, sizes):
        yield MoEConfig(num_tokens=max(TOKEN_COUNTS), num_experts=experts, topk=topk, hidden=hidden, inter=inter, **switches)


def _switch_id(switches):
    return "-".join(str(v) if not isinstance(v, bool) else ("fused" if v else "unfused") for v in switches.values())


def _is_known_bad(cfg: MoEConfig) -> bool:
    return cfg.planner == "legacy" and cfg.fused


def test_legacy_fused_plan_is_flagged_naming_the_pair():
    cfg = MoEConfig(num_tokens=8, num_experts=4, topk=2, hidden=256, inter=256, quant="fp8-token", fused=True, planner="legacy")
    findings = check_static_aliasing(plan_workspaces(cfg, 8))
    assert len(findings) == 1
    f = findings[0]
    assert f.oracle == Oracles.STATIC_ALIASING
    assert f.stage == Stages.ACT_QUANT
    assert f.buffers == [Buffers.GATE_UP_OUTPUT, Buffers.QUANTED_DOWN_INPUT]
    qdi_bytes = 8 * 2 * 256  # [TK, I] fp8, smaller than gate_up_output
    assert f.byte_ranges == [ByteRange("ws2", 0, qdi_bytes)]
    assert f.message == f"gate_up_output and quanted_down_input share ws2 bytes [0, {qdi_bytes}) while both are live at act_quant"


def test_output_in_workspace_moves_the_alias_to_ws1():
    cfg = MoEConfig(quant="fp8-block", fused=True, planner="legacy", output="workspace")
    (f,) = check_static_aliasing(plan_workspaces(cfg, cfg.num_tokens))
    assert f.buffers == [Buffers.GATE_UP_OUTPUT, Buffers.QUANTED_DOWN_INPUT]
    assert f.byte_ranges[0].region == "ws1"


@pytest.mark.parametrize("switches", list(_switches()), ids=_switch_id)
def test_config_space(switches):
    """Legacy + fused is flagged for every shape and T, with exactly the known pair; nothing else is."""
    for cfg, num_tokens in itertools.product(_configs(switches), TOKEN_COUNTS):
        plan = plan_workspaces(cfg, num_tokens)
        findings = check_static_aliasing(plan)
        context = (cfg.short(), num_tokens, [f.headline() for f in findings])
        if not _is_known_bad(cfg):
            assert findings == [], context
            continue
        assert len(findings) == 1, context
        f = findings[0]
        assert (f.stage, f.buffers) == (Stages.ACT_QUANT, [Buffers.GATE_UP_OUTPUT, Buffers.QUANTED_DOWN_INPUT]), context
        expected_ws = "ws2" if cfg.output == "separate" else "ws1"
        qdi = buffer_spec(cfg, Buffers.QUANTED_DOWN_INPUT, num_tokens).nbytes
        assert f.byte_ranges == [ByteRange(expected_ws, 0, qdi)], context


@pytest.mark.parametrize("switches", list(_switches()), ids=_switch_id)
def test_plans_fit_their_own_workspaces(switches):
    for cfg in _configs(switches):
        largest = plan_workspaces(cfg, cfg.num_tokens).workspace_bytes
        for num_tokens in (1, 64, cfg.num_tokens):
            plan = plan_workspaces(cfg, num_tokens)
            assert check_workspace_fit(plan, plan.workspace_bytes) == []
            assert check_workspace_fit(plan, largest) == []  # fewer tokens fit the workspaces sized for the maximum


# ---- liveness on hand-made plans -----------------------------------------------------------


def _plan(stages, placements):
    return WorkspacePlan(
        planner="hand-made",
        buffer_list=tuple(p.buffer for p in placements),
        placements=tuple(placements),
        stages=tuple(StageSpec(name, tuple(reads), tuple(writes)) for name, reads, writes in stages),
        workspace_bytes=(4096, 4096),
    )


def test_a_stage_reading_one_buffer_and_writing_another_is_an_overlap():
    plan = _plan(
        [("s0", [], ["a"]), ("s1", ["a"], ["b"])],
        [Placement("a", 0, 0, 100), Placement("b", 0, 50, 100)],
    )
    (f,) = check_static_aliasing(plan)
    assert f.stage == "s1" and f.buffers == ["a", "b"] and f.byte_ranges == [ByteRange("ws1", 50, 100)]


def test_dead_buffer_may_be_reused():
    plan = _plan(
        [("s0", [], ["a"]), ("s1", ["a"], ["b"]), ("s2", ["b"], ["c"])],
        [Placement("a", 0, 0, 100), Placement("b", 1, 0, 100), Placement("c", 0, 0, 100)],
    )
    assert check_static_aliasing(plan) == []
    assert {n: (r.first, r.last) for n, r in live_ranges(plan).items()} == {"a": (0, 1), "b": (1, 2), "c": (2, 2)}


def test_unread_buffer_lives_at_its_producer_only():
    plan = _plan(
        [("s0", [], ["a"]), ("s1", [], ["b"])],
        [Placement("a", 0, 0, 100), Placement("b", 0, 0, 100)],
    )
    assert check_static_aliasing(plan) == []


def test_unwritten_buffer_never_conflicts():
    plan = _plan(
        [("s0", [], ["a"]), ("s1", ["a", "ghost"], ["b"])],
        [Placement("a", 0, 0, 100), Placement("ghost", 0, 0, 100), Placement("b", 1, 0, 100)],
    )
    assert check_static_aliasing(plan) == []
    assert "ghost" not in live_ranges(plan)


def test_disjoint_bytes_or_workspaces_do_not_conflict():
    stages = [("s0", [], ["a", "b"]), ("s1", ["a", "b"], [])]
    assert check_static_aliasing(_plan(stages, [Placement("a", 0, 0, 100), Placement("b", 0, 100, 50)])) == []
    assert check_static_aliasing(_plan(stages, [Placement("a", 0, 0, 100), Placement("b", 1, 0, 100)])) == []
    assert check_static_aliasing(_plan(stages, [Placement("a", 0, 0, 0), Placement("b", 0, 0, 100)])) == []


def test_long_lived_buffer_is_reported_at_the_first_shared_stage():
    plan = _plan(
        [("s0", [], ["a"]), ("s1", [], ["x"]), ("s2", ["x"], ["b"]), ("s3", ["a", "b"], [])],
        [Placement("a", 1, 0, 64), Placement("x", 0, 0, 64), Placement("b", 1, 32, 64)],
    )
    (f,) = check_static_aliasing(plan)
    assert f.stage == "s2" and f.buffers == ["a", "b"] and f.byte_ranges == [ByteRange("ws2", 32, 64)]
    assert f.figures["live"] == {"a": ["s0", "s3"], "b": ["s2", "s3"]}


# ---- workspace fit ------------------------------------------------------------------------------


def test_placement_past_the_provided_workspace_is_a_contract_finding():
    cfg = MoEConfig(num_tokens=16, quant="fp8-token", fused=True)
    plan = plan_workspaces(cfg, 16)
    ws1, ws2 = plan.workspace_bytes
    findings = check_workspace_fit(plan, (ws1, ws2 - 1))
    assert findings and all(f.oracle == Oracles.CONTRACT for f in findings)
    too_big = [p for p in plan.placements if p.workspace == 1 and p.end == ws2]
    assert [f.buffers[0] for f in findings] == [p.buffer for p in too_big]
    assert findings[0].byte_ranges == [ByteRange("ws2", ws2 - 1, ws2)]
    assert f"but ws2 has {ws2 - 1} bytes" in findings[0].message


def test_placement_in_an_unknown_workspace_is_a_contract_finding():
    plan = _plan([("s0", [], ["a"])], [Placement("a", 2, 0, 8)])
    (f,) = check_workspace_fit(plan, (64, 64))
    assert f.oracle == Oracles.CONTRACT and f.buffers == ["a"]
