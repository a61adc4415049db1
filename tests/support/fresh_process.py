"""A command run in a fresh interpreter, for the tests that start a local Ray runtime.

A local runtime started inside a pytest worker outlives its `ray.shutdown()` in ways later tests of
that worker meet (measured 2026-12-05 in a full suite: its node processes still counted as the
worker's children by the process pool's tests, and the next join of the shared two-node cluster from
the same process had its Board actor destroyed before it ran: 22 failures). Those tests run their
Ray half here instead; the half they compare with stays in process.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_SECONDS = 280  # under the suite's 300 s per test


def run(args: list[str]) -> subprocess.CompletedProcess:
    """`python ARGS` from the repository root, the interpreter on, tests/support/ importable; stdout and stderr kept."""
    path = os.pathsep.join([str(ROOT / "tests" / "support"), str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
    env = dict(os.environ, PYTHONPATH=path, TRITON_INTERPRET=os.environ.get("TRITON_INTERPRET", "1"))
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=TIMEOUT_SECONDS)
