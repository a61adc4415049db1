"""The call-sequence oracle: a call must not depend on the calls made before it.

Owns the small call after the T call, the T call after the small one, the call of other values
of the small call's shape after both, and the diagnostic runs a divergence buys; then it runs the
series of call_series.py (many small calls on one instance, one from another thread). Its T call after the small one also serves two other oracles, so a
passing check pays for no extra T run: it is the last program order's run (appended to
`check.runs` and judged like every order's run, then by the schedule oracle) and, with the
poison oracle selected, that oracle's second run (`check.sequenced`; poison.py's
`poison_findings` judges it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from dataclasses import replace

from diffmoe.contract import Schedule
from diffmoe.problem.inputs import Problem, tokens_of
from diffmoe.findings import Finding, Oracles
from diffmoe.problem.vocabulary import Buffers, Stages, producer_stage
from diffmoe.tolerance.compare import Rule, compare
from diffmoe.tolerance.table import END_TO_END, rule_for
from diffmoe.oracles.base import Oracle
from diffmoe.oracles.call_series import series_findings
from diffmoe.check.guards import POISON_PATTERNS, GuardedTensor
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
           "buffers, reductions over the workspace capacity); then on that pair a call of the small call's shape with "
           "other values (the last T // 16 tokens), judged against its own reference (a result kept by shape), those on "
           "T >= 2; then a series of 32 calls of T = 1..4 on one more instance of the config cut to E, K <= 2, H, I <= 128, and one "
           "from another thread, each bitwise against the first call of its size (a kernel that turns wrong after some "
           "calls, or off the main thread)")
    rank = 60

    def finish(self, check: Check) -> list[Finding]:
        """A call must not depend on the calls before it. An engine reuses one implementation and
        one pair of workspaces for every batch, and the seed bug lived in that reuse: a kernel that
        reduces over the workspace capacity, or keeps a scale from an earlier call, is right on a
        lone call. So, bitwise:

        1. a small call (T // SMALL_CALL_DIVISOR tokens, at least 1) right after the T call
           (runs[0]), on the same instance and unpoisoned workspaces, against the small call on
           a fresh instance and fresh workspaces;
        2. on that fresh pair, the T call right after the small call, against the T call on its own;
        3. on that pair again, a call of the small call's shape with other values (the last
           T // SMALL_CALL_DIVISOR tokens), against its own reference (other_values_findings):
           every other call of a check repeats inputs already seen, so an implementation that
           keeps a result by shape and returns it for any later call of that shape (issue 33)
           passes them all. One small call more per check (docs/oracles.md has its cost).

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
            # a call of T < 2 tokens has no smaller call: only the series, on a config of its own
            if check.selected(self.name):
                check.findings += series_findings(check)
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

        def large_again() -> Run:  # how large_alone was made, made again (runs[0]: the first order and pattern)
            return alone(None, t_large, POISON_PATTERNS[0], order)
        if merged_order is not None:
            ordered = alone(None, t_large, POISON_PATTERNS[0], order) if diverged else after_small
            check.findings += check.judge_run(ordered, first=False)
            runs.append(ordered)
            large_alone = ordered
        if diverged and poison:
            second = alone(None, t_large, fresh_poison, order)
            check.findings += poison_findings(check, large_alone, second)
            large_alone = second

            def large_again() -> Run:
                return alone(None, t_large, fresh_poison, order)

        def small_again() -> Run:  # small_alone's way: fresh pair, workspaces under fresh_poison
            return check.execute(check.build(check.config), check.allocate(shapes, f"workspace_shapes({check.config.num_tokens})"),
                                 out_for(t_small, POISON_PATTERNS[0]), first_order, None, problem=small,
                                 poison_workspaces=fresh_poison, what=f"the T={t_small} call on a fresh instance and "
                                                                      "fresh workspaces, made again")
        # (1)'s small call on its own under the first pattern (the earlier T call ran on it), when
        # the one under the second pattern differs
        if poison and diverges(small_alone, after_large):
            small_first = alone(small, t_small, POISON_PATTERNS[0], first_order)
            if not any(f.oracle == Oracles.POISON for f in check.findings):
                check.findings += poison_findings(check, small_first, small_alone, tokens=t_small)
            small_alone = small_first

            def small_again() -> Run:
                return alone(small, t_small, POISON_PATTERNS[0], first_order)

        def large_then_small() -> Run:  # (1) made again: the T call, then the small one, on a fresh pair
            instance, ws = check.build(check.config), check.allocate(shapes, f"workspace_shapes({check.config.num_tokens})")
            check.execute(instance, ws, out_for(t_large, POISON_PATTERNS[0]), first_order, POISON_PATTERNS[0],
                          what=f"the T={t_large} call on a fresh instance and fresh workspaces, made again")
            return check.execute(instance, ws, out_for(t_small, POISON_PATTERNS[0]), first_order, None, problem=small,
                                 what=f"the T={t_small} call right after the T={t_large} call, made again")

        def small_then_large() -> Run:  # (2) made again on a fresh pair
            instance, ws = check.build(check.config), check.allocate(shapes, f"workspace_shapes({check.config.num_tokens})")
            check.execute(instance, ws, out_for(t_small, POISON_PATTERNS[0]), first_order, None, problem=small,
                          poison_workspaces=fresh_poison, what=f"the T={t_small} call on a fresh pair, made again")
            return check.execute(instance, ws, out_for(t_large, fresh_poison), order, None,
                                 what=f"the T={t_large} call right after the T={t_small} call, made again")
        check.sub_batch = (small, small_alone)  # batch invariance's smaller batch (oracles/batch_invariance.py)
        comparisons = [(after_large, small_alone, t_large, t_small, small_again, large_then_small)]
        if diverged:  # otherwise after_small is bitwise the T call on its own (runs[0])
            comparisons.append((after_small, large_alone, t_small, t_large, large_again, small_then_large))
        for run, reference, earlier, t_call, alone_again, sequence_again in comparisons:
            c = check.first_bitwise_divergence(reference, run, "the same call, with or without an earlier call")
            if c is not None:
                check.findings.append(_divergence_finding(check, c, t_call, earlier, reference, alone_again,
                                                          sequence_again))
        # (3): on the fresh pair, a call of the small call's shape with other values
        other = replace(small, **tokens_of(check.problem, slice(t_large - t_small, t_large)))
        run = check.execute(fresh, fresh_ws, out_for(t_small, POISON_PATTERNS[0]), first_order, None, problem=other,
                            what=f"the T={t_small} call of the last {t_small} tokens right after calls of the first "
                                 f"{t_small} (same workspaces)")
        check.findings += other_values_findings(check, small, small_alone, other, run)
        # (4): SERIES_CALLS small calls on one more instance, one from another thread
        check.findings += series_findings(check)
        return []


def _divergence_finding(check: Check, c, t_call: int, earlier: int, reference: Run, alone_again, sequence_again) -> Finding:
    """The finding for a call that changed when an earlier call ran before it, after telling the
    two causes apart (issue 48: a kernel wrong one call in 40 was blamed on state): state carried
    between calls reproduces, the same two calls made again on a fresh instance diverging again,
    while the call on its own gives the same bytes twice; a nondeterministic implementation gives
    the same call different bytes (its call on its own made twice differs), or does not diverge
    again. Costs two calls more, made only on a divergence."""
    head = (f"{c.name} of a T={t_call} call changes when a T={earlier} call ran before it on the same implementation "
            f"and workspaces: {c.differing} of {c.total} elements differ from the call made on its own")
    figures = {"tokens": t_call, "earlier_tokens": earlier, **c.figures()}
    repeat = check.first_bitwise_divergence(reference, alone_again(), "the same call, made twice on its own")
    if repeat is not None:
        return Finding(
            oracle=Oracles.CALL_SEQUENCE, stage=producer_stage(check.config, repeat.name), buffers=[c.name],
            message=f"{head}; but the call made on its own twice, each on a fresh instance and fresh workspaces, "
                    f"differs too ({repeat.name}: {repeat.differing} of {repeat.total} elements): the implementation "
                    "is nondeterministic (the same call twice gives different bytes), which says nothing of state "
                    "carried between calls",
            figures={**figures, "cause": "nondeterministic", "repeat_differing": repeat.differing})
    again = check.first_bitwise_divergence(reference, sequence_again(), "the same two calls, made again")
    if again is None:
        return Finding(
            oracle=Oracles.CALL_SEQUENCE, stage=producer_stage(check.config, c.name), buffers=[c.name],
            message=f"{head}; but the same two calls made again on a fresh instance and fresh workspaces give the "
                    "call's own bytes: the divergence does not reproduce, so the implementation is nondeterministic "
                    "(the same call twice gives different bytes), not carrying state between calls",
            figures={**figures, "cause": "nondeterministic", "reproduced": False})
    return Finding(
        oracle=Oracles.CALL_SEQUENCE, stage=producer_stage(check.config, c.name), buffers=[c.name],
        message=f"{head} (state left by the earlier call: stale rows, scales or private buffers; the two calls made "
                "again on a fresh instance diverge again, and the call on its own gives the same bytes twice)",
        figures={**figures, "cause": "state", "reproduced": True})


def other_values_findings(check: Check, earlier: Problem, earlier_run: Run, other: Problem, run: Run) -> list[Finding]:
    """(3) of CallSequence.finish: `run`, a call of `other` (the shape of `earlier`, other values)
    made after calls of `earlier` on the same instance, judged against its own reference: by the
    differential (on a check of `other`: every stage on the candidate's own inputs, then the
    output within the derived bound; unless the differential has already found the T call
    diverging from its reference), and, tolerance-free, its output must not be bitwise the
    earlier call's where the two references' outputs differ beyond the table's end-to-end output
    rule (an implementation that reports no intermediates gives the differential nothing to
    derive a bound from; a result kept from the earlier call still shows)."""
    from diffmoe.check.execution import Check as CheckOf, reference_moe
    from diffmoe.oracles.differential import Differential

    t = other.num_tokens
    what = (f"a T={t} call of other values (the last {t} tokens), made after calls of the same shape (the first "
            f"{t} tokens) on the same instance and workspaces")
    judge = CheckOf(check.config, check.factory, [Oracles.DIFFERENTIAL], check.schedules, check.device, check.name,
                    problem=other)
    # where the T call already diverges from its reference the differential has said so: judged
    # again here, those divergences would come back under this oracle's name (seen on Liger and
    # lmdeploy judged under another numerics profile), telling nothing about earlier calls
    if not any(f.oracle == Oracles.DIFFERENTIAL for f in check.findings):
        found = Differential().judge_run(judge, run, first=True)
        for f in found:
            f.oracle = Oracles.CALL_SEQUENCE
            f.message = f"{what}, does not match its own reference: {f.message}"
        if found:
            return found
    references = compare(Buffers.OUTPUT, reference_moe(earlier).output, judge.reference.output,
                         rule_for(check.config.quant, Buffers.OUTPUT, END_TO_END, backend=check.tolerance_backend))
    same = compare(Buffers.OUTPUT, earlier_run.output, run.output, Rule.bitwise("the same output for other inputs"))
    if references.ok or not same.ok:
        return []
    return [Finding(
        oracle=Oracles.CALL_SEQUENCE, stage=Stages.REDUCE, buffers=[Buffers.OUTPUT],
        message=f"{what}, returned bitwise the earlier call's output, though the two references' outputs differ in "
                f"{references.differing} of {references.total} elements beyond the end-to-end output rule: a result "
                "kept from an earlier call of the same shape, not computed from this call's inputs",
        figures={"tokens": t, "reference_elements_differing": references.differing},
    )]
