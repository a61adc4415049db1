"""The contract oracle: what the plug-in contract (diffmoe/contract.py) asks of a run.

Owns the checks of the first order's run: the output's shape, dtype and device, the caller's
output tensor used, every written buffer declared, every materialised buffer written, and, under
the interpreter, every launch reported as a Triton kernel (LaunchInfo.triton) having run at least
one Triton program (diffmoe.interpreter.program_count counts them) and having stored from its
Triton programs the bytes of the views it declares it writes, none of them written by other code
during it (diffmoe.interpreter.store_coverage records the first order's run; `_unperformed_writes`
says which bytes must be stored). Compiled launches are neither counted nor watched, so none of
this is judged there. Input
writes and results that are no RunResult are found by the check itself (diffmoe/check/execution.py)
and reported under this oracle's name whatever the selection: they make the rest unjudgeable.

Must not touch the order runs beyond reading the first one.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

from diffmoe.findings import Finding, Oracles
from diffmoe.problem.inputs import ROUTED_ROW_BUFFERS
from diffmoe.problem.vocabulary import Buffers, Stages, materialised_buffers, producer_stage
from diffmoe.oracles.base import Oracle

if TYPE_CHECKING:
    from diffmoe.check.execution import Check, Run
    from diffmoe.check.recording import RecordedLaunch
    from diffmoe.interpreter.store_coverage import StoreGap

# Implementation-private buffers a launch may write besides the declared pipeline buffers: these,
# and any name under Buffers.PRIVATE_PREFIX (an implementation's own scratch, Buffers.private).
PRIVATE_BUFFERS = {Buffers.AMAX_PARTIALS, Buffers.SORTED_TOKEN_IDS, Buffers.EXPERT_IDS, Buffers.NUM_TOKENS_POST_PADDED}


def is_private(name: str) -> bool:
    return name in PRIVATE_BUFFERS or name.startswith(Buffers.PRIVATE_PREFIX)


class Contract(Oracle):
    name = Oracles.CONTRACT
    checks = "the plug-in contract"
    how = ("output shape/dtype/device, undeclared buffers written, a plan that does not fit the workspaces (reported "
           "before any launch), a launch reported as a Triton kernel that ran no Triton program, left bytes of a view it "
           "declares it writes unstored by its Triton programs, or had them written by host code during it "
           "(interpreter only); outputs and inputs written after run() returned (compared again at the check's end)")
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
        found += _unperformed_writes(check, run)
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


def _unperformed_writes(check: Check, run: Run) -> list[Finding]:
    """A Triton launch's declared writes its Triton programs did not store (issue 43, item 3), from
    the store watch's record (diffmoe/interpreter/store_coverage.py; interpreter, first run only).

    Which bytes must be stored: every byte of every declared view but two kinds, the strictest rule
    measured quiet on the shipped kernel (fp8-token/-tensor/-block fused and unfused, bf16, expert
    maps, zero-token and smaller calls), the cached peers and the bug zoo's controls (2026-12-06):
    * an implementation's private buffers (is_private): scratch the reference gives no value; lmdeploy
      0.18's `_sorted_idx_phase1_kernel` adds to the counts of the experts a call routes to and leaves
      a pre-zeroed count alone (4 of 16 bytes of private:Counts at T=2, E=4);
    * the rows of routed slots a call does not compute (Problem.computed_slots: remote under an
      expert map, unrouted) in the per-routed-row buffers: vLLM 0.33's fused_moe_kernel never stores
      the rows its alignment dropped as remote (7 of 10 rows of gate_up_output and down_output with
      expert map [0, -1, 1, -1] at T=5, K=2), and the reference gives them no value either
      (settle_uncomputed_rows).
    Bytes that changed during the launch with no store of it touching them are written by other code
    inside its window: reported whatever the buffer, no honest kernel measured does it."""
    skipped = ~check.problem.computed_slots()
    found: list[Finding] = []
    for launch in run.log:
        for gap in launch.host_written or ():
            found.append(_gap_finding(launch, gap, gap.nbytes, gap.first, host=True))
        host = {gap.buffer for gap in launch.host_written or ()}
        for gap in launch.unstored or ():
            if is_private(gap.buffer) or gap.buffer in host:  # one finding a view: its host write
                continue
            nbytes, first = gap.nbytes, gap.first
            if gap.buffer in ROUTED_ROW_BUFFERS and gap.row_count == skipped.numel() and bool(skipped.any()):
                kept = [(r, n) for r, n in zip(gap.rows, gap.row_bytes) if not bool(skipped[r])]
                nbytes = sum(n for _, n in kept)
                if kept and kept[0][0] != gap.rows[0]:
                    first = None  # the first run lies in a row that carries no value: name the row instead
                row = kept[0][0] if kept else None
            else:
                row = gap.rows[0] if gap.rows else None
            if nbytes:
                found.append(_gap_finding(launch, gap, nbytes, first, host=False, row=row))
    return found


def _gap_finding(launch: RecordedLaunch, gap: StoreGap, nbytes: int, first: tuple[int, int] | None, host: bool,
                 row: int | None = None) -> Finding:
    where = (f"first bytes [{first[0]}, {first[1]}) of the view" if first is not None else f"first in row {row}")
    if host:
        message = (f"{nbytes} of the {gap.declared} bytes of {gap.buffer} that launch {launch.index} ({launch.kernel}, "
                   f"stage {launch.stage}) declares it writes changed during it, but no store of its Triton programs "
                   f"touched them ({where}): written by host code during launch {launch.kernel}")
    else:
        message = (f"launch {launch.index} ({launch.kernel}, stage {launch.stage}) is reported as a Triton kernel that "
                   f"writes {gap.buffer}, but its Triton programs stored {nbytes} of its {gap.declared} declared bytes "
                   f"nowhere ({where}): what they hold was not computed by the launch")
    return Finding(
        oracle=Oracles.CONTRACT, stage=launch.stage, buffers=[gap.buffer], message=message,
        figures={"launch": launch.index, "kernel": launch.kernel, "buffer": gap.buffer,
                 "host_written_bytes" if host else "unstored_bytes": nbytes, "declared_bytes": gap.declared,
                 **({"first_bytes": list(first)} if first is not None else {"first_row": row})},
    )
