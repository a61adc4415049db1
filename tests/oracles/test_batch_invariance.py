"""The batch-invariance oracle (diffmoe/oracles/batch_invariance.py): a token's results must not
depend on the batch it is computed in. In a check's default selection and the fuzz's cheap set
since issue 48.

What it exists to catch is the bug zoo's `tile-from-batch-size` (tests/bug_zoo/test_bug_zoo.py holds that
only this oracle catches it; tests/bug_zoo/test_bug_zoo_fuzzed.py that the default fuzz finds it from a
cold start); here: a default check catches it at no extra call, it is quiet on the shipped
kernels by default and alone, and it names what it skips and why.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import bug_zoo
import pytest

from diffmoe.contract import factory_batch_invariant
from diffmoe.check import execution
from diffmoe.findings import Oracles
from diffmoe.judge.runner import run_differential
from diffmoe.fuzz.tiers import CHEAP_ORACLES
from diffmoe.oracles.registry import ALL_ORACLES, DEFAULT_ORACLES, resolve_oracles
from diffmoe.problem.config import MoEConfig
from hang_bounds import SUBPROCESS_HANG_S

BI = Oracles.BATCH_INVARIANCE
TILE_BUG = bug_zoo.MUTANTS["tile-from-batch-size"]


SCHEMES = [("bf16", False), ("fp8-token", False), ("fp8-token", True), ("fp8-block", False), ("fp8-block", True)]


@pytest.mark.parametrize(("quant", "fused"), SCHEMES)
def test_a_default_check_is_quiet_on_the_shipped_kernels(quant, fused):
    # call-sequence's one-token call judged (T=3 // 16 = 1), with the second poison pattern
    config = MoEConfig(num_tokens=3, num_experts=4, topk=2, hidden=128, inter=128, quant=quant, fused=fused,
                       zero_rows=1, seed=3)
    report = run_differential(config)
    assert BI in report.oracles and report.passed and BI not in report.skipped, report.render()


@pytest.mark.parametrize(("quant", "fused"), SCHEMES)
@pytest.mark.parametrize("tokens", [1, 3])
def test_alone_it_is_quiet_on_the_shipped_kernels(quant, fused, tokens):
    # its own calls: the last token alone (T=3), the token behind two others (T=1)
    config = MoEConfig(num_tokens=tokens, num_experts=4, topk=2, hidden=128, inter=128, quant=quant, fused=fused,
                       seed=3)
    report = run_differential(config, oracles=[BI])
    assert report.passed and BI not in report.skipped, report.render()


# the configuration under which the interpreter's whole-tile dots (one BLAS gemm) gave a row other
# bits at another place of a larger batch: the shipped kernel was reported (T=70 bf16, issue 33)
HASWELL = {"OPENBLAS_CORETYPE": "Haswell", "OPENBLAS_L2_SIZE": "512"}
PROBED_SCHEMES = ("bf16",)  # T>BLOCK_M (T=70) was reported on bf16 before the fix (diffmoe/interpreter/dot_rows.py)


def test_quiet_on_the_edge_cases_under_openblas_haswell_kernels():
    """The oracle on the shipped kernels over the labelled edge cases, in a process started with
    OpenBLAS's Haswell kernels (read once, when numpy loads the library: tests/support/batch_invariance_probe.py).
    Without the row-by-row dot it reports T>BLOCK_M; with it, nothing."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENBLAS_")}
    env.update(HASWELL)
    probe = subprocess.run([sys.executable, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support", "batch_invariance_probe.py"),
                            *PROBED_SCHEMES], env=env, capture_output=True, text=True, timeout=SUBPROCESS_HANG_S)
    assert probe.returncode == 0, probe.stderr
    result = json.loads(probe.stdout.strip().splitlines()[-1])
    assert result["OPENBLAS_CORETYPE"] == "Haswell" and result["checks"] > 0, result
    assert result["findings"] == [], result


def test_fp8_tensor_is_batch_dependent_by_design_not_a_failure():
    config = MoEConfig(num_tokens=3, num_experts=2, topk=2, hidden=128, inter=128, quant="fp8-tensor")
    report = run_differential(config, oracles=[BI])
    assert report.passed and report.skipped[BI].startswith("batch-dependent by design"), report.render()


def test_an_implementation_that_does_not_claim_it_is_skipped_with_its_word():
    def make(config):
        return TILE_BUG.factory(config)

    make.batch_invariant = False
    report = run_differential(TILE_BUG.config, make)  # a default check: no false alarm on vLLM or SGLang
    assert report.passed and "batch_invariant = False" in report.skipped[BI], report.render()


def test_the_claim_is_a_bool():
    def make(config):
        return None

    make.batch_invariant = "yes"
    with pytest.raises(TypeError, match="batch_invariant attribute must be a bool"):
        factory_batch_invariant(make)


def test_vllm_does_not_claim_it():
    from peers.vllm import make

    assert factory_batch_invariant(make) is False


def test_on_by_default_in_a_check_and_in_the_fuzz_cheap_set():
    assert BI in DEFAULT_ORACLES and BI in resolve_oracles(None) and DEFAULT_ORACLES == ALL_ORACLES
    assert BI in CHEAP_ORACLES


def test_a_default_check_catches_the_tile_bug_and_its_replay_needs_no_oracle_named():
    report = run_differential(TILE_BUG.config, TILE_BUG.factory, implementation_name=TILE_BUG.impl)
    (finding,) = report.findings
    assert finding.oracle == BI and finding.figures["token"] == 0, report.render()
    assert "in a T=1 call (the batch's first 1) and in its T=3 batch" in finding.message, report.render()
    assert "--oracles" not in report.replay_command() and report.replay_command().endswith(f"--impl {TILE_BUG.impl}")


def _calls(monkeypatch, **kwargs) -> list[str]:
    """What every call of the implementation in a check was made for (Check.execute's `what`)."""
    made = []
    execute = execution.Check.execute

    def counted(self, *args, what=None, **kw):
        made.append(what)
        return execute(self, *args, what=what, **kw)

    monkeypatch.setattr(execution.Check, "execute", counted)
    report = run_differential(MoEConfig(num_tokens=16, num_experts=4, topk=2, hidden=128, inter=128,
                                        quant="fp8-token", fused=True), **kwargs)
    assert report.passed and (BI in report.oracles) == (BI in kwargs.get("oracles", DEFAULT_ORACLES)), report.render()
    assert BI not in report.skipped, report.render()
    monkeypatch.undo()
    return made


def test_in_a_default_check_it_makes_no_call_of_its_own(monkeypatch):
    # it judges call-sequence's small call (issue 48: opt-in, it made two calls, 35 % of a check)
    without = _calls(monkeypatch, oracles=[o for o in DEFAULT_ORACLES if o != BI])
    assert _calls(monkeypatch) == without


def test_without_call_sequence_it_makes_one_call_of_one_token(monkeypatch):
    without = _calls(monkeypatch, oracles=[o for o in CHEAP_ORACLES if o != BI], schedules=("identity",))
    with_it = _calls(monkeypatch, oracles=list(CHEAP_ORACLES), schedules=("identity",))
    assert with_it == without + ["the batch-invariance run: token 15 alone (T=1)"]
