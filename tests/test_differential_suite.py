"""The differential suite: run_differential over Hypothesis-drawn configs.

The optimized implementation with the fixed planner must produce no finding anywhere in the
strategy's space (diffmoe/strategies.py). Examples per run come from the Hypothesis profile:
`ci` (derandomized; the default of this suite and CI's), `dev` or `thorough`
(`pytest --hypothesis-profile thorough`). A failure prints the shrunk config as JSON and the
`diffmoe check` command that replays it.
"""

from hypothesis import given

from diffmoe.report import Oracles
from diffmoe.runner import run_differential
from diffmoe.strategies import moe_configs


def _reproducer(report) -> str:
    return f"{report.render()}\nconfig JSON: {report.config.to_json()}\nreplay: {report.replay_command()}"


@given(config=moe_configs(planner="fixed"))
def test_fixed_planner_has_no_findings(config):
    report = run_differential(config)
    assert report.passed, _reproducer(report)


@given(config=moe_configs(planner="legacy", fused=True))
def test_legacy_fused_plan_is_always_caught(config):
    # the seed bug: for every fused FP8 config the legacy plan aliases two live buffers
    report = run_differential(config, oracles=[Oracles.STATIC_ALIASING, Oracles.RUNTIME_ALIASING], schedules=["identity"])
    assert {Oracles.STATIC_ALIASING, Oracles.RUNTIME_ALIASING} <= set(report.oracles_with_findings()), _reproducer(report)
