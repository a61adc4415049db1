"""The teacher-forcing oracle: each stage on its own, fed the reference's exact inputs.

Owns the per-stage reruns through the implementation's optional `run_stage`. Reads the
reference's intermediates; must not touch the order runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from diffmoe.tolerance.compare import Comparison
from diffmoe.tolerance.gemm_interval import compare_stage
from diffmoe.findings import Finding, Oracles
from diffmoe.tolerance.table import FORCED, rule_for
from diffmoe.problem.vocabulary import Stages, pipeline_stages
from diffmoe.oracles.base import Oracle
from diffmoe.oracles.differential import stage_findings

if TYPE_CHECKING:
    from diffmoe.check.execution import Check


class TeacherForcing(Oracle):
    name = Oracles.TEACHER_FORCING
    checks = "each stage on its own"
    how = ("the stage is fed the reference's exact inputs (`run_stage`) and judged with the forced rule: quantisation "
           "bitwise, GEMMs ULP-bounded")
    rank = 90

    def finish(self, check: Check) -> list[Finding]:
        """Each stage on the reference's inputs, judged with the forced rules."""
        from diffmoe.check.candidate import Crash

        if check.problem.num_tokens == 0:
            return []  # a zero-token call has no stage to force: nothing to judge, nothing skipped
        if not check.has_run_stage(check.impl):
            check.skipped[self.name] = "the implementation has no run_stage (diffmoe/contract.py)"
            return []
        found: list[Finding] = []
        failed: list[tuple[str, Comparison]] = []
        ref = check.reference.intermediates
        check.enter("teacher forcing")
        for stage in pipeline_stages(check.config):
            check.report_progress(stage.name)
            # copies: a stage writing into its inputs must not change the reference for later stages
            inputs = {n: ref[n].clone() for n in stage.reads if n in ref}
            what = f"teacher-forced stage {stage.name}"
            try:
                outputs, watched = check.run_stage(check.impl, stage.name, inputs, what)
            except Crash as crash:  # its input-watch findings already joined the check's
                found.append(crash.finding)
                continue
            found += watched
            if not isinstance(outputs, dict):
                found.append(Finding(
                    oracle=Oracles.CONTRACT, stage=stage.name,
                    message=f"{what}: run_stage must return a dict of its outputs, got {type(outputs).__name__}",
                ))
                continue
            outputs = dict(outputs)
            check.settle_uncomputed_rows(outputs)
            for name in stage.writes:
                if name not in outputs or name not in ref:
                    continue
                rule = rule_for(check.config.quant, name, FORCED, fused=stage.name == Stages.ACT_QUANT,
                                backend=check.tolerance_backend, numerics=check.config.numerics_profile)
                c = compare_stage(name, ref[name], outputs[name], rule, {n: ref[n] for n in stage.reads if n in ref}, check.problem)
                if not c.ok:
                    failed.append((stage.name, c))
        # the stage verdicts after the contract and crash findings, the largest departure first
        return found + stage_findings(Oracles.TEACHER_FORCING, failed, {"judged_on": "the reference's own inputs"},
                                      topk_ids=check.problem.topk_ids)
