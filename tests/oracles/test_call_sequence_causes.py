"""The call-sequence oracle tells state carried between calls from nondeterminism (issue 48 item 4).

A kernel wrong one call in 40 diverges, now and then, on the small call made after the T call;
that divergence used to be blamed on "state left by the earlier call". The oracle now makes the
call on its own again, and the two calls again on a fresh instance: state carried between calls
reproduces, a nondeterministic implementation does not.
"""

from __future__ import annotations

import pytest

from bug_zoo import make_amax_pass_cached_across_calls
from diffmoe.findings import Oracles
from diffmoe.judge.runner import run_differential
from diffmoe.problem.config import MoEConfig
from optimized.moe import TritonFP8MoE

CONFIG = MoEConfig(num_tokens=8, num_experts=2, topk=2, hidden=128, inter=128, quant="fp8-tensor", fused=False,
                   seed=1)


class WrongOnce(TritonFP8MoE):
    """Wrong on one call only, whatever came before it: the first call smaller than the config's
    T made after `arm()` (the call-sequence oracle's small call after the T call) gets one output
    element flipped. A stand-in for a kernel wrong one call in N, made deterministic for the test."""

    armed = False

    @classmethod
    def arm(cls) -> None:
        cls.armed = True

    def run(self, problem, workspaces, **kwargs):
        result = super().run(problem, workspaces, **kwargs)
        if WrongOnce.armed and problem.num_tokens < self.config.num_tokens:
            WrongOnce.armed = False
            result.output.view(-1)[0] = -result.output.view(-1)[0] - 1
        return result


def only(report):
    return [f for f in report.findings if f.oracle == Oracles.CALL_SEQUENCE]


def test_a_call_wrong_once_is_told_nondeterministic_not_state():
    WrongOnce.arm()
    report = run_differential(CONFIG, WrongOnce, oracles=[Oracles.CALL_SEQUENCE])
    (finding,) = only(report)
    assert finding.figures["cause"] == "nondeterministic" and finding.figures["reproduced"] is False
    assert "state left by the earlier call" not in finding.message
    assert "does not reproduce" in finding.message


def test_state_carried_between_calls_is_still_named_state():
    report = run_differential(CONFIG.replace(seed=1), make_amax_pass_cached_across_calls,
                              oracles=[Oracles.CALL_SEQUENCE])
    findings = [f for f in only(report) if "ran before it" in f.message]
    assert findings and all(f.figures["cause"] == "state" for f in findings)
    assert "state left by the earlier call" in findings[0].message


def test_quiet_on_the_shipped_kernel():
    WrongOnce.armed = False
    assert only(run_differential(CONFIG, WrongOnce, oracles=[Oracles.CALL_SEQUENCE])) == []
