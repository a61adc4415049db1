"""The poison oracle: a call must not read workspace bytes it did not write, nor a tensor of its own
that nothing wrote.

Owns the second run under the second poison pattern and the bitwise judgement of a pair of
runs of one call under the two patterns (`poison_findings`, which call_sequence.py also uses:
with that oracle selected, its T call on a fresh pair poisoned 0xA5 is this oracle's second
run, `check.sequenced`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from diffmoe.findings import Finding, Oracles
from diffmoe.problem.vocabulary import producer_stage
from diffmoe.oracles.base import Oracle
from diffmoe.check.guards import POISON_PATTERNS

if TYPE_CHECKING:
    from diffmoe.check.execution import Check, Run


def poison_findings(check: Check, first: Run, again: Run, tokens: int | None = None) -> list[Finding]:
    """A finding when two runs of one call, under the two poison patterns, differ."""
    c = check.first_bitwise_divergence(first, again, "the same call under another poison")
    if c is None:
        return []
    call = "" if tokens is None else f" (the T={tokens} call)"
    return [Finding(
        oracle=Oracles.POISON, stage=producer_stage(check.config, c.name), buffers=[c.name],
        message=f"{c.name}{call} depends on workspace bytes written before this call (stale or uninitialised "
                f"read): poison 0x{POISON_PATTERNS[0]:02X} vs 0x{POISON_PATTERNS[1]:02X} differ in "
                f"{c.differing} of {c.total} elements",
        figures={**({"tokens": tokens} if tokens is not None else {}), **c.figures()},
    )]


def unwritten_read_findings(run: Run) -> list[Finding]:
    """A finding per launch and buffer that read bytes of the implementation's own tensor that no
    launch of this call wrote (diffmoe.check.watchers.UnwrittenReads): said as that, not as a
    dependence on workspace bytes or on the program order, which the garbage also causes."""
    return [Finding(
        oracle=Oracles.POISON, stage=stage, buffers=[name],
        message=f"{stage} ({kernel}, launch {index}) reads {nbytes} byte{'s' if nbytes != 1 else ''} of {name} "
                f"(allocated by the implementation, written by no launch) that no launch of this call wrote",
        figures={"launch": index, "kernel": kernel, "unwritten_bytes": nbytes},
    ) for index, stage, kernel, name, nbytes in run.unwritten_reads]


class Poison(Oracle):
    name = Oracles.POISON
    checks = "stale or uninitialised reads"
    how = ("workspaces (and a separate output) filled with 0xFF (NaN) for the first run and 0xA5 for a second; any "
           "buffer that changes read bytes it did not write. With `call-sequence` selected, the second run is that "
           "oracle's T call on a fresh pair poisoned 0xA5, and only a divergence buys the runs that tell the causes apart. "
           "A tensor the implementation allocated, read by a launch while every byte still holds torch's fill (the "
           "call's allocations are poisoned too), is reported as read bytes no launch of this call wrote")
    rank = 80

    def judge_run(self, check: Check, run: Run, first: bool) -> list[Finding]:
        return unwritten_read_findings(run) if first else []

    def finish(self, check: Check) -> list[Finding]:
        if check.sequenced:
            return []  # the second run was call-sequence's T call on a fresh pair
        again = check.execute(check.build(check.config), check.guarded, check.output, check.schedules[0],
                              POISON_PATTERNS[1],
                              what=f"the run under schedule {check.schedules[0]} and the second poison")
        return poison_findings(check, check.runs[0], again)
