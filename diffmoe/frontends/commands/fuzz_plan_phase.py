"""The static first phase of `diffmoe fuzz` (the whole fuzz with --tier plan): the plan tier run before
any execution, whether its outcome ends the fuzz, and how that outcome is printed. Not a command: part
of commands/fuzz.py.

Owns when the plan tier runs and its summary; must not judge a plan (diffmoe/fuzz/plan_tier.py does).
"""

from __future__ import annotations

import json
import random
import sys

from diffmoe.check.report import check_command
from diffmoe.frontends.commands.fuzz_output import ProgressPrinter, _save_failure
from diffmoe.frontends.exits import EXIT_FINDINGS, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, PROG, UsageError
from diffmoe.frontends.output import _print_json


def _plan_phase(args, factory, name, seed: int | None):
    """The static first phase of a fuzz (every tier; the whole fuzz with --tier plan): the plan
    tier's outcome, or None when it does not run (--plan-examples 0, no cheap plan)."""
    from diffmoe.contract import PLAN_WORKSPACES, factory_attribute
    from diffmoe.fuzz.plan_tier import fuzz_plans

    only = args.tier == "plan"
    count = args.max_examples if only else args.plan_examples
    if count and not only and args.keep_going > 1:
        # the plan tier stops at its first finding: it cannot collect distinct failures. It draws
        # within field bounds and searches past waived findings (issue 48: `--quant bf16 --unfused`
        # turned it off, though it found a planted overlap in 0.13 s that the execution tier took 7 s for).
        print(f"{PROG}: fuzz: no plan tier with --keep-going (the execution tier judges each example's plan)",
              file=sys.stderr)
        return None
    if count == 0:
        return None
    if factory is not None and factory_attribute(factory, PLAN_WORKSPACES) is None:
        if only:
            raise UsageError(f"--tier plan: {name} declares no cheap plan (a {PLAN_WORKSPACES} attribute on its factory, "
                             "see diffmoe/contract.py)")
        print(f"{PROG}: fuzz: no plan tier for {name} (its factory has no {PLAN_WORKSPACES} attribute)", file=sys.stderr)
        return None
    plan_seed = seed if seed is not None else random.SystemRandom().randrange(2**32)
    printer = ProgressPrinter(sys.stderr, total=count, label="fuzz plans", json_lines=args.json)
    outcome = None
    try:
        outcome = fuzz_plans(max_examples=count, seed=plan_seed, planner=args.planner, implementation=factory,
                             implementation_name=name, progress=printer, bounds=getattr(args, "bounds", None),
                             waive=getattr(args, "waivers", None) or None)
        if only and not outcome.examples and not outcome.interrupted:
            # nothing judged is no pass (exit codes never lie): it was "0 configs, no finding", exit 0
            raise UsageError(f"--tier plan: no plan of {name} was judged ({'; '.join(outcome.notes)})")
        return outcome
    finally:
        printer.finish(None if outcome is None else outcome.examples)


def _plan_decides(args, outcome) -> bool:
    """Whether the plan tier's outcome ends the fuzz (a finding, an interrupt, --tier plan)."""
    return outcome is not None and (args.tier == "plan" or outcome.report is not None or outcome.interrupted)


def _finish_plan(args, outcome, name) -> int:
    """Print the plan tier's outcome when it ended the fuzz; its exit code."""
    report = outcome.report
    if args.json:
        data = {"tier": "plan", "plan_tier": outcome.to_dict()}
        if report is not None:
            data["config"] = report.config.to_dict()
            data["replay"] = check_command(report.config, name)
        _print_json(data)
    else:
        print(_plan_summary(outcome))
        if report is not None:
            print("minimal failing config:")
            print(json.dumps(report.config.to_dict(), indent=2, sort_keys=True))
            print(report.render())
    if report is not None:
        return EXIT_USAGE if _save_failure(args, report) is not None else EXIT_FINDINGS
    return EXIT_INTERRUPTED if outcome.interrupted else EXIT_OK


def _plan_summary(outcome) -> str:
    rate = outcome.configs_per_second
    head = (f"plan tier (seed {outcome.seed}): {outcome.generated_examples} config{'s' if outcome.generated_examples != 1 else ''}"
            f" in {outcome.seconds:.2f} s" + (f" ({rate:,.0f} configs/s)" if rate else ""))
    if outcome.report is None:
        return head + (", interrupted, no finding so far" if outcome.interrupted else ", no finding")
    return head + f"; first failure after {outcome.seconds_to_first_failure:.3f} s, shrunk in {outcome.shrink_examples} steps"
