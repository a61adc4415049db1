"""What a check at a real model's shape costs, and how it grows with T and with the local experts (issue 42).

Each case is one `diffmoe check --model qwen3-next-80b-a3b --ep 0/N --tokens T --json` in a fresh
process, as a user runs it (the implementation in its own process, every default oracle and
schedule): Qwen3-Next's layer (512 routed experts and a shared one, top-10, H = 2048, I = 512) on
rank 0 of N, which holds 512 / N routed experts and the shared one. Timed once per case (a check at
these sizes takes seconds to minutes; the first-call costs are part of what a user waits for); the
peak resident set of the check's process tree (`os.wait4`'s rusage) is in each case's extra_info:

    python -m pytest bench/bench_model_shapes.py --benchmark-only --benchmark-columns=median \\
        --benchmark-json=/tmp/model_shapes.json

docs/models.md records the figures.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

MODEL = "qwen3-next-80b-a3b"
# (T, EP size): T grows on one routed expert, then the local experts grow at T = 16.
CASES = [(1, 512), (16, 512), (256, 512), (16, 128), (16, 32)]


def _check(tokens: int, size: int) -> dict:
    """One check in a fresh process: its JSON report and the tree's peak resident set in MB."""
    proc = subprocess.Popen([sys.executable, "-m", "diffmoe", "check", "--model", MODEL, "--ep", f"0/{size}",
                             "--tokens", str(tokens), "--json"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    report = json.loads(out)
    assert proc.returncode == 0 and report["passed"], report
    return {"peak_rss_mb": usage.ru_maxrss / 1024, "report_seconds": report.get("seconds")}


@pytest.mark.parametrize("tokens,size", CASES, ids=[f"T{t}-ep{s}" for t, s in CASES])
def test_check_at_a_models_shape(tokens: int, size: int, benchmark):
    measured = {}

    def run():
        measured.update(_check(tokens, size))

    benchmark.group = f"model-shape {MODEL}"
    benchmark.pedantic(run, rounds=1, iterations=1)
    benchmark.extra_info.update({"model": MODEL, "tokens": tokens, "ep_size": size,
                                 "local_routed_experts": 512 // size, **measured})
