"""How fast `diffmoe fuzz` stops: the seconds from a signal to the command's exit, as a shell sees
them (issue 48 moved the figure here from tests/frontends/test_robustness_cli.py, whose 3 s goal failed at
6.7 s at load average 20; the tests there bound a hang only).

* `sigterm-shrinking`: SIGTERM while the first failure is being shrunk (one worker);
* `sigint-generating`: a Ctrl-C (SIGINT) before any failure was found (one worker);
* `ctrl-c-two-workers`: a Ctrl-C to the whole process group of a `--workers 2` fuzz, which also
  stops its local Ray runtime.

Each round starts a fresh fuzz of the stand-in implementation of tests/frontends/test_robustness_cli.py (it
answers at once but hangs for H > 256) and waits, untimed, for the phase; only the signal to the
exit is timed (extra_info keeps each round's figure).

    python -m pytest bench/bench_stop.py --benchmark-only --benchmark-columns=median,min,max,rounds

docs/robustness.md ("Interrupts") quotes the figures with their date and machine.
"""

from __future__ import annotations

import os
import signal
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
from test_robustness_cli import FIRST_EXAMPLE, HANGS_ON_WIDE_HIDDEN, SHRINKING, Fuzz  # noqa: E402

CASES = {
    "sigterm-shrinking": (SHRINKING, signal.SIGTERM, False, ()),
    "sigint-generating": (FIRST_EXAMPLE, signal.SIGINT, False, ()),
    "ctrl-c-two-workers": (SHRINKING, signal.SIGINT, True, ("--workers", "2")),
}
ROUNDS = 3


@pytest.mark.parametrize("case", list(CASES))
def test_stop_latency(benchmark, tmp_path, case):
    phase, signum, group, extra = CASES[case]
    benchmark.group = "fuzz stop"
    (tmp_path / "hangs.py").write_text(HANGS_ON_WIDE_HIDDEN)
    started: list[Fuzz] = []
    seconds: list[float] = []

    def start():
        fuzz = Fuzz(tmp_path, tmp_path / f"db{len(started)}", *extra)
        fuzz.wait_for(phase, timeout=240)
        started.append(fuzz)
        return (), {}

    def stop():
        elapsed, code, _ = started[-1].interrupt(signum, group=group)
        assert code in (1, 130), code
        seconds.append(round(elapsed, 3))

    benchmark.pedantic(stop, setup=start, rounds=ROUNDS, iterations=1)
    benchmark.extra_info.update(case=case, seconds=seconds)
