"""Fuzzing speed: examples per second, and how long the known bug takes to find and shrink.

* fixed planner: `fuzz(max_examples=N, seed=0, planner="fixed", tier=TIER)` with the CLI's
  defaults otherwise (T up to 96), once per execution tier: "run" (the cheap oracle set, every
  8th example full) and "full" (every oracle, every default schedule); N is --fuzz-examples
  (default 5).
  Nothing is expected to fail, so every example is a full generate-phase run.
* legacy planner: what `diffmoe fuzz --planner legacy --seed S --plan-examples 0 --workers 1`
  does (the execution tier alone, max 100 examples) for S in 0..4: the seconds and examples
  until the first failing config, then until shrinking ends, and the minimal config, all in
  extra_info (bench_plan_tier.py times the plan tier on the same seeds).
* default inputs: the run tier over seeds 0..4, with and without the default zero/NaN/Inf
  rows: what they cost (test_fuzz_default_inputs_cost).
* workers: `fuzz_in_workers(workers=W, max_examples=N, seed=0)` (the run tier) for W = 1 and
  2: the speed-up of `--workers 2` is the ratio of the two examples/s (same N, same seed; the
  two workers draw different streams, so the configs differ: compare rates, not seconds).

Each is timed once (one round): a fuzz session is long and its work is fixed by the seed.
The untimed warm-up is one harness run of the smallest config, which pays the interpreter's
(or Triton's) first-call costs without repeating the whole session.
"""

from __future__ import annotations

import importlib

import pytest

from diffmoe.judge.runner import run_differential
from diffmoe.fuzz.strategies import MINIMAL_FUSED_CONFIG

SEED = 0
LEGACY_SEEDS = range(5)
LEGACY_MAX_EXAMPLES = 100  # the CLI's default --max-examples


def _fuzz():
    module = importlib.import_module("diffmoe.fuzz.driver")
    fuzz = getattr(module, "fuzz", None)
    if fuzz is None:
        pytest.skip("diffmoe.fuzz.driver has no fuzz() driver yet: nothing to time")
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
    """Examples/s of each execution tier (diffmoe/fuzz/tiers.py) on the same seed's draws."""
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


DEFAULT_INPUT_SEEDS = range(5)


@pytest.mark.parametrize("special_rows", [True, False], ids=["default-inputs", "no-special-rows"])
def test_fuzz_default_inputs_cost(warmed_up, measure, benchmark, request, moe_device, special_rows):
    """What the default zero/NaN/Inf rows cost the fuzz: the run tier over seeds 0..4 (N examples
    each, --fuzz-examples), with and without them (`--no-special-rows`). Several seeds, because one
    seed's draws differ in size between the two (seed 0 draws 40% larger configs with them, measured
    by campaign.cost_units), which a single seed's examples/s would report as the rows' cost.
    extra_info: examples/s and cost units/s over all the seeds."""
    from diffmoe.fuzz.campaign import cost_units
    from optimized import make_implementation

    fuzz = _fuzz()
    examples = request.config.getoption("fuzz_examples")
    drawn: list = []
    outcomes = []

    def factory(config):
        drawn.append(config)
        return make_implementation(config)

    def session():
        for seed in DEFAULT_INPUT_SEEDS:
            outcomes.append(fuzz(max_examples=examples, seed=seed, planner="fixed", device=str(moe_device),
                                 special_rows=special_rows, implementation=factory, implementation_name="optimized"))

    measure(session, config=MINIMAL_FUSED_CONFIG, provider="diffmoe", group="fuzz-default-inputs", rounds=1, warmup=0)
    seconds = sum(o.seconds for o in outcomes)
    total = sum(o.examples for o in outcomes)
    benchmark.extra_info.update({
        "special_rows": special_rows, "seeds": list(DEFAULT_INPUT_SEEDS), "max_examples": examples,
        "examples": total, "examples_per_s": round(total / seconds, 4) if seconds else None,
        "cost_units_per_s": round(sum(cost_units(c) for c in drawn) / seconds, 1) if seconds else None,
        "found": [not o.passed for o in outcomes],
    })
    benchmark.extra_info.pop("config")


@pytest.mark.parametrize("workers", [1, 2])
def test_fuzz_workers(warmed_up, measure, benchmark, request, moe_device, workers):
    """Examples/s of the run tier in `workers` searches (diffmoe/fuzz/workers.py): one in this process,
    two as Ray tasks on a local runtime the call starts (its start counted)."""
    from diffmoe.fuzz.workers import fuzz_in_workers

    examples = request.config.getoption("fuzz_examples")
    outcomes = []

    def session():
        outcomes.append(fuzz_in_workers(workers=workers, max_examples=examples, seed=SEED, planner="fixed",
                                        device=str(moe_device)))

    measure(session, config=MINIMAL_FUSED_CONFIG, provider="diffmoe", group="fuzz workers", rounds=1, warmup=0)
    outcome = outcomes[-1]
    info = _outcome_info(outcome)
    info.update(workers=workers, max_examples=examples, tier="run",
                examples_per_s=round(outcome.examples / outcome.seconds, 4) if outcome.seconds else None)
    benchmark.extra_info.update(info)
    benchmark.extra_info.pop("config")


@pytest.mark.parametrize("seed", LEGACY_SEEDS)
def test_fuzz_legacy_planner_find_and_shrink(warmed_up, measure, benchmark, moe_device, seed):
    fuzz = _fuzz()
    outcomes = []

    def session():
        outcomes.append(fuzz(max_examples=LEGACY_MAX_EXAMPLES, seed=seed, planner="legacy", device=str(moe_device)))

    measure(session, config=MINIMAL_FUSED_CONFIG, provider="diffmoe", group="fuzz", rounds=1, warmup=0)
    info = _outcome_info(outcomes[-1])
    info["planner"] = "legacy"
    info["seed"] = seed
    info["max_examples"] = LEGACY_MAX_EXAMPLES
    benchmark.extra_info.update(info)
    benchmark.extra_info.pop("config")
