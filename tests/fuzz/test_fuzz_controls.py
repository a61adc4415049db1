"""Fuzz controls: field bounds (`--quant fp8-block --topk 1..2 --fused`), waivers of known findings
(`--waive oracle@stage`, `--waive-file`), and `--keep-going N` distinct failures, each shrunk.

A stand-in runner judges every example (diffmoe.judge.runner replaced), so these measure the
driver and the CLI, not the kernels.
"""

import json
import sys
import types

import pytest
from hypothesis import HealthCheck, given, settings

from diffmoe.check.report import Report, check_command
from diffmoe.findings import Finding, Oracles
from diffmoe.frontends import cli
from diffmoe.frontends.commands import fuzz as fuzz_command
from diffmoe.fuzz import bounds as bounds_module
from diffmoe.fuzz import strategies
from diffmoe.fuzz.bounds import FieldBounds, parse_int_bound
from diffmoe.fuzz.driver import fuzz
from diffmoe.fuzz.strategies import MINIMAL_CONFIG, MINIMAL_FUSED_CONFIG, moe_configs
from diffmoe.fuzz.waivers import Waivers, finding_key, parse_waiver, parse_waiver_text
from diffmoe.fuzz.workers import fuzz_in_workers
from ray_standins import on_cluster  # noqa: F401 - the two-node cluster's fuzz, shared

ALIAS = Finding(Oracles.STATIC_ALIASING, "alias", stage="act_quant")
DIVERGED = Finding(Oracles.DIFFERENTIAL, "diverged", stage="down_gemm")


def legacy_fused(c):
    return c.planner == "legacy" and c.fused


def two_experts(c):
    return c.topk >= 2


def make_runner(rules):
    """rules: (predicate, finding) pairs; a config's findings are those whose predicate holds."""
    fake = types.ModuleType("diffmoe.judge.runner")
    fake.calls = []

    def run_differential(config, implementation=None, *, schedules=None, oracles=None, device=None,
                         implementation_name="optimized", **_):
        fake.calls.append(config)
        findings = [f for pred, f in rules if pred(config)]
        return Report(config, implementation_name, ["static-aliasing"], ["identity"], findings)

    fake.run_differential = run_differential
    fake.load_factory = lambda spec: (lambda config: None)
    return fake


@pytest.fixture
def runner(monkeypatch):
    def install(*rules):
        fake = make_runner(rules)
        monkeypatch.setitem(sys.modules, "diffmoe.judge.runner", fake)
        monkeypatch.setattr(fuzz_command, "DEFAULT_PLAN_EXAMPLES", 0)
        monkeypatch.setattr(fuzz_command, "DEFAULT_FUZZ_WORKERS", 1)
        monkeypatch.delenv("DIFFMOE_HYPOTHESIS_DB", raising=False)
        return fake

    return install


def run_cli(capsys, *argv):
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def draws(strategy, n=150):
    seen = []

    @settings(max_examples=n, database=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(strategy)
    def collect(config):
        seen.append(config)

    collect()
    return seen


# ---- bounds ---------------------------------------------------------------------------------


def test_the_bounds_domain_caps_match_the_strategies():
    assert (bounds_module.FUZZ_MAX_EXPERTS, bounds_module.FUZZ_MAX_SIZE) == (strategies.MAX_EXPERTS, strategies.MAX_SIZE)


def test_bounded_draws_stay_within_every_bound():
    b = FieldBounds(ranges={"topk": (1, 2), "num_tokens": (3, 5)}, values={"quant": ("fp8-block",), "fused": (True,)})
    seen = draws(moe_configs(bounds=b))
    assert seen and all(b.holds(c) for c in seen)
    assert {c.topk for c in seen} == {1, 2}  # the whole range is drawn, not only one end


def test_the_unbounded_draws_leave_those_bounds():
    """The check above can fail: without bounds the same draws leave them."""
    b = FieldBounds(ranges={"topk": (1, 2), "num_tokens": (3, 5)}, values={"quant": ("fp8-block",), "fused": (True,)})
    assert not all(b.holds(c) for c in draws(moe_configs()))


def test_opt_in_fields_are_pinned_too():
    b = FieldBounds(ranges={"nan_rows": (1, 1), "expert_scale_spread": (2, 3)},
                    values={"router": ("softmax-topk",), "tie_heavy": (True,), "skew": ("all-remote",),
                            "expert_map": ((0, -1, 1, -1),)})
    seen = draws(moe_configs(bounds=b), 60)
    assert seen and all(b.holds(c) for c in seen)


def test_a_pinned_profile_for_one_scheme_goes_with_that_scheme():
    """lmdeploy's profile describes fp8-block only: pinned with it, every draw is fp8-block."""
    b = FieldBounds(values={"numerics": ("lmdeploy",), "quant": ("fp8-block",)})
    seen = draws(moe_configs(bounds=b), 20)
    assert seen and all(c.numerics == "lmdeploy" and c.quant == "fp8-block" for c in seen)


def test_no_bounds_draw_exactly_the_configs_they_drew_before():
    """An empty FieldBounds changes nothing: same seed, same examples as the strategy without it."""
    assert draws(moe_configs(bounds=FieldBounds()), 40) == draws(moe_configs(), 40)


@pytest.mark.parametrize("text, needle", [
    ("2000", "[1, 1024]"), ("4..2", "empty range"), ("0", "[1, 1024]"), ("two", "N or LO..HI"),
])
def test_a_bad_int_bound_names_the_field_and_its_range(text, needle):
    with pytest.raises(ValueError, match="--topk") as info:
        parse_int_bound("topk", text, "--topk")
    assert needle in str(info.value)


@pytest.mark.parametrize("argv, needle", [
    (["--topk", "1025"], "--topk must be N or LO..HI within [1, 1024]"),
    (["--topk", "3..1"], "empty range"),
    (["--hidden", "20000"], "--hidden must be N or LO..HI within [1, 16384]"),
    (["--quant", "fp4"], "--quant must be one of"),
    (["--tokens", "4", "--max-tokens", "8"], "cannot be combined"),
    (["--quant", "fp8-block", "--hidden", "16..100"], "multiple of 128"),
    (["--quant", "bf16", "--fused"], "quant"),
    (["--router-weight", "input", "--topk", "2"], "topk must be 1"),
    (["--swiglu-limit", "-1"], "swiglu_limit"),
    (["--waive", "nonsense@down_gemm"], "--waive must be ORACLE@STAGE"),
    (["--keep-going", "2", "--workers", "2"], "--keep-going 2 runs in one process"),
    (["--keep-going", "1001"], "--keep-going must be in [1, 1000]"),
    (["--tier", "plan", "--topk", "1"], "--tier plan draws its own plan domain"),
])
def test_bad_fuzz_controls_exit_2_with_one_line(runner, capsys, argv, needle):
    fake = runner()
    code, out, err = run_cli(capsys, "fuzz", "--max-examples", "3", "--seed", "1", *argv)
    assert code == 2 and needle in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not fake.calls


def test_the_cli_draws_only_within_its_bounds(runner, capsys):
    fake = runner()
    code, out, _ = run_cli(capsys, "fuzz", "--max-examples", "30", "--seed", "4", "--quant", "fp8-block",
                           "--topk", "1..2", "--fused", "--skew", "one-expert,empty-experts")
    assert code == 0, out
    assert fake.calls and all(c.quant == "fp8-block" and c.topk in (1, 2) and c.fused
                              and c.skew in ("one-expert", "empty-experts") for c in fake.calls)


def test_same_seed_same_bounded_examples(runner, capsys):
    fake = runner()
    argv = ("fuzz", "--max-examples", "15", "--seed", "9", "--topk", "2..3", "--problem-seed", "7")
    run_cli(capsys, *argv)
    first = list(fake.calls)
    fake.calls.clear()
    run_cli(capsys, *argv)
    assert first == fake.calls and all(c.seed == 7 for c in first)


# ---- waivers ---------------------------------------------------------------------------------


def test_waiver_keys_and_forms():
    assert finding_key(DIVERGED) == "differential@down_gemm" and finding_key(Finding(Oracles.CRASH, "x")) == "crash"
    assert Waivers(["differential@down_gemm"]).covers(DIVERGED)
    assert not Waivers(["differential@reduce"]).covers(DIVERGED)
    assert Waivers(["differential"]).covers(DIVERGED) and Waivers(["differential@*"]).covers(DIVERGED)
    text = "# known since issue 12\n\nstatic-aliasing@act_quant  # the legacy plan\ndifferential\n"
    assert [str(w) for w in parse_waiver_text(text, "f")] == ["static-aliasing@act_quant", "differential"]
    with pytest.raises(ValueError, match="f line 2"):
        parse_waiver_text("crash\nbogus@x\n", "f")
    with pytest.raises(ValueError, match="stage"):
        parse_waiver("differential@")


def wide(c):
    return c.hidden >= 200 and c.inter >= 200


def test_a_waived_finding_does_not_stop_the_search(runner, capsys):
    """Waived: the search goes on and finds the other failure; unwaived (below), the waived one stops it."""
    runner((legacy_fused, ALIAS), (wide, DIVERGED))
    # seed 3: which seed meets a wide unfused config within 60 examples moves whenever the strategies'
    # choices do (seed 2 did until the outlier channels were drawn, issue 42; seeds 1, 3, 4 and 5 do now)
    code, out, _ = run_cli(capsys, "fuzz", "--max-examples", "60", "--seed", "3", "--planner", "legacy",
                           "--waive", "static-aliasing@act_quant", "--json")
    data = json.loads(out)
    assert code == 1
    assert {f["oracle"] for f in data["report"]["findings"]} >= {Oracles.DIFFERENTIAL}
    assert data["waived_examples"] >= 1


def test_without_the_waiver_the_known_finding_stops_it(runner, capsys):
    runner((legacy_fused, ALIAS))
    code, out, _ = run_cli(capsys, "fuzz", "--max-examples", "40", "--seed", "1", "--planner", "legacy")
    assert code == 1 and check_command(MINIMAL_FUSED_CONFIG.replace(planner="legacy")) in out


def test_only_waived_findings_exit_0_and_say_how_many(runner, capsys, tmp_path):
    runner((legacy_fused, ALIAS))
    baseline = tmp_path / "known.txt"
    baseline.write_text("# known findings\nstatic-aliasing@act_quant\n")
    code, out, _ = run_cli(capsys, "fuzz", "--max-examples", "30", "--seed", "1", "--planner", "legacy",
                           "--waive-file", str(baseline))
    assert code == 0, out
    assert "had only waived findings" in out


def test_a_waiver_of_another_stage_does_not_hide_the_finding(runner, capsys):
    runner((legacy_fused, ALIAS))
    code, _, _ = run_cli(capsys, "fuzz", "--max-examples", "40", "--seed", "1", "--planner", "legacy",
                         "--waive", "static-aliasing@reduce")
    assert code == 1


def test_a_bad_waiver_file_line_exits_2(runner, capsys, tmp_path):
    runner()
    bad = tmp_path / "known.txt"
    bad.write_text("differential@down_gemm\nraces down_gemm\n")
    code, _, err = run_cli(capsys, "fuzz", "--max-examples", "3", "--seed", "1", "--waive-file", str(bad))
    assert code == 2 and "line 2" in err and len(err.strip().splitlines()) == 1


@pytest.mark.skipif(sys.platform != "linux", reason="Ray clusters: Linux")
def test_waivers_and_bounds_work_with_workers(on_cluster):
    """Each Ray task searches within the bounds and past the waived finding (the stand-in of
    tests/support/ray_standins.py: the legacy fused plan's static alias), and the waived counts are summed."""
    b = FieldBounds(ranges={"topk": (1, 1)}, values={"quant": ("fp8-token",)})
    outcome = on_cluster(workers=2, max_examples=20, seed=1, planner="legacy", waive=["static-aliasing"], bounds=b)
    assert outcome.report is None and outcome.waived_examples >= 1
    found = on_cluster(workers=2, max_examples=20, seed=1, planner="legacy", bounds=b)
    assert found.report is not None and b.holds(found.report.config)


# ---- keep going -----------------------------------------------------------------------------


def test_keep_going_collects_distinct_failures_each_shrunk(runner, capsys):
    fake = runner((legacy_fused, ALIAS), (two_experts, DIVERGED))
    code, out, _ = run_cli(capsys, "fuzz", "--max-examples", "60", "--seed", "1", "--planner", "legacy",
                           "--keep-going", "3", "--json")
    data = json.loads(out)
    assert code == 1
    keys = [tuple(f["keys"]) for f in data["failures"]]
    assert len(keys) == 2 and set(keys[0]).isdisjoint(keys[1])
    assert {k for ks in keys for k in ks} == {"static-aliasing@act_quant", "differential@down_gemm"}
    configs = {json.dumps(f["report"]["config"], sort_keys=True) for f in data["failures"]}
    # each shrunk to its own minimal config (the T=E=K=1 minimal one for the alias, K=2 for the other)
    assert MINIMAL_FUSED_CONFIG.replace(planner="legacy").to_json() in configs
    assert all(f["report"]["replay"].startswith("diffmoe check ") for f in data["failures"])
    # a later round replays the earlier rounds' examples from their reports: the first round's calls
    # are a prefix of this run's, and the second round does not start them again
    fake.calls.clear()
    run_cli(capsys, "fuzz", "--max-examples", "60", "--seed", "1", "--planner", "legacy")
    first_round = list(fake.calls)
    fake.calls.clear()
    run_cli(capsys, "fuzz", "--max-examples", "60", "--seed", "1", "--planner", "legacy", "--keep-going", "3")
    assert fake.calls[:len(first_round)] == first_round
    assert fake.calls[len(first_round)] not in first_round[:-1]


def test_keep_going_text_shows_each_failure_with_its_replay_line(runner, capsys):
    runner((legacy_fused, ALIAS), (two_experts, DIVERGED))
    code, out, _ = run_cli(capsys, "fuzz", "--max-examples", "60", "--seed", "1", "--planner", "legacy",
                           "--keep-going", "2")
    assert code == 1
    assert "failure 1 of 2" in out and "failure 2 of 2" in out and out.count("replay: diffmoe check") == 2


def test_keep_going_one_stops_at_the_first(runner, capsys):
    runner((legacy_fused, ALIAS), (two_experts, DIVERGED))
    outcome = fuzz(max_examples=60, seed=1, planner="legacy")
    assert len(outcome.failures) == 1


def test_keep_going_is_quiet_on_a_correct_implementation(runner, capsys):
    runner()
    code, out, _ = run_cli(capsys, "fuzz", "--max-examples", "20", "--seed", "2", "--keep-going", "4")
    assert code == 0 and "no finding" in out


def test_keep_going_same_seed_same_failures(runner):
    runner((legacy_fused, ALIAS), (two_experts, DIVERGED))
    a = fuzz(max_examples=60, seed=3, planner="legacy", keep_going=3)
    b = fuzz(max_examples=60, seed=3, planner="legacy", keep_going=3)
    assert [r.config for r in a.failures] == [r.config for r in b.failures] and len(a.failures) == 2


def test_keep_going_with_workers_is_refused(monkeypatch):
    monkeypatch.setitem(sys.modules, "diffmoe.judge.runner", make_runner([]))
    with pytest.raises(ValueError, match="keep_going=2 needs workers=1"):
        fuzz_in_workers(workers=2, max_examples=4, seed=1, keep_going=2)


def test_minimal_config_is_the_unbounded_floor():
    assert MINIMAL_CONFIG.topk == 1  # the shrink target the bounds above leave in range
