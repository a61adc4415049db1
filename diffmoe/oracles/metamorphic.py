"""The metamorphic oracle: fusing activation and quantisation must not change a bit.

Owns the sibling run (the same inputs under the other `fused` flag, on a fresh instance and
fresh workspaces). Reads the first order's run; must not touch the check's workspaces.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from diffmoe.tolerance.compare import Rule, compare
from diffmoe.findings import Finding, Oracles
from diffmoe.problem.vocabulary import Buffers, producer_stage
from diffmoe.oracles.base import Oracle

if TYPE_CHECKING:
    from diffmoe.check.execution import Check


def _sibling_figures(sibling_cfg) -> dict:
    """Which run disagreed with which: two runs cannot tell whose bits are wrong, so the
    finding names the sibling too (the fuzzer judges it on its own, diffmoe.fuzz.driver)."""
    from diffmoe.check.report import check_command

    return {"sibling_config": sibling_cfg.to_dict(), "sibling_replay": check_command(sibling_cfg)}


class Metamorphic(Oracle):
    name = Oracles.METAMORPHIC
    checks = "fusion does not change bits"
    how = "fused and unfused runs must give bitwise the same `quanted_down_input` and scales"
    rank = 100

    def finish(self, check: Check) -> list[Finding]:
        from diffmoe.check.execution import Crash

        if check.problem.num_tokens == 0 or not check.config.is_fp8:
            return []
        from diffmoe.contract import unsupported

        sibling_cfg = check.config.replace(fused=not check.config.fused)
        refused = unsupported(check.factory, sibling_cfg)
        if refused is not None:  # the implementation has no sibling to compare with (its own word)
            check.skipped[self.name] = f"the implementation does not run the sibling (fused={sibling_cfg.fused}): {refused}"
            return []
        try:
            return self._sibling_agrees(check, sibling_cfg)
        except Crash as crash:  # the sibling's crash is this check's finding; the rest stands
            crash.finding.message = f"metamorphic sibling (fused={sibling_cfg.fused}): {crash.finding.message}"
            crash.finding.figures = {**(crash.finding.figures or {}), **_sibling_figures(sibling_cfg)}
            return [crash.finding]

    def _sibling_agrees(self, check: Check, sibling_cfg) -> list[Finding]:
        """fused and unfused runs must give bitwise the same quanted_down_input."""
        run = check.runs[0]
        # the same inputs (the fused flag does not enter problem generation), under the sibling's config
        other = check.execute_fresh(sibling_cfg, replace(check.problem, config=sibling_cfg),
                                    f"the metamorphic run with fused={sibling_cfg.fused}")
        found = []
        for name in (Buffers.QUANTED_DOWN_INPUT, Buffers.QUANTED_DOWN_INPUT_SCALES):
            if name not in run.buffers or name not in other.buffers:
                continue
            c = compare(name, run.buffers[name], other.buffers[name], Rule.bitwise("fusion must not change the bits"))
            if not c.ok:
                found.append(Finding(
                    oracle=Oracles.METAMORPHIC, stage=producer_stage(check.config, name), buffers=[name],
                    message=f"fused={check.config.fused} and fused={sibling_cfg.fused} disagree on {c.summary()}",
                    figures={**c.figures(), **_sibling_figures(sibling_cfg)},
                ))
        return found
