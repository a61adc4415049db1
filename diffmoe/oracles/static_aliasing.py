"""Static aliasing: judge a declared workspace plan before anything runs.

A buffer is live from the stage that writes it to the last stage that reads it, inclusive.
A stage's inputs and outputs are live at that stage together: a kernel that reads one
buffer and writes another must not have them share bytes, whatever the order its program
instances run in. Two buffers live at the same stage whose placements overlap in the same
workspace are a finding.

This needs only the plan (the buffer list, the placements and the stages), so it is cheap
enough to run on every config the fuzzer draws.

Owns the static rule and the workspace-fit check. Must not run the implementation.
"""

from __future__ import annotations

from dataclasses import dataclass

from diffmoe.contract import Placement, WorkspacePlan
from diffmoe.findings import ByteRange, Finding, Oracles
from diffmoe.problem.vocabulary import WORKSPACE_NAMES, workspace_name
from diffmoe.oracles.base import Oracle


@dataclass(frozen=True)
class LiveRange:
    """Stage indices [first, last] (inclusive) during which a buffer holds data someone needs."""

    buffer: str
    first: int
    last: int

    def intersects(self, other: LiveRange) -> bool:
        return self.first <= other.last and other.first <= self.last


def live_ranges(plan: WorkspacePlan) -> dict[str, LiveRange]:
    """Live range of every placed buffer some stage writes. A buffer no stage reads lives at
    its producer only; a buffer no stage writes holds nothing and is left out."""
    ranges: dict[str, LiveRange] = {}
    for placement in plan.placements:
        name = placement.buffer
        writers = [i for i, stage in enumerate(plan.stages) if name in stage.writes]
        if not writers:
            continue
        first = writers[0]
        readers = [i for i, stage in enumerate(plan.stages) if name in stage.reads and i >= first]
        ranges[name] = LiveRange(name, first, max(readers, default=first))
    return ranges


def _byte_overlap(a: Placement, b: Placement) -> tuple[int, int] | None:
    if a.workspace != b.workspace:
        return None
    start, end = max(a.offset, b.offset), min(a.end, b.end)
    return (start, end) if start < end else None


def check_static_aliasing(plan: WorkspacePlan) -> list[Finding]:
    """One finding per pair of placed buffers that are live at the same stage and share bytes."""
    ranges = live_ranges(plan)
    placed = [p for p in plan.placements if p.buffer in ranges]
    findings: list[tuple[int, Finding]] = []
    for n, a in enumerate(placed):
        for b in placed[n + 1 :]:
            ra, rb = ranges[a.buffer], ranges[b.buffer]
            overlap = _byte_overlap(a, b)
            if overlap is None or not ra.intersects(rb):
                continue
            first_both = max(ra.first, rb.first)
            stage = plan.stages[first_both].name
            first, second = sorted((ra, rb), key=lambda r: (r.first, r.buffer))
            ws = workspace_name(a.workspace)
            start, end = overlap
            findings.append(
                (
                    first_both,
                    Finding(
                        oracle=Oracles.STATIC_ALIASING,
                        stage=stage,
                        buffers=[first.buffer, second.buffer],
                        byte_ranges=[ByteRange(ws, start, end)],
                        message=(
                            f"{first.buffer} and {second.buffer} share {ws} bytes [{start}, {end}) "
                            f"while both are live at {stage}"
                        ),
                        figures={
                            "planner": plan.planner,
                            "buffer_list": list(plan.buffer_list),
                            "live": {r.buffer: [plan.stages[r.first].name, plan.stages[r.last].name] for r in (first, second)},
                        },
                    ),
                )
            )
    findings.sort(key=lambda item: item[0])
    return [finding for _, finding in findings]


def check_workspace_fit(plan: WorkspacePlan, provided_bytes: tuple[int, int]) -> list[Finding]:
    """Placements that run past the workspaces the caller provides (or name no workspace),
    found before launch instead of as an out-of-bounds write."""
    findings = []
    for p in plan.placements:
        ws = workspace_name(p.workspace)
        if not 0 <= p.workspace < len(provided_bytes):
            findings.append(
                Finding(
                    oracle=Oracles.CONTRACT,
                    buffers=[p.buffer],
                    message=f"{p.buffer} is placed in workspace index {p.workspace}, but only {list(WORKSPACE_NAMES)} exist",
                )
            )
            continue
        size = provided_bytes[p.workspace]
        writers = [stage.name for stage in plan.stages if p.buffer in stage.writes]
        if p.offset < 0 or p.nbytes < 0 or (p.nbytes > 0 and p.end > size):
            start = p.offset if p.offset < 0 else max(p.offset, size)
            findings.append(
                Finding(
                    oracle=Oracles.CONTRACT,
                    stage=writers[0] if writers else None,
                    buffers=[p.buffer],
                    byte_ranges=[ByteRange(ws, start, max(p.end, start))],
                    message=f"{p.buffer} needs {ws} bytes [{p.offset}, {p.end}) but {ws} has {size} bytes",
                    figures={"offset": p.offset, "nbytes": p.nbytes, "provided": size, "declared": plan.workspace_bytes[p.workspace]},
                )
            )
    return findings


class StaticAliasing(Oracle):
    name = Oracles.STATIC_ALIASING
    checks = "the declared plan alone, no execution"
    how = ("live range of each buffer (producer to last consumer, a stage's inputs and outputs overlap); overlapping live "
           "ranges at overlapping bytes of one workspace")
    rank = 0

    def judge_plan(self, check, plan: WorkspacePlan) -> list[Finding]:
        check.enter("the static aliasing check")
        return check_static_aliasing(plan)
