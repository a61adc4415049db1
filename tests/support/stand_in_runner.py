"""The stand-in runner the fuzz tests share: a module in place of diffmoe.judge.runner whose
run_differential reports findings exactly where a test says (`make_fake_runner`), and the fixtures
that install it (`fake_runner`) and run `diffmoe fuzz` in this process on it (`cli_runner`).

Owns the stand-in and its fixtures. Must not judge anything: its reports are what the test asked for.
"""

import sys
import types

import pytest

from diffmoe.check.report import Report
from diffmoe.findings import Finding, Oracles
from diffmoe.problem.vocabulary import Buffers


def alias_finding():
    return Finding(
        Oracles.STATIC_ALIASING,
        "gate_up_output and quanted_down_input share ws2 bytes while both are live at act_quant",
        stage="act_quant",
        buffers=[Buffers.GATE_UP_OUTPUT, Buffers.QUANTED_DOWN_INPUT],
    )


def make_fake_runner(fails=lambda c: c.planner == "legacy" and c.fused, raises=None, findings=None):
    """A module with run_differential: findings exactly when `fails(config)` (or `findings(config)`'s)."""
    fake = types.ModuleType("diffmoe.judge.runner")
    fake.calls = []

    def run_differential(config, implementation=None, *, schedules=None, oracles=None, device=None, implementation_name="optimized"):
        fake.calls.append(config)
        if raises is not None and raises(config):
            raise RuntimeError("harness exploded")
        found = findings(config) if findings is not None else [alias_finding()] if fails(config) else []
        return Report(config, implementation_name, ["static-aliasing"], ["identity"], found)

    fake.run_differential = run_differential
    fake.load_factory = lambda spec: (lambda config: None)
    return fake


@pytest.fixture
def fake_runner(monkeypatch):
    def install(**kwargs):
        fake = make_fake_runner(**kwargs)
        monkeypatch.setitem(sys.modules, "diffmoe.judge.runner", fake)
        return fake

    return install


@pytest.fixture
def cli_runner(fake_runner, monkeypatch):
    """The stand-in runner under `diffmoe fuzz` run in this process: no plan-tier examples, no isolation
    (the stand-in judges in this process only), no shared example database."""
    from diffmoe.frontends import flags
    from diffmoe.frontends.commands import fuzz as fuzz_command

    monkeypatch.setattr(fuzz_command, "DEFAULT_PLAN_EXAMPLES", 0)
    monkeypatch.setattr(flags, "DEFAULT_ISOLATION", "none")
    monkeypatch.delenv("DIFFMOE_HYPOTHESIS_DB", raising=False)
    return fake_runner()
