"""The red-zone oracle: out-of-bounds writes, seen as changed guard bytes.

Owns reporting what the check's red-zone watcher (diffmoe/check/execution.py, after every launch of
every run) found; the guards themselves are guards.py's.

Must not check guard bytes itself: the watcher does, after every launch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from diffmoe.findings import Finding, Oracles
from diffmoe.oracles.base import Oracle

if TYPE_CHECKING:
    from diffmoe.check.execution import Check, Run


class RedZone(Oracle):
    name = Oracles.RED_ZONE
    checks = "out-of-bounds writes"
    how = ("guard bytes around each workspace and a separate output, checked after every launch; names the stage, the "
           "workspace and the first bad offset")
    rank = 20

    def judge_run(self, check: Check, run: Run, first: bool) -> list[Finding]:
        for f in run.red_zones:
            f.figures["schedule"] = str(run.schedule)
        return list(run.red_zones)
