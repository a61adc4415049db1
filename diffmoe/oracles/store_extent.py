"""The store-extent oracle: every byte a launch stores lies inside a view it declared it writes.

Owns the verdict on the first run's store addresses; the recording is diffmoe/interpreter/address_recorder.py's.

Must not hook the interpreter itself.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from diffmoe.findings import Finding, Oracles
from diffmoe.oracles.base import Oracle

if TYPE_CHECKING:
    from diffmoe.check.execution import Check, Run


class StoreExtent(Oracle):
    name = Oracles.STORE_EXTENT
    checks = "stray stores (interpreter)"
    how = ("the race recorder's store addresses of each launch must lie inside the views the launch declared it writes; a "
           "store into workspace bytes nobody reads yet changes no value, so only this sees it; names the stage, kernel "
           "and where the bytes landed (`ws1[512:768]`)")
    rank = 11
    records_addresses = True

    def judge_run(self, check: Check, run: Run, first: bool) -> list[Finding]:
        return run.addresses.store_extent_findings() if first and run.addresses is not None else []
