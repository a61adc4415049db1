"""Implementations for tests/isolation/test_isolation.py: faults and probes run in the candidate's process.

A module of its own that imports only what an implementation may (the shipped kernel, the
contract, the import guard's list), so the candidate's process loads it: the faults under test
are the implementation's, not a refused import of a test module.
"""

from __future__ import annotations

import os
import sys
import time

from diffmoe.contract import RunResult
from diffmoe.isolation.import_guard import refused
from optimized.moe import TritonFP8MoE


class ReportsWhatItsProcessHolds(TritonFP8MoE):
    """Fails on purpose with what its process holds: the refused modules imported there."""

    def run(self, problem, workspaces, *, output=None, **kwargs):
        modules = sorted(m for m in sys.modules if refused(m))
        raise RuntimeError(f"pid={os.getpid()} refused-modules={modules}")


class ExitsInRun(TritonFP8MoE):
    def run(self, *args, **kwargs):
        sys.exit(0)


class OsExitInRun(TritonFP8MoE):
    def run(self, *args, **kwargs):
        os._exit(0)


class ProcessEndsInRun(TritonFP8MoE):
    def run(self, *args, **kwargs):
        import posix

        posix._exit(0)  # below os._exit, as C code's exit() would: nothing in process can stop it


def returns_none(config):
    return None


class SleepsForever(TritonFP8MoE):
    """Writes its pid to $DIFFMOE_TEST_PID_FILE when it is built (its process's first act of its own),
    then never returns from run()."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        with open(os.environ["DIFFMOE_TEST_PID_FILE"], "w") as fh:
            fh.write(str(os.getpid()))

    def run(self, *args, **kwargs):
        while True:
            time.sleep(0.05)


class FindsThePeerCache(TritonFP8MoE):
    """The shipped kernel, whose result is zeroed unless the peer cache it finds in its process is
    the one the judge named in $EXPECTED (a peer's wheels are looked up there)."""

    EXPECTED = "DIFFMOE_TEST_PEER_CACHE"

    def run(self, problem, workspaces, **kwargs):
        from diffmoe.adapters import peer_wheels

        result = super().run(problem, workspaces, **kwargs)
        if str(peer_wheels.cache_dir()) != os.environ.get(self.EXPECTED):
            result.output.zero_()
        return result
