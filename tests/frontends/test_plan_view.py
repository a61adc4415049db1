"""`diffmoe plan --png`: every declared slot is drawn, the never-written one labelled as such,
and the buffers written outside the workspaces (the optimized path's private scales) listed."""

from __future__ import annotations

import pytest

from diffmoe.problem.config import MoEConfig
from diffmoe.oracles.static_aliasing import check_static_aliasing
from diffmoe.frontends.plan_view import NEVER_WRITTEN, PRIVATE, draw_plan_png, unplaced_buffers
from diffmoe.problem.vocabulary import Buffers
from optimized.workspace_planner import plan_workspaces

pytest.importorskip("matplotlib")


def test_legacy_fused_plan_draws_every_slot(tmp_path):
    config = MoEConfig(num_tokens=64, quant="fp8-token", fused=True, planner="legacy")
    plan = plan_workspaces(config, config.num_tokens)
    findings = check_static_aliasing(plan)
    assert findings  # the seed bug
    path = tmp_path / "plan.png"
    labels = draw_plan_png(plan, findings, str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    drawn = {label.split(" (")[0] for label in labels}
    assert {p.buffer for p in plan.placements} <= drawn
    assert f"{Buffers.ACTIVATION_OUTPUT} ({NEVER_WRITTEN})" in labels
    assert [label for label in labels if NEVER_WRITTEN in label] == [f"{Buffers.ACTIVATION_OUTPUT} ({NEVER_WRITTEN})"]
    scales = [Buffers.QUANTED_GATE_UP_INPUT_SCALES, Buffers.QUANTED_DOWN_INPUT_SCALES]
    assert set(scales) <= set(unplaced_buffers(plan))
    assert all(f"{name} ({PRIVATE})" in labels for name in scales)


def test_fixed_plan_has_no_never_written_slot(tmp_path):
    config = MoEConfig(num_tokens=16, quant="fp8-block", fused=True, hidden=256, inter=256)
    plan = plan_workspaces(config, config.num_tokens)
    labels = draw_plan_png(plan, check_static_aliasing(plan), str(tmp_path / "plan.png"))
    assert not any(NEVER_WRITTEN in label for label in labels)
    assert {p.buffer for p in plan.placements} <= set(labels)
