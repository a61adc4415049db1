"""The contract's optional `supports(config)` attribute: what an implementation refuses is not
asked of it. run_differential refuses the config, the metamorphic oracle is skipped (with the
reason) when the sibling is refused, and both fuzzers draw around it.

The implementation is the shipped one behind a factory that claims to refuse fused configs, as
a peer without a fused path does (peers/vllm/core.py refuses fused for all but fp8-block).
"""

from __future__ import annotations

import sys

import pytest

from diffmoe.frontends import cli
from diffmoe.problem.config import MoEConfig
from diffmoe.contract import IMPLEMENTATION_ALIASES, unsupported
from diffmoe.fuzz.driver import fuzz
from diffmoe.fuzz.plan_tier import fuzz_plans
from diffmoe.findings import Oracles
from diffmoe.judge.runner import load_factory, run_differential
from optimized import make_implementation, plan_workspaces
from stand_in_runner import make_fake_runner

REFUSAL = "fused must be false for this implementation: it has no fused path"


def no_fused(config: MoEConfig):
    return make_implementation(config)


no_fused.supports = lambda config: REFUSAL if config.fused else None
no_fused.plan_workspaces = plan_workspaces

SMALL = MoEConfig(num_tokens=2, num_experts=2, topk=1, hidden=16, inter=16, quant="fp8-tensor", fused=False)


def test_unsupported_reads_the_attribute():
    assert unsupported(no_fused, SMALL) is None
    assert unsupported(no_fused, SMALL.replace(fused=True)) == REFUSAL
    assert unsupported(make_implementation, SMALL.replace(fused=True)) is None  # no attribute: runs everything
    assert unsupported(None, SMALL) is None


def test_a_bad_answer_is_a_type_error():
    def factory(config):
        return make_implementation(config)

    factory.supports = lambda config: 3
    with pytest.raises(TypeError, match="supports"):
        unsupported(factory, SMALL)


def test_run_differential_refuses_a_refused_config():
    with pytest.raises(ValueError, match="does not run this config: fused must be false"):
        run_differential(SMALL.replace(fused=True), no_fused, oracles=[Oracles.DIFFERENTIAL])


def test_metamorphic_is_skipped_with_the_reason_when_the_sibling_is_refused():
    report = run_differential(SMALL, no_fused, oracles=[Oracles.METAMORPHIC, Oracles.DIFFERENTIAL], schedules=["identity"])
    assert report.passed
    assert REFUSAL in report.skipped[Oracles.METAMORPHIC]
    # without the attribute the same check runs the sibling: nothing skipped
    plain = run_differential(SMALL, make_implementation, oracles=[Oracles.METAMORPHIC], schedules=["identity"])
    assert Oracles.METAMORPHIC not in plain.skipped


def test_the_execution_fuzzer_draws_around_refused_configs(monkeypatch):
    fake = make_fake_runner(fails=lambda c: c.fused)  # would fail at once on any fused draw
    monkeypatch.setitem(sys.modules, "diffmoe.judge.runner", fake)
    outcome = fuzz(max_examples=30, seed=0, implementation=no_fused)
    assert outcome.passed and fake.calls and not any(c.fused for c in fake.calls)


def test_the_plan_tier_draws_around_refused_configs_and_says_so():
    # the legacy planner's alias needs fused: an implementation refusing fused has none to find
    outcome = fuzz_plans(max_examples=3000, seed=0, planner="legacy", implementation=no_fused)
    assert outcome.passed and any("skipped" in n and "supports" in n for n in outcome.notes)
    found = fuzz_plans(max_examples=3000, seed=0, planner="legacy")
    assert not found.passed  # the same draws without the refusal: caught


def test_the_vllm_alias_names_the_peer():
    assert IMPLEMENTATION_ALIASES["vllm"] == "peers.vllm:make_0_33_0"
    factory = load_factory("vllm")
    assert factory.__module__ == "peers.vllm" and callable(getattr(factory, "supports", None))


def test_peers_list_from_the_cli(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("DIFFMOE_PEER_CACHE", str(tmp_path))
    assert cli.main(["peers", "list"]) == 0
    out = capsys.readouterr().out
    assert "vllm==0.33.0" in out and "diffmoe peers fetch vllm" in out  # not cached in an empty cache
    assert cli.main(["peers", "fetch", "no-such-peer"]) == 2
