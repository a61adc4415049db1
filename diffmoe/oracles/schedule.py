"""The schedule oracle: a result must not depend on the order program instances run in.

Owns the comparison of every later order's run with the first, bitwise. The runs themselves
are the runner's (and the last one may be call-sequence's, see call_sequence.py); the order is
applied by the implementation (an order table, `orders_programs`) or, under the interpreter, at
the grid loop by diffmoe.interpreter.grid_order (execution.Check.program_order).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from diffmoe.findings import Finding, Oracles
from diffmoe.problem.vocabulary import producer_stage
from diffmoe.oracles.base import Oracle

if TYPE_CHECKING:
    from diffmoe.check.execution import Check


class ScheduleOracle(Oracle):
    name = Oracles.SCHEDULE
    checks = "order independence"
    how = ("identity, reversed and `random_orders` seeded-random program orders (default 2, seeds seed+1, seed+2, ...) "
           "must give bitwise the same buffers as the first order; every order after the first runs on a fresh instance "
           "built with poisoned private buffers (torch's `fill_uninitialized_memory`: NaN floats, the largest integers), "
           "so state a run leaves in a private scale or id buffer cannot mask a wrong order. The differential judges the "
           "first order's run; a later order that computes something else is reported here, as an order dependence")
    rank = 70

    def finish(self, check: Check) -> list[Finding]:
        runs = check.runs
        if len(runs) < 2:
            return []
        base = runs[0]
        found = []
        for other in runs[1:]:
            c = check.first_bitwise_divergence(base, other, "the same inputs under another program order")
            if c is not None:
                found.append(Finding(
                    oracle=Oracles.SCHEDULE, stage=producer_stage(check.config, c.name), buffers=[c.name],
                    message=f"{c.name} changes with the program order: {base.schedule} vs {other.schedule} "
                            f"differ in {c.differing} of {c.total} elements (first divergent buffer)",
                    figures={"schedules": [str(base.schedule), str(other.schedule)], **c.figures()},
                ))
        return found
