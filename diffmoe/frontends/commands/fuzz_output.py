"""What `diffmoe fuzz` prints beside its report: its progress on stderr (ProgressPrinter), its summary
line, and the minimal failing config written with --save-failure. Not a command: part of commands/fuzz.py.

Owns those lines' wording (tests/frontends/test_robustness_cli.py reads the progress lines); must not decide an
exit status beyond --save-failure's own.
"""

from __future__ import annotations

import json
import sys
from typing import TextIO

from diffmoe.frontends.exits import EXIT_USAGE, PROG


class ProgressPrinter:
    """Fuzz progress on stderr (diffmoe/cluster/progress.py). On a terminal a live bar per phase:
    the generate phase counts examples against `total` (--max-examples: rate and time left), the
    shrink phase has no total (count and rate). Otherwise the plain line
    "fuzz: N examples  phase=P  S s  <config>" at each phase change and every `interval` seconds
    (logs stay short but alive); with --json a JSON object at the same moments (tests/frontends/test_robustness_cli.py
    reads them). A callable as the fuzz's
    `progress` (examples started so far, phase, seconds, the config under way)."""

    def __init__(self, stream: TextIO, tty: bool | None = None, interval: float = 10.0, *,
                 total: int | None = None, label: str = "fuzz", json_lines: bool = False) -> None:
        self.stream, self.tty, self.interval, self.total, self.label = stream, tty, interval, total, label
        self.json_lines = json_lines
        self._progress = None
        self._examples = 0

    def __call__(self, examples: int, phase: str, elapsed: float, config: str) -> None:
        from diffmoe.cluster.progress import Progress

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
