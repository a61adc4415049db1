"""`diffmoe fuzz`: draw configs until one fails, then shrink it; the plan tier first, then the execution
tier, in this process or as Ray tasks.

Owns fuzz's arguments, their checks (all before the implementation loads, issue 48) and the handler;
its field bounds and waivers are commands/fuzz_controls.py's, the plan tier's phase
commands/fuzz_plan_phase.py's, its progress and summary commands/fuzz_output.py's. Must not search or
judge itself (diffmoe.fuzz does).
"""

from __future__ import annotations

import argparse
import json
import random
import sys

from diffmoe.problem.config import MAX_SEED, MAX_TOKENS, PLANNERS
from diffmoe.check.report import check_command
from diffmoe.findings import Oracles
from diffmoe.frontends.commands.fuzz_controls import (
    _add_fuzz_controls, _bounds_leave_a_supported_config, fuzz_bounds, fuzz_waivers,
)
from diffmoe.frontends.commands.fuzz_output import ProgressPrinter, _fuzz_summary, _save_failure
from diffmoe.frontends.commands.fuzz_plan_phase import _finish_plan, _plan_decides, _plan_phase, _plan_summary
from diffmoe.frontends.exits import (
    EXIT_FINDINGS, EXIT_INTERNAL, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, PROG, UsageError, _sigterm_interrupts,
)
from diffmoe.frontends.flags import (
    _add_impl_option, _add_isolation_option, _check_writable, _isolation_kwargs, _non_negative_int, _positive_int,
    _time_limit, parse_device, parse_oracles, time_limit_kwargs,
)
from diffmoe.frontends.implementation import _runner, load_implementation
from diffmoe.frontends.output import _print_json, implementation_output_to_stderr

NAME = "fuzz"

DEFAULT_FUZZ_EXAMPLES = 100  # execution-tier examples of a fuzz
# One search in this process: more workers start a local Ray runtime, 10 to 17 s on a loaded 2-core
# machine (measured 2026-12-05), longer than a short fuzz; --workers N asks for them (diffmoe/fuzz/workers.py).
DEFAULT_FUZZ_WORKERS = 1
DEFAULT_PLAN_EXAMPLES = 10_000  # plans of the static first phase: about a second (bench/bench_plan_tier.py)
DEFAULT_FUZZ_MAX_TOKENS = 96  # diffmoe.fuzz.strategies.DEFAULT_MAX_TOKENS (not imported: it pulls in hypothesis)


def add_parser(sub) -> argparse.ArgumentParser:
    fz = sub.add_parser(NAME, help="draw configs until one fails, then shrink it", description="Draw configs until one fails, then shrink it.")
    fz.add_argument("--max-examples", type=_positive_int, default=None, metavar="N",
                    help=f"configs drawn in the generate phase (default {DEFAULT_FUZZ_EXAMPLES}; with --tier plan, plans, default {DEFAULT_PLAN_EXAMPLES * 10}); the shrinking runs after a failure, a database replay and metamorphic sibling runs are not counted in N")
    fz.add_argument("--tier", choices=("run", "full", "plan"), default="run",
                    help="run (default): most examples judged by a cheap oracle set, every 8th, every failure and the shrinking by all; full: every oracle on every example; plan: only the static plan tier (no execution). run and full start with --plan-examples plans")
    fz.add_argument("--plan-examples", type=_non_negative_int, default=DEFAULT_PLAN_EXAMPLES, metavar="N",
                    help=f"plans the static first phase judges before any execution (default {DEFAULT_PLAN_EXAMPLES}, about a second; 0: none)")
    fz.add_argument("--no-shrink", action="store_true", help="report the first failing example as found, unshrunk")
    fz.add_argument("--seed", type=_non_negative_int, metavar="S", help="fuzzing seed (default: a fresh one, printed)")
    fz.add_argument("--planner", choices=PLANNERS, default="fixed", help="planner of every drawn config (default fixed)")
    _add_impl_option(fz)
    fz.add_argument("--max-tokens", type=_positive_int, default=None, metavar="T", help="largest T drawn (default 96; or bound T with --tokens)")
    fz.add_argument("--max-experts", type=_positive_int, default=None, metavar="E", help="largest E drawn (default 64; or bound E with --experts)")
    fz.add_argument("--oracles", metavar="A,B", help="oracles to run (default every one, in tiers: docs/fuzzing.md)")
    fz.add_argument("--special-rows", action=argparse.BooleanOptionalAction, default=True,
                    help="draw all-zero (padding), NaN and Inf token rows (default: zero rows in about half the examples, NaN and Inf in an eighth each)")
    fz.add_argument("--model-features", action="store_true", help="also draw the SwiGLU limit, dropped slots (-1 ids) and shared experts")
    fz.add_argument("--device", help="torch device (default: the implementation's)")
    fz.add_argument("--time-limit", type=_time_limit, metavar="S",
                    help="per-example limit on seconds without progress (no launch), past it a timeout finding (0: no limit; default 120 on the interpreter, none on CUDA)")
    fz.add_argument("--database", metavar="DIR|redis://HOST:PORT/N",
                    help="Hypothesis example database, a folder or a Redis server shared by several machines: failures are saved there and replayed first next time (not with --seed; default $DIFFMOE_HYPOTHESIS_DB when set and no --seed is given)")
    fz.add_argument("--workers", type=_positive_int, default=None, metavar="N",
                    help="searches running the execution tier, sharing the database and splitting --max-examples, each a Ray task when N > 1 (default 1: this process)")
    fz.add_argument("--cluster", metavar="local|auto|ray://HOST:PORT",
                    help="where --workers N > 1 runs its searches: local (a Ray runtime started here, the default), auto (the running cluster this machine is in), ray://HOST:PORT or HOST:PORT (that cluster)")
    fz.add_argument("--runtime-env", metavar="JSON",
                    help="Ray's runtime environment for the searches' tasks, a JSON object (env_vars, working_dir, py_modules, ...: what the implementation needs on the nodes; used with --workers N > 1)")
    _add_isolation_option(fz)
    fz.add_argument("--json", action="store_true", help="print the outcome as one JSON object")
    fz.add_argument("--save-failure", metavar="FILE.json", help="write the minimal failing config here (replay with check --config)")
    _add_fuzz_controls(fz)
    fz.set_defaults(handler=run)
    return fz


def run(args: argparse.Namespace) -> int:
    from diffmoe.cluster.tasks import MAX_WORKERS
    from diffmoe.fuzz.request import MAX_EXAMPLES_LIMIT, MAX_KEEP_GOING
    from diffmoe.fuzz.profiles import SHARED_DATABASE_ENV, shared_database_path
    from diffmoe.fuzz.plan_tier import MAX_PLAN_EXAMPLES
    from diffmoe.fuzz.strategies import MAX_EXPERTS as FUZZ_MAX_EXPERTS

    if args.max_examples is None:
        args.max_examples = DEFAULT_PLAN_EXAMPLES * 10 if args.tier == "plan" else DEFAULT_FUZZ_EXAMPLES
    # Checked here so a bad value is a usage error, before any example runs.
    if args.tier == "plan" and args.max_examples > MAX_PLAN_EXAMPLES:
        raise UsageError(f"--max-examples must be in [1, {MAX_PLAN_EXAMPLES}] with --tier plan, got {args.max_examples}")
    if args.plan_examples > MAX_PLAN_EXAMPLES:
        raise UsageError(f"--plan-examples must be in [0, {MAX_PLAN_EXAMPLES}], got {args.plan_examples}")
    if args.tier != "plan" and args.max_examples > MAX_EXAMPLES_LIMIT:
        raise UsageError(f"--max-examples must be in [1, {MAX_EXAMPLES_LIMIT}], got {args.max_examples}")
    bounds = fuzz_bounds(args)
    waivers = fuzz_waivers(args)
    # --tokens / --experts bound T and E themselves: with them, --max-T/E would be a second bound
    for field, flag, limit in (("num_tokens", "tokens", "max_tokens"), ("num_experts", "experts", "max_experts")):
        if field in bounds.ranges and getattr(args, limit) is not None:
            raise UsageError(f"--{flag} and --{limit.replace('_', '-')} cannot be combined: --{flag} LO..HI bounds it alone")
    if args.max_tokens is None:
        args.max_tokens = MAX_TOKENS if "num_tokens" in bounds.ranges else DEFAULT_FUZZ_MAX_TOKENS
    if args.max_experts is None:
        args.max_experts = FUZZ_MAX_EXPERTS
    if args.max_tokens > MAX_TOKENS:
        raise UsageError(f"--max-tokens must be in [1, {MAX_TOKENS}], got {args.max_tokens}")
    if args.max_experts > FUZZ_MAX_EXPERTS:
        raise UsageError(f"--max-experts must be in [1, {FUZZ_MAX_EXPERTS}], got {args.max_experts}")
    if args.keep_going > MAX_KEEP_GOING:
        raise UsageError(f"--keep-going must be in [1, {MAX_KEEP_GOING}], got {args.keep_going}")
    if args.keep_going > 1 and args.workers is not None and args.workers > 1:
        raise UsageError(f"--keep-going {args.keep_going} runs in one process: it cannot be combined with --workers "
                         f"{args.workers} (give --workers 1, or leave --workers out)")
    if args.keep_going > 1:
        args.workers = 1
    args.bounds, args.waivers = bounds, waivers  # the plan tier draws within the one, past the other
    bounded = None
    if bounds and args.tier != "plan":
        from diffmoe.fuzz.strategies import moe_configs

        try:  # the bounds together (and with the other flags): an empty combination is a usage error now
            bounded = moe_configs(planner=args.planner, max_tokens=args.max_tokens, max_experts=args.max_experts,
                                  special_rows=args.special_rows, features=args.model_features, bounds=bounds)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    if args.tier == "plan" and (bounds or waivers or args.keep_going > 1):
        raise UsageError("--tier plan draws its own plan domain: field bounds, --waive and --keep-going apply to the run "
                         "and full tiers")
    if args.seed is not None and args.seed > MAX_SEED:
        raise UsageError(f"--seed must be in [0, {MAX_SEED}], got {args.seed}")
    if args.workers is None:
        args.workers = DEFAULT_FUZZ_WORKERS
    if args.workers > MAX_WORKERS:
        raise UsageError(f"--workers must be in [1, {MAX_WORKERS}], got {args.workers}")
    if args.database is not None:
        if args.seed is not None:
            raise UsageError("--seed and --database cannot be combined: a seeded run is reproducible and replays no stored failure")
        _check_database(args.database, reach=False)
    args.runtime_env = _runtime_env(args.runtime_env)
    if args.save_failure is not None:
        _check_writable(args.save_failure)  # before the first example, not after the whole fuzz
    device = parse_device(args.device)
    oracles = parse_oracles(args.oracles)
    # Every check above reads the arguments alone (issue 48: a conflicting pair was refused only after
    # the implementation loaded, 27 s under load); those below ask a cluster, a database server or the
    # implementation itself.
    if args.cluster is not None or args.workers > 1:
        from diffmoe.cluster.tasks import checked_cluster

        try:  # Ray importable and an address answering, before any example: None where it runs in process
            args.cluster = checked_cluster(args.cluster, args.workers)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    shared = shared_database_path()
    if args.database is None and args.seed is None and shared:
        args.database = shared  # as the pytest profiles use it; an explicit --seed or --database wins
        print(f"{PROG}: fuzz: example database {shared} (from {SHARED_DATABASE_ENV})", file=sys.stderr)
    if args.database is not None:
        _check_database(args.database)  # a server that does not answer: exit 2 before any example runs
    factory, name = load_implementation(args.impl, args.isolation)
    if args.tier != "plan":
        if bounded is None:  # no bounds: a factory that refuses every default draw is the same usage error (issue 43)
            from diffmoe.fuzz.strategies import moe_configs

            bounded = moe_configs(planner=args.planner, max_tokens=args.max_tokens, max_experts=args.max_experts,
                                  special_rows=args.special_rows, features=args.model_features)
        _bounds_leave_a_supported_config(bounded, bounds, factory, name)
    # A seed is always chosen and printed, so any run can be repeated exactly; except with a
    # database, whose replays a seed would turn off.
    if args.database is not None:
        seed = None
    else:
        seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**32)
    limit = time_limit_kwargs(_runner(), args.time_limit, device).get("time_limit")
    from diffmoe.fuzz.request import FuzzRequest  # here: `diffmoe --help` imports no Hypothesis
    printer = ProgressPrinter(sys.stderr, total=args.max_examples, json_lines=args.json)  # the execution tier's
    outcome = None
    try:
        with _sigterm_interrupts(), implementation_output_to_stderr():
            plan_outcome = _plan_phase(args, factory, name, seed)
            outcome = None if _plan_decides(args, plan_outcome) else _fuzz_runner(args)(
                workers=args.workers,
                progress=printer,
                request=FuzzRequest(
                    max_examples=args.max_examples,
                    seed=seed,
                    planner=args.planner,
                    implementation=factory,
                    implementation_name=name,
                    max_tokens=args.max_tokens,
                    max_experts=args.max_experts,
                    oracles=oracles,
                    device=device,
                    database=args.database,
                    time_limit=limit,
                    special_rows=args.special_rows,
                    features=args.model_features,
                    tier=args.tier,
                    shrink=not args.no_shrink,
                    bounds=bounds or None,
                    waive=waivers or (),
                    keep_going=args.keep_going,
                    **_isolation_kwargs(args),
                ),
            )
    finally:
        printer.finish(None if outcome is None else outcome.examples)

    if outcome is None:
        return _finish_plan(args, plan_outcome, name)
    if plan_outcome is not None and not args.json:
        print(_plan_summary(plan_outcome))
    report = outcome.report
    if args.json:
        data = {"tier": args.tier, **outcome.to_dict()}
        if plan_outcome is not None:
            data["plan_tier"] = plan_outcome.to_dict()
        if report is not None:
            data["config"] = report.config.to_dict()
            data["replay"] = check_command(report.config, name)
        _print_json(data)
    else:
        print(_fuzz_summary(outcome, args.max_examples, args.database))
        failures = list(zip(outcome.failures, outcome.failure_keys)) if args.keep_going > 1 else []
        if failures:
            for n, (failed, keys) in enumerate(failures, 1):
                print(f"failure {n} of {len(failures)} ({', '.join(keys) or 'no new key'}), minimal failing config:")
                print(json.dumps(failed.config.to_dict(), indent=2, sort_keys=True))
                print(failed.render())
        elif report is not None:
            # a shrink Hypothesis cut short is not minimal: the header must not say it is
            print("smallest failing config found (shrinking was cut short, not minimal):"
                  if getattr(outcome, "shrink_cut", None) else "minimal failing config:")
            print(json.dumps(report.config.to_dict(), indent=2, sort_keys=True))
            print(report.render())
    # Written after the report is out: if the path broke during the fuzz, only the file is lost.
    if report is not None and _save_failure(args, report) is not None:
        return EXIT_USAGE
    if report is not None:
        # the smallest failure is the harness's own crash (run_differential raised): nothing was judged
        if all(f.oracle == Oracles.CRASH and f.message.startswith("run_differential raised") for f in report.findings):
            return EXIT_INTERNAL
        return EXIT_FINDINGS
    return EXIT_INTERRUPTED if outcome.interrupted else EXIT_OK


def _check_database(spec: str, reach: bool = True) -> None:
    """--database: a usage error for a bad spec (and, `reach`, a Redis server that does not answer)."""
    from diffmoe.fuzz.database_spec import check_database

    try:
        check_database(spec, reach=reach)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def _runtime_env(text: str | None) -> dict | None:
    """--runtime-env's JSON object (Ray checks its fields when the runtime starts); a usage error otherwise."""
    if text is None:
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"--runtime-env: not JSON ({exc.msg} at character {exc.pos}); expected an object such as "
                         '\'{"env_vars": {"NAME": "VALUE"}}\'') from None
    if not isinstance(value, dict):
        raise UsageError(f"--runtime-env: expected a JSON object (Ray's runtime environment), got {type(value).__name__}")
    return value


def _fuzz_runner(args: argparse.Namespace):
    """The execution tier's searches: in this process with one worker, Ray tasks with more (a
    cluster that cannot be started or reached is a usage error, exit 2, before its first task)."""
    from diffmoe.fuzz.workers import fuzz_in_workers

    def searches(**kwargs):
        try:
            return fuzz_in_workers(cluster=args.cluster, runtime_env=args.runtime_env, **kwargs)
        except ValueError as exc:
            if str(exc).startswith("--cluster"):
                raise UsageError(str(exc)) from None
            raise

    return searches
