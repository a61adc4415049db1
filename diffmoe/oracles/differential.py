"""The differential oracle: every stage against the reference, on the candidate's own inputs.

Owns the per-stage judgement of the first order's run and the end-to-end output's derived
bound. Reads the run's snapshots and the reference; runs nothing of the implementation.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch

from diffmoe.tolerance.compare import Comparison, Rule, compare
from diffmoe.tolerance.gemm_interval import stage_bound
from diffmoe.check.report import Finding, Oracles
from diffmoe.tolerance.table import END_TO_END, FORCED, rule_for
from diffmoe.problem.vocabulary import Buffers, Stages, pipeline_stages
from diffmoe.oracles.base import Oracle

if TYPE_CHECKING:
    from diffmoe.check.execution import Check, Run

# The end-to-end output's derived bound (derived_output_bound): the effect of the candidate's own
# down-GEMM input, plus the down GEMM's per-stage slack (its forced row in the tolerance table)
# per routed row and the output's own rounding.
DERIVED_OUTPUT_REASON = (
    "the reference's down GEMM and reduce run on the candidate's own down-GEMM input give the exact effect of every "
    "upstream difference (moved e4m3 codes, silu ulps); plus the down GEMM's per-stage rule (its derived interval, or "
    "its ulps and floor) per routed row and 1 ulp for the output's rounding"
)


def bf16_ulp(x: torch.Tensor) -> torch.Tensor:
    """One bf16 ulp at |x| (float64; the subnormal step below 2^-126)."""
    exponent = torch.floor(torch.log2(x.abs().clamp_min(2.0**-126)))
    return torch.pow(2.0, exponent - 7)


def derived_output_bound(check: Check, run: Run,
                         down_interval: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[torch.Tensor, dict] | None:
    """The bound the end-to-end output is held to, per element, and the figures behind it.

    Every upstream difference a candidate may legitimately have (a silu ulp, a moved e4m3
    code) reaches the output only through the down GEMM's input, so the reference's down GEMM
    and reduce are run on the candidate's down-GEMM input: |that output - the reference's|
    is exactly the effect of those differences. On top: what the down GEMM's per-stage rule
    allows (on the interpreter the width of its derived interval, diffmoe.tolerance.gemm_interval; on
    CUDA its ulps and floor; per routed row, summed over K; the reduce's is bitwise) and the
    output's own bf16 rounding (1 ulp). None when the candidate did not report the buffers.
    `down_interval`: the down stage's derived interval on these same inputs when the caller has
    judged that stage already (judge_run), so it is not computed twice."""
    cfg = check.config
    down_in = ((Buffers.QUANTED_DOWN_INPUT, Buffers.QUANTED_DOWN_INPUT_SCALES) if cfg.is_fp8
               else (Buffers.ACTIVATION_OUTPUT,))
    if not all(n in run.buffers for n in (*down_in, Buffers.OUTPUT)):
        return None
    down = check.reference_stage(Stages.DOWN_GEMM, {n: run.buffers[n] for n in down_in})
    if isinstance(down, str):
        return None
    via = check.reference_stage(Stages.REDUCE, down)
    if isinstance(via, str):
        return None
    t, k, h = check.problem.num_tokens, cfg.topk, cfg.hidden
    down_v = down[Buffers.DOWN_OUTPUT].double().view(t, k, h)  # [T, K, H]
    via_v = via[Buffers.OUTPUT].double()  # [T, H]
    effect = (via_v - check.reference.output.double()).abs()  # [T, H] what the candidate's inputs change
    down_rule = rule_for(cfg.quant, Buffers.DOWN_OUTPUT, FORCED, backend=check.tolerance_backend)
    interval = down_interval if down_interval is not None else stage_bound(
        down_rule, Buffers.DOWN_OUTPUT, down[Buffers.DOWN_OUTPUT], {n: run.buffers[n] for n in down_in}, check.problem)
    if interval is None:  # an ulp rule: its ulps and floor per routed row
        per_row = down_rule.max_ulp * bf16_ulp(down_v) + down_rule.atol  # [T, K, H]
    else:  # the derived interval: its whole width per routed row
        per_row = (interval[0] + interval[1]).double().view(t, k, h)
    slack = per_row.sum(dim=1) + bf16_ulp(via_v)  # [T, H]
    bound = torch.nan_to_num(effect + slack, nan=math.inf)  # a NaN input is judged per stage, not here
    figures: dict[str, Any] = {"max_effect_of_inputs": float(torch.nan_to_num(effect, nan=0.0).max()) if effect.numel() else 0.0}
    if cfg.is_fp8 and Buffers.QUANTED_DOWN_INPUT in check.reference.intermediates:
        moved = run.buffers[Buffers.QUANTED_DOWN_INPUT].view(torch.uint8) != \
            check.reference.intermediates[Buffers.QUANTED_DOWN_INPUT].view(torch.uint8)
        figures["moved_down_input_codes"] = int(moved.sum())
    return bound, figures


# the down GEMM's inputs derived_output_bound feeds the reference (the candidate's, by scheme)
_DOWN_INPUTS = {Buffers.QUANTED_DOWN_INPUT, Buffers.QUANTED_DOWN_INPUT_SCALES, Buffers.ACTIVATION_OUTPUT}


class Differential(Oracle):
    name = Oracles.DIFFERENTIAL
    checks = ("every stage, pipeline order, on the candidate's own inputs; one finding per divergent stage, the largest "
              "departure first; then the output end to end")
    how = ("each stage's writes against the reference stage run on the very buffers the candidate's stage read, with the "
           "tight per-stage (`forced`) rules, so legitimate one-ulp differences never carry into a later verdict; the "
           "output against the reference's own within a bound derived per check: the reference's down GEMM and reduce "
           "run on the candidate's down-GEMM input give the exact effect of its moved codes, plus the per-stage slack")
    rank = 50

    def judge_run(self, check: Check, run: Run, first: bool) -> list[Finding]:
        """Every stage judged on the candidate's own inputs, pipeline order, each divergent stage
        its own finding (stage_findings: the largest departure first); then, when no stage
        diverges, the output against the reference's, within the derived bound.

        Each stage's writes are compared with the reference stage run on the very buffers the
        candidate's stage read (its snapshots), under the tight per-stage rules of the tolerance
        table (quantisation bitwise, GEMMs ULP-bounded), so a legitimate one-ulp difference early
        on is never carried into a later stage's verdict: the rules compose. The end-to-end output
        is then held to the effect of the differences the candidate legitimately has (see
        derived_output_bound), not to a fixed elementwise tolerance. Later orders are the
        schedule oracle's."""
        if not first:
            return []
        failed: list[tuple[str, Comparison]] = []
        down_interval = None
        for stage in pipeline_stages(check.config):
            if not all(n in run.buffers or n in check.problem_inputs for n in stage.reads):
                continue  # an input the candidate never reported: nothing to feed the reference
            written = [n for n in stage.writes if n in run.buffers]
            if not written:
                continue
            want = check.reference_stage(stage.name, {n: run.buffers[n] for n in stage.reads if n in run.buffers})
            for name in written:
                rule = rule_for(check.config.quant, name, FORCED, fused=stage.name == Stages.ACT_QUANT,
                                backend=check.tolerance_backend, numerics=check.config.numerics_profile)
                if isinstance(want, str):
                    c = Comparison(name, False, rule, 0, run.buffers[name].numel(), 0, 0.0, problem=want)
                else:
                    fed = {n: run.buffers[n] for n in stage.reads if n in run.buffers}
                    bound = stage_bound(rule, name, want[name], fed, check.problem)
                    if name == Buffers.DOWN_OUTPUT and set(fed) <= _DOWN_INPUTS:
                        down_interval = bound  # the same inputs the output's derived bound reads: reused there
                    c = compare(name, want[name], run.buffers[name], rule, bound=bound)
                if not c.ok:
                    failed.append((stage.name, c))
        extra: dict[str, Any] = {}
        if not failed:
            derived = derived_output_bound(check, run, down_interval)
            if derived is None:
                # No down-GEMM input reported (a fused_experts family function, diffmoe.adapters.families,
                # or any implementation that returns only its output): the output is still judged,
                # against the reference's with the table's end-to-end row. Before, it was not judged
                # at all, and an implementation that returned zeros and nothing else passed (issue 33).
                rule = rule_for(check.config.quant, Buffers.OUTPUT, END_TO_END, backend=check.tolerance_backend,
                                numerics=check.config.numerics_profile)
                c = compare(Buffers.OUTPUT, check.reference.output, run.buffers[Buffers.OUTPUT], rule)
                extra["judged_with"] = "the output's end-to-end rule: the candidate reported no down-GEMM input"
            else:
                bound, extra = derived
                c = compare(Buffers.OUTPUT, check.reference.output, run.buffers[Buffers.OUTPUT],
                            Rule.derived(DERIVED_OUTPUT_REASON), bound=bound)
            if c.ok:
                return []
            failed.append((Stages.REDUCE, c))
            extra["judged_against"] = "the reference's own output"
        return stage_findings(Oracles.DIFFERENTIAL, failed,
                              {"schedule": str(run.schedule), "judged_on": "the candidate's own inputs", **extra})


def stage_findings(oracle: str, failed: list[tuple[str, Comparison]], common: dict[str, Any]) -> list[Finding]:
    """One finding per divergent stage, the largest departure first (issue 27).

    `failed`: (stage, comparison) in pipeline order. A stage's buffers share its finding, headed
    by its worst buffer. Stages are ordered by departure (the largest error relative to the
    buffer's own scale, Comparison.departure), so a quantisation's one-code flip never heads a
    report whose GEMM is off by a factor; ties keep pipeline order. Each finding names its place
    in the pipeline and the earliest divergent stage, which is where a reader starts to debug."""
    by_stage: dict[str, list[Comparison]] = {}
    for stage, c in failed:
        by_stage.setdefault(stage, []).append(c)
    order = list(by_stage)  # pipeline order
    ranked = sorted(order, key=lambda st: -max(c.departure for c in by_stage[st]))
    findings = []
    for stage in ranked:
        worst = max(by_stage[stage], key=lambda c: c.departure)
        figures = {**common, **worst.figures(), "pipeline_position": order.index(stage) + 1,
                   "divergent_stages": len(order), "earliest_divergent_stage": order[0]}
        where = "the earliest divergent stage" if stage == order[0] else f"divergent stage {order.index(stage) + 1} of {len(order)}"
        findings.append(Finding(
            oracle=oracle, stage=stage, buffers=[c.name for c in by_stage[stage]],
            message=f"{stage} diverges on {common.get('judged_on', 'its inputs')} ({where}): {worst.summary()}",
            figures=figures,
        ))
    return findings
