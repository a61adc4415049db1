"""The batch-invariance oracle (diffmoe/oracles/batch_invariance.py): a token's results must not
depend on the batch it is computed in. Opt-in: named with `--oracles`, never in a default check.

What it exists to catch is the bug zoo's `tile-from-batch-size` (tests/test_bug_zoo.py holds that
only this oracle catches it); here: it is quiet on the shipped kernels, it names what it skips and
why, and the plumbing around an opt-in oracle (default selection, replay line, the claim).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import bug_zoo
import pytest

from diffmoe.adapters.contract import factory_batch_invariant
from diffmoe.check.report import Oracles
from diffmoe.check.runner import run_differential
from diffmoe.oracles.registry import DEFAULT_ORACLES, OPT_IN, resolve_oracles
from diffmoe.problem.config import MoEConfig

BI = Oracles.BATCH_INVARIANCE
TILE_BUG = bug_zoo.MUTANTS["tile-from-batch-size"]


@pytest.mark.parametrize(("quant", "fused"), [("bf16", False), ("fp8-token", False), ("fp8-token", True),
                                              ("fp8-block", False), ("fp8-block", True)])
def test_quiet_on_the_shipped_kernels(quant, fused):
    config = MoEConfig(num_tokens=3, num_experts=4, topk=2, hidden=128, inter=128, quant=quant, fused=fused,
                       zero_rows=1, seed=3)
    report = run_differential(config, oracles=[BI])
    assert report.passed and BI not in report.skipped, report.render()


# the configuration under which the interpreter's whole-tile dots (one BLAS gemm) gave a row other
# bits at another place of a larger batch: the shipped kernel was reported (T=70 bf16, issue 33)
HASWELL = {"OPENBLAS_CORETYPE": "Haswell", "OPENBLAS_L2_SIZE": "512"}
PROBED_SCHEMES = ("bf16",)  # T>BLOCK_M (T=70) was reported on bf16 before the fix (diffmoe/interpreter/dot_rows.py)


def test_quiet_on_the_edge_cases_under_openblas_haswell_kernels():
    """The oracle on the shipped kernels over the labelled edge cases, in a process started with
    OpenBLAS's Haswell kernels (read once, when numpy loads the library: tests/batch_invariance_probe.py).
    Without the row-by-row dot it reports T>BLOCK_M; with it, nothing."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENBLAS_")}
    env.update(HASWELL)
    probe = subprocess.run([sys.executable, os.path.join(os.path.dirname(__file__), "batch_invariance_probe.py"),
                            *PROBED_SCHEMES], env=env, capture_output=True, text=True, timeout=240)
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
    report = run_differential(TILE_BUG.config, make, oracles=[BI])
    assert report.passed and "batch_invariant = False" in report.skipped[BI], report.render()


def test_the_claim_is_a_bool():
    def make(config):
        return None

    make.batch_invariant = "yes"
    with pytest.raises(TypeError, match="batch_invariant attribute must be a bool"):
        factory_batch_invariant(make)


def test_vllm_does_not_claim_it():
    from peers.vllm_0_33 import make

    assert factory_batch_invariant(make) is False


def test_opt_in_a_default_check_runs_it_not_and_a_replay_line_names_it():
    assert BI in OPT_IN and BI not in DEFAULT_ORACLES and BI not in resolve_oracles(None)
    default = run_differential(TILE_BUG.config, TILE_BUG.factory, implementation_name=TILE_BUG.impl)
    assert default.passed and BI not in default.oracles, default.render()  # the mutant passes a default check
    report = run_differential(TILE_BUG.config, TILE_BUG.factory, oracles=[BI], implementation_name=TILE_BUG.impl)
    (finding,) = report.findings
    assert finding.oracle == BI and finding.figures["token"] == TILE_BUG.config.num_tokens - 1, report.render()
    assert report.replay_command().endswith(f"--oracles {BI} --impl {TILE_BUG.impl}")
