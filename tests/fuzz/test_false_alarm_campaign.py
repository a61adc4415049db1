"""The false-alarm campaign, reduced for the suite: the profile covers what it promises, the
cost cap holds, the same seed draws the same configs, a correct implementation raises nothing
on a sample of them, and the campaign does report a broken one (so a quiet campaign means
something). The full campaign is bench/false_alarm_campaign.py (docs/false-alarms.md)."""

from __future__ import annotations

import pytest

from bug_zoo import make_dropped_router_weight
from diffmoe.fuzz.campaign import (
    ROUTED_SCALING_FACTORS,
    PROFILE_MAX_EXPERTS,
    PROFILE_MAX_TOKENS,
    PROFILE_MAX_TOPK,
    PROFILE_MAX_WIDTH,
    corner_configs,
    cost_units,
    run_campaign,
    sampled_configs,
)
from diffmoe.problem.config import QUANT_SCHEMES, SCALE_PAIRS
from diffmoe.judge.runner import run_differential

# A reduced campaign's sample: cheap configs only (about 5 s each on the interpreter).
CI_CONFIGS, CI_SEED, CI_COST_CAP = 6, 2026, 30


def test_the_profile_reaches_every_axis_and_input_class():
    configs = sampled_configs(2000, seed=0)
    assert all(cost_units(c) <= 120 for c in configs)
    assert max(c.num_tokens for c in configs) >= PROFILE_MAX_TOKENS // 2
    assert max(c.num_experts for c in configs) >= PROFILE_MAX_EXPERTS - 8
    assert max(c.topk for c in configs) == PROFILE_MAX_TOPK
    assert max(c.hidden for c in configs) == PROFILE_MAX_WIDTH and max(c.inter for c in configs) == PROFILE_MAX_WIDTH
    assert {c.quant for c in configs} == set(QUANT_SCHEMES)
    # every weights/activations pair a serving engine runs, and the routed scaling factor (issue 27 item 5)
    assert {(c.weight_granularity, c.act_granularity) for c in configs if c.is_fp8} == set(SCALE_PAIRS)
    assert {c.routed_scaling_factor for c in configs} == {None, *ROUTED_SCALING_FACTORS}
    for present in (
        lambda c: c.fused, lambda c: not c.fused and c.is_fp8, lambda c: c.output == "workspace",
        lambda c: c.output == "separate", lambda c: c.call_tokens is not None, lambda c: c.nan_rows,
        lambda c: c.inf_rows, lambda c: c.zero_rows, lambda c: c.expert_scale_spread, lambda c: c.renormalize,
        lambda c: c.router == "softmax-topk" and c.topk == 1, lambda c: c.expert_map is not None,
        lambda c: c.tie_heavy, lambda c: c.router_weight == "input", lambda c: c.hidden % 128,
    ):
        assert any(present(c) for c in configs)


def test_the_same_seed_draws_the_same_configs_and_the_cap_holds():
    assert sampled_configs(50, seed=3, cost_cap=40) == sampled_configs(50, seed=3, cost_cap=40)
    assert sampled_configs(50, seed=3) != sampled_configs(50, seed=4)
    assert all(cost_units(c) <= 40 for c in sampled_configs(50, seed=3, cost_cap=40))


def test_corners_put_each_axis_at_its_maximum_for_every_scheme():
    corners = corner_configs()
    for field, top in (("num_tokens", PROFILE_MAX_TOKENS), ("num_experts", PROFILE_MAX_EXPERTS),
                       ("topk", PROFILE_MAX_TOPK), ("hidden", PROFILE_MAX_WIDTH), ("inter", PROFILE_MAX_WIDTH)):
        assert {c.quant for c in corners if getattr(c, field) == top} == set(QUANT_SCHEMES), field


@pytest.mark.parametrize("bad", [dict(count=-1), dict(seed=-2), dict(cost_cap=0), dict(count=1.5)])
def test_bad_campaign_parameters_are_refused(bad):
    with pytest.raises((TypeError, ValueError), match=next(iter(bad))):
        sampled_configs(**{"count": 1, **bad})


@pytest.mark.slow
def test_a_reduced_campaign_raises_no_false_alarm_on_the_shipped_implementation():
    configs = sampled_configs(CI_CONFIGS, CI_SEED, CI_COST_CAP)
    results = list(run_campaign(configs))
    alarms = [f"{r.config.short()}: {r.findings[0]}\n  replay: {r.replay}" for r in results if not r.passed]
    assert not alarms, "false alarms on the fixed implementation:\n" + "\n".join(alarms)


@pytest.mark.slow
def test_the_campaign_reports_a_broken_implementation():
    # configs where the router weight is on the down GEMM and not exactly 1.0 (as at K = 1 under random-k,
    # or a softmax over one expert, or renormalised),
    # with finite tokens that are not all padding (a NaN token or an all-zero call shows no weight)
    configs = [c for c in sampled_configs(30, CI_SEED, CI_COST_CAP)
               if c.router_weight == "down" and (c.topk > 1 or c.router == "softmax-topk" and c.num_experts > 1 and not c.renormalize)
               and not (c.nan_rows or c.inf_rows) and c.zero_rows < c.call_num_tokens][:2]
    assert len(configs) == 2
    results = list(run_campaign(configs, check=lambda c: run_differential(c, make_dropped_router_weight)))
    assert all(not r.passed and r.replay for r in results)


def _campaign_script(monkeypatch):
    """bench/false_alarm_campaign.py as a module (bench/ is no package)."""
    import importlib.util
    import sys
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "bench" / "false_alarm_campaign.py"
    spec = importlib.util.spec_from_file_location("false_alarm_campaign", path)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "false_alarm_campaign", module)
    spec.loader.exec_module(module)
    return module


def _stopped_at_the_second(item):
    from diffmoe.fuzz.campaign import CampaignResult

    _stopped_at_the_second.calls += 1
    if _stopped_at_the_second.calls == 2:
        raise KeyboardInterrupt
    return CampaignResult(config=item.config, seconds=0.0)


def test_ctrl_c_prints_the_finished_configs_summary_and_exits_130(monkeypatch, capsys):
    import json

    script = _campaign_script(monkeypatch)
    _stopped_at_the_second.calls = 0
    monkeypatch.setattr(script, "_one", _stopped_at_the_second)
    assert script.main(["--configs", "3", "--no-corners", "--cost-cap", "30"]) == 130
    summary = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert summary["configs"] == 1 and summary["interrupted"] and summary["false_alarms"] == 0


@pytest.mark.parametrize("argv, says", [(["--workers", "2", "--cluster", "remote"], "--cluster remote: expected local"),
                                        (["--workers", "0"], r"--workers must be in [1, 256], got 0")])
def test_bad_workers_or_cluster_exit_2_before_any_config(monkeypatch, capsys, argv, says):
    script = _campaign_script(monkeypatch)
    monkeypatch.setattr(script, "_one", lambda item: pytest.fail("a config ran"))
    assert script.main(["--configs", "2", "--no-corners", "--cost-cap", "30", *argv]) == 2
    captured = capsys.readouterr()
    assert says in captured.err and "[1/" not in captured.out


@pytest.mark.slow  # four checks and a local Ray start: about 40 s on 2 loaded cores
def test_two_workers_on_a_local_ray_runtime_give_the_in_process_results(monkeypatch, tmp_path, capsys):
    import json

    import fresh_process

    script = _campaign_script(monkeypatch)
    argv = ["--configs", "2", "--no-corners", "--cost-cap", "12", "--seed", str(CI_SEED)]
    assert script.main(argv + ["--workers", "1", "--json-out", str(tmp_path / "one.json")]) == 0
    # the Ray half in a fresh interpreter (tests/support/fresh_process.py says why)
    done = fresh_process.run(["bench/false_alarm_campaign.py", *argv, "--workers", "2", "--json-out", str(tmp_path / "two.json")])
    assert done.returncode == 0, done.stderr[-2000:]
    one, two = (json.loads((tmp_path / f"{n}.json").read_text())["results"] for n in ("one", "two"))
    assert [(r["config"], r["findings"]) for r in two] == [(r["config"], r["findings"]) for r in one] and len(two) == 2
    capsys.readouterr()
