"""The whole optimized implementation (TritonFP8MoE) against the reference, under the
interpreter: every stage on the labelled edge cases, the legacy plan's aliasing bug as it
actually shows, workspace reuse across batch sizes, input validation and teacher forcing.
"""

from __future__ import annotations

# No TRITON_INTERPRET here: tests/conftest.py turns the interpreter on where there is no GPU.
# Set at import, it would flip every kernel decorated later in the same pytest process into the
# interpreter on a GPU machine too (seen on an H200: the compiled suite ran interpreted).

import pytest
import torch

from diffmoe.tolerance.compare import Rule, compare
from diffmoe.problem.config import MoEConfig
from diffmoe.contract import Schedule
from diffmoe.problem.edge_cases import edge_cases
from diffmoe.check.guards import GuardedWorkspaces
from diffmoe.problem.inputs import make_problem
from diffmoe.check.recording import LaunchLog
from diffmoe.tolerance.gemm_interval import compare_stage
from diffmoe.tolerance.table import rule_for
from diffmoe.problem.vocabulary import Buffers as B
from diffmoe.problem.vocabulary import Stages, buffer_spec, materialised_buffers, pipeline_stages
from optimized import TritonFP8MoE, make_implementation
from optimized.backend import interpreter_enabled
from optimized.workspace_planner import plan_workspaces
from reference import reference_moe
from reference.moe import (
    dequantize_activation,
    dequantize_weight,
    expert_gemm,
    local_expert_ids,
    quantize_activation,
    silu_and_mul,
)

pytestmark = pytest.mark.skipif(
    not interpreter_enabled(), reason="runs the implementation on CPU tensors under the Triton interpreter (TRITON_INTERPRET=1)"
)

FP8_SCHEMES = ("fp8-tensor", "fp8-token", "fp8-block")
SCHEMES = ("bf16", *FP8_SCHEMES)


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[t.element_size()])


def bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(bits(a), bits(b))


def filled_workspaces(impl: TritonFP8MoE, byte: int, max_tokens: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    n1, n2 = impl.workspace_shapes(max_tokens)
    return torch.full((n1,), byte, dtype=torch.uint8), torch.full((n2,), byte, dtype=torch.uint8)


def run(config: MoEConfig, schedule: Schedule = Schedule()):
    """(output, LaunchLog) of one run on workspaces poisoned with NaN bytes. The problem is the
    config's: the planner and the schedule do not change the generated tensors."""
    impl = make_implementation(config)
    problem = make_problem(config)
    log = LaunchLog()
    result = impl.run(problem, filled_workspaces(impl, 0xFF), schedule=schedule, recorder=log)
    return result.output.clone(), log


# =============================================================================================
# Every stage on the labelled edge cases (fixed planner)


def _switches():
    for quant in SCHEMES:
        for fused in ((False,) if quant == "bf16" else (False, True)):
            yield quant, fused


EDGE_CASES = {
    f"{quant}/{'fused' if fused else 'unfused'}/{label}": cfg
    for quant, fused in _switches()
    for label, cfg in edge_cases(quant, fused=fused, planner="fixed").items()
}


def own_upstream_expectations(problem, snaps: dict[str, torch.Tensor]) -> dict[str, tuple[torch.Tensor, Rule]]:
    """Each stage recomputed by the reference's building blocks from the implementation's OWN
    upstream buffers (its snapshots), with the forced rule: every stage is judged on its own
    inputs, so a loose end-to-end bound cannot hide a stage's error."""
    cfg = problem.config
    q, k = cfg.quant, cfg.topk
    local = local_expert_ids(problem)
    want: dict[str, tuple[torch.Tensor, Rule]] = {}
    if cfg.is_fp8:
        a1 = dequantize_activation(snaps[B.QUANTED_GATE_UP_INPUT], snaps[B.QUANTED_GATE_UP_INPUT_SCALES], q)
    else:
        x = problem.hidden_states
        if cfg.router_weight == "input":
            x = (x.float() * problem.topk_weights).to(torch.bfloat16)
        a1 = x.float()
    w1 = dequantize_weight(problem.w1, problem.w1_scale, cfg.weight_scheme)
    want[B.GATE_UP_OUTPUT] = (expert_gemm(a1.repeat_interleave(k, dim=0), local, w1).to(torch.bfloat16),
                              rule_for(q, B.GATE_UP_OUTPUT, "forced"))
    if not cfg.fused:
        want[B.ACTIVATION_OUTPUT] = (silu_and_mul(snaps[B.GATE_UP_OUTPUT], cfg.swiglu_limit),
                                     rule_for(q, B.ACTIVATION_OUTPUT, "forced"))
    if cfg.is_fp8:
        if cfg.fused:  # recomputes silu from gate_up: the same function on the interpreter (bitwise)
            codes, scales = quantize_activation(silu_and_mul(snaps[B.GATE_UP_OUTPUT], cfg.swiglu_limit), q)
        else:  # the implementation's own activation: bitwise
            codes, scales = quantize_activation(snaps[B.ACTIVATION_OUTPUT], q)
        want[B.QUANTED_DOWN_INPUT] = (codes, rule_for(q, B.QUANTED_DOWN_INPUT, "forced", fused=cfg.fused))
        want[B.QUANTED_DOWN_INPUT_SCALES] = (scales, rule_for(q, B.QUANTED_DOWN_INPUT_SCALES, "forced", fused=cfg.fused))
        a2 = dequantize_activation(snaps[B.QUANTED_DOWN_INPUT], snaps[B.QUANTED_DOWN_INPUT_SCALES], q)
    else:
        a2 = snaps[B.ACTIVATION_OUTPUT].float()
    down = expert_gemm(a2, local, dequantize_weight(problem.w2, problem.w2_scale, cfg.weight_scheme))
    if cfg.router_weight == "down":
        down = down * problem.topk_weights.reshape(-1, 1)
    want[B.DOWN_OUTPUT] = (down.to(torch.bfloat16), rule_for(q, B.DOWN_OUTPUT, "forced"))
    per_token = snaps[B.DOWN_OUTPUT].view(problem.num_tokens, k, -1)
    acc = per_token[:, 0].float()
    for j in range(1, k):
        acc = acc + per_token[:, j].float()
    if cfg.routed_scaling_factor is not None:  # the factor on the float32 sum, before its one rounding
        acc = acc * torch.tensor(cfg.routed_scaling_factor, dtype=torch.float32)
    want[B.OUTPUT] = (acc.to(torch.bfloat16), rule_for(q, B.OUTPUT, "forced"))
    return want


@pytest.mark.parametrize("config", EDGE_CASES.values(), ids=EDGE_CASES.keys())
def test_every_stage_against_the_reference_on_edge_cases(config):
    impl = make_implementation(config)
    problem = make_problem(config)
    ref = reference_moe(problem)
    guarded = GuardedWorkspaces(impl.workspace_shapes())  # poisoned with NaN bytes, between canaries
    log = LaunchLog(snapshot=True)
    result = impl.run(problem, guarded.workspaces, recorder=log)
    assert guarded.check_red_zones() == [], "a launch wrote outside its workspace"
    snaps = dict(log.snapshots)
    assert bitwise_equal(snaps[B.OUTPUT], result.output)
    names = materialised_buffers(config)
    # every materialised buffer was written by a launch (the per-tensor amax partials are private scratch)
    assert sorted(snaps) == sorted(names + ([B.AMAX_PARTIALS] if config.quant == "fp8-tensor" else []))
    if config.output == "workspace":  # the output is carved from ws1, not a fresh tensor
        assert result.output.untyped_storage().data_ptr() == guarded.workspaces[0].untyped_storage().data_ptr()

    # the input quantisation sees exactly the reference's input: codes and scales bitwise
    if config.is_fp8:
        for name in (B.QUANTED_GATE_UP_INPUT, B.QUANTED_GATE_UP_INPUT_SCALES):
            c = compare(name, ref.intermediates[name], snaps[name], Rule.bitwise())
            assert c.ok, c.summary()

    # every stage given the implementation's own upstream
    for name, (want, rule) in own_upstream_expectations(problem, snaps).items():
        c = compare_stage(name, want, snaps[name], rule, snaps, problem)
        assert c.ok, f"stage writing {name}, on the implementation's own inputs: {c.summary()}"

    # every buffer, and the output, end to end against the reference
    for name in names:
        c = compare(name, ref.intermediates[name], snaps[name], rule_for(config.quant, name, "end_to_end"))
        assert c.ok, f"end to end: {c.summary()}"


# =============================================================================================
# The legacy plan's alias, as it shows


def _legacy_config(quant: str, planner: str = "legacy", **fields) -> MoEConfig:
    # TK = 40 routed rows: the fused act+quant launch has 2 programs of 32 rows on the interpreter
    base = dict(num_tokens=20, num_experts=4, topk=2, hidden=128, inter=128, quant=quant, fused=True, planner=planner, seed=3)
    return MoEConfig(**{**base, **fields})


@pytest.mark.parametrize("output", ("separate", "workspace"))
@pytest.mark.parametrize("quant", FP8_SCHEMES)
def test_legacy_fused_plan_puts_gate_up_output_and_quanted_down_input_on_the_same_bytes(quant, output):
    config = _legacy_config(quant, output=output)
    plan = plan_workspaces(config, config.num_tokens)
    gate_up, codes = plan.placement(B.GATE_UP_OUTPUT), plan.placement(B.QUANTED_DOWN_INPUT)
    assert gate_up.workspace == codes.workspace
    assert max(gate_up.offset, codes.offset) < min(gate_up.end, codes.end)  # overlapping bytes
    # the act_quant stage reads one and writes the other
    (act_quant,) = [s for s in plan.stages if s.name == Stages.ACT_QUANT]
    assert B.GATE_UP_OUTPUT in act_quant.reads and B.QUANTED_DOWN_INPUT in act_quant.writes
    # the fixed plan separates them
    fixed = plan_workspaces(config, config.num_tokens, planner="fixed")
    assert fixed.placement(B.GATE_UP_OUTPUT).workspace != fixed.placement(B.QUANTED_DOWN_INPUT).workspace


@pytest.mark.parametrize("quant", FP8_SCHEMES)
def test_legacy_fused_plan_is_corrupted_by_reversed_program_order(quant):
    config = _legacy_config(quant)
    ref = reference_moe(make_problem(config))
    rule = rule_for(quant, B.OUTPUT, "end_to_end")

    fixed, _ = run(config.replace(planner="fixed"))
    assert compare(B.OUTPUT, ref.output, fixed, rule).ok
    for schedule in (Schedule("reversed"), Schedule("random", 2)):
        again, _ = run(config.replace(planner="fixed"), schedule)
        assert bitwise_equal(again, fixed), f"the fixed plan depends on the program order ({schedule})"

    _, log = run(config)
    act_quant = [launch for launch in log.launches if launch.stage == Stages.ACT_QUANT]
    assert act_quant and all(launch.grid[0] >= 2 for launch in act_quant)

    # Reversed: program 1 runs first and stores its codes (rows 32..39, bytes [32*I, 40*I) of
    # ws2) over gate_up rows 8..9, which program 0 reads afterwards: token 4 comes out wrong.
    reversed_out, _ = run(config, Schedule("reversed"))
    c = compare(B.OUTPUT, ref.output, reversed_out, rule)
    assert not c.ok, "the legacy alias went unnoticed under reversed order"
    bad_tokens = (bits(reversed_out) != bits(fixed)).any(dim=1).nonzero().flatten().tolist()
    assert bad_tokens == [4], f"tokens {bad_tokens} differ; expected exactly token 4 (gate_up rows 8, 9)"

    # Identity (the interpreter's and a quiet GPU's ascending order), measured: harmless here.
    # Program p's codes (rows 32p.., I bytes each) land on gate_up rows 8p.. (4*I bytes each),
    # rows of program p // 4 <= p, which has already run; and with I = 128 one column step of
    # 256 covers the row, so a program reads all it needs before it stores. The output is
    # bitwise the fixed plan's: the bug is invisible without a reordering schedule.
    identity_out, _ = run(config)
    assert bitwise_equal(identity_out, fixed)


@pytest.mark.parametrize("quant,inter", [("fp8-token", 512), ("fp8-block", 256)])
def test_legacy_fused_plan_is_corrupted_even_in_order_when_a_row_takes_two_column_steps(quant, inter):
    """Measured: when I exceeds the row kernel's column step (256, or the 128 group of
    fp8-block), program 0 stores the codes of its first step over gate_up columns it reads in
    its second step, so even ascending order corrupts the output. The fixed plan does not."""
    config = _legacy_config(quant, inter=inter, num_tokens=8)  # TK = 16: a single program
    ref = reference_moe(make_problem(config))
    rule = rule_for(quant, B.OUTPUT, "end_to_end")
    legacy, log = run(config)
    assert [launch.grid for launch in log.launches if launch.stage == Stages.ACT_QUANT][-1] == (1,)
    assert not compare(B.OUTPUT, ref.output, legacy, rule).ok
    fixed, _ = run(config.replace(planner="fixed"))
    assert compare(B.OUTPUT, ref.output, fixed, rule).ok


@pytest.mark.parametrize("output", ("separate", "workspace"))
def test_bf16_legacy_and_fixed_plans_give_the_same_bits(output):
    """The bf16 path has no fused flag: both planners colour the same list."""
    config = MoEConfig(num_tokens=20, num_experts=4, topk=2, hidden=128, inter=128, quant="bf16", planner="legacy", output=output, seed=4)
    legacy_plan, fixed_plan = plan_workspaces(config, 20), plan_workspaces(config, 20, planner="fixed")
    assert (legacy_plan.buffer_list, legacy_plan.placements) == (fixed_plan.buffer_list, fixed_plan.placements)
    legacy, _ = run(config, Schedule("reversed"))
    fixed, _ = run(config.replace(planner="fixed"))
    assert bitwise_equal(legacy, fixed)
    c = compare(B.OUTPUT, reference_moe(make_problem(config)).output, fixed, rule_for("bf16", B.OUTPUT, "end_to_end"))
    assert c.ok, c.summary()


# =============================================================================================
# Workspace reuse across batch sizes


def _private_buffers(impl: TritonFP8MoE) -> dict[str, int]:
    named = {
        B.SORTED_TOKEN_IDS: impl._sorted_token_ids,
        B.EXPERT_IDS: impl._expert_ids,
        B.NUM_TOKENS_POST_PADDED: impl._num_tokens_post_padded,
        B.AMAX_PARTIALS: impl._amax_partials,
        **impl._scales,
    }
    return {name: t.data_ptr() for name, t in named.items()}


REUSE_CASES = {
    "fp8-tensor/fused/output-separate": MoEConfig(num_tokens=64, num_experts=5, topk=2, hidden=128, inter=128,
                                                  quant="fp8-tensor", fused=True, seed=8),
    "fp8-block/unfused/output-in-workspace": MoEConfig(num_tokens=64, num_experts=5, topk=2, hidden=128, inter=128,
                                                       quant="fp8-block", output="workspace", seed=9),
}


@pytest.mark.parametrize("config", REUSE_CASES.values(), ids=REUSE_CASES.keys())
def test_workspaces_reused_across_batch_sizes_give_fresh_answers(config):
    """One implementation and one pair of workspaces for T <= 64, called with T going down and
    up: each answer is bitwise the answer of a fresh implementation on fresh workspaces holding
    a different garbage byte, so nothing a previous (larger) call left behind is read."""
    impl = make_implementation(config)
    shared = filled_workspaces(impl, 0xA5)
    private = _private_buffers(impl)
    assert len(private) == (6 if config.is_fp8 else 4)
    out = None
    for t in (64, 7, 1, 33, 64):
        cfg_t = config.replace(num_tokens=t)
        problem = make_problem(cfg_t.replace(seed=config.seed + t))  # a different problem per call
        if config.output == "separate":
            out = torch.empty(t, config.hidden, dtype=torch.bfloat16)
        got = impl.run(problem, shared, output=out).output
        fresh_impl = make_implementation(cfg_t)
        want = fresh_impl.run(problem, filled_workspaces(fresh_impl, 0xFF)).output
        assert bitwise_equal(got, want), f"T={t}: the reused workspaces change the answer"
        if out is not None:
            assert got.data_ptr() == out.data_ptr()  # written into the caller's tensor
        assert _private_buffers(impl) == private, f"T={t}: a private buffer was reallocated"


# =============================================================================================
# Input validation


@pytest.fixture(scope="module")
def small():
    config = MoEConfig(num_tokens=8, num_experts=4, topk=2, hidden=128, inter=128, quant="fp8-token", fused=True)
    impl = make_implementation(config)
    return impl, make_problem(config), impl.allocate_workspaces()


def test_workspaces_of_the_wrong_dtype_are_refused(small):
    impl, problem, (ws1, ws2) = small
    with pytest.raises(TypeError, match="ws1 must be a contiguous 1-D uint8 tensor"):
        impl.run(problem, (ws1.view(torch.int8), ws2))
    with pytest.raises(TypeError, match="ws2 must be a contiguous 1-D uint8 tensor"):
        impl.run(problem, (ws1, torch.zeros(ws2.numel(), dtype=torch.float32)))
    with pytest.raises(TypeError, match="ws1 must be a contiguous 1-D uint8 tensor"):
        impl.run(problem, (ws1.view(2, -1), ws2))
    with pytest.raises(TypeError, match="workspaces must be a pair"):
        impl.run(problem, (ws1,))


def test_workspaces_too_small_are_refused_naming_the_workspace_and_sizes(small):
    impl, problem, (ws1, ws2) = small
    n1, n2 = impl.workspace_shapes()
    with pytest.raises(ValueError, match=rf"ws1 holds {n1 - 1} bytes, the plan for T=8 needs {n1}"):
        impl.run(problem, (ws1[: n1 - 1], ws2))
    with pytest.raises(ValueError, match=rf"ws2 holds {n2 - 1} bytes, the plan for T=8 needs {n2}"):
        impl.run(problem, (ws1, ws2[: n2 - 1]))


def test_more_tokens_than_the_maximum_are_refused(small):
    impl, problem, workspaces = small
    bigger = make_problem(problem.config.replace(num_tokens=9))
    with pytest.raises(ValueError, match=r"num_tokens must be in \[1, 8\].*got 9"):
        impl.run(bigger, workspaces)


def test_an_output_of_the_wrong_shape_or_dtype_is_refused(small):
    impl, problem, workspaces = small
    for bad in (torch.empty(8, 127, dtype=torch.bfloat16), torch.empty(7, 128, dtype=torch.bfloat16),
                torch.empty(8, 128, dtype=torch.float32)):
        with pytest.raises(ValueError, match=r"output must be a \[8, 128\] bf16 tensor"):
            impl.run(problem, workspaces, output=bad)


def test_a_problem_of_another_config_is_refused_naming_the_field(small):
    impl, problem, workspaces = small
    other = make_problem(problem.config.replace(hidden=256))
    with pytest.raises(ValueError, match=r"differs from the implementation's in \['hidden'\]"):
        impl.run(other, workspaces)
    with pytest.raises(ValueError, match="stage must be one of"):
        impl.run_stage("no_such_stage", {}, problem)


# =============================================================================================
# Teacher forcing: run_stage


RUN_STAGE_CASES = {
    f"{quant}/{'fused' if fused else 'unfused'}": MoEConfig(num_tokens=5, num_experts=4, topk=2, hidden=128, inter=128,
                                                            quant=quant, fused=fused, seed=12)
    for quant, fused in _switches()
}


@pytest.mark.parametrize("config", RUN_STAGE_CASES.values(), ids=RUN_STAGE_CASES.keys())
def test_run_stage_returns_each_stages_writes_on_the_reference_inputs(config):
    impl = make_implementation(config)
    problem = make_problem(config)
    ref = reference_moe(problem)
    problem_inputs = set(problem.inputs())
    for stage in pipeline_stages(config):
        inputs = {name: ref.intermediates[name].clone() for name in stage.reads if name not in problem_inputs}
        before = {name: t.clone() for name, t in inputs.items()}
        log = LaunchLog()
        outputs = impl.run_stage(stage.name, inputs, problem, recorder=log)
        assert sorted(outputs) == sorted(stage.writes), f"{stage.name} returned {sorted(outputs)}"
        assert log.launches and all(launch.stage == stage.name for launch in log.launches)
        for name, t in outputs.items():
            spec = buffer_spec(config, name)
            assert (tuple(t.shape), t.dtype) == (spec.shape, spec.dtype), name
            rule = rule_for(config.quant, name, "forced", fused=stage.name == Stages.ACT_QUANT)
            c = compare_stage(name, ref.intermediates[name], t, rule, ref.intermediates, problem)
            assert c.ok, f"{stage.name} on the reference's inputs: {c.summary()}"
        for name, t in inputs.items():
            assert bitwise_equal(t, before[name]), f"{stage.name} wrote its input {name}"
