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
the limit is diffmoe.judge.runner.default_time_limit(): 120 s on the Triton interpreter, none on
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
diffmoe/cluster/progress.py: a live bar (counts, rate, time left) on a terminal, plain lines
otherwise; stdout and the results are untouched.

The runner, the implementation under test (reached only through diffmoe.contract) and
matplotlib are imported inside the commands that need them, so `--help` and argument errors answer at once.

The commands live in diffmoe/frontends/commands/, one module each, registered in its COMMANDS list;
the options they share in flags.py and config_flags.py, the exit codes in exits.py, the loading of
--impl in implementation.py, stdout's discipline in output.py. This module is the top: the parser
built from that list, main() and its error handling. Nothing in diffmoe imports it but
`python -m diffmoe`; it re-exports the names callers (tests, bench/) reach through it. A command
only turns arguments into calls of the modules that do the work (runner, fuzzing, plan_view,
conformance, compile_gate) and prints their result. It must not judge anything itself.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import warnings
from typing import Sequence

from diffmoe.problem.config import quoted
from diffmoe.frontends.commands import COMMANDS, usage_choices
from diffmoe.frontends.exits import (
    EXIT_BROKEN_PIPE, EXIT_INTERNAL, EXIT_INTERRUPTED, EXIT_USAGE, PROG, UsageError, _one_line, forget_caught_interrupts,
)
from diffmoe.frontends.flags import fold_fn

# Re-exported: the names tests, bench/ and docs reach through `diffmoe.frontends.cli`. A test that
# patches a command's setting patches the module that reads it (diffmoe/frontends/commands/fuzz.py,
# flags.py), not these.
from diffmoe.frontends.commands.check import IN_PROCESS_NOTICE  # noqa: F401
from diffmoe.frontends.commands.compile_check import GateProgress  # noqa: F401
from diffmoe.frontends.commands.fuzz_controls import fuzz_bounds  # noqa: F401
from diffmoe.frontends.commands.fuzz_output import ProgressPrinter  # noqa: F401
from diffmoe.frontends.config_flags import config_from_args  # noqa: F401
from diffmoe.frontends.exits import EXIT_FINDINGS, EXIT_OK, _sigterm_interrupts  # noqa: F401
from diffmoe.frontends.flags import MAX_TIME_LIMIT_S, parse_oracles, time_limit_kwargs  # noqa: F401
from diffmoe.frontends.implementation import load_implementation  # noqa: F401


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


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description="Differential testing of fused FP8 MoE kernels against a PyTorch reference.")
    sub = parser.add_subparsers(dest="command", metavar=usage_choices())
    for command in COMMANDS:
        command.add_parser(sub)
    return parser


REFERENCE_WIDTH = 100  # columns of the CLI reference (docs/cli.md), whatever the terminal


def reference_text() -> str:
    """Every subcommand's usage, from build_parser(), at a fixed width: the block of docs/cli.md between
    `<!-- cli-reference:start -->` and `<!-- cli-reference:end -->` (tests/frontends/test_cli_reference.py
    holds it to this; `python tests/frontends/test_cli_reference.py --write` regenerates it)."""
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


def _command_list() -> str:
    """Every command, in the usage line's order, from the one list (it once named 9 of 11)."""
    names = usage_choices().strip("{}").split(",")
    return ", ".join(names[:-1]) + " or " + names[-1]


def main(argv: Sequence[str] | None = None) -> int:
    # Workspaces are poisoned on purpose, so a kernel that reads stale bytes computes on NaN
    # and huge values; numpy (under the Triton interpreter) warns about each. The oracles
    # report what matters, the warnings would only bury it.
    warnings.filterwarnings("ignore", category=RuntimeWarning, module=r"triton\.runtime\.interpreter")
    try:
        return _run(argv)
    finally:
        forget_caught_interrupts()


def _run(argv: Sequence[str] | None) -> int:
    """main() but for its last step: the command's status (or the error's) from argv."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        if args.command is None:
            raise UsageError(f"a command is required: {_command_list()} (see diffmoe --help)")
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
