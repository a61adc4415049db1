"""The numerics choice end to end: a factory declares its profile (contract.NUMERICS), the harness
resolves a config's numerics=None to it before the problem is built, and each implementation is
judged against its own profile.

The reference's rounding points themselves: tests/reference/test_reference_numerics.py; vLLM's kernel
under both profiles: tests/peers/test_peers_vllm.py.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before Triton is imported

import pytest

from diffmoe.frontends import cli
from diffmoe import contract
from diffmoe.problem.config import MoEConfig
from diffmoe.contract import NUMERICS, factory_attribute, factory_numerics, judged_config
from diffmoe.problem.inputs import make_problem
from diffmoe.findings import Oracles
from diffmoe.judge.runner import run_differential
from diffmoe.problem.vocabulary import Stages

SMALL = dict(num_tokens=4, num_experts=4, topk=3, hidden=128, inter=128, quant="bf16")


def optimized_factory():
    from optimized import make_implementation

    return make_implementation


def vllm_numerics_factory(config):
    """The shipped implementation, declaring vLLM's profile: judged against rounding it does not do."""
    return optimized_factory()(config)


vllm_numerics_factory.numerics = "vllm"


# ---- the contract --------------------------------------------------------------------------------


def test_a_factory_declares_its_profile_and_a_config_naming_one_keeps_it():
    assert NUMERICS in contract.FACTORY_ATTRIBUTES
    assert factory_numerics(optimized_factory()) is None and factory_numerics(None) is None
    assert factory_numerics(vllm_numerics_factory) == "vllm" == factory_attribute(vllm_numerics_factory, NUMERICS)
    c = MoEConfig(**SMALL)
    assert judged_config(c, vllm_numerics_factory) == c.replace(numerics="vllm")
    assert judged_config(c, optimized_factory()) is c  # undeclared: None stays, diffmoe's profile
    explicit = c.replace(numerics="diffmoe")
    assert judged_config(explicit, vllm_numerics_factory) is explicit


@pytest.mark.parametrize("value", ["fast", 3])
def test_a_bad_declared_profile_is_named(value):
    def factory(config):
        raise AssertionError("not built")

    factory.numerics = value
    with pytest.raises(ValueError, match=r"numerics attribute must be one of \['diffmoe', 'vllm', 'liger', 'lmdeploy', 'sglang', 'sglang_fallback'\]"):
        judged_config(MoEConfig(**SMALL), factory)
    with pytest.raises(ValueError, match="numerics attribute"):
        run_differential(MoEConfig(**SMALL), factory)


# ---- the shipped implementation under each profile ----------------------------------------------


@pytest.mark.parametrize("changes", [{}, dict(quant="fp8-token", topk=2, nan_rows=1)], ids=["k3", "nan-token"])
def test_the_shipped_implementation_is_quiet_under_its_own_profile(changes):
    report = run_differential(MoEConfig(**{**SMALL, **changes}), oracles=[Oracles.DIFFERENTIAL, Oracles.TEACHER_FORCING])
    assert report.config.numerics is None and "numerics" not in report.replay_command()
    assert report.passed, report.render()


@pytest.mark.parametrize("changes, how, stage", [
    ({}, "config", Stages.REDUCE),
    ({}, "factory", Stages.REDUCE),
    (dict(quant="fp8-token", topk=2, nan_rows=1), "config", Stages.QUANT_INPUT),
], ids=["k3-reduce-config", "k3-reduce-factory", "nan-token-config"])
def test_the_shipped_implementation_is_flagged_under_vllms_profile(changes, how, stage):
    """The shipped reduce sums K = 3 rows in float32 and its quant propagates a NaN; vLLM's
    profile sums in bf16 and drops the NaN: the profile is used, wherever it is named (the
    config, or the factory's declaration)."""
    c = MoEConfig(**{**SMALL, **changes})
    c, factory = (c.replace(numerics="vllm"), optimized_factory()) if how == "config" else (c, vllm_numerics_factory)
    report = run_differential(c, factory, oracles=[Oracles.DIFFERENTIAL, Oracles.TEACHER_FORCING])
    assert report.config.numerics == "vllm" and "--numerics vllm" in report.replay_command()
    found = {(f.oracle, f.stage) for f in report.findings}
    assert {(Oracles.DIFFERENTIAL, stage), (Oracles.TEACHER_FORCING, stage)} <= found, report.render()
    assert all(f.figures["earliest_divergent_stage"] == stage for f in report.findings), report.render()


def test_the_shipped_implementation_is_flagged_under_ligers_profile():
    """Liger takes SwiGLU of the float32 gate/up product and weighs the down rows in the reduce;
    the shipped path rounds the product to bf16 first and weighs before the down rounding: under
    `numerics="liger"` the activation is the earliest divergent stage, and the router weight's
    placement (a factor) heads the report: reduce and down_gemm lead, the activation's ulps last."""
    report = run_differential(MoEConfig(**SMALL, numerics="liger"), oracles=[Oracles.DIFFERENTIAL])
    assert report.config.numerics == "liger" and "--numerics liger" in report.replay_command()
    assert [f.stage for f in report.findings] == [Stages.REDUCE, Stages.DOWN_GEMM, Stages.ACTIVATION], report.render()
    assert report.findings[0].figures["earliest_divergent_stage"] == Stages.ACTIVATION


def test_the_shipped_implementation_is_flagged_under_lmdeploys_profile():
    """lmdeploy scales by amax * float32(1/448); the shipped quant divides: under
    `numerics="lmdeploy"` quant_input is the earliest divergent stage (its finding comes last:
    a scale one ulp apart is the smallest departure; the router weight's placement leads)."""
    c = MoEConfig(**{**SMALL, "quant": "fp8-block", "topk": 2}, numerics="lmdeploy")
    report = run_differential(c, oracles=[Oracles.DIFFERENTIAL])
    assert report.findings and report.findings[-1].stage == Stages.QUANT_INPUT, report.render()
    assert report.findings[0].figures["earliest_divergent_stage"] == Stages.QUANT_INPUT


def test_the_lmdeploy_profile_is_for_blocked_fp8_only():
    with pytest.raises(ValueError, match=r"numerics='lmdeploy' needs quant='fp8-block'.*got quant='bf16'"):
        MoEConfig(**SMALL, numerics="lmdeploy")


def test_a_given_problem_is_judged_under_the_resolved_profile():
    """A problem built from the unresolved config (numerics=None) is rebuilt around the resolved
    one: its tensors do not depend on numerics, the reference's rounding does."""
    c = MoEConfig(**SMALL)
    report = run_differential(c, vllm_numerics_factory, oracles=[Oracles.DIFFERENTIAL], problem=make_problem(c))
    assert report.config.numerics == "vllm"
    assert [f.stage for f in report.findings] == [Stages.REDUCE], report.render()


# ---- the CLI and the fuzzer -----------------------------------------------------------------------


def test_the_cli_takes_numerics_and_refuses_other_values(capsys):
    args = cli.build_parser().parse_args(["check", "--numerics", "vllm"])
    assert cli.config_from_args(args).numerics == "vllm"
    assert cli.config_from_args(cli.build_parser().parse_args(["check"])).numerics is None
    assert cli.main(["check", "--numerics", "fast"]) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert "--numerics" in err and "vllm" in err


def test_a_peers_short_name_replays_with_its_profile():
    """`--impl vllm` replays as `--numerics vllm --impl vllm`: the replay line names the profile
    the check resolved, and loads the same factory."""
    factory, name = cli.load_implementation("vllm")
    assert factory_numerics(factory) == "vllm"
    from diffmoe.check.report import check_command

    line = check_command(judged_config(MoEConfig(**SMALL), factory), name)
    assert line.endswith("--numerics vllm --impl vllm") and "#" not in line


def test_the_fuzzer_judges_and_reports_the_resolved_config(monkeypatch):
    """Every example is judged under the factory's profile, and the report's config is the drawn
    one (no note about a sibling being reported instead)."""
    import sys
    import types

    from diffmoe.fuzz.driver import fuzz
    from diffmoe.check.report import Report
    from diffmoe.findings import Finding

    fake = types.ModuleType("diffmoe.judge.runner")
    fake.calls = []

    def fake_run_differential(config, implementation=None, *, schedules=None, oracles=None, device=None,
                              implementation_name="x"):
        fake.calls.append(config)
        findings = [Finding(Oracles.DIFFERENTIAL, "planted", stage=Stages.REDUCE)] if config.topk >= 2 else []
        return Report(config, implementation_name, ["differential"], ["identity"], findings)

    fake.run_differential = fake_run_differential
    monkeypatch.setitem(sys.modules, "diffmoe.judge.runner", fake)
    outcome = fuzz(implementation=vllm_numerics_factory, max_examples=30, seed=0)
    assert fake.calls and all(c.numerics == "vllm" for c in fake.calls)
    assert not outcome.passed and outcome.report.config.numerics == "vllm" and not outcome.notes
