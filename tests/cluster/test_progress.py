"""Progress of long runs (diffmoe/cluster/progress.py): on a terminal a live bar with counts,
rate and time left, rewritten in place; anywhere else plain lines, never a carriage return, at a
bounded rate, the fuzz's line byte for byte as before; with --json, JSON lines at the same moments. Then each long run, in plain mode: `diffmoe
fuzz`, `diffmoe compile-check` (and its gate progress, the one `--sweep` and bench/compile_sweep.py
use), `diffmoe museum`, and bench/false_alarm_campaign.py, each through the cheapest stand-in.

A fake clock drives the rate and the time left, so no assertion depends on how fast this
machine is.
"""

from __future__ import annotations

import importlib.util
import io
import json
import re
import sys
from pathlib import Path

import pytest

from diffmoe.frontends import cli
from diffmoe.cluster.progress import Progress, format_seconds, live_terminal, pace, time_left
from stand_in_cli import fake_runner  # noqa: F401 - the CLI tests' stand-in runner fixture, shared

ROOT = Path(__file__).resolve().parents[2]
# the fuzz's plain line, as tests/frontends/test_robustness_cli.py parses it
FUZZ_LINE = re.compile(r"^fuzz: (\d+) examples?  phase=(generate|shrink) +\d+\.\d s  (T=\d+ .*)$")


class FakeTTY(io.StringIO):
    """A terminal as far as isatty() tells."""

    def isatty(self) -> bool:
        return True


class Clock:
    """A clock that moves only when told."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(autouse=True)
def a_terminal_that_draws(monkeypatch):
    """TERM and NO_COLOR as a colour terminal has them (the tests that want plain set their own)."""
    monkeypatch.setenv("TERM", "xterm-256color")
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.delenv("COLUMNS", raising=False)


def drawn(text: str) -> list[str]:
    """The states a live bar drew, in order (each carriage return starts one)."""
    return [part.rstrip("\n").rstrip() for part in text.split("\r") if part.strip()]


# ---- the live bar ---------------------------------------------------------------------------


def test_on_a_terminal_a_bar_with_counts_rate_and_time_left_is_rewritten_in_place():
    stream, clock = FakeTTY(), Clock()
    with Progress(stream, "museum", total=10, unit="release", clock=clock) as progress:
        assert progress.live
        for done in (1, 2, 3):
            clock.now += 1.5
            progress.update(done, detail=f"exhibit {done}")
        text = stream.getvalue()
    states = drawn(text)
    assert "\n" not in text and "\r" in text  # one line, rewritten
    last = states[-1]
    assert "museum:" in last and "3/10 releases" in last and "30%" in last
    assert "1.5 s/release" in last  # seconds per item: an item takes more than a second
    assert "00:10 left" in last  # 7 to go at 1.5 s each
    assert "00:04 elapsed" in last and last.endswith("exhibit 3")
    assert any("1/10 releases" in s for s in states) and any("2/10 releases" in s for s in states)
    assert stream.getvalue().endswith("\n")  # closed: the bar stays, the next output starts below it


def test_fast_items_read_per_second_and_the_first_draw_has_no_rate_yet():
    stream, clock = FakeTTY(), Clock()
    progress = Progress(stream, "plans", total=100, unit="config", clock=clock)
    assert "0/100 configs" in drawn(stream.getvalue())[0] and "? left" in drawn(stream.getvalue())[0]
    clock.now += 2.0
    progress.update(8)
    assert "4.0 configs/s" in drawn(stream.getvalue())[-1] and "00:23 left" in drawn(stream.getvalue())[-1]
    progress.close()


def test_an_unknown_total_shows_count_and_rate_and_no_time_left():
    stream, clock = FakeTTY(), Clock()
    progress = Progress(stream, "fuzz", total=None, unit="example", clock=clock, phase="shrink")
    clock.now += 6.0
    progress.update(3, detail="T=1 E=1")
    last = drawn(stream.getvalue())[-1]
    assert "fuzz (shrink): 3 examples" in last and "2.0 s/example" in last
    assert "left" not in last and "%" not in last and "/?" not in last
    progress.close()


def test_a_new_phase_leaves_the_last_bar_and_counts_from_where_it_starts():
    stream, clock = FakeTTY(), Clock()
    progress = Progress(stream, "fuzz", total=5, unit="example", clock=clock)
    progress.update(0, phase="generate", total=5)  # relabels the bar nothing was counted on
    clock.now += 1.0
    progress.update(2, phase="generate", total=5)
    clock.now += 1.0
    progress.update(2, phase="shrink", total=None)
    clock.now += 3.0
    progress.update(5, phase="shrink", total=None)
    progress.close()
    lines = stream.getvalue().split("\n")
    assert len(lines) == 3 and lines[-1] == ""  # the generate bar and the shrink bar, each left on its line
    assert "fuzz (generate)" in lines[0] and "2/5 examples" in drawn(lines[0])[-1]
    assert drawn(lines[0])[0].startswith("fuzz:")  # the bar that counted nothing was relabelled in place
    assert "fuzz (shrink): 3 examples" in drawn(lines[1])[-1] and "1.0 s/example" in drawn(lines[1])[-1]


def test_write_clears_the_bar_around_a_line_of_the_callers():
    stream, out, clock = FakeTTY(), io.StringIO(), Clock()
    progress = Progress(stream, "campaign", total=2, unit="config", clock=clock)
    progress.write("[1/2] PASS", file=out)
    progress.close()
    assert out.getvalue() == "[1/2] PASS\n"  # exactly the caller's line, where the caller said
    assert "\r " in stream.getvalue()  # the bar was blanked before it


@pytest.mark.parametrize("env", [{"TERM": "dumb"}, {"NO_COLOR": "1"}])
def test_a_dumb_terminal_or_no_color_gets_plain_lines(monkeypatch, env):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    stream = FakeTTY()
    assert not live_terminal(stream)
    with Progress(stream, "museum", total=2, unit="release") as progress:
        progress.update(1)
    assert "\r" not in stream.getvalue() and stream.getvalue().startswith("museum: 1/2 releases")


def test_live_terminal_needs_a_terminal():
    assert live_terminal(FakeTTY()) and not live_terminal(io.StringIO()) and not live_terminal(object())


# ---- plain lines ----------------------------------------------------------------------------


def test_off_a_terminal_one_plain_line_per_item_never_a_carriage_return():
    stream, clock = io.StringIO(), Clock()
    with Progress(stream, "museum", total=4, unit="release", clock=clock) as progress:
        assert not progress.live
        for done in (1, 2, 3):
            clock.now += 1.5
            progress.update(done, detail=f"exhibit {done}")
    text = stream.getvalue()
    assert "\r" not in text
    assert text.splitlines() == [
        "museum: 1/4 releases  00:01 elapsed  1.5 s/release  00:04 left  exhibit 1",
        "museum: 2/4 releases  00:03 elapsed  1.5 s/release  00:03 left  exhibit 2",
        "museum: 3/4 releases  00:04 elapsed  1.5 s/release  00:01 left  exhibit 3",
    ]  # nothing at open or close


def test_json_lines_come_when_plain_lines_would_and_once_more_at_the_close():
    stream, clock = FakeTTY(), Clock()  # a terminal too: JSON lines are asked for, so no bar
    progress = Progress(stream, "museum", total=3, unit="release", json_lines=True, clock=clock)
    for done in (1, 2):
        clock.now += 1.5
        progress.update(done, detail=f"exhibit {done}", line="ignored: the caller's plain line")
    progress.close(done=3, detail="exhibit 3")
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert lines == [
        {"progress": "museum", "phase": None, "done": 1, "total": 3, "unit": "release", "elapsed_s": 1.5,
         "detail": "exhibit 1", "closed": False},
        {"progress": "museum", "phase": None, "done": 2, "total": 3, "unit": "release", "elapsed_s": 3.0,
         "detail": "exhibit 2", "closed": False},
        {"progress": "museum", "phase": None, "done": 3, "total": 3, "unit": "release", "elapsed_s": 3.0,
         "detail": "exhibit 3", "closed": True},
    ]
    assert "\r" not in stream.getvalue()


def test_json_lines_of_a_fast_run_keep_the_plain_lines_pace_and_count_each_phase():
    stream, clock = io.StringIO(), Clock()
    progress = Progress(stream, "fuzz", total=100, unit="example", each=False, interval=10, json_lines=True, clock=clock)
    for done in range(1, 30):
        clock.now += 1.0
        progress.update(done, phase="generate")
    progress.update(30, phase="shrink", total=None)
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [(x["phase"], x["done"], x["total"]) for x in lines] == [("generate", 0, 100), ("generate", 10, 100),
                                                                      ("generate", 20, 100), ("shrink", 0, None)]


def test_plain_lines_of_a_fast_run_come_at_each_phase_and_every_interval():
    stream, clock = io.StringIO(), Clock()
    progress = Progress(stream, "fuzz", total=100, unit="example", each=False, interval=10, clock=clock)
    for done in range(1, 30):
        clock.now += 1.0
        progress.update(done, phase="generate", line=f"line {done}")
    clock.now += 0.5
    progress.update(30, phase="shrink", total=None, line="line 30")
    progress.close(done=40)
    # the first update of each phase, then one every 10 s (11 s, 21 s after the first)
    assert stream.getvalue().splitlines() == ["line 1", "line 11", "line 21", "line 30"]


def test_the_fuzz_printer_keeps_its_plain_line_byte_for_byte():
    stream = io.StringIO()
    printer = cli.ProgressPrinter(stream, tty=False, interval=3600, total=10)
    printer(1, "generate", 0.25, "T=1 E=1 K=1 H=16 I=16 fp8-tensor fused")
    printer(2, "generate", 1.5, "T=2 E=1 K=1 H=16 I=16 fp8-tensor fused")
    printer(3, "shrink", 12.0, "T=1 E=1 K=1 H=16 I=16 fp8-tensor")
    printer.finish()
    assert stream.getvalue() == (
        "fuzz: 1 example  phase=generate     0.2 s  T=1 E=1 K=1 H=16 I=16 fp8-tensor fused\n"
        "fuzz: 3 examples  phase=shrink    12.0 s  T=1 E=1 K=1 H=16 I=16 fp8-tensor\n"
    )
    for line in stream.getvalue().splitlines():
        assert FUZZ_LINE.match(line), line
        assert line.split(" s  ", 1)[1].startswith("T=")  # what test_robustness_cli._config_of reads


def test_the_fuzz_printer_on_a_terminal_counts_against_max_examples_then_shrinks_without_a_total():
    stream = FakeTTY()
    printer = cli.ProgressPrinter(stream, total=10)
    for n in range(1, 5):
        printer(n, "generate", float(n), f"T={n}")
    printer(5, "shrink", 5.0, "T=1")
    printer(6, "shrink", 6.0, "T=1")
    printer.finish()
    text = stream.getvalue()
    generate, shrink = text.split("\n")[:2]
    assert "fuzz (generate)" in generate and "3/10 examples" in drawn(generate)[-1] and "left" in drawn(generate)[-1]
    assert "fuzz (shrink)" in shrink and "2 examples" in drawn(shrink)[-1] and "left" not in drawn(shrink)[-1]
    assert "phase=" not in text  # the plain line is for logs only


@pytest.mark.parametrize("make, words", [
    (lambda: Progress(io.StringIO(), "", total=1), "label"),
    (lambda: Progress(io.StringIO(), "x", total=-1), "total"),
    (lambda: Progress(io.StringIO(), "x", total=1.5), "total"),
    (lambda: Progress(io.StringIO(), "x", interval=-1), "interval"),
    (lambda: Progress(io.StringIO(), "x", interval=float("nan")), "interval"),
    (lambda: Progress(io.StringIO(), "x", unit=""), "unit"),
    (lambda: Progress(io.StringIO(), "x").update(-1), "done"),
    (lambda: Progress(io.StringIO(), "x").update(True), "done"),
    (lambda: Progress(io.StringIO(), "x").update(1, total=-2), "total"),
])
def test_bad_arguments_are_clear_value_errors(make, words):
    with pytest.raises(ValueError, match=words):
        make()


def test_an_update_after_close_is_refused_and_a_second_close_is_nothing():
    progress = Progress(io.StringIO(), "x", total=1)
    progress.close()
    progress.close()
    with pytest.raises(ValueError, match="closed"):
        progress.update(1)


def test_the_figures():
    assert format_seconds(0) == "00:00" and format_seconds(83.9) == "01:23" and format_seconds(3725) == "1:02:05"
    assert pace(0, 5.0, "run") == "? s/run" and pace(2, 0.5, "run") == "4.0 runs/s" and pace(2, 5.0, "run") == "2.5 s/run"
    assert time_left(0, 4, 1.0) == "?" and time_left(1, 4, 2.0) == "00:06" and time_left(5, 4, 2.0) == "00:00"
    assert time_left(1, None, 2.0) == "?"


def test_a_count_past_the_total_raises_the_total():
    stream = io.StringIO()
    progress = Progress(stream, "fuzz", total=2, unit="example")
    progress.update(3)
    assert progress.total == 3 and stream.getvalue().startswith("fuzz: 3/3 examples")


# ---- the long runs, in plain mode -----------------------------------------------------------


def test_fuzz_reports_progress_in_plain_lines_and_stdout_is_untouched(fake_runner, capsys):
    code = cli.main(["fuzz", "--max-examples", "5", "--seed", "3"])
    out, err = capsys.readouterr()
    assert code == 0 and "no finding" in out and "fuzz: " not in out
    lines = [line for line in err.splitlines() if line.startswith("fuzz")]
    assert lines and lines[0].startswith("fuzz: 1 example  phase=generate ")
    assert all(FUZZ_LINE.match(line) for line in lines), lines
    assert "\r" not in err


def test_fuzz_with_json_reports_progress_as_json_lines_and_stdout_is_the_one_object(fake_runner, capsys):
    code = cli.main(["fuzz", "--max-examples", "5", "--seed", "3", "--json"])
    out, err = capsys.readouterr()
    assert code == 0
    assert json.loads(out)["passed"] is True  # stdout: the one JSON object, nothing else
    lines = [json.loads(line) for line in err.splitlines() if line.startswith('{"progress": "fuzz"')]
    assert lines[0]["phase"] == "generate" and lines[0]["done"] == 0 and lines[0]["total"] == 5
    assert lines[0]["detail"].startswith("T=") and lines[-1]["closed"] is True and lines[-1]["done"] == 5
    assert not any(FUZZ_LINE.match(line) for line in err.splitlines()) and "\r" not in err


def test_fuzz_on_a_terminal_shows_a_bar_of_max_examples(fake_runner, monkeypatch, capsys):
    terminal = FakeTTY()
    monkeypatch.setattr(sys, "stderr", terminal)
    code = cli.main(["fuzz", "--max-examples", "5", "--seed", "3"])
    out = capsys.readouterr().out
    assert code == 0 and "no finding" in out and "fuzz (generate)" not in out
    states = drawn(terminal.getvalue())
    assert any("/5 examples" in s and "left" in s for s in states), states
    assert "5/5 examples" in states[-1]  # the finished run: every example counted
    assert not any(FUZZ_LINE.match(s) for s in states)


def test_museum_reports_each_release_run_in_plain_lines(monkeypatch, capsys):
    from diffmoe.museum import exhibits as museum
    from diffmoe.judge import runner
    from diffmoe.check.report import Report
    from diffmoe.findings import Finding

    exhibit = next(e for e in museum.EXHIBITS if e.name == "stale-ep-rows")

    def run_differential(config, factory, *, oracles=None, problem=None, implementation_name=None):
        buggy = implementation_name in {exhibit.impl_spec(r) for r in exhibit.buggy}  # each run names its MODULE:FACTORY
        findings = [Finding(exhibit.oracle, "stale rows", stage=exhibit.stage)] if buggy else []
        return Report(config, implementation_name, list(oracles or []), ["identity"], findings)

    monkeypatch.setattr(runner, "load_factory", lambda release: object())  # no wheel is opened
    monkeypatch.setattr(runner, "run_differential", run_differential)
    monkeypatch.setattr(museum, "missing_releases", lambda exhibits: [])
    assert museum.main([exhibit.name]) == 0
    out, err = capsys.readouterr()
    total = len(exhibit.buggy) + 1
    lines = err.splitlines()
    assert len(lines) == total and "\r" not in err
    for done, (line, release) in enumerate(zip(lines, [*exhibit.buggy, exhibit.fixed]), 1):
        assert line.startswith(f"museum: {done}/{total} releases  ") and " elapsed  " in line, line
        assert line.endswith(f"{exhibit.name} {release} (expected {'pass' if release == exhibit.fixed else 'fail'}): as recorded")
    assert "museum: " not in out and "NOT AS RECORDED" not in out  # stdout: the verdicts only


class _Result:
    kernel, arch, variant, status = "grouped_gemm_kernel", "sm_90", "native", "ok"


def test_compile_gate_progress_plain_capture_quiet_then_a_line_per_specialization():
    stream, clock = io.StringIO(), Clock()
    progress = cli.GateProgress(stream, 3, clock=clock)
    for done in (1, 2, 3):
        clock.now += 6.0  # the capture's lines come at most every 10 s, none for the last config
        progress.captured(done, 3, 5 * done)
    for done in (1, 2):
        progress.compiled(done, 15, _Result())
    progress.close()
    assert stream.getvalue().splitlines() == [
        "compile-check capture: 2/3 configs  00:12 elapsed  6.0 s/config  00:06 left  10 specializations so far",
        "compile-check: 1/15 grouped_gemm_kernel sm_90 native: ok",
        "compile-check: 2/15 grouped_gemm_kernel sm_90 native: ok",
    ]


def test_compile_gate_progress_on_a_terminal_captures_configs_then_compiles_specializations():
    stream, clock = FakeTTY(), Clock()
    progress = cli.GateProgress(stream, 2, label="compile sweep", clock=clock)
    clock.now += 20.0
    progress.captured(1, 2, 7)
    clock.now += 20.0
    progress.captured(2, 2, 12)
    clock.now += 3.0
    progress.compiled(1, 12, _Result())
    progress.close()
    capture, compiled = stream.getvalue().split("\n")[:2]
    assert "compile sweep capture" in capture and "2/2 configs" in drawn(capture)[-1] and "12 specializations so far" in capture
    assert "compile sweep:" in compiled and "1/12 specializations" in drawn(compiled)[-1]
    assert "3.0 s/specialization" in drawn(compiled)[-1] and "00:33 left" in drawn(compiled)[-1]


def test_compile_check_reports_each_specialization_in_plain_lines_with_json_on_stdout(tmp_path):
    """A real compile of the toy plug-in kernel (tests/backend/test_compile_gate.py's), two targets: the
    progress lines on stderr, the JSON report alone on stdout."""
    from compile_runs import PLUGIN, compile_check

    (tmp_path / "toy_plugin.py").write_text(PLUGIN)
    proc = compile_check("--impl", "toy_plugin:good", "--tokens", "8", "--quant", "bf16", "--arch", "sm_90,sm_89",
                         extra_path=str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = [line for line in proc.stderr.splitlines() if line.startswith("compile-check")]
    assert lines == ["compile-check: 1/2 zero_kernel sm_90 default: ok", "compile-check: 2/2 zero_kernel sm_89 default: ok"]
    assert "\r" not in proc.stderr
    # with --json: the report alone on stdout, the same progress as JSON lines on stderr
    proc = compile_check("--impl", "toy_plugin:good", "--tokens", "8", "--quant", "bf16", "--arch", "sm_90,sm_89",
                         "--json", extra_path=str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout)["specializations"] == 2
    compiled = [json.loads(line) for line in proc.stderr.splitlines() if line.startswith('{"progress": "compile-check"')]
    assert [(x["done"], x["detail"], x["closed"]) for x in compiled] == [
        (1, "zero_kernel sm_90 default: ok", False), (2, "zero_kernel sm_89 default: ok", False),
        (2, "zero_kernel sm_89 default: ok", True)]


def _fake_one(item):
    """A campaign check that passes at once (module level: a task's function travels by name)."""
    from diffmoe.fuzz.campaign import CampaignResult

    return CampaignResult(config=item.config, seconds=0.0)


def test_the_false_alarm_campaign_reports_each_config_on_stderr_and_keeps_stdout(monkeypatch, capsys):
    spec = importlib.util.spec_from_file_location("false_alarm_campaign", ROOT / "bench" / "false_alarm_campaign.py")
    campaign = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "false_alarm_campaign", campaign)
    spec.loader.exec_module(campaign)
    monkeypatch.setattr(campaign, "_one", _fake_one)
    assert campaign.main(["--configs", "3", "--no-corners", "--cost-cap", "30", "--jobs", "1"]) == 0
    out, err = capsys.readouterr()
    lines = err.splitlines()
    assert [line.split("  ")[0] for line in lines] == [f"false-alarm campaign: {n}/3 configs" for n in (1, 2, 3)]
    assert all(line.endswith("0 false alarms") and " left  " in line for line in lines) and "\r" not in err
    stdout = out.splitlines()
    assert [line.split("]")[0] for line in stdout[:3]] == ["[1/3", "[2/3", "[3/3"]
    assert json.loads(stdout[3])["configs"] == 3 and len(stdout) == 4  # the results and the summary, as before
