"""`DifferentialRun`: one check's phases (diffmoe/judge/runner.py's docstring), each active
oracle's hooks called in turn.

Apart from runner.py, which a module beside a factory imports (and so the candidate's process):
this one imports the oracles, which the candidate's process refuses (issue 43).

Owns the order of a check's phases; must not judge anything itself (the oracles do).
"""

from __future__ import annotations

import torch

from diffmoe.contract import ImplementationFactory, Schedule
from diffmoe.check.execution import Check, ProgressCallback
from diffmoe.check.guards import POISON_PATTERNS
from diffmoe.oracles.call_sequence import makes_last_order_run
from diffmoe.oracles.registry import active_oracles
from diffmoe.oracles.static_aliasing import check_workspace_fit
from diffmoe.problem.config import MoEConfig
from diffmoe.problem.inputs import Problem


class DifferentialRun(Check):
    """One check: the phases of the module docstring, each oracle's hooks called in turn."""

    def __init__(self, config: MoEConfig, factory: ImplementationFactory, oracles: list[str],
                 schedules: list[Schedule], device: torch.device, name: str,
                 problem: Problem | None = None, progress: ProgressCallback | None = None, candidate=None,
                 sample=None):
        super().__init__(config, factory, oracles, schedules, device, name, problem, progress,
                         active=active_oracles(oracles), candidate=candidate, sample=sample)

    def run(self) -> None:
        cfg = self.config
        impl = self.impl = self.build(cfg)
        t = self.problem.num_tokens
        plan = self.plan = self.workspace_plan(impl, t)
        # workspaces are allocated once for the largest batch, as an engine does; the plan is the call's
        shapes = self.shapes = self.workspace_shapes(impl, cfg.num_tokens)
        for oracle in self.active:
            self.findings += oracle.judge_plan(self, plan)
        fit = check_workspace_fit(plan, shapes)
        if fit:
            self.findings += fit  # an undersized workspace is reported before any launch
            return
        guarded = self.guarded = self.allocate(shapes, f"workspace_shapes({cfg.num_tokens})")
        output = None
        if cfg.output == "separate":
            output = self.output = self.new_output(t)
        # With call-sequence running, the last order's run is made by that oracle, on a fresh
        # instance right after a smaller call (oracles/call_sequence.py): one run serves both.
        self.sequenced = makes_last_order_run(self)
        merged = self.sequenced and len(self.schedules) >= 2
        for index, schedule in enumerate(self.schedules[:-1] if merged else self.schedules):
            # every order after the first on a fresh instance: state the first run left in a
            # private buffer must not mask a wrong order in the next
            instance = impl if index == 0 else self.build(cfg)
            run = self.execute(instance, guarded, output, schedule, POISON_PATTERNS[0],
                               attribute_input_writes=index == 0, record_addresses=index == 0)
            if self.sample is not None:  # the same programs over another poison: what they wrote is what both agree on
                other = self.execute(self.build(cfg), guarded, output, schedule, POISON_PATTERNS[1],
                                     what="the sampled run's second poison")
                self.settle_unsampled(run, other)
            self.runs.append(run)
            self.findings += self.judge_run(run, first=index == 0)
        for oracle in self.active:
            self.findings += oracle.finish(self)
        for oracle in self.active:
            self.findings += oracle.after_finish(self)
