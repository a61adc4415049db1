"""A sampled check (`run_differential(sample=...)`, `diffmoe check --sample-programs N`; issue 42):
each launch but the alignment runs a chosen few of its programs, and the differential judges the
elements they wrote.

What is held: the shipped kernel passes with every launch sampled (in this process and behind the
isolation boundary), the report saying what ran and how many elements of each buffer were judged;
a wrong weight scale in the programs that ran is caught, by the differential and by teacher forcing
(each stage sampled on the reference's inputs), and a tile a whole launch never writes is caught;
elements no chosen program wrote are never judged, even where the fixed planner leaves an earlier buffer's bytes under them (the write
views are poisoned per launch, guards.WritesPoisoned); what a sampled check cannot take (NaN rows,
two schedules, an oracle that compares whole runs, not a ProgramSample) is refused by name, on the
command line with exit 2 and one line; the replay line names the sample.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before Triton is imported

import json
from dataclasses import dataclass

import pytest
import torch

from bug_zoo import MUTANTS
from diffmoe.check.guards import WritesPoisoned
from diffmoe.check.report import Report
from diffmoe.contract import LaunchInfo
from diffmoe.interpreter import grid_order
from diffmoe.interpreter.program_sample import ProgramSample
from diffmoe.judge.runner import run_differential
from diffmoe.oracles.registry import SAMPLED_ORACLES
from diffmoe.problem.config import MoEConfig
from diffmoe.frontends import cli

SUPPORTED, WHY = grid_order.status()
pytestmark = pytest.mark.skipif(not SUPPORTED, reason=WHY)

# Every launch of a unit test's size sampled: two seeded programs beside the corners and ends.
EVERY_LAUNCH = ProgramSample(seed=0, seeded=2, full_below=2)
CONFIG = MoEConfig(num_tokens=64, num_experts=4, topk=2, hidden=256, inter=256)


@pytest.fixture(scope="module")
def sampled_report() -> Report:
    return run_differential(CONFIG, sample=EVERY_LAUNCH)


def test_the_shipped_kernel_passes_with_every_launch_sampled(sampled_report):
    report = sampled_report
    assert report.passed, report.render()
    assert report.oracles == list(SAMPLED_ORACLES) and report.schedules == ["identity"] and not report.skipped
    judged = report.sample["judged"]
    assert 0 < judged["gate_up_output"][0] < judged["gate_up_output"][1]  # some programs did not run
    assert judged["quanted_gate_up_input"][0] > 0
    assert "sampled)" in report.sample["ran"] and "sampled:" in report.render()


def test_behind_the_isolation_boundary_the_same_programs_are_judged(sampled_report):
    isolated = run_differential(CONFIG, sample=EVERY_LAUNCH, isolation="process")
    assert isolated.passed, isolated.render()
    assert isolated.sample == sampled_report.sample


def test_the_report_says_what_was_sampled_and_its_replay_chooses_the_same_programs(sampled_report):
    again = Report.from_json(sampled_report.to_json())
    assert again.sample == sampled_report.sample
    line = sampled_report.replay_command()
    assert line.endswith("--sample-programs 2 --sample-seed 0")


def test_a_wrong_weight_scale_in_the_programs_that_ran_is_caught():
    mutant = MUTANTS["expert-zero-weight-scale"]
    report = run_differential(mutant.config.replace(num_tokens=64), mutant.factory, sample=EVERY_LAUNCH)
    assert {"differential", "teacher-forcing"} <= set(report.oracles_with_findings())
    assert any(f.stage == "gate_up_gemm" for f in report.findings)


def test_a_tile_a_whole_launch_never_writes_is_still_caught():
    """Only from the first sampled stage on are unwritten elements settled: a GEMM whose grid misses
    the padded tiles, in a launch small enough to run whole, is judged on every element."""
    mutant = MUTANTS["gemm-grid-ignores-padding"]
    report = run_differential(mutant.config, mutant.factory, sample=ProgramSample(seed=0, seeded=2))
    assert "differential" in report.oracles_with_findings()
    assert report.sample["judged"]["gate_up_output"][0] == report.sample["judged"]["gate_up_output"][1]


def test_no_element_is_judged_over_bytes_an_earlier_buffer_left():
    """At H=1024, I=64 the gate-up GEMM runs whole and the down GEMM is sampled, and the fixed planner
    lays down_output over bytes that buffers dead by then filled in the same run: without each
    launch's write views poisoned, what no chosen program wrote held those bytes, the same in both
    runs, and was judged (118,256 false mismatches, 2026-12-08)."""
    config = CONFIG.replace(num_tokens=256, hidden=1024, inter=64)
    report = run_differential(config, sample=ProgramSample(seed=0, seeded=2))
    assert report.passed, report.render()
    judged, total = report.sample["judged"]["down_output"]
    assert 0 < judged < total
    assert report.sample["judged"]["gate_up_output"][0] == report.sample["judged"]["gate_up_output"][1]  # ran whole


def test_stages_after_the_first_sampled_one_are_judged_under_teacher_forcing_only(sampled_report):
    """What a stage computed from an element no program wrote cannot be told by its bits: the
    pipeline run settles them whole, and teacher forcing judges them on the reference's inputs."""
    report = run_differential(CONFIG.replace(num_tokens=2048), sample=ProgramSample(seed=0, seeded=4))
    assert report.passed, report.render()
    assert 0 < report.sample["judged"]["gate_up_output"][0] < report.sample["judged"]["gate_up_output"][1]
    assert report.sample["judged"]["activation_output"][0] == 0
    judged, total = report.sample["forced"]["activation_output"]
    assert 0 < judged < total


@dataclass
class _Launch:
    triton: bool
    reads: dict
    writes: dict


def test_write_views_are_poisoned_before_a_triton_launch_but_not_what_it_reads():
    ws = torch.zeros(64, dtype=torch.uint8)
    out, in_place = ws[:16].view(torch.bfloat16), ws[32:48].view(torch.bfloat16)
    WritesPoisoned(0xA5).before_launch(_Launch(True, {"x": in_place}, {"out": out, "y": in_place}))
    assert bool((ws[:16] == 0xA5).all()) and bool((ws[32:48] == 0).all())
    WritesPoisoned(0xFF).before_launch(_Launch(False, {}, {"out": out}))  # host code writes all it declares
    assert bool((ws[:16] == 0xA5).all())


@pytest.mark.parametrize("kwargs, error, words", [
    ({"config": CONFIG.replace(nan_rows=1)}, ValueError, "nan_rows=0"),
    ({"schedules": ["identity", "reversed"]}, ValueError, "one schedule"),
    ({"oracles": ["differential", "schedule"]}, ValueError, "['schedule'] cannot judge a sampled check"),
    ({"sample": 3}, TypeError, "ProgramSample"),
])
def test_what_a_sampled_check_cannot_take_is_refused_by_name(kwargs, error, words):
    call = {"config": CONFIG, "sample": EVERY_LAUNCH, **kwargs}
    with pytest.raises(error) as raised:
        run_differential(call.pop("config"), **call)
    assert words in str(raised.value)


def test_on_the_command_line(capsys):
    args = ["check", "--tokens", "64", "--experts", "4", "--topk", "2", "--hidden", "256", "--inter", "256",
            "--isolation", "none"]
    assert cli.main([*args, "--sample-programs", "2", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["sample"]["seeded"] == 2 and report["config"]["nan_rows"] == 0  # no NaN token unless asked
    assert report["replay"].endswith("--nan-rows 0 --sample-programs 2 --sample-seed 0")
    for extra, words in ((["--sample-seed", "3"], "--sample-seed needs --sample-programs"),
                         (["--sample-programs", "2", "--oracles", "poison"], "cannot judge a sampled check"),
                         (["--sample-programs", "2", "--nan-rows", "1"], "nan_rows=0"),
                         (["--sample-programs", "-1"], "must be >= 0")):
        assert cli.main([*args, *extra]) == 2
        err = capsys.readouterr().err
        assert words in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err


def test_a_check_stopped_before_its_record_still_replays_its_sample():
    """A timeout's report is made without the worker's record: the sample alone, so its replay line
    chooses the same programs (a production-shape check that timed out replayed unsampled, 2026-12-08)."""
    from diffmoe.judge.runner import _Job

    job = _Job(CONFIG, None, list(SAMPLED_ORACLES), [], torch.device("cpu"), "optimized", None, sample=EVERY_LAUNCH)
    report = job.report([], 1.0)
    assert report.replay_command().endswith("--sample-programs 2 --sample-seed 0")
    assert "no run finished" in report.render()
