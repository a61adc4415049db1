"""Plan-tier speed (diffmoe.fuzz.plan_tier): configs judged per second, and the known bug's find and shrink.

* fixed planner: `fuzz_plans(max_examples=20000, seed=0, planner="fixed")`, three timed rounds
  (the machine may be busy: every round's configs/s is in extra_info, with the best and the
  median). Nothing is expected to fail, so every config is a generate-phase plan and judgement.
* legacy planner: `fuzz_plans(max_examples=20000, seed=S, planner="legacy")` for S in 0..4, one
  timed round each: seconds to the first failure, seconds shrinking, configs judged, and the
  minimal config, in extra_info.

No warm-up beyond one small session: the plan tier compiles nothing and runs no kernel.
"""

from __future__ import annotations

import statistics

import pytest

from diffmoe.fuzz.plan_tier import fuzz_plans
from diffmoe.fuzz.strategies import MINIMAL_FUSED_CONFIG

FIXED_EXAMPLES = 20_000
FIXED_ROUNDS = 3
LEGACY_SEEDS = range(5)
LEGACY_MAX_EXAMPLES = 20_000


def _outcome_info(outcome) -> dict:
    info = outcome.to_dict()
    report = info.pop("report")
    info["found"] = not outcome.passed
    if report is not None:
        info["minimal_config"] = outcome.report.config.short()
        info["finding_oracles"] = sorted({f["oracle"] for f in report["findings"]})
        info["finding_buffers"] = report["findings"][0]["buffers"]
    return info


def test_plan_tier_fixed_planner_configs_per_second(measure, benchmark):
    fuzz_plans(max_examples=200, seed=1, planner="fixed")  # warm-up: imports, first calls
    outcomes = []

    def session():
        outcomes.append(fuzz_plans(max_examples=FIXED_EXAMPLES, seed=0, planner="fixed"))

    measure(session, config=MINIMAL_FUSED_CONFIG, provider="diffmoe", group="plan-tier",
            rounds=FIXED_ROUNDS, warmup=0)
    rates = [o.examples / o.seconds for o in outcomes]
    info = _outcome_info(outcomes[-1])
    info.update(planner="fixed", max_examples=FIXED_EXAMPLES, configs_per_s_rounds=[round(r) for r in rates],
                configs_per_s_best=round(max(rates)), configs_per_s_median=round(statistics.median(rates)),
                all_passed=all(o.passed for o in outcomes))
    benchmark.extra_info.update(info)
    benchmark.extra_info.pop("config")  # the drawn configs vary; the seed is the reproducer
    assert info["all_passed"]


@pytest.mark.parametrize("seed", LEGACY_SEEDS)
def test_plan_tier_legacy_planner_find_and_shrink(measure, benchmark, seed):
    outcomes = []

    def session():
        outcomes.append(fuzz_plans(max_examples=LEGACY_MAX_EXAMPLES, seed=seed, planner="legacy"))

    measure(session, config=MINIMAL_FUSED_CONFIG, provider="diffmoe", group="plan-tier-legacy", rounds=1, warmup=0)
    outcome = outcomes[-1]
    info = _outcome_info(outcome)
    info.update(planner="legacy", max_examples=LEGACY_MAX_EXAMPLES,
                shrunk_to_minimal_fused=outcome.failing_config == MINIMAL_FUSED_CONFIG.replace(planner="legacy"))
    benchmark.extra_info.update(info)
    benchmark.extra_info.pop("config")
