"""A default check with the call-sequence oracle's call of other values of one shape (issue 33) and
without it, in one process, alternating: "without" is diffmoe/oracles/call_sequence.py as it was
before that call, loaded from an older checkout (its git worktree or clone); `time.process_time()`,
median of the rounds. Torch runs on one thread, as in the check worker (diffmoe/check/worker.py).

    TRITON_INTERPRET=1 .venv/bin/python bench/ab_call_of_other_values.py OLDER_CHECKOUT --rounds 5
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import time

os.environ.setdefault("TRITON_INTERPRET", "1")  # before anything imports Triton

import torch  # noqa: E402

import optimized  # noqa: E402,F401 - installs the interpreter fixes and the fast path
from diffmoe.judge.runner import run_differential  # noqa: E402
from diffmoe.oracles import call_sequence  # noqa: E402
from diffmoe.problem.config import MoEConfig  # noqa: E402

# the oracle-overhead benchmark's config (bench/bench_oracle_overhead.py), and a larger bf16 call
CONFIGS = {
    "T=16 E=8 K=2 H=I=128 fp8-token fused": MoEConfig(num_tokens=16, num_experts=8, topk=2, hidden=128, inter=128,
                                                      quant="fp8-token", fused=True),
    "T=64 E=8 K=2 H=I=128 bf16": MoEConfig(num_tokens=64, num_experts=8, topk=2, hidden=128, inter=128, quant="bf16"),
}


def older_finish(checkout: str):
    """CallSequence.finish of the older checkout's call_sequence.py (its imports resolve here)."""
    path = os.path.join(checkout, "diffmoe", "oracles", "call_sequence.py")
    spec = importlib.util.spec_from_file_location("call_sequence_before", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.CallSequence.finish


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("older", help="a checkout whose call_sequence.py lacks the call of other values")
    parser.add_argument("--rounds", type=int, default=5, help="rounds of each, alternating (default 5)")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error(f"--rounds must be >= 1, got {args.rounds}")
    new, old = call_sequence.CallSequence.finish, older_finish(args.older)
    torch.set_num_threads(1)
    try:
        for name, config in CONFIGS.items():
            times: dict[bool, list[float]] = {False: [], True: []}
            for r in range(args.rounds + 1):  # round 0 warms imports, rewrites and memos
                for with_it in (False, True):
                    call_sequence.CallSequence.finish = new if with_it else old
                    start = time.process_time()
                    report = run_differential(config)
                    assert report.passed, report.render()
                    if r:
                        times[with_it].append(time.process_time() - start)
            a, b = statistics.median(times[False]), statistics.median(times[True])
            print(f"{name}: without {a:.3f} s, with {b:.3f} s: {b - a:+.3f} s ({100 * (b - a) / a:+.1f} %) "
                  f"(process time, medians of {args.rounds})")
    finally:
        call_sequence.CallSequence.finish = new


if __name__ == "__main__":
    main()
