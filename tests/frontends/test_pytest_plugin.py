"""The pytest plugin: profiles reach pytest, CI defaults to `ci`, the fixtures work."""

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from diffmoe.fuzz.profiles import CI_MAX_EXAMPLES, DEV_MAX_EXAMPLES, PROFILES, ci_requested, load_profile
from diffmoe.check.report import Report
from diffmoe.findings import Finding, Oracles
from diffmoe.fuzz.strategies import MINIMAL_FUSED_CONFIG
from hang_bounds import SUBPROCESS_HANG_S

PROBE = textwrap.dedent(
    """
    from hypothesis import settings

    def test_profile():
        print("PROFILE", settings.get_current_profile_name(), settings().max_examples, settings().derandomize)
    """
)


def run_probe(tmp_path, *args, env_ci=None):
    path = tmp_path / "test_probe.py"
    path.write_text(PROBE)
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "GITHUB_ACTIONS")}
    if env_ci is not None:
        env["CI"] = env_ci
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", str(path), "-q", "-s", "-p", "no:cacheprovider", "--rootdir", str(tmp_path), *args],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=SUBPROCESS_HANG_S,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (line,) = [ln for ln in proc.stdout.splitlines() if ln.startswith("PROFILE")]
    return line.split()[1:]


def test_profile_option_and_ci_default(tmp_path):
    assert run_probe(tmp_path, env_ci="true") == ["ci", str(CI_MAX_EXAMPLES), "True"]
    # the option reaches Hypothesis, and an explicit choice wins over CI
    assert run_probe(tmp_path, "--hypothesis-profile", "dev", env_ci="true")[:2] == ["dev", str(DEV_MAX_EXAMPLES)]


def test_load_profile_and_ci_detection():
    from hypothesis import settings

    before = settings.get_current_profile_name()
    try:
        assert load_profile("ci").max_examples == CI_MAX_EXAMPLES
        assert settings.get_current_profile_name() == "ci"
    finally:
        settings.load_profile(before)
    with pytest.raises(ValueError, match="profile"):
        load_profile("nightly")
    assert set(PROFILES) == {"ci", "dev", "thorough"}
    assert ci_requested({"CI": "true"}) and ci_requested({"CI": "1"})
    assert not ci_requested({}) and not ci_requested({"CI": "false"})


def test_problem_and_reference_fixtures(moe_problem_factory, moe_reference):
    problem = moe_problem_factory(MINIMAL_FUSED_CONFIG)
    result = moe_reference(problem)
    assert result.output.shape == (1, MINIMAL_FUSED_CONFIG.hidden) and result.output.dtype == torch.bfloat16
    assert "gate_up_output" in result.intermediates


def test_guarded_workspaces_fixture(guarded_workspaces):
    guarded = guarded_workspaces((64, 32))
    ws1, ws2 = guarded.workspaces
    assert ws1.numel() == 64 and ws2.numel() == 32
    ws1.fill_(1)
    assert guarded.check_red_zones() == []


def test_assert_report_passes(assert_report_passes):
    clean = Report(MINIMAL_FUSED_CONFIG, "optimized", [], [])
    assert_report_passes(clean)
    bad = Report(MINIMAL_FUSED_CONFIG.replace(planner="legacy"), "optimized", [], [],
                 [Finding(Oracles.STATIC_ALIASING, "share ws2", stage="act_quant", buffers=["gate_up_output", "quanted_down_input"])])
    with pytest.raises(pytest.fail.Exception) as info:
        assert_report_passes(bad)
    message = str(info.value)
    assert "static-aliasing at act_quant" in message and bad.replay_command() in message
