"""The teacher-forcing oracle: each stage on its own, fed the reference's exact inputs.

Owns the per-stage reruns through the implementation's optional `run_stage`. Reads the
reference's intermediates; must not touch the order runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from diffmoe.check.execution import written_elements
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

    @staticmethod
    def _settle_unsampled(check: Check, stage, outputs: dict, what: str, found: list[Finding]) -> bool:
        """A sampled check: the stage once more on the same inputs; an element both runs agree on and
        that is not NaN was written by a chosen program (what the stage allocates is NaN until
        written, Candidate.run_stage), every other takes the reference's value, which is exactly what
        the stage computes from the reference's inputs. False when the second run failed (its
        finding in `found`)."""
        from diffmoe.check.candidate import Crash

        ref = check.reference.intermediates
        try:
            again, watched = check.run_stage(check.impl, stage.name, {n: ref[n].clone() for n in stage.reads if n in ref},
                                             f"{what}, run again (a sampled check)")
        except Crash as crash:
            found.append(crash.finding)
            return False
        found += watched
        again = again if isinstance(again, dict) else {}
        for name in stage.writes:
            mine, theirs, expected = outputs.get(name), again.get(name), ref.get(name)
            if not all(isinstance(t, torch.Tensor) for t in (mine, theirs, expected)) or \
                    not mine.shape == theirs.shape == expected.shape or mine.dtype != theirs.dtype:
                continue
            written = written_elements(mine, theirs, expected)
            if bool(written.all()):
                # a stage whose launch ran a sample yet left no element unwritten returned memory the
                # poison never reached (vLLM's run_stage zero-fills its outputs): nothing can be told
                # written, so nothing is judged
                written = torch.zeros_like(written)
            counted = check.computed_elements(name, mine)
            check.judged_forced[name] = (int((counted & written).sum()), int(counted.sum()))
            mine = outputs[name] = mine.clone()
            mine[~written] = expected.to(mine.device, mine.dtype)[~written.to(expected.device)]
        return True

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
        # a sampled check: the stages whose launches ran a sample (None: an unannounced one did)
        sampled = check.sampled_stages() if check.sample is not None else set()
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
            if (sampled is None or stage.name in sampled) and not self._settle_unsampled(check, stage, outputs, what, found):
                continue
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
