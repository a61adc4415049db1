"""A snapshot of what the command line says on every labelled edge case of every scheme, to show a
reorganisation changed no behaviour: `diffmoe check --json` (fields holding times removed) or
`diffmoe plan`, one JSON line per case, through the CLI's main() in one process.

    PYTHONPATH=OLD_TREE python bench/behaviour_snapshot.py before.jsonl check
    PYTHONPATH=NEW_TREE python bench/behaviour_snapshot.py after.jsonl check
    cmp before.jsonl after.jsonl

Run from outside both trees (PYTHONPATH picks the tree). docs/flow.md records the last comparison.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import shlex
import sys

from diffmoe.check.report import check_command
from diffmoe.frontends import cli
from diffmoe.problem.config import QUANT_SCHEMES
from diffmoe.problem.edge_cases import edge_cases

TIMED = re.compile(r"second|elapsed|_s$|time")  # keys whose values are measured, not decided


def untimed(obj):
    if isinstance(obj, dict):
        return {k: untimed(v) for k, v in obj.items() if not TIMED.search(k)}
    if isinstance(obj, list):
        return [untimed(v) for v in obj]
    return obj


def snapshot(out: str, command: str) -> None:
    with open(out, "w", encoding="utf-8") as f:
        for quant in QUANT_SCHEMES:
            for label, config in edge_cases(quant).items():
                argv = [command, *shlex.split(check_command(config))[2:]] + (["--json"] if command == "check" else [])
                stdout = io.StringIO()
                with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(io.StringIO()):
                    try:
                        code = cli.main(argv)
                    except SystemExit as exc:
                        code = exc.code
                said = stdout.getvalue()
                if command == "check":
                    with contextlib.suppress(ValueError):
                        said = untimed(json.loads(said))
                f.write(json.dumps({"quant": quant, "case": label, "rc": code, "out": said}, sort_keys=True) + "\n")
                print(quant, label, code, flush=True)


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[2] not in ("check", "plan"):
        sys.exit("usage: behaviour_snapshot.py OUT.jsonl check|plan")
    snapshot(sys.argv[1], sys.argv[2])
