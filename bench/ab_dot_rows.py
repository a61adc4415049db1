"""The interpreter's dots row by row (diffmoe/interpreter/dot_rows.py) against one whole-tile
`np.matmul`, in one process, alternating: the shipped kernels' dots are the fixes' bf16 and fp8
dots (diffmoe/interpreter/fixes.py), whose product is `fixes.matmul_by_rows`; "whole" swaps it for
`np.matmul` of the tile for the round. Measured: the execution tier's cheap check of the three
configs of bench/ab_interpreter_speed.py, and a default check of T=16 E=8 K=2 H=I=128 fp8-token
fused; `time.process_time()`, median of the rounds. Torch on one thread, as in the check worker.

    TRITON_INTERPRET=1 .venv/bin/python bench/ab_dot_rows.py --rounds 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("TRITON_INTERPRET", "1")  # before anything imports Triton

import numpy as np  # noqa: E402
import torch  # noqa: E402

import optimized  # noqa: E402,F401 - installs the interpreter fixes and the fast path
from diffmoe.judge.runner import run_differential  # noqa: E402
from diffmoe.fuzz.tiers import CHEAP_ORACLES, cheap_schedule  # noqa: E402
from diffmoe.interpreter import dot_rows, fixes  # noqa: E402
from diffmoe.problem.config import MoEConfig  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
from ab_interpreter_speed import CONFIGS  # noqa: E402

DEFAULT = MoEConfig(num_tokens=16, num_experts=8, topk=2, hidden=128, inter=128, quant="fp8-token", fused=True)


def whole_tile(a, b, dtype):
    return np.matmul(a, b, dtype=dtype)


def one_round(rows: bool, which: str) -> float:
    fixes.matmul_by_rows = dot_rows.matmul_by_rows if rows else whole_tile
    start = time.process_time()
    if which == "cheap":
        for config in CONFIGS:
            assert run_differential(config, oracles=CHEAP_ORACLES, schedules=(cheap_schedule(config),)).passed
    else:
        assert run_differential(DEFAULT).passed
    return time.process_time() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="rounds of each, alternating (default 3)")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error(f"--rounds must be >= 1, got {args.rounds}")
    torch.set_num_threads(1)
    try:
        for which in ("cheap", "default"):
            one_round(True, which)  # imports, rewrites and memos outside the measurement
            one_round(False, which)
            times: dict[bool, list[float]] = {False: [], True: []}
            for _ in range(args.rounds):
                for rows in (False, True):
                    times[rows].append(one_round(rows, which))
            for rows in (False, True):
                print(f"{which} check, {'rows ' if rows else 'whole'}: process {statistics.median(times[rows]):.3f} s "
                      f"(median of {args.rounds}; rounds {', '.join(f'{t:.2f}' for t in times[rows])})")
    finally:
        fixes.matmul_by_rows = dot_rows.matmul_by_rows


if __name__ == "__main__":
    main()
