"""The contract oracle: what the plug-in contract (diffmoe/adapters/contract.py) asks of a run.

Owns the checks of the first order's run: the output's shape, dtype and device, the caller's
output tensor used, every written buffer declared, every materialised buffer written, and, under
the interpreter, every launch reported as a Triton kernel (LaunchInfo.triton) having run at least
one Triton program (diffmoe.interpreter.program_count counts them; compiled launches are not
counted, so nothing is judged there). Input
writes and results that are no RunResult are found by the check itself (diffmoe/check/execution.py)
and reported under this oracle's name whatever the selection: they make the rest unjudgeable.

Must not touch the order runs beyond reading the first one.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

from diffmoe.check.report import Finding, Oracles
from diffmoe.problem.vocabulary import Buffers, Stages, materialised_buffers, producer_stage
from diffmoe.oracles.base import Oracle

if TYPE_CHECKING:
    from diffmoe.check.execution import Check, Run

# Implementation-private buffers a launch may write besides the declared pipeline buffers: these,
# and any name under Buffers.PRIVATE_PREFIX (an implementation's own scratch, Buffers.private).
PRIVATE_BUFFERS = {Buffers.AMAX_PARTIALS, Buffers.SORTED_TOKEN_IDS, Buffers.EXPERT_IDS, Buffers.NUM_TOKENS_POST_PADDED}


def is_private(name: str) -> bool:
    return name in PRIVATE_BUFFERS or name.startswith(Buffers.PRIVATE_PREFIX)


class Contract(Oracle):
    name = Oracles.CONTRACT
    checks = "the plug-in contract"
    how = ("output shape/dtype/device, undeclared buffers written, a plan that does not fit the workspaces (reported "
           "before any launch), a launch reported as a Triton kernel that ran no Triton program (interpreter only)")
    rank = 30

    def judge_run(self, check: Check, run: Run, first: bool) -> list[Finding]:
        if not first:
            return []
        cfg = check.config
        t = check.problem.num_tokens
        out = run.output
        want = (t, cfg.hidden)
        found: list[Finding] = []
        if tuple(out.shape) != want or out.dtype != torch.bfloat16 or out.device.type != check.device.type:
            found.append(Finding(
                oracle=Oracles.CONTRACT, stage=Stages.REDUCE, buffers=[Buffers.OUTPUT],
                message=f"output must be {list(want)} bfloat16 on {check.device.type}, got {list(out.shape)} "
                        f"{out.dtype} on {out.device.type}",
            ))
        output = check.output
        if output is not None and run.returned is not None and (
            run.returned.data_ptr() != output.tensor.data_ptr() or run.returned.shape != output.tensor.shape
        ):
            found.append(Finding(
                oracle=Oracles.CONTRACT, stage=Stages.REDUCE, buffers=[Buffers.OUTPUT],
                message="run() was given an output tensor but returned a different tensor; the result must be "
                        "written into the caller's output",
            ))
        declared = set(materialised_buffers(cfg))
        inputs = set(check.problem.inputs())
        for launch in run.log:
            if launch.triton and launch.programs == 0 and math.prod(launch.grid) > 0:
                found.append(Finding(
                    oracle=Oracles.CONTRACT, stage=launch.stage, buffers=[r.name for r in launch.writes],
                    message=f"launch {launch.kernel} (stage {launch.stage}) is reported as a Triton kernel on a grid of "
                            f"{math.prod(launch.grid)} programs, but the interpreter ran no Triton program during it: "
                            "what it wrote was computed by other code",
                    figures={"grid": list(launch.grid), "programs_run": 0},
                ))
        for launch in run.log:
            for region in launch.writes:
                if region.name in inputs:
                    found.append(Finding(
                        oracle=Oracles.CONTRACT, stage=launch.stage, buffers=[region.name],
                        message=f"launch {launch.kernel} declares a write to the input {region.name}; inputs belong "
                                "to the caller and must not be written",
                    ))
                elif region.name not in declared and not is_private(region.name):
                    found.append(Finding(
                        oracle=Oracles.CONTRACT, stage=launch.stage, buffers=[region.name],
                        message=f"launch {launch.kernel} writes {region.name!r}, which the pipeline does not declare",
                    ))
        # A materialised buffer that no launch reports writing was never snapshotted, so the
        # differential could not judge it. Not applicable to a zero-token call (nothing is
        # written) or to an implementation that reports no launch at all (it computes outside
        # launches and returns its intermediates).
        if t == 0 or not len(run.log):
            return found
        written = {region.name for launch in run.log for region in launch.writes} | run.reported
        for name in materialised_buffers(cfg):
            if name not in written:
                stage = producer_stage(cfg, name)
                found.append(Finding(
                    oracle=Oracles.CONTRACT, stage=stage, buffers=[name],
                    message=f"{name} is materialised by stage {stage}, but no launch reported writing it (nor did run() "
                            "return it among its intermediates), so the bytes compared were never computed",
                ))
        return found
