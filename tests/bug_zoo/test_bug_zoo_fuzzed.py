"""Every bug-zoo mutant is found by the default fuzz (the execution tier, cheap oracle set and
every FULL_EVERY-th example full) from a cold start: no database, a fixed seed, nothing about
the mutant told to the fuzzer but the flag a user would pass for its input class (the
planner for the legacy planner; the NaN and zero-row mutants need none: the default draws hold
those rows). A finding
counts when the implementation the mutant was broken from passes the config reported.

Shrinking is off (`shrink=False`): finding is what the tiers could lose; the shrinker's own
tests are tests/fuzz/test_fuzzing.py's. One mutant, the planted carve in vLLM's adapter, is also
fuzzed as a user would, `diffmoe fuzz --impl bug_zoo:...`, and shrunk: to its zoo config. The domain is narrowed (T <= 32, E <= 8) only to keep the
suite short: each example is still drawn by the default strategies.
"""

from __future__ import annotations

import json

import pytest

from bug_zoo import MUTANTS
from diffmoe.frontends import cli
from diffmoe.problem.config import MoEConfig
from diffmoe.fuzz.driver import fuzz
from diffmoe.check.report import check_command
from diffmoe.judge.runner import run_differential
from diffmoe.fuzz.strategies import size_floor

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")]

MAX_EXAMPLES = 60
# Known gap, kept visible (strict: the day the fuzz finds it, this fails and the mark goes): the
# router weight on the input needs K = 1 and a weight below 1 (a softmax over E >= 2 logits, not
# renormalised). Seed 0 drew no such example in 60 (E <= 8), nor in 300 with E <= 2: the
# strategies draw that input class too rarely. The bug zoo's own test catches the mutant.
# amax-pass-cached-across-calls was a known gap the same way (seed 0 drew no fp8-tensor config whose
# second call's amax moves the codes in 60 examples, 2026-12-05) until the strategies drew the
# outlier channels (issue 42): seed 0 now finds it within 60 examples and its mark went (2026-12-06).
RARELY_DRAWN = {"input-router-weight-dropped"}
# tile-from-batch-size shows only where the bf16 output keeps a float32 reordering's last bit: the
# default fuzz of seed 0 met it at example 4 (issue 48), and at example 103 once the strategies drew
# the spread and outlier channels (issue 42; `max_tokens=32, max_experts=8`, 2026-12-07, 56 s). The
# bug zoo's own test catches the mutant at its pinned config.
RARELY_DRAWN |= {"tile-from-batch-size"}


def _cases():
    for name in sorted(MUTANTS):
        marks = [pytest.mark.xfail(strict=True, reason="input class the strategies rarely draw")] if name in RARELY_DRAWN else []
        yield pytest.param(name, marks=marks, id=name)


@pytest.mark.parametrize("name", list(_cases()))
def test_the_default_fuzz_finds_the_mutant_from_a_cold_start(name):
    mutant = MUTANTS[name]
    mutant.fetch_peer()
    outcome = fuzz(seed=0, planner=mutant.config.planner, implementation=mutant.factory,
                   implementation_name=mutant.impl, shrink=False, max_examples=MAX_EXAMPLES, max_tokens=32, max_experts=8)
    assert outcome.report is not None, f"{name}: no failure in {outcome.examples} examples"
    # Any oracle may be the one: on a drawn config a mutant may first crash (a view carved past
    # ws1, fp8 scales read on a bf16 config) or show to another oracle than on its minimal config.
    # What makes it the mutant's doing is the control: the shipped implementation passes the
    # very config reported (with the fixed planner: the legacy planner is that mutant's bug), or
    # for a peer's mutant, the unmodified adapter does.
    control = run_differential(outcome.report.config.replace(planner="fixed"), mutant.control_factory)
    assert control.passed, (name, control.render())


def test_diffmoe_fuzz_shrinks_the_planted_vllm_carve_to_its_zoo_config(capsys):
    # The zoo row's config is not typed from a guess: it is what the command prints, and it is
    # minimal (one token, one expert, K = 1, H and I at the domain's floor: nothing to remove).
    mutant = MUTANTS["vllm-cache2-in-ws2"]
    mutant.fetch_peer()
    code = cli.main(["fuzz", "--impl", mutant.impl, "--seed", "0", "--max-examples", "30", "--json"])
    data = json.loads(capsys.readouterr().out)
    assert code == 1, data
    shrunk = MoEConfig.from_dict(data["config"])
    assert (shrunk.num_tokens, shrunk.num_experts, shrunk.topk) == (1, 1, 1), shrunk
    assert shrunk.hidden == shrunk.inter == size_floor(shrunk.quant), shrunk
    assert shrunk == mutant.config, (shrunk, mutant.config)
    assert data["replay"] == check_command(mutant.config, mutant.impl)


# about 90 s a seed on 2 loaded cores (the mutant's run and its control's)
@pytest.mark.parametrize("seed", [0, 1])
def test_the_default_fuzz_finds_a_granularity_mix_up_within_20_examples(seed):
    # Issue 48 item 5: with the scale pairs drawn as two axes only, per-tensor weights beside
    # per-token activations came in 9 % of a default fuzz's examples, the first at T = K = 1, and
    # this mutant went unfound in 100 (the committed driver, seed 0: 20 of 20 passed, 195 s). Every
    # pair now comes within the first 8 examples at a size that shows a mix-up (diffmoe/fuzz/pairs.py).
    # Default domain (T <= 96, E <= 64), as `diffmoe fuzz --impl bug_zoo:make_tensor_path_for_tensor_weights`.
    mutant = MUTANTS["tensor-path-for-tensor-weights"]
    outcome = fuzz(seed=seed, implementation=mutant.factory, implementation_name=mutant.impl, shrink=False, max_examples=20)
    assert outcome.report is not None, f"no failure in {outcome.examples} examples"
    assert outcome.generated_examples <= 20
    config = outcome.report.config
    assert (config.weight_granularity, config.act_granularity) == ("tensor", "token"), config.short()
    assert run_differential(config, mutant.control_factory).passed
