"""`diffmoe check`: one config through every oracle (or --oracles), its report printed; the exit status
its verdict.

Owns check's arguments and the handler; must not judge anything itself (diffmoe.judge.runner's
run_differential does).
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from diffmoe.contract import ConfigRefused, Schedule
from diffmoe.frontends.config_flags import _add_config_options, config_from_args
from diffmoe.frontends.exits import EXIT_FINDINGS, EXIT_INTERNAL, EXIT_OK, PROG, UsageError, _sigterm_interrupts
from diffmoe.frontends.flags import (
    _add_impl_option, _add_isolation_option, _isolation_kwargs, _non_negative_int, _oracle_registry, _time_limit, parse_device,
    parse_oracles,
    time_limit_kwargs,
)
from diffmoe.frontends.implementation import _runner, load_implementation
from diffmoe.frontends.output import _print_json, implementation_output_to_stderr

NAME = "check"

# Printed on stderr before a check that runs in this process (no worker to outlive it).
IN_PROCESS_NOTICE = (f"{PROG}: running in process (no time limit): an implementation that ends the process from "
                     f"below Python (C's exit(), a signal) ends {PROG} with its status; trust exit 0 only with the "
                     "report printed")


def parse_schedules(texts: Sequence[str] | None) -> list[Schedule] | None:
    if not texts:
        return None
    try:
        return [Schedule.parse(t) for t in texts]
    except (TypeError, ValueError) as exc:
        raise UsageError(str(exc)) from None


def add_parser(sub) -> argparse.ArgumentParser:
    check = sub.add_parser(NAME, help="run one config through every oracle", description="Run one config through every oracle.")
    _add_config_options(check)
    _add_impl_option(check)
    check.add_argument("--schedule", action="append", metavar="identity|reversed|random:SEED", help="program order (repeatable; default identity, reversed and --random-orders random ones)")
    check.add_argument("--oracles", metavar="A,B", help="oracles to run (default every one): "
                            f"{', '.join(_oracle_registry().ALL_ORACLES)}")
    check.add_argument("--device", help="torch device (default: the implementation's)")
    check.add_argument("--time-limit", type=_time_limit, metavar="S",
                       help="stop the check with a timeout finding when it makes no progress (no launch) for S seconds (0: no limit; default 120 on the interpreter, none on CUDA)")
    _add_isolation_option(check)
    check.add_argument("--json", action="store_true", help="print the report as one JSON object (its launches included)")
    check.add_argument("--launches", action="store_true",
                       help="after the report, every launch of the first program order's run: its stage, the buffers it "
                            "read and wrote, and why it has that stage")
    check.add_argument("--sample-programs", type=_non_negative_int, metavar="N",
                       help="run a chosen few of each Triton launch's programs, for production shapes: every corner of "
                            "the grid, its first and last two, and N more drawn from --sample-seed; the differential "
                            "judges the elements they wrote (interpreter only; docs/models.md)")
    check.add_argument("--sample-seed", type=_non_negative_int, metavar="S", help="the seed of --sample-programs' draw (default 0)")
    check.set_defaults(handler=run)
    return check


def _sample(args: argparse.Namespace, config, schedules, oracles):
    """The check's ProgramSample, or None; a UsageError for what a sampled check cannot take."""
    if args.sample_programs is None:
        if args.sample_seed is not None:
            raise UsageError("--sample-seed needs --sample-programs")
        return None
    from diffmoe.interpreter.program_sample import ProgramSample

    sample = ProgramSample(seed=args.sample_seed or 0, seeded=args.sample_programs)
    try:
        _runner().sampled_selection(sample, config, schedules, oracles)
    except (TypeError, ValueError) as exc:
        raise UsageError(f"--sample-programs: {exc}") from None
    return sample


def run(args: argparse.Namespace) -> int:
    config = config_from_args(args)
    if args.sample_programs is not None and args.nan_rows is None:
        config = config.replace(nan_rows=0)  # a sampled check has no NaN token (runner.sampled_selection says why)
    schedules = parse_schedules(args.schedule)
    oracles = parse_oracles(args.oracles)
    device = parse_device(args.device)  # every argument checked before the implementation loads (issue 48)
    sample = _sample(args, config, schedules, oracles)
    factory, name = load_implementation(args.impl, args.isolation)
    runner = _runner()
    limit = time_limit_kwargs(runner, args.time_limit, device)
    if not limit:
        print(IN_PROCESS_NOTICE, file=sys.stderr, flush=True)
    # SIGTERM as Ctrl-C: KeyboardInterrupt in the waiting parent, whose run_in_worker stops and
    # reaps the worker's process group on the way out (the worker has its own group, so the
    # default SIGTERM would leave it running); main() then prints one line and returns 130.
    try:
        with _sigterm_interrupts(), implementation_output_to_stderr():
            report = runner.run_differential(
                config, factory, schedules=schedules, oracles=oracles, device=device, implementation_name=name, **limit,
                **_isolation_kwargs(args), **({"sample": sample} if sample is not None else {}),
            )
    except ConfigRefused as exc:  # the implementation's `supports` said no: a usage error, one line
        raise UsageError(f"{exc} (its `supports`; choose a config it runs)") from None
    if args.json:
        _print_json(report.to_dict())
    else:
        print(report.render())
        if args.launches:
            print(report.render_launches())
    if not report.passed:
        return EXIT_FINDINGS
    # an oracle named with --oracles that could not run: that part was not judged, so no 0
    asked = [name for name in (oracles or ()) if name in report.skipped]
    if asked:
        print(f"{PROG}: not judged: " + "; ".join(f"{n} ({report.skipped[n]})" for n in asked), file=sys.stderr)
        return EXIT_INTERNAL
    return EXIT_OK
