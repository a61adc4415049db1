"""Before and after the interpreter fast path (diffmoe/interpreter/fast_path.py) in one process: the
execution tier's cheap check (the fuzzer's per-example work, diffmoe/fuzz/tiers.py) of three configs
the default fuzz draws (seed 5), with the fast path installed and with triton's own interpreter
(`interpreter_speed.uninstall()`), alternating, `time.process_time()` and wall seconds, median of
the rounds. Torch runs on one thread, as in the check worker (diffmoe/check/worker.py). Process time is
steadier than wall time on a shared machine; both are printed. The bits do not differ
(tests/interpreter/test_interpreter_speed.py), so only time is compared.

    TRITON_INTERPRET=1 .venv/bin/python bench/ab_interpreter_speed.py --rounds 3

`--against bounds-guard` compares instead the same checks with and without the bounds guard
(diffmoe/interpreter/bounds_guard.py, which every call runs under): its cost on the interpreter.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("TRITON_INTERPRET", "1")  # before anything imports Triton

import torch  # noqa: E402

import optimized  # noqa: E402,F401 - installs the interpreter fixes and the fast path
from diffmoe.interpreter import bounds_guard  # noqa: E402
from diffmoe.interpreter import fast_path as interpreter_speed  # noqa: E402
from diffmoe.problem.config import MoEConfig  # noqa: E402
from diffmoe.fuzz.tiers import CHEAP_ORACLES, cheap_schedule  # noqa: E402
from diffmoe.judge.runner import run_differential  # noqa: E402

# drawn by `diffmoe fuzz --seed 5` (its 7th, 6th and 10th examples): a many-expert block-scaled
# check, a small per-token one and a wide unfused one
CONFIGS = (
    MoEConfig(num_tokens=33, num_experts=47, topk=11, hidden=128, inter=128, quant="fp8-block", fused=True, seed=43973),
    MoEConfig(num_tokens=27, num_experts=10, topk=7, hidden=110, inter=96, quant="fp8-token", fused=True, seed=4031),
    MoEConfig(num_tokens=64, num_experts=47, topk=47, hidden=21, inter=16, quant="fp8-tensor", seed=1380287),
)


_guard_for_call = bounds_guard.guard_for_call


def _no_guard(named, stage=None):
    return None, "switched off by bench/ab_interpreter_speed.py --against bounds-guard"


def one_round(fast: bool, against: str = "triton") -> tuple[float, float]:
    """Process and wall seconds of one cheap check of every config: with the fast path (fast) or
    triton's own interpreter; with `against="bounds-guard"`, with (fast) or without the bounds guard."""
    if against == "bounds-guard":
        bounds_guard.guard_for_call = _guard_for_call if fast else _no_guard
    elif fast:
        assert interpreter_speed.install() == "installed"
    else:
        interpreter_speed.uninstall()
    cpu, wall = time.process_time(), time.perf_counter()
    for config in CONFIGS:
        report = run_differential(config, oracles=CHEAP_ORACLES, schedules=(cheap_schedule(config),))
        assert report.passed, report.render()
    return time.process_time() - cpu, time.perf_counter() - wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="rounds of each, alternating (default 3)")
    parser.add_argument("--against", choices=("triton", "bounds-guard"), default="triton",
                        help="what the fast path is compared with (default triton's own interpreter), or "
                             "bounds-guard: the checks with and without the bounds guard")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error(f"--rounds must be >= 1, got {args.rounds}")
    torch.set_num_threads(1)
    one_round(True, args.against)  # imports, rewrites and memos outside the measurement
    one_round(False, args.against)
    times: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
    for _ in range(args.rounds):
        for fast in (False, True):
            times[fast].append(one_round(fast, args.against))
    assert interpreter_speed.install() == "installed"
    bounds_guard.guard_for_call = _guard_for_call
    labels = {True: "fast path", False: "triton   "} if args.against == "triton" else \
        {True: "guard    ", False: "no guard "}
    for fast in (False, True):
        cpu = statistics.median(c for c, _ in times[fast])
        wall = statistics.median(w for _, w in times[fast])
        print(f"{labels[fast]}: process {cpu:.2f} s, wall {wall:.2f} s "
              f"(median of {args.rounds}; rounds {', '.join(f'{c:.2f}/{w:.2f}' for c, w in times[fast])})")


if __name__ == "__main__":
    main()
