"""`python -m diffmoe ...` in a fresh process whose working folder and PYTHONPATH are tests/support/
(the hostile kernels a command names import from there): its exit status, its JSON report (None when
stdout is none) and its text. Shared by the exploit suite and the launch-work tests.

Owns the call. Must not judge its result: the tests do.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent  # tests/support/: the helpers a command imports


def _cli(*args: str, env: dict[str, str] | None = None) -> tuple[int, dict | None, str]:
    done = subprocess.run([sys.executable, "-m", "diffmoe", *args], cwd=TESTS, capture_output=True, text=True,
                          timeout=900, env=dict(os.environ, PYTHONPATH=str(TESTS), **(env or {})))
    try:
        return done.returncode, json.loads(done.stdout), done.stderr
    except json.JSONDecodeError:
        return done.returncode, None, done.stdout + done.stderr
