"""Each divergent stage is its own finding, the largest departure first (issue 27, item 4).

A report is read from the top: its first finding must be the worst thing wrong. Before, the
differential named only the earliest divergent stage and listed the others by name, so a
one-code flip in a quantisation headed a report whose GEMM was off by a factor (measured on
Liger 0.8.5 under diffmoe's profile: the activation's 2 ulps headed, the down GEMM's rows off
by the router weight, departure 1.56, were a name in `also_divergent`; tests/peers/test_peers_liger.py).
`departure` is the largest error relative to the buffer's own scale (Comparison.departure).
"""

from __future__ import annotations

import math

import pytest
import torch

import bug_zoo
from diffmoe.findings import Oracles
from diffmoe.judge.runner import run_differential
from diffmoe.problem.config import MoEConfig
from diffmoe.problem.vocabulary import Stages
from diffmoe.tolerance.compare import Rule, compare

# fp8-tensor: one weight scale per expert, which the GEMM mutant swaps for expert 0's; a spread
# of the experts' scales makes that a factor; tie-heavy inputs put about half the quantised
# values on a rounding midpoint, where the ties mutant moves one code.
PLANTED = MoEConfig(num_tokens=8, num_experts=4, topk=2, hidden=128, inter=128, quant="fp8-tensor", fused=False,
                    tie_heavy=True, expert_scale_spread=2)


class TiesAwayAndExpertZeroScale(bug_zoo.TiesRoundedAwayFromZero, bug_zoo.ExpertZeroWeightScale):
    """Two bugs at once: every quantisation rounds ties away from zero (one code off, about half
    the elements of a tie-heavy input) and both GEMMs use expert 0's weight scale (a factor)."""


def test_a_gemm_off_by_a_factor_heads_the_report_before_one_code_flips():
    report = run_differential(PLANTED, TiesAwayAndExpertZeroScale, oracles=[Oracles.DIFFERENTIAL])
    stages = [f.stage for f in report.findings]
    assert stages[0] in (Stages.GATE_UP_GEMM, Stages.DOWN_GEMM), report.render()
    assert Stages.QUANT_INPUT in stages, report.render()  # the flip is reported too, not absorbed
    departures = [f.figures["departure"] for f in report.findings]
    assert departures == sorted(departures, reverse=True), departures
    assert all(f.figures["earliest_divergent_stage"] == Stages.QUANT_INPUT for f in report.findings)
    flip = report.findings[stages.index(Stages.QUANT_INPUT)]
    assert flip.figures["departure"] < 0.1 < report.findings[0].figures["departure"], report.render()
    assert "the earliest divergent stage" in flip.message


def test_each_bug_alone_is_named_where_it_is():
    """The quiet half: each mutant alone heads its own report at its own stage."""
    ties = run_differential(PLANTED, bug_zoo.TiesRoundedAwayFromZero, oracles=[Oracles.DIFFERENTIAL])
    assert ties.findings and ties.findings[-1].stage == Stages.QUANT_INPUT, ties.render()
    scale = run_differential(PLANTED, bug_zoo.ExpertZeroWeightScale, oracles=[Oracles.DIFFERENTIAL])
    assert [f.stage for f in scale.findings][0] in (Stages.GATE_UP_GEMM, Stages.DOWN_GEMM), scale.render()
    assert Stages.QUANT_INPUT not in [f.stage for f in scale.findings], scale.render()


def test_the_shipped_implementation_has_no_stage_finding():
    assert run_differential(PLANTED, oracles=[Oracles.DIFFERENTIAL, Oracles.TEACHER_FORCING]).passed


@pytest.mark.parametrize(("reference", "candidate", "departure"), [
    ([1.0, -4.0, 2.0], [1.0, -4.0, 2.0], 0.0),  # identical
    ([1.0, -4.0, 2.0], [1.0, -4.0, 2.5], 0.125),  # 0.5 off on a buffer of scale 4
    ([1.0, -4.0, 2.0], [1.0, -4.0, float("nan")], math.inf),  # a NaN facing a number
    ([0.0, 0.0], [0.0, 1.0], math.inf),  # a difference on an all-zero reference
])
def test_departure_is_the_largest_error_relative_to_the_buffers_scale(reference, candidate, departure):
    c = compare("x", torch.tensor(reference), torch.tensor(candidate), Rule.bitwise("test"))
    assert c.departure == departure
    assert c.figures()["departure"] == (departure if math.isfinite(departure) else "inf")
