"""`diffmoe check --launches` and the report's `launches`: every launch of the first program order's
run, its stage, the buffers it read and wrote, and why it has that stage (issue 49: users of the
adapter kit wrote their own script to see this before they trusted an adapter)."""

from __future__ import annotations

import json

from diffmoe.check.report import Report
from diffmoe.frontends import cli
from diffmoe.problem.config import MoEConfig
from diffmoe.problem.vocabulary import Stages

SMALL = ["--tokens", "4", "--experts", "2", "--topk", "2", "--hidden", "128", "--inter", "128", "--quant", "fp8-token",
         "--fused", "--oracles", "differential"]
# the shipped kernel's launches, fused (it aligns on the host: no align launch is reported)
SHIPPED = [(Stages.QUANT_INPUT, "act_quant_kernel"), (Stages.GATE_UP_GEMM, "grouped_gemm_kernel"),
           (Stages.ACT_QUANT, "act_quant_kernel"), (Stages.DOWN_GEMM, "grouped_gemm_kernel"),
           (Stages.REDUCE, "moe_reduce_kernel")]


def test_the_json_report_carries_each_launch_through_the_worker_and_the_isolation(capsys):
    assert cli.main(["check", *SMALL, "--json"]) == 0  # the CLI's default: a worker process, the candidate isolated
    launches = json.loads(capsys.readouterr().out)["launches"]
    assert [(row["stage"], row["kernel"]) for row in launches] == SHIPPED
    assert launches[3]["reads"][:2] == ["quanted_down_input", "w2"] and launches[3]["writes"] == ["down_output"]
    assert all(row["triton"] and row["placed"] == "reported at this stage by the implementation" for row in launches)


def test_check_launches_lists_them_after_the_report(capsys):
    assert cli.main(["check", *SMALL, "--launches"]) == 0
    out = capsys.readouterr().out
    listing = out[out.index("  launches (5, the first program order's run):"):]
    assert "[1] gate_up_gemm: grouped_gemm_kernel (Triton, grid (2,), 2 programs)" in listing
    assert "reads down_output; writes output" in listing
    assert cli.main(["check", *SMALL]) == 0 and "launches (" not in capsys.readouterr().out  # only when asked


def test_a_run_that_reports_no_launch_says_so():
    report = Report(config=MoEConfig(), implementation="x", oracles=[], schedules=[])
    assert report.render_launches() == "  launches: none reported by the first program order's run"
    assert "launches" not in report.to_dict()
    row = {"index": 0, "stage": "reduce", "kernel": "k", "grid": [1], "triton": False, "programs": None,
           "reads": ["down_output"], "writes": ["output"], "placed": "why"}
    report.launches = [row]
    assert Report.from_dict(report.to_dict()).launches == [row]


def test_what_the_candidate_names_is_one_printable_line():
    from diffmoe.check.recording import RecordedLaunch, TensorRegion
    from diffmoe.check.report import MAX_LAUNCH_TEXT, launch_rows

    region = TensorRegion("out\x1b[2Jput", 0, 0, 4, "cpu", 4)
    launch = RecordedLaunch(0, Stages.REDUCE, "k\x1b]0;pwned\x07\nsecond line", (1,), [], [region], why="x" * 1000)
    (row,) = launch_rows([launch])
    assert row["kernel"] == "k\\x1b]0;pwned\\x07\\nsecond line" and row["writes"] == ["out\\x1b[2Jput"]
    assert len(row["placed"]) == MAX_LAUNCH_TEXT and row["placed"].endswith("...")
