"""The museum of real vLLM bugs (diffmoe/adapters/museum.py): every runnable exhibit behaves as recorded
(each buggy release fails with the recorded oracle at the recorded stage, the fixed release
passes the same config and inputs), the verdict can fail, the mechanism behind exhibit 1 is what
the exhibit says (a zero-filled workspace hides it, a poisoned one shows it), and the command
line's exit codes. The museum's wheels are fetched once each, as the peers suite fetches its own.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before Triton is imported

import dataclasses
import json

import pytest
import torch

from diffmoe.adapters import museum
from diffmoe.adapters import peer_wheels
from diffmoe.check.report import Oracles
from diffmoe.problem.vocabulary import Stages
from diffmoe.check.runner import load_factory
from reference import reference_moe

RUNNABLE = [e for e in museum.EXHIBITS if e.pending is None]
BY_NAME = {e.name: e for e in museum.EXHIBITS}


@pytest.fixture(scope="module", autouse=True)
def museum_wheels():
    return [peer_wheels.fetch(spec) for spec in sorted({r for e in museum.EXHIBITS for r in (*e.buggy, e.fixed)})]


@pytest.mark.parametrize("exhibit", RUNNABLE, ids=[e.name for e in RUNNABLE])
def test_every_exhibit_behaves_as_recorded(exhibit):
    result = museum.run_exhibit(exhibit)
    assert result.as_recorded, museum._render(result)
    assert [v.release for v in result.verdicts] == [*exhibit.buggy, exhibit.fixed]


def test_the_verdict_fails_when_the_fixed_release_is_a_buggy_one_or_the_oracle_is_wrong():
    stale = BY_NAME["stale-ep-rows"]
    mislabelled = dataclasses.replace(stale, buggy=("vllm==0.28.0",), fixed="vllm==0.30.0")
    assert not museum.run_exhibit(mislabelled).as_recorded  # 0.30.0 fails what a fixed release must pass
    wrong_stage = dataclasses.replace(stale, buggy=("vllm==0.28.0",), stage="gate_up_gemm")
    assert not museum.run_exhibit(wrong_stage).as_recorded  # found, but not where the row says


def _call(release: str, fill: int) -> torch.Tensor:
    exhibit = BY_NAME["stale-ep-rows"]
    problem = museum.exhibit_problem(exhibit)
    impl = load_factory(release)(exhibit.config)
    n1, n2 = impl.workspace_shapes()
    ws = (torch.full((n1,), fill, dtype=torch.uint8), torch.full((n2,), fill, dtype=torch.uint8))
    return impl.run(problem, ws).output


def test_exhibit_one_is_hidden_by_zero_filled_workspaces_and_shown_by_poisoned_ones():
    """Token 0's slots are -1, so its output is 0; 0.28.0 sums whatever workspace2 held there."""
    ref = reference_moe(museum.exhibit_problem(BY_NAME["stale-ep-rows"])).output
    assert torch.equal(ref[0], torch.zeros_like(ref[0]))
    assert torch.equal(_call("vllm==0.28.0", 0x00)[0], ref[0])  # zeros in, zeros summed: hidden
    assert torch.isnan(_call("vllm==0.28.0", 0xFF)[0]).all()  # NaN poison summed into the output
    assert torch.equal(_call("vllm==0.33.0", 0xFF)[0], ref[0])  # the pad-aware moe_sum skips the slots


def test_an_exhibit_needing_a_missing_config_field_is_pending_not_run():
    pending = dataclasses.replace(BY_NAME["stale-ep-rows"], requires="no_such_field")
    assert "MoEConfig.no_such_field" in pending.pending
    assert museum.run_exhibit(pending).verdicts == [] and not museum.run_exhibit(pending).as_recorded
    assert dataclasses.replace(pending, requires="expert_map").pending is None
    assert BY_NAME["swiglu-clamp-dropped"].pending is None and BY_NAME["swiglu-clamp-dropped"].config.swiglu_limit == 1.0


def test_the_command_line(capsys):
    assert museum.main(["--list"]) == 0
    listed = capsys.readouterr().out
    assert all(e.name in listed for e in museum.EXHIBITS) and "vllm-project/vllm#54083" in listed
    assert museum.main(["no-such-exhibit"]) == 2
    assert "unknown exhibit" in capsys.readouterr().err
    assert museum.main(["stale-ep-rows-own-call"]) == 0
    assert "NOT AS RECORDED" not in capsys.readouterr().out


def test_the_command_line_fails_when_an_exhibit_does_not_behave_as_recorded(monkeypatch, capsys):
    wrong = dataclasses.replace(BY_NAME["stale-ep-rows-own-call"], oracle="poison")  # poison cannot see this one
    monkeypatch.setattr(museum, "EXHIBITS", (wrong,))
    assert museum.main([wrong.name]) == 1
    assert "NOT AS RECORDED" in capsys.readouterr().out


def test_diffmoe_museum_is_wired_into_the_command_line(capsys):
    from diffmoe.frontends.cli import main as cli_main

    assert cli_main(["museum", "--list"]) == 0 and "stale-ep-rows" in capsys.readouterr().out
    assert cli_main(["museum", "no-such-exhibit"]) == 2


@pytest.mark.slow  # 29 s on 2 cores (issue 30)
def test_the_shrinker_reaches_exhibit_ones_minimal_config_from_a_broader_domain():
    """`diffmoe fuzz --impl vllm==0.28.0 --model-features --seed 0 --max-experts 8 --max-tokens 16`:
    drawing clamp limits, -1 slots and shared experts over T <= 16 and E <= 8, the fuzzer finds the
    stale-EP-rows bug unaided and shrinks it to one token, one expert under an expert map, top-1,
    the smallest H and I, one -1 slot; the fixed release passes that config."""
    from diffmoe.fuzz.driver import fuzz
    from diffmoe.check.runner import run_differential

    outcome = fuzz(implementation=load_factory("vllm==0.28.0"), implementation_name="vllm==0.28.0", max_examples=40,
                   seed=0, features=True, max_experts=8, max_tokens=16)
    assert not outcome.passed
    c = outcome.failing_config
    assert (c.num_tokens, c.num_experts, c.topk, c.hidden, c.inter) == (1, 1, 1, 16, 16), c
    assert c.expert_map is not None and c.dropped_slots == 1 and c.swiglu_limit is None and c.shared_experts == 0, c
    assert (Oracles.POISON, Stages.REDUCE) in {(f.oracle, f.stage) for f in outcome.report.findings}
    assert run_differential(c, load_factory("vllm==0.33.0")).passed


def test_without_cached_wheels_the_museum_says_which_fetch_to_run(tmp_path, monkeypatch, capsys):
    """An empty peer cache is a usage error naming each `diffmoe peers fetch`, in one line and
    before any run (it once printed `crash@None NOT AS RECORDED` for every release)."""
    from diffmoe.frontends.cli import main as cli_main

    monkeypatch.setenv(peer_wheels.CACHE_ENV, str(tmp_path / "empty"))
    assert cli_main(["museum"]) == 2
    out, err = capsys.readouterr()
    releases = sorted({r for e in RUNNABLE for r in (*e.buggy, e.fixed)})
    assert out == "" and len(err.strip().splitlines()) == 1, err
    assert all(f"`diffmoe peers fetch {r}`" in err for r in releases), err
    assert "NOT AS RECORDED" not in err and "crash" not in err


@pytest.mark.parametrize("argv, says", [(["--workers", "0"], "--workers must be in [1, 256], got 0"),
                                        (["--workers", "2", "--cluster", "remote"], "--cluster remote: expected local")])
def test_bad_workers_or_cluster_exit_2_before_any_run(argv, says, capsys):
    assert museum.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert says in err and len(err.splitlines()) == 1


@pytest.mark.slow  # four release runs and a local Ray start: about 40 s on 2 loaded cores
def test_two_workers_on_a_local_ray_runtime_give_the_in_process_verdicts(museum_wheels, capsys):
    names = ["stale-ep-rows-own-call", "sglang-top1-routed-scaling"]
    assert museum.main([*names, "--json"]) == 0
    here = json.loads(capsys.readouterr().out)
    assert museum.main([*names, "--json", "--workers", "2"]) == 0
    on_ray = json.loads(capsys.readouterr().out)
    strip = lambda rows: [{**r, "verdicts": [{k: v for k, v in d.items() if k != "seconds"} for d in r["verdicts"]]}  # noqa: E731
                          for r in rows]
    assert strip(on_ray) == strip(here) and all(r["as_recorded"] for r in on_ray)
