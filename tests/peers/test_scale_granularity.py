"""The weights' and the activations' scale granularity as two config axes, and routed_scaling_factor
(issue 27 item 5): the config (aliases, pairs, JSON), the problem, the reference, the shipped
kernels quiet on every pair and caught when they ignore an axis, the peers' refusals, the command
line and the strategies."""

from __future__ import annotations

import json
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
from hypothesis import HealthCheck, find, settings  # noqa: E402

from bug_zoo import make_expert_zero_weight_scale  # noqa: E402
from dense_moe import dense_moe_float64  # noqa: E402
from diffmoe.check.report import check_command  # noqa: E402
from diffmoe.judge.runner import run_differential  # noqa: E402
from diffmoe.frontends import cli  # noqa: E402
from diffmoe.fuzz.strategies import moe_configs  # noqa: E402
from diffmoe.problem.config import MAX_ROUTED_SCALING_FACTOR, SCALE_PAIRS, MoEConfig  # noqa: E402
from diffmoe.problem.edge_cases import edge_cases  # noqa: E402
from diffmoe.problem.inputs import make_problem  # noqa: E402
from optimized.moe import TritonFP8MoE  # noqa: E402
from optimized.reduce import run_reduce  # noqa: E402
from reference import reference_moe  # noqa: E402
from reference.rounding import gemm_reduce as gr  # noqa: E402

SMALL = dict(num_tokens=5, num_experts=3, topk=2, hidden=128, inter=128, random_orders=0, seed=3)
TENSOR_BESIDE_TOKEN = MoEConfig(quant="fp8-token", weight_scales="tensor", expert_scale_spread=3, **SMALL)
CHEAP = ("differential", "teacher-forcing")


# ---- config ----------------------------------------------------------------------------------


@pytest.mark.parametrize("quant,weights,acts", [
    ("fp8-tensor", "tensor", "tensor"), ("fp8-token", "channel", "token"), ("fp8-block", "block", "group"),
])
def test_the_old_scheme_names_are_aliases_of_their_pairs(quant, weights, acts):
    alias = MoEConfig(quant=quant)
    spelled = MoEConfig(quant=quant, weight_scales=weights, act_scales=acts)
    assert spelled == alias and spelled.to_json() == alias.to_json()
    assert (alias.weight_granularity, alias.act_granularity) == (weights, acts)
    assert alias.weight_scheme == quant and alias.scale_schemes == quant


def test_old_json_and_replay_lines_mean_what_they_meant():
    old = MoEConfig(quant="fp8-token", swiglu_limit=7.0)
    assert not {"weight_scales", "act_scales", "routed_scaling_factor"} & set(json.loads(old.to_json()))
    assert MoEConfig.from_json(old.to_json()) == old
    assert "--weight-scales" not in check_command(old) and "--routed-scaling-factor" not in check_command(old)
    new = MoEConfig(quant="fp8-token", weight_scales="tensor", routed_scaling_factor=2.5)
    assert MoEConfig.from_json(new.to_json()) == new
    assert new.weight_scheme == "fp8-tensor" and new.scale_schemes == ("fp8-token", "fp8-tensor")


@pytest.mark.parametrize("fields,error,message", [
    (dict(quant="fp8-tensor", weight_scales="channel"), ValueError, r"weight_scales='channel' .* allowed weights/activations: tensor/tensor"),
    (dict(quant="fp8-token", weight_scales="block"), ValueError, "no pair a serving engine runs"),
    (dict(quant="fp8-block", weight_scales="tensor"), ValueError, "no pair a serving engine runs"),
    (dict(quant="fp8-token", weight_scales="row"), ValueError, r"weight_scales must be None or one of \['tensor', 'channel', 'block'\]"),
    (dict(quant="fp8-token", weight_scales=1), TypeError, "weight_scales must be None or a string"),
    (dict(quant="bf16", weight_scales="tensor"), ValueError, "weight_scales must be None for quant='bf16'"),
    (dict(quant="fp8-block", act_scales="token"), ValueError, r"act_scales='token' needs quant='fp8-token'"),
    (dict(routed_scaling_factor=0.0), ValueError, r"routed_scaling_factor must be finite and in \(0, 256\]"),
    (dict(routed_scaling_factor=float("nan")), ValueError, "routed_scaling_factor"),
    (dict(routed_scaling_factor=MAX_ROUTED_SCALING_FACTOR * 2), ValueError, "routed_scaling_factor"),
    (dict(routed_scaling_factor="2.5"), TypeError, "routed_scaling_factor must be None or a float"),
])
def test_invalid_axes_name_the_field_and_the_allowed_values(fields, error, message):
    with pytest.raises(error, match=message):
        MoEConfig(**fields)


def test_every_pair_is_a_config_and_an_int_factor_is_its_float():
    for weights, acts in SCALE_PAIRS:
        quant = {"tensor": "fp8-tensor", "token": "fp8-token", "group": "fp8-block"}[acts]
        cfg = MoEConfig(quant=quant, weight_scales=weights, act_scales=acts)
        assert (cfg.weight_granularity, cfg.act_granularity) == (weights, acts)
    assert MoEConfig(routed_scaling_factor=16).routed_scaling_factor == 16.0


# ---- the problem and the reference ----------------------------------------------------------------


def test_per_tensor_weights_beside_per_token_activations_have_one_scale_per_expert():
    problem = make_problem(TENSOR_BESIDE_TOKEN)
    assert problem.w1_scale.shape == (3,) and problem.w2_scale.shape == (3,)
    assert len(set(problem.w1_scale.tolist())) == 3  # the spread keeps the experts' scales apart
    activation_scales = reference_moe(problem).intermediates["quanted_gate_up_input_scales"]
    assert activation_scales.shape == (5, 1)  # per token
    w1 = gr.dequantize_weight(problem.w1, problem.w1_scale, TENSOR_BESIDE_TOKEN.weight_scheme)
    # within half an e4m3 step of the master (16 codes of its expert's one scale at the top binade; a tie
    # lands on the bound itself, hence the float32 rounding margin)
    bound = 16 * problem.w1_scale[:, None, None] * (1 + 2**-20)
    assert ((w1 - problem.w1_master.float()).abs() <= bound).all()


def test_the_reference_follows_the_weights_granularity():
    """The dense float64 formulation (its own weight dequantisation) agrees with the reference on the
    new pair within tests/reference/test_reference.py's FP8 bound (worst token's relative L2 error 2^-3), and
    reading the weights by the alias's layout instead would not even run."""
    problem = make_problem(TENSOR_BESIDE_TOKEN)
    ref = reference_moe(problem).output.double()
    dense = dense_moe_float64(problem)
    assert ((ref - dense).norm(dim=1) / dense.norm(dim=1)).max() <= 2**-3
    with pytest.raises((IndexError, RuntimeError)):
        gr.dequantize_weight(problem.w1, problem.w1_scale, "fp8-token")  # [L] read as [L, N]


def test_routed_scaling_factor_scales_the_float32_sum_before_its_one_rounding():
    base = MoEConfig(quant="fp8-token", **SMALL)
    scaled = base.replace(routed_scaling_factor=2.5)
    down = reference_moe(make_problem(scaled)).intermediates["down_output"].view(5, 2, 128)
    expected = ((down[:, 0].float() + down[:, 1].float()) * 2.5).to(torch.bfloat16)
    assert torch.equal(reference_moe(make_problem(scaled)).output, expected)
    assert not torch.equal(reference_moe(make_problem(base)).output, expected)


# ---- the shipped kernels: quiet on every pair, caught when an axis is ignored --------------------------


@pytest.mark.parametrize("quant", ["fp8-tensor", "fp8-token", "fp8-block", "bf16"])
@pytest.mark.parametrize("label", ["weights-at-another-granularity", "routed-scaling-factor",
                                   "routed-scaling-factor-with-shared-experts"])
def test_the_shipped_kernel_is_quiet_on_the_new_edge_cases(quant, label):
    config = edge_cases(quant, fused=quant == "fp8-token")[label].replace(random_orders=0)
    report = run_differential(config)
    assert report.passed, [f.message for f in report.findings]


def test_one_experts_scale_for_every_expert_is_caught_on_per_tensor_weights_beside_tokens():
    """ExpertZeroWeightScale (the bug zoo's w_scale[0]) on the new pair: its [L] weight scale."""
    report = run_differential(TENSOR_BESIDE_TOKEN, make_expert_zero_weight_scale, oracles=CHEAP)
    assert not report.passed
    assert {f.stage for f in report.findings if f.oracle == "differential"} & {"gate_up_gemm", "down_gemm"}


class IgnoresRoutedScalingFactor(TritonFP8MoE):
    """A reduce that sums the routed rows and never applies the routed scaling factor."""

    def _reduce(self, stage, ctx, down, out):
        run_reduce(ctx, self.tiles, self.traits, stage=stage, down=down, out=out, topk=self.config.topk)


def make_ignores_routed_scaling_factor(config: MoEConfig) -> TritonFP8MoE:
    return IgnoresRoutedScalingFactor(config)


def test_a_kernel_ignoring_the_routed_scaling_factor_is_caught_at_the_reduce():
    config = MoEConfig(quant="fp8-token", routed_scaling_factor=2.5, **SMALL)
    report = run_differential(config, make_ignores_routed_scaling_factor, oracles=CHEAP)
    assert not report.passed
    assert any(f.stage == "reduce" for f in report.findings)
    assert run_differential(config.replace(routed_scaling_factor=None), make_ignores_routed_scaling_factor,
                            oracles=CHEAP).passed  # quiet without the factor: the test shows what it catches


# ---- peers ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("spec,config", [
    ("peers.vllm:make_0_33_0", MoEConfig(quant="fp8-token", routed_scaling_factor=2.5)),
    ("peers.vllm:make_0_28_0", MoEConfig(quant="fp8-token", routed_scaling_factor=2.5)),
    ("peers.lmdeploy:make_0_18_0", MoEConfig(quant="fp8-block", routed_scaling_factor=2.5)),
    ("peers.liger:make_0_8_5", MoEConfig(quant="bf16", routed_scaling_factor=2.5)),
])
def test_peers_without_a_routed_scaling_factor_refuse_it_by_name(spec, config):
    from diffmoe.adapters.loading import load_factory

    refusal = load_factory(spec).supports(config)
    assert refusal is not None and "routed_scaling_factor" in refusal


def test_vllm_receives_the_two_granularities_apart():
    """vLLM's FusedMoEQuantConfig as its layer builds it: per-token activations without per-channel
    weights for (kFp8StaticTensorSym, kFp8DynamicTokenSym)."""
    from peers.vllm.core import quant_config

    pair = quant_config(TENSOR_BESIDE_TOKEN)
    assert pair.per_act_token_quant and not pair.per_out_ch_quant
    alias = quant_config(MoEConfig(quant="fp8-token"))
    assert alias.per_act_token_quant and alias.per_out_ch_quant


# ---- command line and strategies ---------------------------------------------------------------------


def _config(argv):
    return cli.config_from_args(cli.build_parser().parse_args(["check", *argv]))


def test_the_command_line_sets_each_axis_and_the_replay_line_rebuilds_it():
    config = _config(["--quant", "fp8-token", "--weight-scales", "tensor", "--routed-scaling-factor", "2.5"])
    assert (config.weight_granularity, config.routed_scaling_factor) == ("tensor", 2.5)
    replay = check_command(config).split()[2:]
    assert _config(replay) == config
    assert _config(["--act-scales", "group"]).quant == "fp8-block"


@pytest.mark.parametrize("argv,message", [
    (["--act-scales", "token", "--weight-scales", "block"], "no pair a serving engine runs"),
    (["--quant", "fp8-block", "--act-scales", "tensor"], "act_scales='tensor' needs quant='fp8-tensor'"),
    (["--routed-scaling-factor", "-1"], "routed_scaling_factor must be finite"),
])
def test_a_bad_axis_is_one_line_and_exit_2(argv, message, capsys):
    assert cli.main(["check", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err and "Traceback" not in err


@pytest.mark.parametrize("weights,acts", SCALE_PAIRS)
def test_the_strategies_draw_every_pair(weights, acts):
    found = find(moe_configs(max_tokens=4, max_experts=4),
                 lambda c: (c.weight_granularity, c.act_granularity) == (weights, acts),
                 settings=settings(max_examples=400, database=None, suppress_health_check=list(HealthCheck)))
    assert found.is_fp8


def test_the_strategies_draw_the_routed_scaling_factor_with_the_model_features():
    found = find(moe_configs(max_tokens=4, max_experts=4, features=True),
                 lambda c: c.routed_scaling_factor is not None,
                 settings=settings(max_examples=400, database=None, suppress_health_check=list(HealthCheck)))
    assert found.routed_scaling_factor in (2.5, 16.0, 0.5)


# ---- each vLLM release, read from its own wheel (issue 27 item 6, for the scale layouts) ------------

VLLM_RELEASES = ("vllm==0.28.0", "vllm==0.30.0", "vllm==0.33.0")
# config.SCALE_PAIRS as vLLM's quant-scheme keys (weights, activations)
VLLM_KEYS = {
    ("tensor", "tensor"): ("kFp8StaticTensorSym", "kFp8DynamicTensorSym"),
    ("tensor", "token"): ("kFp8StaticTensorSym", "kFp8DynamicTokenSym"),
    ("channel", "token"): ("kFp8StaticChannelSym", "kFp8DynamicTokenSym"),
    ("block", "group"): ("kFp8Static128BlockSym", "kFp8Dynamic128Sym"),
}
_PAIR_CONFIG = {("tensor", "tensor"): dict(quant="fp8-tensor"), ("tensor", "token"): dict(quant="fp8-token", weight_scales="tensor"),
                ("channel", "token"): dict(quant="fp8-token"), ("block", "group"): dict(quant="fp8-block", fused=True)}


def _wheel_file(spec: str, path: str) -> str:
    from diffmoe.adapters import peer_wheels

    return (peer_wheels.fetch(spec) / path).read_text()


@pytest.mark.parametrize("spec", VLLM_RELEASES)
def test_every_pair_is_one_the_releases_own_experts_support_and_the_adapter_runs(spec):
    """Each release's TritonExperts._supports_quant_scheme (read from its wheel) lists every pair, and
    the adapter, which passes the pair as that release's FusedMoEQuantConfig holds it, runs each."""
    from diffmoe.adapters.loading import load_factory

    source = _wheel_file(spec, "vllm/model_executor/layers/fused_moe/experts/triton_moe.py")
    supports = load_factory(spec).supports
    assert set(VLLM_KEYS) == set(SCALE_PAIRS)
    for pair, (weight_key, act_key) in VLLM_KEYS.items():
        assert f"({weight_key}, {act_key})" in source, f"{spec} does not list {pair}"
        assert supports(MoEConfig(**_PAIR_CONFIG[pair])) is None, pair


def test_vllm_0_28_reads_expert_0s_per_tensor_scale_beside_per_token_activations():
    """vLLM 0.28.0 and 0.30.0 pass a 1-D (per-tensor, [E]) weight scale to fused_moe_kernel with expert
    stride 0 (`B_scale.stride(0) if B_scale.ndim >= 2 else 0`, read from the wheel), so beside per-token
    activations every expert's GEMMs use expert 0's scale; 0.33.0 passes `B_scale.stride(0)`. The pair's
    edge case (per-expert scales apart) catches it; 0.33.0 passes it."""
    from diffmoe.adapters.loading import load_factory

    old = _wheel_file("vllm==0.28.0", "vllm/model_executor/layers/fused_moe/fused_moe.py")
    assert "B_scale.stride(0) if B_scale is not None and B_scale.ndim >= 2 else 0" in old
    assert "B_scale.stride(0) if B_scale is not None else 0" in _wheel_file(
        "vllm==0.33.0", "vllm/model_executor/layers/fused_moe/fused_moe.py")
    caught = run_differential(TENSOR_BESIDE_TOKEN, load_factory("vllm==0.28.0"), oracles=CHEAP,
                              implementation_name="vllm==0.28.0")
    assert {f.stage for f in caught.findings if f.oracle == "differential"} & {"gate_up_gemm", "down_gemm"}
    assert run_differential(TENSOR_BESIDE_TOKEN, load_factory("vllm==0.33.0"), implementation_name="vllm==0.33.0").passed
