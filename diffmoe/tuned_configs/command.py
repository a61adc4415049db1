"""`diffmoe tuned-configs --impl NAME[==V]`: the command line of the tuned-config sweep (sweep.py).

    diffmoe tuned-configs --impl vllm==0.33.0 [--model NAME] [--files GLOB] [--max-entries N] [--resume FILE]
                          [--config-dir DIR] [--workers N [--cluster local|auto|ray://HOST:PORT]] [--json]

stdout: a table (file, batch, config, verdict, first finding) and the files skipped with their
reason, or one JSON object with --json; stderr: progress (diffmoe/cluster/progress.py) and usage
errors. Exit 0 only when every judged entry passed, 1 when one failed, 2 for usage errors (an
--impl without tuned configs, a release not in the peer cache: its fetch command, a glob matching
no file, a bad number, a --cluster that is not a cluster spec or cannot be reached). --workers N > 1
judges the distinct runs as Ray tasks (diffmoe/cluster/tasks.py) on --cluster, a local Ray runtime
by default; a task that fails is the CLI's internal error (exit 3), the verdicts before it kept in
--resume's file.

Owns the arguments, the output and the exit codes. Must not judge: sweep.py does.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Sequence

EXIT_PASS, EXIT_FAIL, EXIT_USAGE = 0, 1, 2
DESCRIPTION = ("Judge every tuned tile config a peer's release ships: each entry forced through the release's own "
               "override on a CPU-size problem of its file's scheme, checked by every oracle (exit 1 on a failing entry).")


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 1, got {text!r}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`diffmoe tuned-configs`' arguments (diffmoe/frontends/commands/tuned_configs.py adds them to its subcommand)."""
    parser.add_argument("--impl", required=True, metavar="NAME[==V]",
                        help="the peer release whose shipped tuned configs are judged (vllm, vllm==0.28.0, vllm==0.30.0, vllm==0.33.0, "
                             "sglang, sglang==0.5.20, sglang==0.5.23)")
    parser.add_argument("--model", metavar="NAME",
                        help="only the files a real model's MoE layer loads: its E (with shared experts fused or not) and N = I / TP "
                             "for TP in 1, 2, 4, 8, 16 (`diffmoe models` lists the names)")
    parser.add_argument("--files", default="*.json", metavar="GLOB", help="only the config files whose name matches GLOB (default: all)")
    parser.add_argument("--max-entries", type=_count, metavar="N", help="judge at most N file entries (then the default config)")
    parser.add_argument("--resume", type=Path, metavar="FILE",
                        help="append each verdict to FILE (JSON lines) and take the verdicts it already holds: an interrupted sweep continues")
    parser.add_argument("--config-dir", type=Path, metavar="DIR",
                        help="read the config files from DIR instead of the release's cached wheel (a copy to try an edit on)")
    parser.add_argument("--workers", type=_count, default=1, metavar="N",
                        help="judge N distinct runs at a time, as Ray tasks (default 1: one after another in this process)")
    parser.add_argument("--cluster", metavar="local|auto|ray://HOST:PORT",
                        help="where --workers N > 1 runs its tasks: local (a Ray runtime started here, the default), auto (the running "
                             "cluster this machine is in), ray://HOST:PORT or HOST:PORT (that cluster); each task asks for one GPU on CUDA")
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")


def main(argv: Sequence[str] | None = None, *, prog: str = "diffmoe tuned-configs") -> int:
    parser = argparse.ArgumentParser(prog=prog, description=DESCRIPTION)
    add_arguments(parser)
    try:
        args = parser.parse_args(list(argv) if argv is not None else None)
    except SystemExit as exc:
        return EXIT_PASS if exc.code == 0 else EXIT_USAGE
    return run(args, prog)


def _usage(prog: str, message: str) -> int:
    print(f"{prog}: {message}", file=sys.stderr)
    return EXIT_USAGE


def run(args: argparse.Namespace, prog: str = "diffmoe tuned-configs") -> int:
    from diffmoe.contract import factory_peer_wheel
    from diffmoe.adapters.loading import load_factory
    from diffmoe.adapters.peer_wheels import PeerError, peer_root
    from diffmoe.cluster.progress import Progress

    from diffmoe.cluster.tasks import checked_cluster

    from .sweep import factory_tuned_configs, sweep

    # the arguments first, then the cluster, then the release's import (issue 48: a usage error after a
    # slow import is a usage error that came late)
    from diffmoe.problem.models import model

    try:
        shape = None if args.model is None else model(args.model, "--model")
    except ValueError as exc:
        return _usage(prog, str(exc))
    if args.config_dir is not None and not args.config_dir.is_dir():
        return _usage(prog, f"--config-dir {str(args.config_dir)!r} is not a folder")
    if args.resume is not None and (args.resume.is_dir() or not args.resume.absolute().parent.is_dir()):
        return _usage(prog, f"--resume {str(args.resume)!r} must be a file in an existing folder")
    try:  # before any run and before the progress starts
        cluster = checked_cluster(args.cluster, args.workers)
    except ValueError as exc:
        return _usage(prog, str(exc))
    try:
        factory = load_factory(args.impl)
        declared = factory_tuned_configs(factory)
    except (ValueError, TypeError) as exc:
        return _usage(prog, str(exc))
    if declared is None:
        return _usage(prog, f"--impl {args.impl!r} declares no tuned configs (tuned_config_dir, with_tile_config); "
                            "releases that do: vllm, vllm==0.28.0, vllm==0.30.0, vllm==0.33.0, sglang, sglang==0.5.20, sglang==0.5.23")
    if args.config_dir is not None:
        folder = args.config_dir
    else:
        try:
            folder = peer_root(factory_peer_wheel(factory)) / declared[0]
        except PeerError as exc:
            return _usage(prog, str(exc))
    result = None
    try:
        with Progress(sys.stderr, "tuned-configs", total=None, unit="verdict", json_lines=args.json) as progress:
            def on_row(row) -> None:
                verdict = "PASS" if row.passed else f"FAIL {row.first_finding[:100]}"
                progress.advance(detail=f"{row.file} batch {row.batch}: {verdict}{' (shared)' if row.shared else ''}")

            result = sweep(factory, folder, args.impl, pattern=args.files, max_entries=args.max_entries, resume=args.resume,
                           on_start=lambda total: progress.update(0, total=total), on_row=on_row,
                           workers=args.workers, cluster=cluster, model=shape)
    except ValueError as exc:
        return _usage(prog, str(exc))
    if args.json:
        print(json.dumps({"impl": args.impl, "passed": result.passed, "rows": [r.as_json() for r in result.rows],
                          "skipped": [{"file": f, "why": why} for f, why in result.skipped]}))
    else:
        print(render(result))
    return EXIT_PASS if result.passed else EXIT_FAIL


def render(result) -> str:
    lines = [f"{'file':60}  {'batch':>5}  {'config':44}  verdict  first finding"]
    for r in result.rows:
        tile = "the release's get_default_config" if r.tile is None else " ".join(
            f"{k.replace('BLOCK_SIZE_', '').replace('GROUP_SIZE_M', 'G')}={v}" for k, v in r.tile.items())
        lines.append(f"{r.file:60}  {r.batch:>5}  {tile:44}  {'PASS' if r.passed else 'FAIL':7}  "
                     f"{(r.first_finding or '')[:160]}")
    failed = sum(not r.passed for r in result.rows)
    lines.append(f"{len(result.rows)} entries judged, {failed} failed, {sum(r.shared for r in result.rows)} "
                 f"verdicts shared with an identical run; {len(result.skipped)} files skipped")
    for name, why in result.skipped:
        lines.append(f"  skipped {name}: {why}")
    return "\n".join(lines)
