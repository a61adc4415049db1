"""`diffmoe plan`: the implementation's workspace plan for one config, its overlaps (the static
aliasing check) as a table, and with --png a picture.

Owns plan's arguments and the handler; the table and the picture are diffmoe/frontends/plan_view.py's,
the judgement diffmoe/oracles/static_aliasing.py's.
"""

from __future__ import annotations

import argparse
import sys

from diffmoe.contract import WorkspacePlan, factory_plan
from diffmoe.frontends.config_flags import _add_config_options, config_from_args
from diffmoe.frontends.exits import EXIT_FINDINGS, EXIT_OK, PROG, UsageError, _one_line
from diffmoe.frontends.flags import _add_impl_option, _check_writable
from diffmoe.frontends.implementation import default_factory, load_implementation, refuse_unsupported
from diffmoe.frontends.output import implementation_output_to_stderr

NAME = "plan"


def add_parser(sub) -> argparse.ArgumentParser:
    plan = sub.add_parser(NAME, help="show the workspace plan and its overlaps", description="Show the workspace plan and its overlaps.")
    _add_config_options(plan)
    _add_impl_option(plan)
    plan.add_argument("--png", metavar="FILE", help="also draw the two workspaces to a PNG file")
    plan.set_defaults(handler=run)
    return plan


def run(args: argparse.Namespace) -> int:
    config = config_from_args(args)
    if args.png is not None:
        _check_writable(args.png, "--png")  # before the implementation loads (issue 48)
    factory, name = load_implementation(args.impl)  # an --impl that cannot be loaded: a usage error, exit 2
    refuse_unsupported(factory, name, config)  # not "the implementation's plan failed" (exit 1): nothing to judge
    try:
        with implementation_output_to_stderr():
            # asked through the contract: the factory's cheap `plan_workspaces` where it has one, else built
            plan = factory_plan(factory if factory is not None else default_factory(), config)
    except Exception as exc:  # noqa: BLE001 - the implementation's fault, not the harness's: a finding
        print(f"{PROG}: the implementation's plan failed: {type(exc).__name__}: {_one_line(str(exc))}", file=sys.stderr)
        return EXIT_FINDINGS
    if not isinstance(plan, WorkspacePlan):
        print(f"{PROG}: the implementation's plan must be a diffmoe.contract.WorkspacePlan, got {type(plan).__name__}",
              file=sys.stderr)
        return EXIT_FINDINGS
    from diffmoe.frontends.plan_view import draw_plan_png, render_plan
    from diffmoe.oracles.static_aliasing import check_static_aliasing

    findings = check_static_aliasing(plan)
    print(f"config: {config.short()}")
    print(render_plan(plan, findings))
    if args.png is not None:
        try:
            draw_plan_png(plan, findings, args.png)
        except OSError as exc:
            raise UsageError(f"--png {args.png}: {exc.strerror or exc}") from None
        print(f"picture: {args.png}")
    return EXIT_FINDINGS if findings else EXIT_OK
