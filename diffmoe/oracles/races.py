"""The races oracle: a byte stored by one program instance and touched by another of the same launch.

Owns the verdict on the first run's address record; the recording is diffmoe/interpreter/address_recorder.py's
(the one module that hooks the interpreter's loads and stores).

Must not hook the interpreter itself.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from diffmoe.findings import Finding, Oracles
from diffmoe.oracles.base import Oracle

if TYPE_CHECKING:
    from diffmoe.check.execution import Check, Run


class Races(Oracle):
    name = Oracles.RACES
    checks = "interpreter only"
    how = ("per-program load/store addresses (masked lanes excluded); a byte stored by one program and touched by "
           "another of the same launch")
    rank = 10
    records_addresses = True

    def judge_run(self, check: Check, run: Run, first: bool) -> list[Finding]:
        return run.addresses.findings() if first and run.addresses is not None else []
