"""The call-sequence oracle: a call must not depend on the calls made before it.

Owns the small call after the T call, the T call after the small one, and the diagnostic
runs a divergence buys. Its T call after the small one also serves two other oracles, so a
passing check pays for no extra T run: it is the last program order's run (appended to
`check.runs` and judged like every order's run, then by the schedule oracle) and, with the
poison oracle selected, that oracle's second run (`check.sequenced`; poison.py's
`poison_findings` judges it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from diffmoe.adapters.contract import Schedule
from diffmoe.problem.inputs import Problem
from diffmoe.check.report import Finding, Oracles
from diffmoe.problem.vocabulary import producer_stage
from diffmoe.oracles.base import Oracle
from diffmoe.oracles.guards import POISON_PATTERNS, GuardedTensor
from diffmoe.oracles.poison import poison_findings

if TYPE_CHECKING:
    from diffmoe.check.execution import Check, Run

# The smaller call has T // 16 tokens (at least 1): a decode-sized call beside a prefill-sized
# one, as an engine makes them. The interpreter's cost of a call is mostly per launch and per
# expert block, not per token: measured at E=8 K=2 H=I=128 fp8-token fused, a T=16 call takes
# 0.48 s, T=8 0.42 s, T=2 0.24 s, T=1 0.19 s, so T // 2 would make the two small calls cost
# nearly two full runs.
SMALL_CALL_DIVISOR = 16


def makes_last_order_run(check: Check) -> bool:
    """Whether this oracle runs (and so makes the last order's and poison's second run)."""
    return check.selected(Oracles.CALL_SEQUENCE) and check.problem.num_tokens >= 2


class CallSequence(Oracle):
    name = Oracles.CALL_SEQUENCE
    checks = "state left by earlier calls"
    how = ("a small call (T // 16 tokens, at least 1: a decode step after a prefill) right after the T call on the same "
           "instance and unpoisoned workspaces, bitwise against the small call on a fresh instance and fresh workspaces; "
           "then, on that fresh pair, the T call right after the small one (under the last program order, which the "
           "schedule oracle then judges), bitwise against the T call on its own (stale rows, scales cached in private "
           "buffers, reductions over the workspace capacity); T >= 2")
    rank = 60

    def finish(self, check: Check) -> list[Finding]:
        """A call must not depend on the calls before it. An engine reuses one implementation and
        one pair of workspaces for every batch, and the seed bug lived in that reuse: a kernel that
        reduces over the workspace capacity, or keeps a scale from an earlier call, is right on a
        lone call. So, bitwise:

        1. a small call (T // SMALL_CALL_DIVISOR tokens, at least 1) right after the T call
           (runs[0]), on the same instance and unpoisoned workspaces, against the small call on
           a fresh instance and fresh workspaces;
        2. on that fresh pair, the T call right after the small call, against the T call on its own.

        The T call of (2) does three jobs, so a passing check pays for two small runs and no
        extra T run: it runs under the last program order (whose run the schedule oracle then
        judges, appended to `check.runs`), and with the poison oracle selected the fresh pair is
        poisoned with the second pattern, making it the poison oracle's second run too (a T call
        that reads bytes written before it sees the first pattern in runs[0], and the small
        call's bytes or the second pattern here). Only when it diverges from runs[0] are the runs
        made that tell the causes apart: the T call on its own under that order (the schedule
        oracle's run, judged bitwise against runs[0]), then under the second pattern (the poison
        oracle's), each on a fresh instance and fresh workspaces.

        Findings are added to check.findings as they are made, so a crash in a later call keeps them."""
        if not makes_last_order_run(check):
            if check.selected(self.name):
                check.skipped[self.name] = "a call of T < 2 tokens has no smaller call"
            return []
        poison = check.selected(Oracles.POISON)
        merged_order = check.schedules[-1] if len(check.schedules) >= 2 else None
        shapes, output, runs = check.shapes, check.output, check.runs
        large = runs[0]
        t_large = check.problem.num_tokens
        t_small = max(1, t_large // SMALL_CALL_DIVISOR)
        from diffmoe.check.execution import first_tokens

        small = first_tokens(check.problem, t_small)
        first_order = check.schedules[0]
        order = merged_order or first_order
        fresh_poison = POISON_PATTERNS[1] if poison else POISON_PATTERNS[0]

        def out_for(t: int, pattern: int) -> GuardedTensor | None:
            """A caller's fresh output for a call, poisoned: the workspaces carry state from call to
            call, the output is the caller's new tensor each time."""
            if output is None:
                return None
            return check.new_output(t, pattern)

        def alone(problem: Problem | None, t: int, pattern: int, schedule: Schedule) -> Run:
            return check.execute(check.build(check.config), check.allocate(shapes, f"workspace_shapes({check.config.num_tokens})"), out_for(t, pattern),
                                 schedule, pattern, problem=problem,
                                 what=f"the T={t} call under schedule {schedule} on a fresh instance and fresh "
                                      f"workspaces, poison 0x{pattern:02X}")

        def diverges(a: Run, b: Run) -> bool:
            return check.first_bitwise_divergence(a, b, "") is not None

        after_large = check.execute(check.impl, check.guarded, out_for(t_small, POISON_PATTERNS[0]), first_order, None,
                                    problem=small,
                                    what=f"the T={t_small} call right after the T={t_large} call (same workspaces)")
        fresh = check.build(check.config)
        fresh_ws = check.allocate(shapes, f"workspace_shapes({check.config.num_tokens})")
        # the small call's output under the first pattern, as after_large's: its comparison is
        # about the workspaces' state, not the output's
        small_alone = check.execute(fresh, fresh_ws, out_for(t_small, POISON_PATTERNS[0]), first_order, None,
                                    problem=small, poison_workspaces=fresh_poison,
                                    what=f"the T={t_small} call on a fresh instance and fresh workspaces")
        after_small = check.execute(fresh, fresh_ws, out_for(t_large, fresh_poison), order, None,
                                    what=f"the T={t_large} call under schedule {order} right after the T={t_small} "
                                         "call (same workspaces)")
        diverged = diverges(large, after_small)

        # (2)'s T call on its own, under the order of after_small and the first pattern
        large_alone = large
        if merged_order is not None:
            ordered = alone(None, t_large, POISON_PATTERNS[0], order) if diverged else after_small
            check.findings += check.judge_run(ordered, first=False)
            runs.append(ordered)
            large_alone = ordered
        if diverged and poison:
            second = alone(None, t_large, fresh_poison, order)
            check.findings += poison_findings(check, large_alone, second)
            large_alone = second
        # (1)'s small call on its own under the first pattern (the earlier T call ran on it), when
        # the one under the second pattern differs
        if poison and diverges(small_alone, after_large):
            small_first = alone(small, t_small, POISON_PATTERNS[0], first_order)
            if not any(f.oracle == Oracles.POISON for f in check.findings):
                check.findings += poison_findings(check, small_first, small_alone, tokens=t_small)
            small_alone = small_first
        comparisons = [(after_large, small_alone, t_large, t_small)]
        if diverged:  # otherwise after_small is bitwise the T call on its own (runs[0])
            comparisons.append((after_small, large_alone, t_small, t_large))
        for run, reference, earlier, t_call in comparisons:
            c = check.first_bitwise_divergence(reference, run, "the same call, with or without an earlier call")
            if c is None:
                continue
            check.findings.append(Finding(
                oracle=Oracles.CALL_SEQUENCE, stage=producer_stage(check.config, c.name), buffers=[c.name],
                message=f"{c.name} of a T={t_call} call changes when a T={earlier} call ran before it on the same "
                        f"implementation and workspaces: {c.differing} of {c.total} elements differ from the call "
                        "made on its own (state left by the earlier call: stale rows, scales or private buffers)",
                figures={"tokens": t_call, "earlier_tokens": earlier, **c.figures()},
            ))
        return []
