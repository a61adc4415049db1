"""Each bug-zoo mutant of the shipped kernel under a sampled check (docs/models.md, "Sampled checks").

Every launch but the alignment sampled (ProgramSample(seed=0, seeded=2, full_below=2): the grid's
corners and ends and two seeded programs, even at a unit test's size), at the mutant's own config
with no NaN or Inf rows (a sampled check has none). One line per mutant: the oracles it is meant to
be caught by that a sampled check runs, what the sampled check found, and whether the shipped
kernel passes the same sampled check. Run from the repository root:

    python bench/sampled_bug_zoo.py
"""

from __future__ import annotations

import os
import sys
import time
import warnings
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "support"))

from bug_zoo import MUTANTS  # noqa: E402

from diffmoe.interpreter.program_sample import ProgramSample  # noqa: E402
from diffmoe.judge.runner import run_differential  # noqa: E402
from diffmoe.oracles.registry import SAMPLED_ORACLES  # noqa: E402

SAMPLE = ProgramSample(seed=0, seeded=2, full_below=2)


def main() -> int:
    warnings.filterwarnings("ignore")
    caught = meant = 0
    for mutant in MUTANTS.values():
        if mutant.peer is not None:
            continue
        config = mutant.config.replace(nan_rows=0, inf_rows=0)
        expected = sorted(set(mutant.expected_oracles) & set(SAMPLED_ORACLES))
        start = time.perf_counter()
        report = run_differential(config, mutant.factory, implementation_name=mutant.impl, sample=SAMPLE)
        control = run_differential(mutant.control_config.replace(nan_rows=0, inf_rows=0), mutant.control_factory,
                                   sample=SAMPLE)
        found = report.oracles_with_findings()
        meant += bool(expected)
        caught += bool(expected) and bool(found)
        print(f"{mutant.name:34s} meant: {','.join(expected) or '-':42s} found: {','.join(found) or 'none':36s} "
              f"control: {'PASS' if control.passed else 'FAIL'}  NaN rows dropped: {'yes' if config != mutant.config else 'no'}"
              f"  {time.perf_counter() - start:.0f} s", flush=True)
    print(f"{caught} of {meant} mutants meant for an oracle a sampled check runs were caught")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
