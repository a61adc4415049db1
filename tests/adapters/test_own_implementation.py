"""Your own kernel, first class: reports name the implementation under test and their replay
line reproduces it (from run_differential, the CLI and the pytest plugin); what an
implementation prints never reaches the CLI's stdout; a closed stdout and an unusable --device
end quietly.

The implementations here cost nothing to run: `exploding` raises when built (a `crash`
finding, no kernel launched); the NOISY module prints, at the Python level and on file
descriptor 1, and answers with the reference's result, judged by the static-aliasing oracle
alone.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import textwrap

import pytest
import torch

from diffmoe.frontends import cli
from diffmoe.contract import DEFAULT_IMPLEMENTATION, DEFAULT_IMPLEMENTATION_NAME
from diffmoe.check.report import Report, check_command
from diffmoe.findings import Oracles
from diffmoe.judge.runner import factory_name, load_factory, run_differential
from diffmoe.fuzz.strategies import MINIMAL_FUSED_CONFIG
from hang_bounds import SUBPROCESS_HANG_S

HERE = os.path.dirname(os.path.abspath(__file__))
SMALL = ["--tokens", "1", "--experts", "1", "--topk", "1", "--hidden", "16", "--inter", "16", "--quant", "fp8-tensor", "--fused",
         "--expert-scale-spread", "0", "--outlier-channels", "0"]  # MINIMAL_FUSED_CONFIG
SPEC = f"{__name__}:exploding"  # its folder is on sys.path (pytest's prepend import mode): this module imports by its file name


def exploding(config):
    """A module-level factory: importable as SPEC, so a replay command can load it."""
    raise RuntimeError("exploding factory: no implementation today")


def run_cli(capsys, *argv):
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def replay_argv(report: Report) -> list[str]:
    """The replay command as a shell reads it (its comment dropped), without `diffmoe check`."""
    argv = shlex.split(report.replay_command(), comments=True)
    assert argv[:2] == ["diffmoe", "check"]
    return argv[2:]


# ---- the implementation's name, and a replay that reproduces it --------------------------


def test_factory_names():
    assert __name__ == "test_own_implementation" and load_factory(SPEC) is exploding
    assert factory_name(None) == DEFAULT_IMPLEMENTATION_NAME
    assert factory_name(load_factory(DEFAULT_IMPLEMENTATION)) == DEFAULT_IMPLEMENTATION_NAME  # the default, passed by hand
    assert factory_name(exploding) == SPEC
    assert factory_name(lambda config: None) == "test_factory_names.<locals>.<lambda>"

    def closure(config):
        raise AssertionError

    assert factory_name(closure) == "test_factory_names.<locals>.closure"
    closure.name = "my fused MoE, tile 64"
    assert factory_name(closure) == "my fused MoE, tile 64"


def test_run_differential_names_an_importable_factory_and_its_replay_reproduces_it(capsys):
    report = run_differential(MINIMAL_FUSED_CONFIG, exploding)
    assert [f.oracle for f in report.findings] == [Oracles.CRASH]
    assert report.implementation == SPEC and report.to_dict()["implementation"] == SPEC
    assert report.replay_command() == check_command(MINIMAL_FUSED_CONFIG) + f" --impl {SPEC}"
    assert f"replay: {report.replay_command()}" in report.render() and SPEC in report.render().splitlines()[0]
    # the replay runs this factory, not the default (which passes this config)
    code, out, _ = run_cli(capsys, "check", *replay_argv(report), "--json")
    data = json.loads(out)
    assert code == 1 and data["implementation"] == SPEC and data["findings"][0]["oracle"] == Oracles.CRASH
    assert data["replay"] == report.replay_command()


def test_a_factory_no_command_can_load_says_so_and_its_replay_cannot_run_the_default(capsys):
    report = run_differential(MINIMAL_FUSED_CONFIG, lambda config: exploding(config))
    label = "test_a_factory_no_command_can_load_says_so_and_its_replay_cannot_run_the_default.<locals>.<lambda>"
    assert report.implementation == label and not report.passed
    replay = report.replay_command()
    assert f"--impl MODULE:FACTORY  # implementation {label} is not importable as MODULE:FACTORY" in replay
    assert "pass it to run_differential" in replay and f"replay: {replay}" in report.render()
    # pasted into a shell, it is a usage error, never a passing run of the default implementation
    code, out, err = run_cli(capsys, "check", *replay_argv(report))
    assert code == 2 and out == "" and "--impl" in err and "MODULE" in err
    # an explicit name still wins, for Python callers who label their runs
    named = run_differential(MINIMAL_FUSED_CONFIG, exploding, implementation_name="mine:v2")
    assert named.implementation == "mine:v2" and named.replay_command().endswith("--impl mine:v2")
    with pytest.raises(TypeError, match="implementation_name"):
        run_differential(MINIMAL_FUSED_CONFIG, exploding, implementation_name=3)


def test_the_cli_names_its_impl_in_the_report_and_the_replay(capsys):
    code, out, _ = run_cli(capsys, "check", *SMALL, "--impl", SPEC, "--time-limit", "0", "--json")
    data = json.loads(out)
    assert code == 1 and data["implementation"] == SPEC
    assert data["replay"] == check_command(MINIMAL_FUSED_CONFIG) + f" --impl {SPEC}"
    code, out, _ = run_cli(capsys, "check", *SMALL, "--impl", SPEC, "--time-limit", "0")
    assert code == 1 and f"replay: {data['replay']}" in out


PLUGIN_PROBE = textwrap.dedent(
    """
    from diffmoe.judge.runner import run_differential
    from diffmoe.fuzz.strategies import MINIMAL_FUSED_CONFIG

    def exploding(config):
        raise RuntimeError("probe factory")

    def test_mine(assert_report_passes):
        assert_report_passes(run_differential(MINIMAL_FUSED_CONFIG, exploding))
    """
)


def test_the_pytest_plugin_shows_a_replay_with_the_implementation(tmp_path):
    (tmp_path / "test_probe_impl.py").write_text(PLUGIN_PROBE)
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "GITHUB_ACTIONS")}
    env["TRITON_INTERPRET"] = "1"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "test_probe_impl.py", "-q", "-p", "no:cacheprovider", "--rootdir", str(tmp_path)],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=SUBPROCESS_HANG_S,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    (line,) = [ln.strip() for ln in proc.stdout.splitlines() if ln.strip().startswith("replay: ")]
    assert line == "replay: " + check_command(MINIMAL_FUSED_CONFIG) + " --impl test_probe_impl:exploding"
    assert "diffmoe FAIL" in proc.stdout and "test_probe_impl:exploding" in proc.stdout
    # and the line replays the probe's factory (with the test's folder importable)
    replay = subprocess.run(
        [sys.executable, "-m", "diffmoe", *shlex.split(line.removeprefix("replay: "))[1:], "--json"],
        capture_output=True, text=True, env=dict(env, PYTHONPATH=str(tmp_path)), cwd=tmp_path, timeout=SUBPROCESS_HANG_S,
    )
    data = json.loads(replay.stdout)
    assert replay.returncode == 1 and data["findings"][0]["oracle"] == Oracles.CRASH, replay.stderr
    assert "probe factory" in data["findings"][0]["message"]


# ---- what the implementation prints goes to stderr ---------------------------------------

NOISY = '''
import os
import sys

from optimized.moe import TritonFP8MoE


class Noisy(TritonFP8MoE):
    def run(self, problem, workspaces, **kwargs):
        print("NOISE from print")
        sys.stdout.write("NOISE from sys.stdout\\n")
        sys.stdout.flush()
        os.write(1, b"NOISE on fd 1\\n")
        return super().run(problem, workspaces, **kwargs)


def make(config):
    print("NOISE while building")
    return Noisy(config)
'''


@pytest.fixture
def noisy(tmp_path, monkeypatch):
    (tmp_path / "noisy_impl.py").write_text(NOISY)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def test_json_stays_one_object_when_the_implementation_prints_in_process(noisy, capfd):
    for command in (["check", *SMALL], ["fuzz", "--max-examples", "2", "--seed", "1", "--max-tokens", "1", "--max-experts", "1"]):
        code = cli.main([*command, "--impl", "noisy_impl:make", "--oracles", "static-aliasing", "--time-limit", "0", "--json"])
        out, err = capfd.readouterr()
        data = json.loads(out)  # exactly one JSON document: nothing else on stdout, fd 1 included
        assert code == 0 and data["passed"] is True, err
        assert "NOISE from print" in err and "NOISE from sys.stdout" in err and "NOISE on fd 1" in err
        assert "NOISE while building" in err


def run_noisy_cli(folder, *argv, stdout=subprocess.PIPE):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(folder), HERE, os.environ.get("PYTHONPATH", "")]), TRITON_INTERPRET="1")
    return subprocess.Popen([sys.executable, "-m", "diffmoe", *argv], stdout=stdout, stderr=subprocess.PIPE, text=True, env=env)


def test_json_stays_one_object_when_the_implementation_prints_in_a_worker(noisy):
    # without --time-limit the interpreter's default limit applies: the check runs in a worker
    proc = run_noisy_cli(noisy, "check", *SMALL, "--impl", "noisy_impl:make", "--oracles", "static-aliasing", "--json")
    out, err = proc.communicate(timeout=SUBPROCESS_HANG_S)
    assert proc.returncode == 0, err
    assert json.loads(out)["passed"] is True and out.count("\n") == 1
    assert "NOISE from print" in err and "NOISE on fd 1" in err


# ---- a closed stdout ends quietly ----------------------------------------------------------


@pytest.mark.parametrize("argv", [
    ["check", *SMALL, "--impl", "noisy_impl:make", "--oracles", "static-aliasing", "--time-limit", "0"],
    ["doctor", "--json"],
], ids=["check", "doctor --json"])
def test_a_closed_stdout_exits_141_without_a_traceback(noisy, argv):
    proc = run_noisy_cli(noisy, *argv)
    proc.stdout.close()  # the reader is gone before the first byte is written: every write is EPIPE
    err = proc.stderr.read()
    proc.wait(timeout=SUBPROCESS_HANG_S)
    assert proc.returncode == cli.EXIT_BROKEN_PIPE == 141, err
    assert "Traceback" not in err and "BrokenPipeError" not in err and "Exception ignored" not in err


def test_doctor_json_into_head_is_quiet():
    proc = subprocess.run(
        ["bash", "-c", f"set -o pipefail; {shlex.quote(sys.executable)} -m diffmoe doctor --json | head -c 10"],
        capture_output=True, text=True, timeout=SUBPROCESS_HANG_S, env=dict(os.environ, TRITON_INTERPRET="1"),
    )
    assert proc.stdout == '{"backend"' and proc.returncode in (0, 141)  # 0 when the whole object fit the pipe
    assert "Traceback" not in proc.stderr and "Broken pipe" not in proc.stderr


# ---- a device this torch cannot use ------------------------------------------------------

DEVICE_COMMANDS = [
    ["check", *SMALL],
    ["fuzz", "--max-examples", "1", "--seed", "1"],
    ["doctor", "--json"],
    ["demo"],
]


@pytest.mark.skipif(torch.cuda.is_available(), reason="this torch has CUDA")
@pytest.mark.parametrize("command", DEVICE_COMMANDS, ids=[c[0] for c in DEVICE_COMMANDS])
@pytest.mark.parametrize("device", ["cuda", "cuda:0"])
def test_cuda_on_a_cpu_only_torch_is_one_line_exit_2(capsys, command, device):
    code, out, err = run_cli(capsys, *command, "--device", device)
    assert code == 2 and out == "" and err.count("\n") == 1
    assert err.startswith(f"diffmoe: error: --device {device}: cuda is not available with this torch")


def test_plan_takes_no_device(capsys):
    code, out, err = run_cli(capsys, "plan", *SMALL, "--device", "cuda")
    assert code == 2 and out == "" and err == "diffmoe: error: unrecognized arguments: --device cuda\n"


def test_a_device_index_past_the_count_is_one_line_exit_2(capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    code, out, err = run_cli(capsys, "doctor", "--device", "cuda:1")
    assert code == 2 and out == "" and err == "diffmoe: error: --device cuda:1: this machine has 1 cuda device\n"
