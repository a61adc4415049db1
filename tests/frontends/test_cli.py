"""The diffmoe command line: exit codes, one-line errors, JSON output, plan, fuzz, demo.

Most tests run main() in-process with a fake runner; a few run the real implementation on
the smallest configs, and two run `python -m diffmoe` to see what a shell sees.
"""

import json
import subprocess
import sys

import pytest

from diffmoe.frontends import cli, flags
from diffmoe.frontends.commands import fuzz as fuzz_command
from diffmoe.problem.config import MoEConfig
from diffmoe.check.report import Report, check_command
from diffmoe.findings import Oracles
from diffmoe.fuzz.strategies import MINIMAL_FUSED_CONFIG
from diffmoe.problem.vocabulary import Buffers
from stand_in_cli import fake_runner  # noqa: F401 - the stand-in runner fixture, shared (tests/support/)

SMALL = ["--tokens", "1", "--experts", "1", "--topk", "1", "--hidden", "16", "--inter", "16", "--quant", "fp8-tensor", "--fused"]
# what SMALL checks: the fuzz's minimal fused draw with a check's default inputs, the spread and the
# outlier channels (issue 42), which the fuzz's draws shrink away
SMALL_CONFIG = MINIMAL_FUSED_CONFIG.replace(expert_scale_spread=MoEConfig().expert_scale_spread,
                                            outlier_channels=MoEConfig().outlier_channels)


def run_cli(capsys, *argv):
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# ---- check --------------------------------------------------------------------------------


def test_check_clean_exits_0(fake_runner, capsys):
    code, out, err = run_cli(capsys, "check", *SMALL)
    assert code == 0 and "PASS" in out
    call = fake_runner.calls[0]
    assert call["config"] == SMALL_CONFIG
    assert call["implementation"] is None and call["schedules"] is None and call["oracles"] is None


def test_check_with_findings_exits_1_and_shows_replay(fake_runner, capsys):
    code, out, _ = run_cli(capsys, "check", *SMALL, "--planner", "legacy")
    assert code == 1
    assert "FAIL" in out and "gate_up_output" in out
    assert check_command(SMALL_CONFIG.replace(planner="legacy")) in out


def test_check_defaults_are_moeconfig_defaults_with_one_padding_token_and_one_nan_token(fake_runner, capsys):
    assert run_cli(capsys, "check")[0] == 0
    assert fake_runner.calls[0]["config"] == MoEConfig(zero_rows=1, nan_rows=1)


@pytest.mark.parametrize("argv,zero_rows,nan_rows", [
    (["--zero-rows", "0"], 0, 1),  # asked for no padding token: the NaN token stays
    (["--zero-rows", "3"], 3, 1),
    (["--zero-rows", "7"], 7, 0),  # a NaN token would leave no ordinary token
    (["--nan-rows", "0"], 1, 0),  # asked for no NaN token
    (["--nan-rows", "2"], 1, 2),
    (["--tokens", "1"], 0, 0),  # a one-token call keeps its token ordinary
    (["--tokens", "8", "--call-tokens", "1"], 0, 0),
    (["--tokens", "2"], 1, 0),  # the padding token comes first
    (["--tokens", "3"], 1, 1),  # a zero, a NaN and an ordinary token
    (["--tokens", "3", "--zero-rows", "0"], 0, 1),
    (["--tokens", "3", "--inf-rows", "1"], 1, 0),
    (["--tokens", "3", "--nan-rows", "1", "--inf-rows", "1"], 0, 1),  # no ordinary token would be left
    (["--tokens", "4", "--nan-rows", "1", "--inf-rows", "1"], 1, 1),
    # per-tensor activation scales: a NaN token makes the shared scale and every output row NaN
    (["--quant", "fp8-tensor"], 1, 0),
    (["--quant", "fp8-token", "--weight-scales", "tensor"], 1, 1),  # per-token activations beside per-tensor weights
    (["--quant", "fp8-block"], 1, 1),
    (["--quant", "bf16"], 1, 1),
    (["--quant", "fp8-tensor", "--nan-rows", "1"], 1, 1),
])
def test_the_padding_and_nan_tokens_are_defaults_the_flags_and_replays_control(fake_runner, capsys, argv, zero_rows, nan_rows):
    assert run_cli(capsys, "check", *argv)[0] == 0
    config = fake_runner.calls[0]["config"]
    assert (config.zero_rows, config.nan_rows) == (zero_rows, nan_rows)
    # the replay rebuilds exactly this config, and names a row flag only where the default is not it
    command = check_command(config)
    run_cli(capsys, "check", *command.split()[2:])
    assert fake_runner.calls[1]["config"] == config
    for flag in ("--zero-rows", "--nan-rows"):
        if flag not in argv:
            assert flag not in command


@pytest.mark.parametrize("zero_rows,nan_rows,named", [
    (1, 1, ""), (0, 1, "--zero-rows 0"), (1, 0, "--nan-rows 0"), (0, 0, "--zero-rows 0 --nan-rows 0"),
    (2, 0, "--zero-rows 2 --nan-rows 0"), (6, 1, "--zero-rows 6"), (7, 0, "--zero-rows 7"), (1, 3, "--nan-rows 3"), (0, 3, "--zero-rows 0 --nan-rows 3"),
])
def test_replays_name_the_fewest_row_flags(fake_runner, capsys, zero_rows, nan_rows, named):
    config = MoEConfig(zero_rows=zero_rows, nan_rows=nan_rows)
    command = check_command(config)
    words = command.split()
    assert " ".join(f"{w} {v}" for w, v in zip(words, words[1:]) if w in ("--zero-rows", "--nan-rows")) == named
    run_cli(capsys, "check", *command.split()[2:])
    assert fake_runner.calls[0]["config"] == config


def test_a_config_file_holds_exactly_what_it_says(fake_runner, capsys, tmp_path):
    path = tmp_path / "c.json"
    path.write_text(MoEConfig().to_json())
    assert run_cli(capsys, "check", "--config", str(path))[0] == 0
    assert fake_runner.calls[0]["config"] == MoEConfig()  # no padding token added to a file's config


def test_check_json_is_one_object(fake_runner, capsys):
    code, out, _ = run_cli(capsys, "check", *SMALL, "--planner", "legacy", "--json")
    assert code == 1
    data = json.loads(out)  # exactly one JSON document
    assert data["passed"] is False
    assert MoEConfig.from_dict(data["config"]) == SMALL_CONFIG.replace(planner="legacy")
    (finding,) = data["findings"]
    assert {"oracle", "stage", "buffers", "message"} <= set(finding)
    assert finding["buffers"] == [Buffers.GATE_UP_OUTPUT, Buffers.QUANTED_DOWN_INPUT]


def test_check_passes_schedules_oracles_and_impl(fake_runner, capsys):
    code, _, _ = run_cli(
        capsys, "check", "--schedule", "reversed", "--schedule", "random:7", "--oracles", "races,poison", "--impl", "mymod:factory"
    )
    assert code == 0
    call = fake_runner.calls[0]
    assert [str(s) for s in call["schedules"]] == ["reversed", "random:7"]
    assert call["oracles"] == ["races", "poison"] and call["name"] == "mymod:factory"


def test_every_replay_command_parses_back(fake_runner, capsys):
    config = MoEConfig(num_tokens=7, num_experts=6, topk=1, hidden=97, inter=45, quant="fp8-token", fused=True,
                       router_weight="input", planner="legacy", output="workspace", expert_map=(0, -1, 1, -1, 2, -1),
                       skew="empty-experts", seed=11)
    argv = check_command(config).split()[2:]  # drop "diffmoe check"
    run_cli(capsys, "check", *argv)
    assert fake_runner.calls[0]["config"] == config


def test_replay_commands_carry_the_opt_in_inputs(fake_runner, capsys):
    config = MoEConfig(num_tokens=9, num_experts=5, topk=2, hidden=128, inter=128, call_tokens=4, router="softmax-topk",
                       renormalize=True, expert_scale_spread=3, zero_rows=2, nan_rows=1, inf_rows=1, tie_heavy=True,
                       random_orders=4, seed=3)
    command = check_command(config)
    for flag in ("--call-tokens 4", "--router softmax-topk --renormalize", "--expert-scale-spread 3", "--zero-rows 2",
                 "--nan-rows 1", "--inf-rows 1", "--tie-heavy", "--random-orders 4"):
        assert flag in command
    run_cli(capsys, "check", *command.split()[2:])
    assert fake_runner.calls[0]["config"] == config
    # a default config's command names none of them
    assert "--call-tokens" not in check_command(MoEConfig()) and "--random-orders" not in check_command(MoEConfig())


@pytest.mark.parametrize("argv,needle", [
    (["--call-tokens", "9", "--tokens", "8"], "call_tokens"),
    (["--nan-rows", "x"], "--nan-rows"),
    (["--expert-scale-spread", "9"], "expert_scale_spread"),
    (["--random-orders", "99"], "random_orders"),
    (["--renormalize"], "renormalize"),
])
def test_bad_input_flags_exit_2_with_one_line(capsys, argv, needle):
    code, _, err = run_cli(capsys, "check", *argv)
    assert code == 2 and needle in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_check_config_file(fake_runner, capsys, tmp_path):
    path = tmp_path / "c.json"
    path.write_text(MINIMAL_FUSED_CONFIG.to_json())
    assert run_cli(capsys, "check", "--config", str(path))[0] == 0
    assert fake_runner.calls[0]["config"] == MINIMAL_FUSED_CONFIG


BAD = [
    (["check", "--experts", "2", "--topk", "3"], "topk must be in [1, num_experts=2], got 3"),
    (["check", "--tokens", "abc"], "--tokens"),
    (["check", "--quant", "int4"], "--quant"),
    (["check", "--quant", "bf16", "--fused"], "fused"),
    (["check", "--hidden", "100", "--quant", "fp8-block"], "hidden must be a multiple of 128"),
    (["check", "--expert-map=0,x"], "--expert-map"),
    (["check", "--experts", "3", "--expert-map=0,0,1"], "expert_map"),
    (["check", "--schedule", "sideways"], "schedule"),
    (["check", "--oracles", "vibes"], "--oracles"),
    (["check", "--impl", "nomodule:nothing"], "--impl"),
    (["check", "--device", "warp-drive"], "--device"),
    (["check", "--fused", "--unfused"], "--unfused"),
    (["check", "--bogus"], "unrecognized arguments"),
    (["check", "--config", "/nonexistent/c.json"], "cannot read config file"),
    (["check", "--config", "c.json", "--tokens", "3"], "--config cannot be combined"),
    (["fuzz", "--max-examples", "0"], "--max-examples"),
    (["fuzz", "--max-tokens", "9999999"], "--max-tokens"),
    (["fuzz", "--max-experts", "65"], "--max-experts"),
    (["fuzz", "--oracles", "crash"], "--oracles"),
    (["fuzz", "--save-failure", "/nonexistent/dir/f.json"], "--save-failure"),
    (["plan", "--topk", "0"], "topk"),
    (["frobnicate"], "invalid choice"),
    ([], "a command is required"),
]


@pytest.mark.parametrize("argv,needle", BAD, ids=[" ".join(a) or "(none)" for a, _ in BAD])
def test_bad_arguments_exit_2_with_one_line(fake_runner, capsys, argv, needle):
    code, out, err = run_cli(capsys, *argv)
    assert code == 2
    assert out == ""
    assert err.count("\n") == 1 and err.startswith("diffmoe: error: ")
    assert needle in err
    assert not fake_runner.calls


@pytest.mark.parametrize("content", ["{not json", "[1, 2]", '{"num_tokens": 0}', '{"colour": "red"}', "\udcff"])
def test_malformed_config_file_exits_2(fake_runner, capsys, tmp_path, content):
    path = tmp_path / "bad.json"
    path.write_bytes(content.encode("utf-8", "surrogateescape"))
    code, out, err = run_cli(capsys, "check", "--config", str(path))
    assert code == 2 and err.count("\n") == 1 and str(path) in err


def test_help_exits_0(capsys):
    code, out, _ = run_cli(capsys, "check", "--help")
    assert code == 0 and "--expert-map" in out


def test_shell_sees_one_line_and_no_traceback():
    proc = subprocess.run(
        [sys.executable, "-m", "diffmoe", "check", "--experts", "2", "--topk", "3"], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 2
    assert proc.stderr == "diffmoe: error: topk must be in [1, num_experts=2], got 3\n"
    assert proc.stdout == ""


# ---- plan ---------------------------------------------------------------------------------


def test_plan_legacy_marks_the_alias(capsys):
    code, out, _ = run_cli(capsys, "plan", *SMALL, "--planner", "legacy")
    assert code == 1
    rows = {line.split()[0]: line for line in out.splitlines() if line.startswith(("gate_up_output", "quanted_down_input", "activation_output"))}
    assert "ws2" in rows["gate_up_output"] and "ALIASES quanted_down_input" in rows["gate_up_output"]
    assert "ALIASES gate_up_output" in rows["quanted_down_input"]
    assert "never written" in rows["activation_output"]
    assert "gate_up_gemm..act_quant" in rows["gate_up_output"]


def test_plan_fixed_is_clean_and_draws_a_png(capsys, tmp_path):
    png = tmp_path / "plan.png"
    code, out, _ = run_cli(capsys, "plan", *SMALL, "--output", "workspace", "--png", str(png))
    assert code == 0 and "no overlap" in out and "ALIASES" not in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plan_png_of_the_legacy_alias(capsys, tmp_path):
    png = tmp_path / "legacy.png"
    assert run_cli(capsys, "plan", "--fused", "--planner", "legacy", "--png", str(png))[0] == 1
    assert png.stat().st_size > 1000


# ---- fuzz ---------------------------------------------------------------------------------


def test_fuzz_finds_shrinks_and_saves(fake_runner, capsys, tmp_path):
    saved = tmp_path / "failure.json"
    code, out, err = run_cli(capsys, "fuzz", "--max-examples", "40", "--seed", "1", "--planner", "legacy", "--save-failure", str(saved))
    assert code == 1
    minimal = MINIMAL_FUSED_CONFIG.replace(planner="legacy")
    assert MoEConfig.from_json(saved.read_text()) == minimal
    assert check_command(minimal) in out and "minimal failing config" in out and "seed 1" in out
    assert "phase=generate" in err and "phase=shrink" in err  # progress goes to stderr
    # and the saved file replays
    assert run_cli(capsys, "check", "--config", str(saved))[0] == 1


def test_fuzz_json_is_one_object(fake_runner, capsys):
    code, out, _ = run_cli(capsys, "fuzz", "--max-examples", "40", "--seed", "1", "--planner", "legacy", "--json")
    assert code == 1
    data = json.loads(out)
    assert data["passed"] is False and data["examples"] >= 1
    assert MoEConfig.from_dict(data["config"]) == MINIMAL_FUSED_CONFIG.replace(planner="legacy")
    assert data["report"]["findings"][0]["oracle"] == Oracles.STATIC_ALIASING
    assert data["replay"].startswith("diffmoe check ")


def test_fuzz_clean_exits_0(fake_runner, capsys):
    code, out, _ = run_cli(capsys, "fuzz", "--max-examples", "5", "--seed", "3")
    assert code == 0 and "no finding" in out


def test_fuzz_sigterm_stops_cleanly_and_reports(fake_runner, capsys, monkeypatch):
    import os
    import signal

    original = fake_runner.run_differential

    def run_then_terminate(config, *args, **kwargs):
        report = original(config, *args, **kwargs)
        if len(fake_runner.calls) == 3:
            os.kill(os.getpid(), signal.SIGTERM)  # the CLI turns this into KeyboardInterrupt
        return report

    monkeypatch.setattr(fake_runner, "run_differential", run_then_terminate)
    before = signal.getsignal(signal.SIGTERM)
    code, out, err = run_cli(capsys, "fuzz", "--max-examples", "50", "--seed", "3", "--json")
    assert code == 130
    data = json.loads(out)
    assert data["interrupted"] is True and data["examples"] == 3
    assert signal.getsignal(signal.SIGTERM) == before  # handler restored


def test_progress_printer_rewrites_a_bar_per_phase_in_place_on_a_tty():
    import io

    stream = io.StringIO()
    printer = cli.ProgressPrinter(stream, tty=True, total=10)
    printer(1, "generate", 0.5, "T=1 long config text")
    printer(2, "generate", 0.7, "T=2")
    printer(3, "shrink", 1.0, "T=1")
    printer.finish()
    generate, shrink, rest = stream.getvalue().split("\n")  # each phase's bar left on its own line
    assert rest == "" and generate.count("\r") >= 2 and shrink.count("\r") >= 2
    assert "fuzz (generate)" in generate and "/10 examples" in generate and "fuzz (shrink)" in shrink
    assert "phase=" not in generate + shrink  # the plain line is for logs (tests/cluster/test_progress.py)


def test_progress_printer_is_periodic_off_a_tty():
    import io

    stream = io.StringIO()
    printer = cli.ProgressPrinter(stream, tty=False, interval=3600)
    for n in range(1, 6):
        printer(n, "generate", float(n), "c")
    printer(6, "shrink", 6.0, "c")
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2 and "phase=generate" in lines[0] and "phase=shrink" in lines[1]


# ---- demo ---------------------------------------------------------------------------------


def test_demo_with_the_alias_caught_exits_0(fake_runner, capsys):
    code, out, _ = run_cli(capsys, "demo")
    assert code == 0
    assert "PASS" in out and "FAIL" in out and "Conclusion" in out
    assert [c["config"].planner for c in fake_runner.calls] == ["fixed", "legacy"]
    assert all(c["config"].fused and c["config"].is_fp8 for c in fake_runner.calls)


def test_demo_exits_1_when_the_alias_goes_unnoticed(fake_runner, capsys, monkeypatch):
    clean = lambda config, *a, **k: Report(config, "optimized", [], [], [])  # noqa: E731
    monkeypatch.setattr(fake_runner, "run_differential", clean)
    code, out, _ = run_cli(capsys, "demo")
    assert code == 1 and "went unnoticed" in out


# ---- real runs ----------------------------------------------------------------------------


def test_real_check_fixed_and_legacy(capsys):
    assert run_cli(capsys, "check", *SMALL, "--schedule", "identity")[0] == 0
    code, out, _ = run_cli(capsys, "check", *SMALL, "--planner", "legacy", "--schedule", "identity", "--json")
    assert code == 1
    data = json.loads(out)
    oracles = {f["oracle"] for f in data["findings"]}
    assert Oracles.STATIC_ALIASING in oracles
    assert all(set(f["buffers"]) <= {Buffers.GATE_UP_OUTPUT, Buffers.QUANTED_DOWN_INPUT} for f in data["findings"] if f["buffers"])


@pytest.mark.slow
def test_real_demo():
    proc = subprocess.run([sys.executable, "-m", "diffmoe", "demo"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    assert "races" in proc.stdout and "static-aliasing" in proc.stdout


# ---- fuzz: output paths, counts ---------------------------------------------------------------


@pytest.mark.parametrize("where", ["/proc/x/failure.json", "/proc/x", "folder"])
def test_fuzz_unwritable_save_failure_is_a_usage_error_before_any_example(fake_runner, capsys, tmp_path, where):
    path = str(tmp_path) if where == "folder" else where
    code, out, err = run_cli(capsys, "fuzz", "--max-examples", "5", "--seed", "1", "--save-failure", path)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("diffmoe: error: --save-failure")
    assert not fake_runner.calls


def test_fuzz_save_failure_probe_leaves_no_file(fake_runner, capsys, tmp_path):
    saved = tmp_path / "failure.json"
    assert run_cli(capsys, "fuzz", "--max-examples", "5", "--seed", "3", "--save-failure", str(saved))[0] == 0
    assert not saved.exists()  # nothing failed, nothing written


@pytest.mark.parametrize("as_json", [False, True])
def test_fuzz_report_is_printed_before_a_failing_save(fake_runner, capsys, tmp_path, monkeypatch, as_json):
    import shutil

    folder = tmp_path / "out"
    folder.mkdir()
    original = fake_runner.run_differential

    def remove_the_folder(config, *args, **kwargs):
        shutil.rmtree(folder, ignore_errors=True)  # the path breaks while the fuzz runs
        return original(config, *args, **kwargs)

    monkeypatch.setattr(fake_runner, "run_differential", remove_the_folder)
    argv = ["fuzz", "--max-examples", "40", "--seed", "1", "--planner", "legacy", "--save-failure", str(folder / "f.json")]
    code, out, err = run_cli(capsys, *argv, *(["--json"] if as_json else []))
    assert code == 2 and "cannot write" in err
    minimal = MINIMAL_FUSED_CONFIG.replace(planner="legacy")
    if as_json:
        data = json.loads(out)
        assert MoEConfig.from_dict(data["config"]) == minimal and data["replay"] == check_command(minimal)
    else:
        assert "minimal failing config" in out and check_command(minimal) in out and "saved to" not in out


def test_fuzz_summary_counts_examples_and_shrinking_runs_apart(fake_runner, capsys):
    import re

    code, out, _ = run_cli(capsys, "fuzz", "--max-examples", "40", "--seed", "1", "--planner", "legacy", "--json")
    data = json.loads(out)
    code, out, _ = run_cli(capsys, "fuzz", "--max-examples", "40", "--seed", "1", "--planner", "legacy")
    summary = out.splitlines()[0]
    match = re.search(r": (\d+) examples? \+ (\d+) shrinking runs? in ", summary)
    assert match, summary
    generated, shrinking = int(match[1]), int(match[2])
    assert generated == data["generated_examples"] <= 40 and shrinking == data["shrink_examples"] > 0
    assert generated + shrinking == data["examples"]


def test_fuzz_help_says_what_max_examples_counts(capsys):
    code, out, _ = run_cli(capsys, "fuzz", "--help")
    out = " ".join(out.split())
    assert code == 0
    assert "generate phase" in out and "shrinking runs" in out


def test_fuzz_plan_tier_finds_the_legacy_planner_first(capsys):
    code, out, err = run_cli(capsys, "fuzz", "--planner", "legacy", "--seed", "0")
    assert code == 1
    assert out.startswith("plan tier (seed 0): ") and "first failure after" in out
    minimal = SMALL_CONFIG.replace(planner="legacy")  # a plan draws no inputs: it keeps the defaults (issue 42)
    assert check_command(minimal) in out and "static-aliasing" in out


def test_fuzz_plan_tier_alone_is_quiet_on_the_fixed_planner(capsys):
    code, out, _ = run_cli(capsys, "fuzz", "--tier", "plan", "--max-examples", "3000", "--seed", "2", "--json")
    data = json.loads(out)
    assert code == 0 and data["tier"] == "plan" and data["plan_tier"]["passed"] and data["plan_tier"]["examples"] == 3000
