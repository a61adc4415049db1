"""Run every bug-zoo mutant once and print the table of docs/bug-zoo.md: mutant, what it breaks,
the oracles that catch it, the smallest config that shows it (as a `diffmoe check` command line),
and the mutation score. The table is generated from the runs, never typed by hand.

    python tests/support/make_bug_zoo_table.py                         # print the table
    python tests/support/make_bug_zoo_table.py --write docs/bug-zoo.md # replace the marked block there
    python tests/support/make_bug_zoo_table.py --workers 2             # two mutants at a time (a local Ray runtime)
    python tests/support/make_bug_zoo_table.py --workers 16 --cluster auto   # a Ray cluster's nodes

With --write, the text between `<!-- bug-zoo:start -->` and `<!-- bug-zoo:end -->` is
replaced; a file without both markers is left alone and the script exits with status 2.
The exit status is 1 when some mutant goes uncaught, so CI can run the script as a check.
The output depends only on the mutants and their configs (no timings), so it is stable.

Each mutant's run is a task of diffmoe/cluster/tasks.py (`run_mutant`): `--workers 1` runs them here
in order; `--workers N` runs N at a time as Ray tasks on `--cluster` (a local Ray runtime by default),
the table in the zoo's order whatever order they finish in. The tasks' processes find bug_zoo through
PYTHONPATH (`mutant_runtime_env`), as a replay command does.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))  # the repository root: diffmoe, optimized, reference
sys.path.insert(0, HERE)  # bug_zoo

import bug_zoo  # noqa: E402  (imports optimized first, which selects the interpreter without a GPU)
from diffmoe.check.report import check_command  # noqa: E402
from diffmoe.findings import Oracles
from diffmoe.judge.runner import ALL_ORACLES, run_differential  # noqa: E402
from diffmoe.cluster.tasks import Task, run_tasks  # noqa: E402

START = "<!-- bug-zoo:start -->"
END = "<!-- bug-zoo:end -->"
ORACLE_ORDER = list(ALL_ORACLES) + [Oracles.CRASH, Oracles.TIMEOUT]


@dataclass(frozen=True)
class MutantRun:
    """What the table needs of one mutant's report (plain data: it comes back from a Ray task)."""

    found: tuple[str, ...]  # the oracles with findings, sorted
    passed: bool


def oracle_list(run: MutantRun) -> str:
    found = set(run.found)
    ordered = [o for o in ORACLE_ORDER if o in found] + sorted(found - set(ORACLE_ORDER))
    return ", ".join(ordered) if ordered else "**none (survived)**"


def run_mutant(name: str) -> MutantRun:
    """A task: the mutant's config run against it with its oracles."""
    mutant = bug_zoo.MUTANTS[name]
    mutant.fetch_peer()  # a peer's mutant: its files cached, or one line naming the fetch command
    report = run_differential(mutant.config, mutant.factory, implementation_name=mutant.impl)
    return MutantRun(tuple(report.oracles_with_findings()), report.passed)


def mutant_runtime_env() -> dict:
    """Ray's runtime environment of the tasks: tests/ (bug_zoo, this module) and the repository on the path."""
    path = [HERE, os.path.dirname(os.path.dirname(HERE))] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return {"env_vars": {"PYTHONPATH": os.pathsep.join(path)}}


def run_all(progress=None, *, names: list[str] | None = None, workers: int = 1,
            cluster: str | None = None) -> list[tuple[bug_zoo.Mutant, MutantRun]]:
    """Every mutant (or those `names`) run once, in the zoo's order; `progress(line)` as each finishes.
    Ctrl-C raises KeyboardInterrupt once the runs under way are cancelled."""
    import make_bug_zoo_table as module  # by its module name: a Ray task's function must be importable, not __main__'s

    mutants = [bug_zoo.MUTANTS[n] for n in names] if names is not None else list(bug_zoo.MUTANTS.values())
    runs: dict[int, MutantRun] = {}

    def on_result(index: int, run: MutantRun) -> None:
        runs[index] = run
        if progress:
            progress(f"{mutants[index].name}: {oracle_list(run)} ({len(runs)} of {len(mutants)})")

    tasks = [Task(module.run_mutant, m.name, name=m.name) for m in mutants]
    from diffmoe.check.execution import default_device

    done = run_tasks(tasks, workers=workers, cluster=cluster, device=str(default_device()), on_result=on_result,
                     runtime_env=mutant_runtime_env() if workers > 1 else None)  # one GPU per mutant on CUDA
    if done.interrupted:
        raise KeyboardInterrupt
    return [(m, runs[i]) for i, m in enumerate(mutants)]


def render_table(results: list[tuple[bug_zoo.Mutant, MutantRun]]) -> str:
    lines = [
        "| mutant | what it breaks | oracles that catch it | smallest config that shows it |",
        "|---|---|---|---|",
    ]
    for mutant, run in results:
        command = check_command(mutant.config, mutant.impl)
        lines.append(f"| `{mutant.name}` | {mutant.what_it_breaks} | {oracle_list(run)} | `{command}` |")
    caught = sum(1 for _, run in results if not run.passed)
    lines += [
        "",
        f"mutation score: {caught} of {len(results)} mutants caught",
        "",
        "Generated by `python tests/support/make_bug_zoo_table.py --write docs/bug-zoo.md` from `tests/support/bug_zoo.py`; "
        "replay a row with `PYTHONPATH=tests/support` in front of its command.",
    ]
    return "\n".join(lines)


def replace_block(text: str, block: str) -> str | None:
    """`text` with the marked block replaced by `block`; None when the markers are missing or out of order."""
    start = text.find(START)
    end = text.find(END, start + len(START)) if start >= 0 else -1
    if start < 0 or end < 0:
        return None
    return text[: start + len(START)] + "\n" + block + "\n" + text[end:]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", metavar="FILE", help=f"replace the text between {START} and {END} in FILE")
    parser.add_argument("--workers", type=int, default=1, metavar="N",
                        help="mutants run at a time, as Ray tasks when over 1 (default 1: one after another here)")
    parser.add_argument("--cluster", metavar="local|auto|ray://HOST:PORT",
                        help="where --workers N > 1 runs: local (a Ray runtime started here, the default), auto, ray://HOST:PORT")
    args = parser.parse_args(argv)
    try:  # before any run
        from diffmoe.cluster.tasks import checked_cluster

        checked_cluster(args.cluster, args.workers)
    except ValueError as exc:
        print(f"make_bug_zoo_table: {exc}", file=sys.stderr)
        return 2

    if args.write:  # check the markers before spending minutes on the runs
        try:
            with open(args.write, encoding="utf-8") as f:
                original = f.read()
        except OSError as exc:
            print(f"make_bug_zoo_table: cannot read {args.write}: {exc}", file=sys.stderr)
            return 2
        if replace_block(original, "") is None:
            print(f"make_bug_zoo_table: {args.write} lacks the markers {START} ... {END}; nothing written",
                  file=sys.stderr)
            return 2

    try:
        results = run_all(progress=lambda line: print(line, file=sys.stderr, flush=True), workers=args.workers,
                          cluster=args.cluster)
    except ValueError as exc:  # a --cluster nothing answers at: before any run
        print(f"make_bug_zoo_table: {exc}", file=sys.stderr)
        return 2
    table = render_table(results)
    if args.write:
        updated = replace_block(original, table)
        with open(args.write, "w", encoding="utf-8") as f:
            f.write(updated)
        print(f"wrote the bug-zoo table into {args.write}", file=sys.stderr)
    else:
        print(table)
    return 0 if all(not run.passed for _, run in results) else 1


if __name__ == "__main__":
    sys.exit(main())
