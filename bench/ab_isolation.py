"""What isolation costs a default check, in CPU seconds of both processes and in wall time.

Runs the same default check (every default oracle and schedule, in this process as the judge)
alternately with the implementation in this process (`isolation="none"`) and in its own
(`"process"`), `--rounds` times each after one untimed warm-up of each (the zygote's start is
paid there, once, as a CLI run or a test session pays it). CPU seconds are this process's
`time.process_time()` plus, isolated, the candidate's own (it reports them when its check closes:
diffmoe.isolation.client.candidate_cpu_seconds), so a busy machine disturbs them far less than
wall time; both are printed, medians and the ratio.

    TRITON_INTERPRET=1 .venv/bin/python bench/ab_isolation.py --rounds 7

bench/bench_isolation.py is the pytest-benchmark of the same comparison in wall time.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from diffmoe.judge.runner import run_differential
from diffmoe.isolation.client import candidate_cpu_seconds
from diffmoe.problem.config import MoEConfig

CONFIGS = {
    "T=16 E=8 K=2 H=I=128 fp8-token fused": MoEConfig(num_tokens=16, num_experts=8, topk=2, hidden=128, inter=128,
                                                       quant="fp8-token", fused=True, output="separate", seed=0),
    "T=64 E=8 K=2 H=I=256 bf16": MoEConfig(num_tokens=64, num_experts=8, topk=2, hidden=256, inter=256, quant="bf16",
                                           fused=False, seed=0),
}


def one(config: MoEConfig, isolation: str) -> tuple[float, float]:
    cpu0, candidate0, wall0 = time.process_time(), candidate_cpu_seconds(), time.perf_counter()
    report = run_differential(config, isolation=isolation)
    if not report.passed:
        raise SystemExit(f"the config does not pass, timings would be meaningless:\n{report.render()}")
    return time.process_time() - cpu0 + candidate_cpu_seconds() - candidate0, time.perf_counter() - wall0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    # one thread, as the CLI's checks run (a forked worker, diffmoe/check/worker.py), and the
    # candidate takes its judge's count: idle OpenMP threads spinning on a busy machine would
    # otherwise be counted as CPU seconds
    torch.set_num_threads(1)
    for label, config in CONFIGS.items():
        for isolation in ("none", "process"):
            one(config, isolation)  # warm-up: first-call costs, the zygote's start
        times: dict[str, list[tuple[float, float]]] = {"none": [], "process": []}
        for _ in range(args.rounds):
            for isolation in ("none", "process"):
                times[isolation].append(one(config, isolation))
        cpu = {k: statistics.median(c for c, _ in v) for k, v in times.items()}
        wall = {k: statistics.median(w for _, w in v) for k, v in times.items()}
        print(f"{label}: CPU s none {cpu['none']:.3f} process {cpu['process']:.3f} "
              f"(+{100 * (cpu['process'] / cpu['none'] - 1):.1f} %); wall s none {wall['none']:.3f} "
              f"process {wall['process']:.3f} (+{100 * (wall['process'] / wall['none'] - 1):.1f} %), "
              f"medians of {args.rounds}")


if __name__ == "__main__":
    main()
