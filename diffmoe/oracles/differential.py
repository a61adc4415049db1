"""The differential oracle: every stage against the reference, on the candidate's own inputs.

Owns the per-stage judgement of the first order's run and the end-to-end output's derived
bound. Reads the run's snapshots and the reference; runs nothing of the implementation.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch

from diffmoe.tolerance.compare import Comparison, Rule, compare
from diffmoe.tolerance.gemm_interval import outward_float32, stage_bound
from diffmoe.findings import Finding, Oracles
from diffmoe.tolerance.table import END_TO_END, FORCED, rule_for
from diffmoe.problem.vocabulary import Buffers, Stages, pipeline_stages
from diffmoe.oracles.base import Oracle
from diffmoe.oracles.by_expert import by_expert

if TYPE_CHECKING:
    from diffmoe.check.execution import Check, Run

# The end-to-end output's derived bound (derived_output_bound): the reduce run on the two ends of
# every routed row's interval. The reduce (float32 or bf16 adds, the router weight's product where
# the profile puts it there, the routed scaling factor, the last bf16 rounding) is a chain of
# correctly rounded, monotone operations, so a candidate whose down rows lie in their intervals and
# whose reduce is the reference's (its per-stage rule is bitwise) lands between the reduce of the
# rows' lower ends and that of their upper ends: the routed_scaling_factor, which multiplies the
# float32 sum before the output's rounding, scales the rows' slack with it (issue 48: a bound that
# summed the rows' slack unscaled failed the shipped kernel at factor 2.5).
DERIVED_OUTPUT_REASON = (
    "every routed row lies in the down GEMM's per-stage interval (its derived interval, or its ulps and floor) around "
    "the reference's down GEMM run on the candidate's own down-GEMM input (which carries the exact effect of every "
    "upstream difference: moved e4m3 codes, silu ulps); the reduce (rounded adds, router weight, routed scaling "
    "factor, the output's rounding) is monotone, so the output lies between the reduce of the rows' two ends"
)


def bf16_steps(x: torch.Tensor, steps: int) -> torch.Tensor:
    """The bf16 value `steps` representable values above bf16 `x` (below when negative; +-0 is one
    value, as the ulp distance counts), saturating at the infinities; NaN stays NaN."""
    magnitude = x.view(torch.int16).to(torch.int64) & 0x7FFF
    ordered = torch.where(x.view(torch.int16) < 0, -magnitude, magnitude) + steps
    moved = ordered.abs().clamp_max(0x7F80) | torch.where(ordered < 0, 0x8000, 0)  # 0x7F80: infinity
    return torch.where(torch.isnan(x), x, moved.to(torch.int32).to(torch.int16).view(torch.bfloat16))


def down_row_ends(rule: Rule, rows: torch.Tensor,
                  interval: tuple[torch.Tensor, torch.Tensor] | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(lowest, highest) float32 value a candidate's bf16 down rows may take under the down GEMM's
    per-stage rule, around the reference's rows: the derived interval's ends (bf16 values), or the
    farther of max_ulp bf16 steps and the absolute floor (ULP: either passes an element)."""
    if interval is not None:
        below, above = interval
        return (rows.double() - below.double()).float(), (rows.double() + above.double()).float()
    lo = torch.minimum(bf16_steps(rows, -rule.max_ulp).float(), outward_float32(rows.double() - rule.atol, -math.inf))
    hi = torch.maximum(bf16_steps(rows, rule.max_ulp).float(), outward_float32(rows.double() + rule.atol, math.inf))
    return lo, hi


def derived_output_bound(check: Check, run: Run, down_interval: tuple[torch.Tensor, torch.Tensor] | None = None
                         ) -> tuple[tuple[torch.Tensor, torch.Tensor], dict] | None:
    """(below, above) per output element: reference - below <= candidate <= reference + above, and
    the figures behind it.

    Every upstream difference a candidate may legitimately have (a silu ulp, a moved e4m3 code)
    reaches the output only through the down GEMM's input, so the reference's down GEMM is run on
    the candidate's down-GEMM input; each of the candidate's rows may then lie anywhere in that
    row's per-stage interval (on the interpreter its derived interval, diffmoe.tolerance.gemm_interval;
    on CUDA its ulps and floor). The reference's reduce, run on the rows' lower ends and on their
    upper ends (ends swapped where a weight the reduce applies is negative), brackets the output:
    every operation of the reduce is monotone and the candidate's reduce is the reference's (bitwise
    per stage). The bracket carries the routed scaling factor and the output's own rounding exactly.
    None when the candidate did not report the buffers. `down_interval`: the down stage's derived
    interval on these same inputs when the caller has judged that stage already (judge_run), so it
    is not computed twice."""
    from reference.rounding.points import rounding  # the profile's router_weight point: where the weight multiplies

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
    rows = down[Buffers.DOWN_OUTPUT]  # [TK, H] bf16
    down_rule = rule_for(cfg.quant, Buffers.DOWN_OUTPUT, FORCED, backend=check.tolerance_backend)
    interval = down_interval if down_interval is not None else stage_bound(
        down_rule, Buffers.DOWN_OUTPUT, rows, {n: run.buffers[n] for n in down_in}, check.problem)
    lo, hi = down_row_ends(down_rule, rows, interval)  # [TK, H] float32
    if cfg.router_weight == "down" and not rounding(cfg.numerics_profile).weighs_in_down_gemm:
        negative = (check.problem.topk_weights.reshape(-1, 1) < 0).to(lo.device)  # [TK, 1]: the reduce weighs the row
        lo, hi = torch.where(negative, hi, lo), torch.where(negative, lo, hi)
    ends = [check.reference_stage(Stages.REDUCE, {Buffers.DOWN_OUTPUT: e}) for e in (lo, hi)]
    if any(isinstance(e, str) for e in ends):
        return None
    low, high = (e[Buffers.OUTPUT].double() for e in ends)  # [T, H]
    ref = check.reference.output.double()
    # a NaN or infinite end (a NaN input's rows, an interval without ends) is judged per stage, not here
    below = torch.nan_to_num(ref - low, nan=math.inf)
    above = torch.nan_to_num(high - ref, nan=math.inf)
    effect = (via[Buffers.OUTPUT].double() - ref).abs()  # [T, H] what the candidate's inputs change
    figures: dict[str, Any] = {"max_effect_of_inputs": float(torch.nan_to_num(effect, nan=0.0).max()) if effect.numel() else 0.0}
    if cfg.is_fp8 and Buffers.QUANTED_DOWN_INPUT in check.reference.intermediates:
        moved = run.buffers[Buffers.QUANTED_DOWN_INPUT].view(torch.uint8) != \
            check.reference.intermediates[Buffers.QUANTED_DOWN_INPUT].view(torch.uint8)
        figures["moved_down_input_codes"] = int(moved.sum())
    return (below, above), figures


# the down GEMM's inputs derived_output_bound feeds the reference (the candidate's, by scheme)
_DOWN_INPUTS = {Buffers.QUANTED_DOWN_INPUT, Buffers.QUANTED_DOWN_INPUT_SCALES, Buffers.ACTIVATION_OUTPUT}


class Differential(Oracle):
    name = Oracles.DIFFERENTIAL
    checks = ("every stage, pipeline order, on the candidate's own inputs; one finding per divergent stage, the largest "
              "departure first; then the output end to end")
    how = ("each stage's writes against the reference stage run on the very buffers the candidate's stage read, with the "
           "tight per-stage (`forced`) rules, so legitimate one-ulp differences never carry into a later verdict; the "
           "output against the reference's own within a bound derived per check: the reference's down GEMM on the "
           "candidate's down-GEMM input, each row widened to its per-stage interval, then the reference's (monotone) "
           "reduce of the rows' two ends, which carries the routed scaling factor")
    rank = 50

    def judge_run(self, check: Check, run: Run, first: bool) -> list[Finding]:
        """Every stage judged on the candidate's own inputs, pipeline order, each divergent stage
        its own finding (stage_findings: the largest departure first); then, when no stage
        diverges, the output against the reference's, within the derived bound.

        Each stage's writes are compared with the reference stage run on the very buffers the
        candidate's stage read (its snapshots), under the tight per-stage rules of the tolerance
        table (quantisation bitwise, GEMMs ULP-bounded), so a legitimate one-ulp difference early
        on is never carried into a later stage's verdict: the rules compose. The end-to-end output
        is then held to the bracket the differences the candidate legitimately has allow (see
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
                              {"schedule": str(run.schedule), "judged_on": "the candidate's own inputs", **extra},
                              topk_ids=check.problem.topk_ids)


def stage_findings(oracle: str, failed: list[tuple[str, Comparison]], common: dict[str, Any],
                   topk_ids: torch.Tensor | None = None) -> list[Finding]:
    """One finding per divergent stage, the largest departure first (issue 27).

    `failed`: (stage, comparison) in pipeline order. A stage's buffers share its finding, headed
    by its worst buffer. Stages are ordered by departure (the largest error relative to the
    buffer's own scale, Comparison.departure), so a quantisation's one-code flip never heads a
    report whose GEMM is off by a factor; ties keep pipeline order. Each finding names its place
    in the pipeline and the earliest divergent stage, which is where a reader starts to debug.
    With the problem's `topk_ids`, a routed rows' buffer's failures are grouped by expert
    (diffmoe/oracles/by_expert.py): in the figures, and in the message when one expert's rows hold
    them all or every routed expert's rows but one do."""
    by_stage: dict[str, list[Comparison]] = {}
    for stage, c in failed:
        by_stage.setdefault(stage, []).append(c)
    order = list(by_stage)  # pipeline order
    ranked = sorted(order, key=lambda st: -max(c.departure for c in by_stage[st]))
    findings = []
    for stage in ranked:
        worst = max(by_stage[stage], key=lambda c: c.departure)
        grouped, phrase = by_expert(worst.name, worst.row_failures, topk_ids, worst.total)
        figures = {**common, **worst.figures(), **grouped, "pipeline_position": order.index(stage) + 1,
                   "divergent_stages": len(order), "earliest_divergent_stage": order[0]}
        where = "the earliest divergent stage" if stage == order[0] else f"divergent stage {order.index(stage) + 1} of {len(order)}"
        findings.append(Finding(
            oracle=oracle, stage=stage, buffers=[c.name for c in by_stage[stage]],
            message=f"{stage} diverges on {common.get('judged_on', 'its inputs')} ({where}): {worst.summary()}"
                    + (f"; {phrase}" if phrase else ""),
            figures=figures,
        ))
    return findings
