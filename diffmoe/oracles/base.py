"""The one interface every oracle implements, and the order a check calls it in.

An oracle is a class with a `name` (as findings and `--oracles` spell it), a line for the
oracle table (docs/oracles.md) (`checks`, `how`) and the hooks it takes part in. Each hook receives the check
(`diffmoe.check.execution.Check`: the config, the problem, the reference's results, the first
instance and its workspaces, and the services to build and run the implementation again) and
returns its findings. A check calls the hooks in this order:

  1. `judge_plan(check, plan)`     the declared plan, before anything runs;
  2. `judge_run(check, run, first)` each program order's run, right after it (`first`: the
     first order's; `run.addresses` holds the interpreter's per-program address record when an
     active oracle set `records_addresses`);
  3. `finish(check)`               once every order ran (`check.runs`): oracles that compare
     runs, and oracles that run the implementation again (their own calls, stages, siblings).
  4. `after_finish(check)`         once every `finish` ran: what the calls the oracles made showed.
  `after_crash(check)` instead of the hooks not yet called when a crash ends the check: what an
  oracle saw before it (the bounds oracle's refused accesses, which often lead to the crash).
  `warnings(check)`              last, crash or not: lines the report carries that are not
     findings and change no verdict (the overflow oracle's offsets near 2^31).

Within one hook, oracles run in ascending `rank`, which fixes the order their findings come
in a report: how memory was used (races, stray stores, guard bytes, the contract, aliasing)
before the values computed in it, the way an engineer debugs. The registry
(`diffmoe/oracles/registry.py`) lists the oracles in the order users see them.

An oracle must not raise for the implementation's faults: a `diffmoe.check.execution.Crash` from a
rerun is caught by the check (its finding reported) unless the oracle catches it itself.
Adding an oracle: one module under `diffmoe/oracles/` with one subclass, and one row in the
registry.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from diffmoe.contract import WorkspacePlan
from diffmoe.findings import Finding

if TYPE_CHECKING:
    from diffmoe.check.execution import Check, Run


class Oracle:
    name: ClassVar[str]
    checks: ClassVar[str]  # docs/oracles.md: what it checks, a few words
    how: ClassVar[str]  # docs/oracles.md: how
    rank: ClassVar[int]  # order of findings within one hook (see the module docstring)
    records_addresses: ClassVar[bool] = False  # needs the interpreter's address recorder on the first run

    def judge_plan(self, check: Check, plan: WorkspacePlan) -> list[Finding]:
        return []

    def judge_run(self, check: Check, run: Run, first: bool) -> list[Finding]:
        return []

    def finish(self, check: Check) -> list[Finding]:
        return []

    def after_finish(self, check: Check) -> list[Finding]:
        """Once every oracle's `finish` ran: what the calls they made showed (the bounds oracle)."""
        return []

    def after_crash(self, check: Check) -> list[Finding]:
        """Findings to report before a crash that ended the check (what led up to it)."""
        return []

    def warnings(self, check: Check) -> list[str]:
        """What the report should say that is no finding (never changes the verdict)."""
        return []
