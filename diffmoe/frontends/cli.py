"""The `diffmoe` command line: check one config, fuzz, show a workspace plan, run the demo.

    diffmoe check [config options | --model NAME [--ep R/N] | --config FILE.json] [--impl MODULE:FACTORY]
                  [--oracles a,b] [--time-limit S] [--json]
    diffmoe fuzz  [--max-examples N] [--seed S | --database DIR|redis://HOST:PORT/N] [--workers N] [--planner P] [--impl ...]
                  [--max-tokens T] [--max-experts E] [--oracles a,b] [--time-limit S] [--json]
                  [--save-failure FILE.json] [config flags as bounds: --topk 1..2 --quant fp8-block --fused ...]
                  [--waive ORACLE@STAGE ... | --waive-file F] [--keep-going N]
    diffmoe plan  [config options | --config FILE.json] [--impl ...] [--png FILE]
    diffmoe demo
    diffmoe doctor [--device D] [--json]
    diffmoe peers fetch NAME [--wheel FILE.whl] | diffmoe peers list
    diffmoe museum [NAME ...] [--list] [--workers N [--cluster C]] [--json] [--fetch]
    diffmoe models [--json]
    diffmoe tuned-configs --impl NAME[==V] [--model NAME] [--files GLOB] [--max-entries N] [--resume FILE]
                  [--workers N [--cluster C]] [--json]
    diffmoe numerics fit [--impl ...] [--quant Q,...] [--configs N] [--seed S] [--base PROFILE]
                  [--time-limit S] [--json]
    diffmoe compile-check [--arch sm_90 ...] [--impl ...] [--variant V,...] [--tile-class C,...]
                  [config options | --config FILE.json | --sweep] [--forbid-spills V,...]
                  [--jobs N] [--json]

Exit codes (EXIT_*; they cannot lie: 0 is only ever a verdict):
  0    every selected oracle ran and passed (for `plan`: no aliasing overlap);
  1    findings: what the implementation did wrong, crashes, sys.exit() in its code, a worker
       that died, broken contracts and timeouts included (for `plan`: an overlap);
  2    usage errors: bad arguments, an invalid config, an --impl that cannot be imported
       (its module's error named), a config its `supports` refuses, a peer whose pinned wheel
       is not cached (the `diffmoe peers fetch` named); one line on stderr, no traceback;
  3    the harness could not judge: an internal error of diffmoe, or of its worker process
       (`diffmoe: internal error: ...` and the traceback on stderr; no verdict either way);
  130  interrupted (Ctrl-C or SIGTERM): a check stops its worker process group first; a fuzz
       interrupted before it found anything (one that found a failure prints it, exit 1);
  141  stdout closed by its reader (`diffmoe doctor --json | head -c 10`): quiet, no traceback,
       the status a shell reports for a process ended by SIGPIPE.
A --device this torch cannot use (cuda on a CPU-only build) is a usage error (2). Whatever the
implementation under test prints goes to stderr (implementation_output_to_stderr), so stdout
holds only the command's own output.
A check run in process (--time-limit 0, or no limit on CUDA) says so on stderr: an
implementation that calls os._exit() there ends diffmoe with its own status, and nothing in
the process can outlive that, so trust an exit status of 0 only with the report printed
(with --json: the one object on stdout). In a worker (the default on the interpreter) an
os._exit() is a crash finding. compile-check: 0 every specialization compiled (and the
--forbid-spills variants spilled nothing), 1 any failure, unsupported target or spill, 2 usage
errors (an unknown arch, a Triton without the ahead-of-time API, nothing captured).

--time-limit S bounds the silence of each check (each fuzz example): when no phase and no
launch has started for S seconds the check's worker process is killed and the check reports a
`timeout` finding; a slow check that keeps launching is never one. 0 turns the limit off; without the flag
the limit is diffmoe.check.runner.default_time_limit(): 120 s on the Triton interpreter, none on
CUDA. Ctrl-C or SIGTERM stops a fuzz at once: it prints the smallest failure found so far
(exit 1) or that none was found (exit 130). --database DIR keeps Hypothesis's example
database there: a failure found (even by an interrupted run) is replayed first by the next
run with the same DIR. --database redis://HOST:PORT/N keeps it on a Redis server instead, shared by
workers on several machines (a bad URL or a server that does not answer: exit 2 before any example
runs; diffmoe/fuzz/database_spec.py). A seeded run replays nothing (Hypothesis's @seed turns the database
off), so --seed and --database exclude each other. Without either, DIFFMOE_HYPOTHESIS_DB (the
pytest profiles' shared database, diffmoe/fuzz/profiles.py) names the database; --seed
still wins over it. --workers N (default 1: the search runs in this process) runs the execution
tier as N searches sharing the database, each a Ray task (diffmoe/fuzz/workers.py): on a local Ray
runtime the command starts and stops itself, or with --cluster auto|ray://HOST:PORT on a running
cluster; the plan tier runs here.

`numerics fit` exits 0 when a profile explains every stage of every calibration config, 1 when a
residue is left (a stage no menu choice explains, or a candidate that fails on a config), 2 for
usage errors (and a calibration set the implementation refuses whole).

Long runs (fuzz, compile-check and its --sweep, museum, tuned-configs, numerics fit) report progress on stderr through
diffmoe/frontends/progress.py: a live bar (counts, rate, time left) on a terminal, plain lines
otherwise; stdout and the results are untouched.

The runner, the implementation under test (reached only through diffmoe.adapters.contract) and
matplotlib are imported inside the commands that need them, so `--help` and argument errors answer at once.

The options commands share are in flags.py and config_flags.py, the exit codes in exits.py, the
loading of --impl in implementation.py, stdout's discipline in output.py (all in diffmoe/frontends/).

Longer than 400 lines because it holds the argument parser and one handler per command (six),
with the argument checks each needs and the progress adapters of fuzz and compile-check; a
handler only turns arguments into calls of the modules that do the work (runner, fuzzing,
plan_view, conformance, compile_gate) and prints their result. It must not judge anything itself.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import sys
import time
import warnings
from typing import Sequence, TextIO

from diffmoe.problem.config import MAX_SEED, MAX_SWIGLU_LIMIT, MAX_TOKENS, PLANNERS, QUANT_SCHEMES, MoEConfig, quoted
from diffmoe.problem.numerics import PROFILE_NAMES
from diffmoe.adapters.contract import (
    CONFORMANCE_HOOKS, ConfigRefused, Schedule, WorkspacePlan, factory_attribute, factory_plan,
)
from diffmoe.check.report import Oracles, Report, check_command
from diffmoe.frontends import models as model_flags
from diffmoe.frontends.config_flags import (
    CONFIG_FLAGS, MODEL_FLAGS, _add_config_options, config_from_args, numerics_spec, parse_expert_map,
)
from diffmoe.frontends.exits import (
    EXIT_BROKEN_PIPE, EXIT_FINDINGS, EXIT_INTERNAL, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, PROG, UsageError, _one_line,
    _sigterm_interrupts,
)
from diffmoe.frontends.flags import (
    MAX_TIME_LIMIT_S, _add_impl_option, _add_isolation_option, _check_writable, _csv, _isolation_kwargs,  # noqa: F401 - MAX_TIME_LIMIT_S re-exported
    _non_negative_int, _oracle_registry, _positive_int, _read_small_text, _time_limit, fold_fn, parse_device,
    parse_oracles, time_limit_kwargs,
)
from diffmoe.frontends.implementation import _runner, default_factory, load_implementation, refuse_unsupported
from diffmoe.frontends.output import _print_json, implementation_output_to_stderr

# Printed on stderr before a check that runs in this process (no worker to outlive it).
IN_PROCESS_NOTICE = (f"{PROG}: running in process (no time limit): an implementation that ends the process from "
                     f"below Python (C's exit(), a signal) ends {PROG} with its status; trust exit 0 only with the "
                     "report printed")
DEFAULT_FUZZ_EXAMPLES = 100  # execution-tier examples of a fuzz
# One search in this process: more workers start a local Ray runtime, 10 to 17 s on a loaded 2-core
# machine (measured 2026-12-05), longer than a short fuzz; --workers N asks for them (diffmoe/fuzz/workers.py).
DEFAULT_FUZZ_WORKERS = 1
DEFAULT_PLAN_EXAMPLES = 10_000  # plans of the static first phase: about a second (bench/bench_plan_tier.py)

# Config flags a fuzz does not bound (yet): the granularity axes and the routed scaling factor are drawn
# by the strategies (diffmoe.fuzz.strategies) and pinned per check only.
UNBOUNDED_FUZZ_FLAGS = ("weight_scales", "act_scales", "routed_scaling_factor")


# The demo: small enough for the interpreter, with more routed rows (T*K = 48) than one
# row block, so the legacy alias is visible to the race and schedule oracles as well as
# to the static check.
DEMO_CONFIG = MoEConfig(
    num_tokens=24, num_experts=4, topk=2, hidden=128, inter=128, quant="fp8-token", fused=True, seed=0
)


class _Exit(Exception):
    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status


class _Parser(argparse.ArgumentParser):
    """argparse that reports errors as one line (no usage block) and never calls sys.exit."""

    def error(self, message: str):  # type: ignore[override]
        raise UsageError(message)

    def exit(self, status: int = 0, message: str | None = None):  # type: ignore[override]
        if message:
            self._print_message(message, sys.stderr)
        raise _Exit(status)


# ---- argument helpers -------------------------------------------------------------------


def parse_schedules(texts: Sequence[str] | None) -> list[Schedule] | None:
    if not texts:
        return None
    try:
        return [Schedule.parse(t) for t in texts]
    except (TypeError, ValueError) as exc:
        raise UsageError(str(exc)) from None


# `diffmoe fuzz` bounds: check's config flags, each taking N or LO..HI (integers) or A[,B] (choices).
# The problem seed is --problem-seed: fuzz's --seed is the search's own seed.
FUZZ_BOUND_FLAGS = {flag: name for flag, name in CONFIG_FLAGS.items()
                    if flag not in ("seed", "planner", *UNBOUNDED_FUZZ_FLAGS)}
FUZZ_BOUND_FLAGS["problem_seed"] = "seed"
FUZZ_SWITCHES = ("renormalize", "tie_heavy")  # --X / --no-X pins them
DEFAULT_FUZZ_MAX_TOKENS = 96  # diffmoe.fuzz.strategies.DEFAULT_MAX_TOKENS (not imported: it pulls in hypothesis)


def _add_fuzz_controls(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("field bounds (check's config flags: N or LO..HI for integers, A or A,B for choices; "
                             "each field drawn only within its bound)")
    model_flags.add_flags(g)
    for flag, name in FUZZ_BOUND_FLAGS.items():
        option = "--" + flag.replace("_", "-")
        if name == "fused":
            fused = g.add_mutually_exclusive_group()
            fused.add_argument("--fused", dest="fused", action="store_const", const=True, help="draw only fused configs")
            fused.add_argument("--unfused", dest="fused", action="store_const", const=False, help="draw only unfused configs")
        elif flag in FUZZ_SWITCHES:
            g.add_argument(option, action=argparse.BooleanOptionalAction, default=None, help=f"pin {name} on (or off)")
        elif name == "expert_map":
            g.add_argument(option, metavar="A,B,...", help="pin the expert map (write --expert-map=0,-1,1); pins E to its length")
        elif name in ("numerics", "swiglu_limit"):
            g.add_argument(option, metavar="VALUE", help=f"pin {name}")
        else:
            from diffmoe.fuzz.bounds import CHOICE_FIELDS, INT_FIELDS

            if name in INT_FIELDS:
                lo, hi = INT_FIELDS[name]
                g.add_argument(option, metavar="N|LO..HI", help=f"bound {name} within [{lo}, {hi}]")
            else:
                g.add_argument(option, metavar="A[,B]", help=f"{name}: one or more of {', '.join(map(str, CHOICE_FIELDS[name]))}")
    w = p.add_argument_group("known findings and several failures")
    w.add_argument("--waive", action="append", metavar="ORACLE@STAGE",
                   help="search past findings of ORACLE at STAGE (ORACLE alone or ORACLE@*: at any stage); repeatable")
    w.add_argument("--waive-file", metavar="FILE", help="waivers, one ORACLE@STAGE per line, # comments allowed")
    w.add_argument("--keep-going", type=_positive_int, default=1, metavar="N",
                   help="collect up to N distinct failures (by oracle@stage), each shrunk, each with its replay line "
                        "(default 1: stop at the first; runs with --workers 1)")


def fuzz_bounds(args: argparse.Namespace):
    """The FieldBounds the fuzz's bound flags describe; UsageError naming the flag and the allowed range."""
    from diffmoe.fuzz.bounds import CHOICE_FIELDS, INT_FIELDS, FieldBounds, parse_choices, parse_int_bound

    ranges: dict[str, tuple[int, int]] = {}
    values: dict[str, tuple] = {}
    try:
        for flag, name in FUZZ_BOUND_FLAGS.items():
            text = getattr(args, flag, None)
            if text is None:
                continue
            option = "--" + flag.replace("_", "-")
            if name in INT_FIELDS:
                ranges[name] = parse_int_bound(name, text, option)
            elif isinstance(text, bool):
                values[name] = (text,)
            elif name in CHOICE_FIELDS:
                values[name] = parse_choices(name, text, option)
            elif name == "expert_map":
                values[name] = (parse_expert_map(text),)
            elif name == "numerics":
                values[name] = (numerics_spec(text),)
            else:  # swiglu_limit
                try:
                    values[name] = (float(text),)
                except ValueError:
                    raise ValueError(f"{option} must be a number in (0, {MAX_SWIGLU_LIMIT:g}], got {text[:60]!r}") from None
        model_flags.fuzz_pins(args, ranges, values)  # --model's fields where no flag bounds them, --ep's map
        return FieldBounds(ranges=ranges, values=values)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


# Draws tried for a config the implementation's `supports` accepts within the bounds: the fuzz itself
# gives up (Hypothesis's Unsatisfiable) well before this many consecutive refusals would pass.
SUPPORTED_PROBE_EXAMPLES = 500


def _bounds_leave_a_supported_config(strategy, bounds, factory, name: str) -> None:
    """A usage error (one line, naming the bounds and one refusal) when every bounded draw is a
    config the implementation's own `supports` refuses (`fuzz --impl vllm --quant fp8-token --fused`):
    otherwise the fuzz would end in an internal error, every example rejected."""
    from diffmoe.adapters.contract import SUPPORTS, factory_attribute, unsupported

    if factory is None or factory_attribute(factory, SUPPORTS) is None:
        return
    from hypothesis import HealthCheck, Phase, find, settings
    from hypothesis.errors import NoSuchExample, Unsatisfiable

    refusals: list[str] = []

    def runs(config) -> bool:
        reason = unsupported(factory, config)
        if reason is not None:
            refusals.append(reason)
        return reason is None

    try:
        find(strategy, runs, settings=settings(max_examples=SUPPORTED_PROBE_EXAMPLES, database=None, derandomize=True,
                                               phases=[Phase.generate], suppress_health_check=list(HealthCheck)))
    except (NoSuchExample, Unsatisfiable):
        why = f": {refusals[0]}" if refusals else ""
        if bounds:
            raise UsageError(f"{name} does not run any config within the bounds ({bounds.describe()}){why} "
                             "(its `supports`; widen or change the bounds)") from None
        raise UsageError(f"{name} does not run any config the fuzz draws{why} (its `supports` refused "
                         f"all {len(refusals)} draws; narrow the fuzz with field bounds such as --quant to what it runs)") from None


def fuzz_waivers(args: argparse.Namespace):
    """The Waivers of --waive and --waive-file; UsageError naming the flag (or file line) and the form."""
    from diffmoe.fuzz.waivers import MAX_WAIVER_FILE_CHARS, Waivers, parse_waiver, parse_waiver_text

    try:
        items = [parse_waiver(text) for text in args.waive or ()]
        if args.waive_file is not None:
            text = _read_small_text(args.waive_file, "waiver file", MAX_WAIVER_FILE_CHARS)
            if len(text) > MAX_WAIVER_FILE_CHARS:
                raise UsageError(f"waiver file {args.waive_file} is larger than {MAX_WAIVER_FILE_CHARS} characters")
            items += parse_waiver_text(text, f"--waive-file {args.waive_file}")
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return Waivers(items)


# ---- check ------------------------------------------------------------------------------


def cmd_check(args: argparse.Namespace) -> int:
    config = config_from_args(args)
    schedules = parse_schedules(args.schedule)
    oracles = parse_oracles(args.oracles)
    device = parse_device(args.device)  # every argument checked before the implementation loads (issue 48)
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
                **_isolation_kwargs(args),
            )
    except ConfigRefused as exc:  # the implementation's `supports` said no: a usage error, one line
        raise UsageError(f"{exc} (its `supports`; choose a config it runs)") from None
    if args.json:
        _print_json(report.to_dict())
    else:
        print(report.render())
    if not report.passed:
        return EXIT_FINDINGS
    # an oracle named with --oracles that could not run: that part was not judged, so no 0
    asked = [name for name in (oracles or ()) if name in report.skipped]
    if asked:
        print(f"{PROG}: not judged: " + "; ".join(f"{n} ({report.skipped[n]})" for n in asked), file=sys.stderr)
        return EXIT_INTERNAL
    return EXIT_OK


# ---- fuzz -------------------------------------------------------------------------------


class ProgressPrinter:
    """Fuzz progress on stderr (diffmoe/frontends/progress.py). On a terminal a live bar per phase:
    the generate phase counts examples against `total` (--max-examples: rate and time left), the
    shrink phase has no total (count and rate). Otherwise the plain line
    "fuzz: N examples  phase=P  S s  <config>" at each phase change and every `interval` seconds
    (logs stay short but alive); with --json a JSON object at the same moments (tests/test_robustness_cli.py
    reads them). A callable as the fuzz's
    `progress` (examples started so far, phase, seconds, the config under way)."""

    def __init__(self, stream: TextIO, tty: bool | None = None, interval: float = 10.0, *,
                 total: int | None = None, label: str = "fuzz", json_lines: bool = False) -> None:
        self.stream, self.tty, self.interval, self.total, self.label = stream, tty, interval, total, label
        self.json_lines = json_lines
        self._progress = None
        self._examples = 0

    def __call__(self, examples: int, phase: str, elapsed: float, config: str) -> None:
        from diffmoe.frontends.progress import Progress

        line = f"fuzz: {examples} example{'s' if examples != 1 else ''}  phase={phase}  {elapsed:6.1f} s  {config}"
        if self._progress is None:
            self._progress = Progress(self.stream, self.label, total=self.total, unit="example", each=False,
                                      interval=self.interval, live=self.tty, json_lines=self.json_lines)
        self._examples = examples
        # `examples` counts the one starting now: one fewer have finished (a new phase counts its own)
        self._progress.update(max(0, examples - 1), phase=phase, detail=config, line=line,
                              total=self.total if phase == "generate" else None)

    def finish(self, examples: int | None = None) -> None:
        """The run is over, after `examples` in all (default: every example started has finished)."""
        if self._progress is not None:
            self._progress.close(done=self._examples if examples is None else examples)
            self._progress = None


def _plan_phase(args, factory, name, seed: int | None):
    """The static first phase of a fuzz (every tier; the whole fuzz with --tier plan): the plan
    tier's outcome, or None when it does not run (--plan-examples 0, no cheap plan)."""
    from diffmoe.adapters.contract import PLAN_WORKSPACES, factory_attribute
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
                             "see diffmoe/adapters/contract.py)")
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


def _save_failure(args, report) -> int | None:
    """--save-failure: write the minimal failing config; EXIT_USAGE when the file cannot be written."""
    if args.save_failure is None:
        return None
    try:
        with open(args.save_failure, "w", encoding="utf-8") as fh:
            fh.write(json.dumps(report.config.to_dict(), indent=2, sort_keys=True) + "\n")
    except OSError as exc:
        sys.stdout.flush()
        print(f"{PROG}: error: cannot write {args.save_failure}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_USAGE
    if not args.json:
        print(f"saved to {args.save_failure} (replay with: {PROG} check --config {args.save_failure})")
    return None


def cmd_fuzz(args: argparse.Namespace) -> int:
    from diffmoe.cluster.tasks import MAX_WORKERS
    from diffmoe.fuzz.driver import MAX_EXAMPLES_LIMIT, MAX_KEEP_GOING
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
    printer = ProgressPrinter(sys.stderr, total=args.max_examples, json_lines=args.json)  # the execution tier's
    outcome = None
    try:
        with _sigterm_interrupts(), implementation_output_to_stderr():
            plan_outcome = _plan_phase(args, factory, name, seed)
            outcome = None if _plan_decides(args, plan_outcome) else _fuzz_runner(args)(
                workers=args.workers,
                max_examples=args.max_examples,
                seed=seed,
                planner=args.planner,
                implementation=factory,
                implementation_name=name,
                max_tokens=args.max_tokens,
                max_experts=args.max_experts,
                progress=printer,
                oracles=oracles,
                device=device,
                database=args.database,
                time_limit=limit,
                **_isolation_kwargs(args),
                **({} if args.special_rows else {"special_rows": False}),
                **({"features": True} if args.model_features else {}),
                **({"tier": args.tier} if args.tier != "run" else {}),
                **({"shrink": False} if args.no_shrink else {}),
                **({"bounds": bounds} if bounds else {}),
                **({"waive": waivers} if waivers else {}),
                **({"keep_going": args.keep_going} if args.keep_going > 1 else {}),
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


def _fuzz_summary(outcome, max_examples: int, database: str | None = None) -> str:
    origin = f"seed {outcome.seed}" if outcome.seed is not None else f"database {database}" if database else "unseeded"
    # --max-examples counts the generated examples; shrinking runs and metamorphic siblings come on top
    generated = outcome.examples - outcome.shrink_examples
    head = f"fuzz ({origin}): {generated} example{'s' if generated != 1 else ''}"
    if outcome.shrink_examples:
        head += f" + {outcome.shrink_examples} shrinking run{'s' if outcome.shrink_examples != 1 else ''}"
    siblings = getattr(outcome, "sibling_runs", 0)
    if siblings:
        head += f" + {siblings} metamorphic sibling run{'s' if siblings != 1 else ''}"
    head += f" in {outcome.seconds:.1f} s"
    if outcome.interrupted:
        head += ", interrupted"
    if outcome.report is None:
        return head + (", no finding so far" if outcome.interrupted else f", no finding in up to {max_examples} examples") \
            + _waived_note(outcome)
    parts = [head]
    if outcome.seconds_to_first_failure is not None:
        parts.append(f"first failure after {outcome.seconds_to_first_failure:.1f} s")
    if outcome.seconds_shrinking is not None:
        parts.append(f"shrunk in {outcome.seconds_shrinking:.1f} s")
    if outcome.interrupted:
        parts.append("the config below is the smallest failure found before the interrupt")
    parts.extend(outcome.notes)
    if len(outcome.failures) > 1:
        parts.append(f"{len(outcome.failures)} distinct failures")
    return "; ".join(parts) + _waived_note(outcome)


def _waived_note(outcome) -> str:
    waived = getattr(outcome, "waived_examples", 0)
    return f"; {waived} example{'s' if waived != 1 else ''} had only waived findings" if waived else ""


# ---- plan -------------------------------------------------------------------------------


def cmd_plan(args: argparse.Namespace) -> int:
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
        print(f"{PROG}: the implementation's plan must be a diffmoe.adapters.contract.WorkspacePlan, got {type(plan).__name__}",
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


# ---- demo -------------------------------------------------------------------------------


def demo_conclusion(fixed: Report, legacy: Report) -> str:
    cfg = fixed.config
    size = f"a fused {cfg.quant} MoE with T={cfg.num_tokens}, E={cfg.num_experts}, K={cfg.topk}, H={cfg.hidden}, I={cfg.inter}"
    if fixed.passed and not legacy.passed:
        buffers = sorted({b for f in legacy.findings for b in f.buffers})
        return (
            f"Conclusion: on {size}, the fixed workspace planner passes every oracle, while the legacy "
            f"planner is caught by {', '.join(legacy.oracles_with_findings())}, naming {', '.join(buffers) or 'no buffer'}. "
            "The legacy plan keeps a slot for activation_output, which the fused act+quant kernel never "
            "writes; that flips the workspace parity so gate_up_output and quanted_down_input share bytes "
            "while one kernel reads the first and writes the second. A GPU only shows this as an accuracy "
            "drop under out-of-order scheduling; diffmoe shows it on a laptop, and the replay line above "
            "rebuilds the failing case."
        )
    problems = []
    if not fixed.passed:
        problems.append(f"the fixed planner has findings ({', '.join(fixed.oracles_with_findings())})")
    if legacy.passed:
        problems.append("the legacy planner's alias went unnoticed")
    return f"Conclusion: on {size}, the demo did not go as expected: {'; '.join(problems)}."


def cmd_peers(args: argparse.Namespace) -> int:
    from diffmoe.adapters.peer_wheels import main as peers_main

    return peers_main(args.rest, prog=f"{PROG} peers")


def cmd_museum(args: argparse.Namespace) -> int:
    from diffmoe.adapters.museum import run as museum_run

    return museum_run(args, prog=f"{PROG} museum")


def cmd_models(args: argparse.Namespace) -> int:
    return model_flags.run(args, prog=f"{PROG} models")


def cmd_tuned_configs(args: argparse.Namespace) -> int:
    from diffmoe.tuned_configs.command import run as tuned_configs_run

    return tuned_configs_run(args, prog=f"{PROG} tuned-configs")


class FitProgress:
    """`numerics fit` progress on stderr (diffmoe/frontends/progress.py): a bar of calibration configs
    on a terminal, otherwise a plain line per config and stage ("numerics fit: 2/14 CONFIG: STAGE")."""

    def __init__(self, stream: TextIO, live: bool | None = None, json_lines: bool = False) -> None:
        self.stream, self.live, self.bar, self.json_lines = stream, live, None, json_lines

    def __call__(self, done: int, total: int, what: str) -> None:
        if self.bar is None:
            from diffmoe.frontends.progress import Progress

            self.bar = Progress(self.stream, "numerics fit", total=total, unit="config", each=True, live=self.live,
                                json_lines=self.json_lines)
        self.bar.update(done, detail=what, line=f"numerics fit: {done}/{total} {what}")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def cmd_numerics(args: argparse.Namespace) -> int:
    if args.numerics_command != "fit":
        raise UsageError("a numerics command is required: fit (see diffmoe numerics --help)")
    quants = _csv(args.quant)
    if quants is not None:
        unknown = [q for q in quants if q not in QUANT_SCHEMES]
        if unknown or not quants:
            raise UsageError(f"--quant must be a comma-separated list from {list(QUANT_SCHEMES)}, got {args.quant!r}")
    device = parse_device(args.device)  # every argument checked before the implementation loads (issue 48)
    factory, name = load_implementation(args.impl)
    if factory is None:
        factory = default_factory()
    from diffmoe.numerics_fit import fit_profile

    progress = FitProgress(sys.stderr, json_lines=args.json)
    try:
        with _sigterm_interrupts(), implementation_output_to_stderr():
            report = fit_profile(factory, quants=quants, count=args.configs, seed=args.seed, base=args.base,
                                 device=device, implementation_name=name, progress=progress,
                                 **time_limit_kwargs(_runner(), args.time_limit, device))
    except ValueError as exc:  # a calibration set the implementation refuses whole
        raise UsageError(f"numerics fit: {exc}") from None
    finally:
        progress.close()
    if args.json:
        _print_json(report.to_dict())
    else:
        print(report.render(), end="")
    return report.exit_code


def cmd_doctor(args: argparse.Namespace) -> int:
    device = parse_device(args.device)
    # The probes are the harness's; what the default implementation does about each primitive
    # comes through the contract (its factory's `conformance_hooks`). Loading the factory first
    # lets the implementation set up its backend (e.g. the interpreter when no GPU) before
    # diffmoe.backend.conformance imports triton.
    # The probes run under implementation_output_to_stderr: only the table (or JSON) is stdout.
    with implementation_output_to_stderr():
        hooks = factory_attribute(default_factory(), CONFORMANCE_HOOKS)
        from diffmoe.backend.doctor import run_doctor

        report = run_doctor(device, hooks() if hooks is not None else None)
    if args.json:
        _print_json(report.to_dict())
    else:
        print(report.render())
    return report.exit_code


# ---- compile-check ----------------------------------------------------------------------


class GateProgress:
    """The compile gate's progress on stderr (diffmoe/frontends/progress.py), `compile-check` and
    `--sweep` (and bench/compile_sweep.py): first the capture, the configs run with every launch
    intercepted (on a terminal a bar of configs; otherwise a line at most every PLAIN_INTERVAL_S
    seconds, none for the last config, which the compile lines follow at once), then the compile,
    a bar of specializations, or one plain line each: "compile-check: 3/48 KERNEL sm_90 native: ok"."""

    def __init__(self, stream: TextIO, configs: int, *, label: str = "compile-check", live: bool | None = None,
                 clock=time.monotonic, json_lines: bool = False) -> None:
        self.stream, self.label, self.live, self.clock, self.json_lines = stream, label, live, clock, json_lines
        self.capture = self._progress(f"{label} capture", configs, "config", each=False)
        self.compile = None

    def _progress(self, label: str, total: int, unit: str, each: bool):
        from diffmoe.frontends.progress import Progress

        return Progress(self.stream, label, total=total, unit=unit, each=each, live=self.live, clock=self.clock,
                        json_lines=self.json_lines)

    def captured(self, done: int, total: int, found: int) -> None:
        """capture_progress of diffmoe.backend.compile_gate.run_gate."""
        detail = f"{found} specialization{'s' if found != 1 else ''} so far"
        if done < total:
            self.capture.update(done, detail=detail)
            return
        self.capture.close(done=done, detail=detail)
        if found:
            self.compile = self._progress(self.label, found, "specialization", each=True)

    def compiled(self, done: int, total: int, result) -> None:
        """progress of diffmoe.backend.compile_gate.run_gate."""
        if self.compile is None:
            self.capture.close()
            self.compile = self._progress(self.label, total, "specialization", each=True)
        what = f"{result.kernel} {result.arch} {result.variant}: {result.status}"
        self.compile.update(done, total=total, detail=what, line=f"{self.label}: {done}/{total} {what}")

    def close(self) -> None:
        self.capture.close()
        if self.compile is not None:
            self.compile.close()


def cmd_compile_check(args: argparse.Namespace) -> int:
    # Real compiles need the kernels decorated as JITFunctions: no interpreter, before any import
    # of triton (nothing on the way here imported it).
    os.environ["TRITON_INTERPRET"] = "0"
    archs = [a for text in (args.arch or ["sm_90"]) for a in _csv(text) or []]
    from diffmoe.backend import compile_gate as gate

    for arch in archs:
        try:
            gate.parse_arch(arch)
        except ValueError as exc:
            raise UsageError(f"--arch: {exc}") from None
    given = [flag for flag in (*CONFIG_FLAGS, *MODEL_FLAGS) if getattr(args, flag, None) is not None]
    if args.sweep and (given or args.config is not None):
        raise UsageError("--sweep cannot be combined with a config (flags or --config)")
    one_config = given or args.config is not None
    if one_config:
        configs = [config_from_args(args)]
    else:
        configs = gate.sweep_configs() if args.sweep else gate.representative_configs()
    classes = _csv(args.tile_class)
    if classes is not None:
        unknown = [c for c in classes if c not in gate.TILE_CLASSES]
        if unknown or not classes:
            raise UsageError(f"--tile-class must be a comma-separated list from {list(gate.TILE_CLASSES)}, got {args.tile_class!r}")
        configs = [c for c in configs if gate.tile_class(c) in classes]
        if not configs:
            raise UsageError(f"no config of this run falls in tile class {', '.join(classes)}")
    # every argument is checked by now; the implementation loads (issue 48)
    factory, name = load_implementation(args.impl)
    if one_config:
        refuse_unsupported(factory, name, configs[0])
    if factory is None:
        factory = default_factory()
    progress = GateProgress(sys.stderr, len(configs), json_lines=args.json)
    try:
        with implementation_output_to_stderr():
            report = gate.run_gate(factory, configs, archs, variants=_csv(args.variant), jobs=args.jobs,
                                   forbid_spills=_csv(args.forbid_spills) or (), progress=progress.compiled,
                                   capture_progress=progress.captured)
    except gate.CompileGateError as exc:
        raise UsageError(str(exc)) from None
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    finally:
        progress.close()
    if args.json:
        _print_json(report.to_dict())
    else:
        print(report.render())
    return EXIT_OK if report.exit_code == 0 else EXIT_FINDINGS


def cmd_demo(args: argparse.Namespace) -> int:
    run = _runner().run_differential
    device = parse_device(args.device)  # before anything is printed
    reports = []
    for planner in ("fixed", "legacy"):
        config = DEMO_CONFIG.replace(planner=planner)
        print(f"== {planner} planner: {check_command(config)}")
        with implementation_output_to_stderr():
            report = run(config, None, device=device)
        print(report.render())
        print()
        reports.append(report)
    fixed, legacy = reports
    print(demo_conclusion(fixed, legacy))
    return EXIT_OK if fixed.passed and not legacy.passed else EXIT_FINDINGS


# ---- parser and entry point -------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description="Differential testing of fused FP8 MoE kernels against a PyTorch reference.")
    sub = parser.add_subparsers(dest="command", metavar="{check,fuzz,plan,demo,doctor,compile-check,peers,museum,models,tuned-configs,numerics}")

    check = sub.add_parser("check", help="run one config through every oracle", description="Run one config through every oracle.")
    _add_config_options(check)
    _add_impl_option(check)
    check.add_argument("--schedule", action="append", metavar="identity|reversed|random:SEED", help="program order (repeatable; default identity, reversed and --random-orders random ones)")
    check.add_argument("--oracles", metavar="A,B", help="oracles to run (default every one): "
                            f"{', '.join(_oracle_registry().ALL_ORACLES)}")
    check.add_argument("--device", help="torch device (default: the implementation's)")
    check.add_argument("--time-limit", type=_time_limit, metavar="S",
                       help="stop the check with a timeout finding when it makes no progress (no launch) for S seconds (0: no limit; default 120 on the interpreter, none on CUDA)")
    _add_isolation_option(check)
    check.add_argument("--json", action="store_true", help="print the report as one JSON object")
    check.set_defaults(handler=cmd_check)

    fz = sub.add_parser("fuzz", help="draw configs until one fails, then shrink it", description="Draw configs until one fails, then shrink it.")
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
    fz.set_defaults(handler=cmd_fuzz)

    plan = sub.add_parser("plan", help="show the workspace plan and its overlaps", description="Show the workspace plan and its overlaps.")
    _add_config_options(plan)
    _add_impl_option(plan)
    plan.add_argument("--png", metavar="FILE", help="also draw the two workspaces to a PNG file")
    plan.set_defaults(handler=cmd_plan)

    demo = sub.add_parser("demo", help="fixed vs legacy planner on a small fused FP8 config", description="Check a small fused FP8 config with the fixed and the legacy planner.")
    demo.add_argument("--device", help="torch device (default: the implementation's)")
    demo.set_defaults(handler=cmd_demo)

    doctor = sub.add_parser(
        "doctor", help="check the Triton backend's primitives the optimized kernels rely on",
        description="Run small conformance kernels on the active Triton backend (interpreter or CUDA) and report, "
                    "per primitive, whether it is right and which workaround the optimized path applies.")
    doctor.add_argument("--device", help="torch device (default: the implementation's)")
    doctor.add_argument("--json", action="store_true", help="print the report as one JSON object")
    doctor.set_defaults(handler=cmd_doctor)

    peers = sub.add_parser(
        "peers", help="fetch and list the peers' pinned wheels (third-party kernels run behind the contract)",
        description="diffmoe peers fetch NAME [--wheel FILE.whl] | diffmoe peers list (diffmoe/adapters/peer_wheels.py)", add_help=False)
    peers.add_argument("rest", nargs=argparse.REMAINDER, help="fetch NAME [--wheel FILE.whl], or list")
    peers.set_defaults(handler=cmd_peers)

    from diffmoe.adapters import museum as museum_module  # the exhibit table names the arguments

    museum = sub.add_parser(
        "museum", help="real vLLM, SGLang and Liger-Kernel bugs: each buggy release must fail as recorded, the fixed one pass (diffmoe/adapters/museum.py)",
        description=museum_module.DESCRIPTION)
    museum_module.add_arguments(museum)
    museum.set_defaults(handler=cmd_museum)

    models = sub.add_parser("models", help="the real models --model names: E, K, H, I, shared experts, quant, and what fits here",
                            description="The real models' MoE layers `--model NAME` sets (check, fuzz, tuned-configs); "
                                        "each cited in docs/models.md.")
    model_flags.add_arguments(models)
    models.set_defaults(handler=cmd_models)

    from diffmoe.tuned_configs import command as tuned_configs_module

    tuned = sub.add_parser(
        "tuned-configs", help="judge every tuned tile config a peer's release ships (diffmoe/tuned_configs/)",
        description=tuned_configs_module.DESCRIPTION)
    tuned_configs_module.add_arguments(tuned)
    tuned.set_defaults(handler=cmd_tuned_configs)

    numerics = sub.add_parser(
        "numerics", help="fit the numerics profile an implementation computes (diffmoe numerics fit)",
        description="diffmoe numerics fit: the rounding-point choices that reproduce an implementation's stages bit for bit")
    numerics_sub = numerics.add_subparsers(dest="numerics_command", metavar="{fit}")
    fit = numerics_sub.add_parser(
        "fit", help="fit a profile (base + overrides, the TOML --numerics-file reads) on a calibration set",
        description="Run the implementation once per calibration config and, stage by stage on its own inputs, find the "
                    "menu choice of every rounding point that reproduces its outputs bit for bit (GEMMs: within their "
                    "derived interval) over every config. Prints the profile as TOML with its evidence; a stage no "
                    "choice explains is a residue, shown as a finding (exit 1), never absorbed.")
    _add_impl_option(fit)
    fit.add_argument("--quant", metavar="Q,...", help=f"calibrate on these schemes only (default: every one the implementation supports: {', '.join(QUANT_SCHEMES)})")
    fit.add_argument("--configs", type=_positive_int, metavar="N", help="calibration configs (default: one per feature, four, per supported scheme and fused flag)")
    fit.add_argument("--seed", type=_non_negative_int, default=0, metavar="S", help="seed of the first calibration config (default 0; the next ones S+1, ...)")
    fit.add_argument("--base", choices=PROFILE_NAMES, help="the built-in profile the TOML starts from (default: the one agreeing with the most fitted points)")
    fit.add_argument("--device", help="torch device (default: the implementation's)")
    fit.add_argument("--time-limit", type=_time_limit, metavar="S",
                     help="stop a candidate run that makes no progress (no launch) for S seconds: that config is a residue (0: no limit; default 120 on the interpreter, none on CUDA)")
    fit.add_argument("--json", action="store_true", help="print the fit as one JSON object")
    fit.set_defaults(handler=cmd_numerics)
    numerics.set_defaults(handler=cmd_numerics, numerics_command=None)

    cc = sub.add_parser(
        "compile-check", help="compile every kernel specialization for a GPU, no GPU needed",
        description="Run the implementation on CPU tensors with every Triton launch intercepted, then compile each "
                    "distinct specialization ahead of time for the target GPU(s) and report registers, spills, shared "
                    "memory and the matrix instruction. Without a config: the CI subset (every scheme x fused flag x "
                    "tile class, both order-table settings).")
    cc.add_argument("--arch", action="append", metavar="sm_90",
                    help="target, repeatable or comma-separated: sm_80, sm_89, sm_90 (default), sm_100")
    _add_impl_option(cc)
    cc.add_argument("--variant", metavar="V,...", help="the implementation's compile variants to build (default all it declares; "
                                                       "the optimized MoE: native, safe)")
    cc.add_argument("--tile-class", metavar="C,...", help="only configs of these CUDA tile classes: decode, mid, prefill")
    _add_config_options(cc)
    cc.add_argument("--sweep", action="store_true", help="the full sweep instead of the CI subset")
    cc.add_argument("--forbid-spills", metavar="V,...", help="variants whose register spills are failures (CI: native)")
    cc.add_argument("--jobs", type=_positive_int, metavar="N", help="compiler processes (default: the machine's cores)")
    cc.add_argument("--json", action="store_true", help="print the report as one JSON object")
    cc.set_defaults(handler=cmd_compile_check)
    return parser


REFERENCE_WIDTH = 100  # columns of the CLI reference (docs/cli.md), whatever the terminal


def reference_text() -> str:
    """Every subcommand's usage, from build_parser(), at a fixed width: the block of docs/cli.md between
    `<!-- cli-reference:start -->` and `<!-- cli-reference:end -->` (tests/test_cli_reference.py
    holds it to this; `python tests/test_cli_reference.py --write` regenerates it)."""
    usages: list[str] = []

    def add(parser: argparse.ArgumentParser) -> None:
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        for command in sub.choices.values():
            if any(isinstance(a, argparse._SubParsersAction) for a in command._actions):
                add(command)  # `numerics fit`: each nested command's own usage
                continue
            formatter = command.formatter_class(prog=command.prog, width=REFERENCE_WIDTH)
            formatter.add_usage(command.usage, command._actions, command._mutually_exclusive_groups, prefix="")
            usages.append(formatter.format_help().rstrip())

    add(build_parser())
    return "\n".join(usages) + "\n"


def _stdout_closed() -> int:
    """stdout's reader went away (`diffmoe check ... | head -1`): exit quietly with 141, what a
    shell reports for a process ended by SIGPIPE, as `yes | head -1` does. stdout is pointed at
    devnull, so the interpreter's last flush at exit finds no broken pipe to complain about."""
    with contextlib.suppress(AttributeError, OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    return EXIT_BROKEN_PIPE


def main(argv: Sequence[str] | None = None) -> int:
    # Workspaces are poisoned on purpose, so a kernel that reads stale bytes computes on NaN
    # and huge values; numpy (under the Triton interpreter) warns about each. The oracles
    # report what matters, the warnings would only bury it.
    warnings.filterwarnings("ignore", category=RuntimeWarning, module=r"triton\.runtime\.interpreter")
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        if args.command is None:
            raise UsageError("a command is required: check, fuzz, plan, demo, doctor, compile-check, peers, museum or numerics (see diffmoe --help)")
        fold_fn(args)
        status = args.handler(args)
        sys.stdout.flush()  # a closed pipe shows here, inside the handler below, not at exit
        return status
    except BrokenPipeError:
        return _stdout_closed()
    except UsageError as exc:
        print(f"{PROG}: error: {_one_line(str(exc))}", file=sys.stderr)
        return EXIT_USAGE
    except _Exit as exc:
        return exc.status
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - a harness bug is no verdict: never 0, never 1
        from diffmoe.adapters.peer_wheels import PeerError

        if isinstance(exc, PeerError):  # a peer not cached, met wherever a command builds it: the fix in one line
            print(f"{PROG}: error: {_one_line(str(exc))}", file=sys.stderr)
            return EXIT_USAGE
        return _internal_error(exc)


def _internal_error(exc: BaseException) -> int:
    """A failure of diffmoe itself (or its worker process, WorkerError; or a SystemExit that
    escaped a command): one line saying so, then the traceback, and EXIT_INTERNAL. The
    implementation's own failures never come here: they are findings (exit 1)."""
    import traceback

    text = str(exc).strip()
    first = text.splitlines()[0] if text else ""
    what = f"SystemExit({quoted(exc.code)}) escaped the command" if isinstance(exc, SystemExit) else \
        f"{type(exc).__name__}: {first}"
    with contextlib.suppress(Exception):
        print(f"{PROG}: internal error: {_one_line(what)} (the harness could not judge; exit {EXIT_INTERNAL})",
              file=sys.stderr)
        traceback.print_exception(type(exc), exc, exc.__traceback__, file=sys.stderr)
    return EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())
