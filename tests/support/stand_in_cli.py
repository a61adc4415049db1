"""The stand-in runner the command-line tests share (`fake_runner`): diffmoe.judge.runner replaced by a
module whose reports have findings exactly for fused configs with the legacy planner, and the CLI set to
run the fuzz, the implementation and the database in this process.

Owns the fixture. Must not judge anything: its reports are fixed by the config.
"""

import sys
import types

import pytest

from diffmoe.check.report import Report
from diffmoe.findings import Finding, Oracles
from diffmoe.frontends import flags
from diffmoe.frontends.commands import fuzz as fuzz_command
from diffmoe.problem.vocabulary import Buffers


def alias_finding():
    return Finding(
        Oracles.STATIC_ALIASING,
        "gate_up_output and quanted_down_input share ws2 bytes [0, 16) while both are live at act_quant",
        stage="act_quant",
        buffers=[Buffers.GATE_UP_OUTPUT, Buffers.QUANTED_DOWN_INPUT],
    )


@pytest.fixture
def fake_runner(monkeypatch):
    """A runner whose reports have findings exactly for fused configs with the legacy planner."""
    fake = types.ModuleType("diffmoe.judge.runner")
    fake.calls = []

    def run_differential(config, implementation=None, *, schedules=None, oracles=None, device=None, implementation_name="optimized"):
        fake.calls.append(dict(config=config, implementation=implementation, schedules=schedules, oracles=oracles, name=implementation_name))
        findings = [alias_finding()] if config.planner == "legacy" and config.fused else []
        return Report(config, implementation_name, list(oracles or ["static-aliasing"]), [str(s) for s in schedules or ["identity"]], findings)

    def load_factory(spec):
        if spec != "mymod:factory":
            raise ValueError(f"--impl module {spec.split(':')[0]!r} cannot be imported")
        return lambda config: None

    fake.run_differential = run_differential
    fake.load_factory = load_factory
    monkeypatch.setitem(sys.modules, "diffmoe.judge.runner", fake)
    # these tests drive the execution fuzz through the stand-in: no plan-tier first phase by
    # default (test_fuzz_plan_tier_finds_the_legacy_planner_first runs it for real)
    monkeypatch.setattr(fuzz_command, "DEFAULT_PLAN_EXAMPLES", 0)
    # the stand-in records its calls in this process: the fuzz runs here, not in Ray tasks
    # (tests/cluster/test_cluster_fuzz.py and test_robustness_cli.py run those)
    monkeypatch.setattr(fuzz_command, "DEFAULT_FUZZ_WORKERS", 1)
    # and the implementation in this process: the stand-in's factories exist only here
    monkeypatch.setattr(flags, "DEFAULT_ISOLATION", "none")
    monkeypatch.delenv("DIFFMOE_HYPOTHESIS_DB", raising=False)
    return fake
