"""Fuzzing speed: examples per second, and how long the known bug takes to find and shrink.

* fixed planner: `fuzz(max_examples=N, seed=0, planner="fixed", tier=TIER)` with the CLI's
  defaults otherwise (T up to 96), once per execution tier: "run" (the cheap oracle set, every
  8th example full) and "full" (every oracle, every default schedule); N is --fuzz-examples
  (default 5).
  Nothing is expected to fail, so every example is a full generate-phase run.
* legacy planner: what `diffmoe fuzz --planner legacy --seed 0` does (max 100 examples):
  the seconds and examples until the first failing config, then until shrinking ends, and
  the minimal config, all in extra_info.

Each is timed once (one round): a fuzz session is long and its work is fixed by the seed.
The untimed warm-up is one harness run of the smallest config, which pays the interpreter's
(or Triton's) first-call costs without repeating the whole session.
"""

from __future__ import annotations

import importlib

import pytest

from diffmoe.runner import run_differential
from diffmoe.strategies import MINIMAL_FUSED_CONFIG

SEED = 0
LEGACY_MAX_EXAMPLES = 100  # the CLI's default --max-examples


def _fuzz():
    module = importlib.import_module("diffmoe.fuzzing")
    fuzz = getattr(module, "fuzz", None)
    if fuzz is None:
        pytest.skip("diffmoe.fuzzing has no fuzz() driver yet: nothing to time")
    return fuzz


@pytest.fixture(scope="module")
def warmed_up(moe_device) -> None:
    run_differential(MINIMAL_FUSED_CONFIG, device=moe_device)


def _outcome_info(outcome) -> dict:
    info = outcome.to_dict()
    report = info.pop("report")
    info["found"] = not outcome.passed
    info["generate_examples"] = outcome.examples - outcome.shrink_examples
    if report is not None:
        info["minimal_config"] = report["config"]
        info["finding_oracles"] = sorted({f["oracle"] for f in report["findings"]})
    return info


@pytest.mark.parametrize("tier", ["run", "full"])
def test_fuzz_fixed_planner(warmed_up, measure, benchmark, request, moe_device, tier):
    """Examples/s of each execution tier (diffmoe/fuzz_tiers.py) on the same seed's draws."""
    fuzz = _fuzz()
    examples = request.config.getoption("fuzz_examples")
    outcomes = []

    def session():
        outcomes.append(fuzz(max_examples=examples, seed=SEED, planner="fixed", device=str(moe_device), tier=tier))

    measure(session, config=MINIMAL_FUSED_CONFIG, provider="diffmoe", group="fuzz", rounds=1, warmup=0)
    outcome = outcomes[-1]
    info = _outcome_info(outcome)
    info["examples_per_s"] = round(outcome.examples / outcome.seconds, 4) if outcome.seconds else None
    info["planner"] = "fixed"
    info["tier"] = tier
    info["max_examples"] = examples
    benchmark.extra_info.update(info)
    benchmark.extra_info.pop("config")  # the drawn configs vary; the seed is the reproducer


def test_fuzz_legacy_planner_find_and_shrink(warmed_up, measure, benchmark, moe_device):
    fuzz = _fuzz()
    outcomes = []

    def session():
        outcomes.append(fuzz(max_examples=LEGACY_MAX_EXAMPLES, seed=SEED, planner="legacy", device=str(moe_device)))

    measure(session, config=MINIMAL_FUSED_CONFIG, provider="diffmoe", group="fuzz", rounds=1, warmup=0)
    info = _outcome_info(outcomes[-1])
    info["planner"] = "legacy"
    info["max_examples"] = LEGACY_MAX_EXAMPLES
    benchmark.extra_info.update(info)
    benchmark.extra_info.pop("config")
