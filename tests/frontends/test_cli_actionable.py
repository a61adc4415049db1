"""Findings a newcomer can act on, at the command line (issue 28, item 5): a config the
implementation's `supports` refuses is exit 2 in one line on every path (check, plan, compile-check,
a fuzz whose bounds leave only refused configs); a peer run without its cached wheel names the
`diffmoe peers fetch` to run (exit 2); on a CPU the CLI turns the Triton interpreter on before it
imports an `--impl` module; an implementation variant travels in the spec, so replay lines carry it.
"""

import os
import re
import shlex
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest
import torch

from diffmoe.adapters import peer_wheels
from diffmoe.contract import IMPLEMENTATION_ALIASES
from diffmoe.check.report import Report, check_command, is_factory_spec
from diffmoe.frontends import cli, flags
from diffmoe.frontends.commands import fuzz as fuzz_command
from diffmoe.problem.config import MoEConfig
from hang_bounds import SUBPROCESS_HANG_S

ROOT = Path(__file__).resolve().parents[2]
SMALL = ["--tokens", "1", "--experts", "1", "--topk", "1", "--hidden", "16", "--inter", "16", "--quant", "fp8-tensor"]


def refuses_fused(config):
    raise AssertionError("never built: its `supports` refuses the config first")


refuses_fused.supports = lambda config: "no fused act+quant here" if config.fused else None
refuses_fused.plan_workspaces = lambda config, num_tokens: (_ for _ in ()).throw(AssertionError("never asked"))


def refuses_all(config):
    raise AssertionError("never built: its `supports` refuses every config")


refuses_all.supports = lambda config: "runs nothing"


def refuses_all_plans(config):
    raise AssertionError("never built")


refuses_all_plans.supports = refuses_all.supports
refuses_all_plans.plan_workspaces = lambda config, num_tokens: (_ for _ in ()).throw(AssertionError("never asked"))


def block_profile_only(config):
    raise AssertionError("never built: its `supports` refuses the config first")


# a numerics profile that describes one scheme (lmdeploy's: blocked FP8 only), as lmdeploy's factory declares it
block_profile_only.numerics = "lmdeploy"
block_profile_only.supports = lambda config: None if config.quant == "fp8-block" else "fp8-block only"


def runs_from_a_missing_wheel(config):
    raise AssertionError("never built: its wheel is not cached")


runs_from_a_missing_wheel.peer_wheel = "vllm==0.28.0"


def runs_from_an_unknown_wheel(config):
    raise AssertionError("never built")


runs_from_an_unknown_wheel.peer_wheel = "no-such-peer"


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


# ---- a refused config: exit 2, one line, on every path ---------------------------------------


def test_plan_of_a_refused_config_is_a_usage_error(capsys):
    """It was "the implementation's plan failed: ValueError: ..." and exit 1 (`diffmoe plan --impl vllm
    --quant fp8-token --fused`), a finding for a config nobody could run."""
    code = cli.main(["plan", *SMALL, "--fused", "--impl", "test_cli_actionable:refuses_fused"])
    err = capsys.readouterr().err
    assert code == cli.EXIT_USAGE
    assert "does not run this config: no fused act+quant here" in one_line(err)


def test_check_of_a_config_its_profile_cannot_describe_is_a_usage_error(capsys):
    """`diffmoe check --impl lmdeploy` at the default fp8-token was an internal error (exit 3, a
    traceback): the declared profile was taken before the factory's `supports` was asked."""
    code = cli.main(["check", *SMALL[:-2], "--impl", "test_cli_actionable:block_profile_only", "--isolation", "none"])
    assert code == cli.EXIT_USAGE
    assert "does not run this config: fp8-block only" in one_line(capsys.readouterr().err)


def test_compile_check_of_a_refused_config_is_a_usage_error(capsys, monkeypatch):
    # compile-check sets TRITON_INTERPRET=0 for its compiles: restored after the test
    monkeypatch.setenv("TRITON_INTERPRET", os.environ.get("TRITON_INTERPRET", "1"))
    code = cli.main(["compile-check", *SMALL, "--fused", "--impl", "test_cli_actionable:refuses_fused"])
    assert code == cli.EXIT_USAGE
    assert "does not run this config: no fused act+quant here" in one_line(capsys.readouterr().err)


@pytest.fixture
def fake_runner(monkeypatch):
    fake = types.ModuleType("diffmoe.judge.runner")
    fake.calls = []

    def run_differential(config, implementation=None, *, implementation_name="optimized", **_):
        fake.calls.append(config)
        return Report(config, implementation_name, ["static-aliasing"], ["identity"], [])

    fake.run_differential = run_differential
    fake.load_factory = lambda spec: refuses_fused
    monkeypatch.setitem(sys.modules, "diffmoe.judge.runner", fake)
    monkeypatch.setattr(fuzz_command, "DEFAULT_PLAN_EXAMPLES", 0)
    monkeypatch.setattr(fuzz_command, "DEFAULT_FUZZ_WORKERS", 1)
    monkeypatch.setattr(flags, "DEFAULT_ISOLATION", "none")  # the stand-in's factory exists only here
    monkeypatch.delenv("DIFFMOE_HYPOTHESIS_DB", raising=False)
    return fake


def test_a_fuzz_whose_bounds_leave_only_refused_configs_is_a_usage_error(fake_runner, capsys):
    """Every bounded draw refused: one line naming the bounds and the refusal, not an internal error
    (Hypothesis's Unsatisfiable) after the first example."""
    code = cli.main(["fuzz", "--max-examples", "3", "--seed", "1", "--fused", "--quant", "fp8-tensor", "--impl", "x:refuses_fused"])
    line = one_line(capsys.readouterr().err)
    assert code == cli.EXIT_USAGE and "does not run any config within the bounds" in line
    assert "no fused act+quant here" in line and not fake_runner.calls


@pytest.mark.parametrize("impl, tier, needle", [
    # no bounds at all: it was an internal error (exit 3, Hypothesis's Unsatisfiable), issue 43
    ("x:refuses_all", [], "does not run any config the fuzz draws: runs nothing"),
    # the plan tier alone: it was "0 configs in 0.01 s, no finding", exit 0 for nothing judged
    ("x:refuses_all_plans", ["--tier", "plan"], "--tier plan: no plan of x:refuses_all_plans was judged"),
])
def test_a_fuzz_of_a_factory_that_refuses_every_config_is_a_usage_error(fake_runner, monkeypatch, capsys, impl, tier,
                                                                          needle):
    monkeypatch.setattr(fake_runner, "load_factory", lambda spec: globals()[spec.partition(":")[2]])
    code = cli.main(["fuzz", "--max-examples", "3", "--seed", "1", *tier, "--impl", impl])
    line = one_line(capsys.readouterr().err)
    assert code == cli.EXIT_USAGE and needle in line and not fake_runner.calls


def test_a_fuzz_whose_bounds_leave_supported_configs_runs(fake_runner, capsys):
    code = cli.main(["fuzz", "--max-examples", "3", "--seed", "1", "--unfused", "--impl", "x:refuses_fused"])
    assert code == cli.EXIT_OK, capsys.readouterr().err
    assert fake_runner.calls and not any(c.fused for c in fake_runner.calls)


# ---- a peer without its cached wheel -----------------------------------------------------------


@pytest.mark.parametrize("argv, fetch", [
    (["check", "--impl", "vllm==0.28.0"], "diffmoe peers fetch vllm==0.28.0"),
    (["check", "--impl", "vllm", *SMALL], "diffmoe peers fetch vllm"),
    (["plan", "--impl", "lmdeploy"], "diffmoe peers fetch lmdeploy"),
    (["fuzz", "--impl", "liger", "--max-examples", "1", "--seed", "0"], "diffmoe peers fetch liger"),
    (["check", "--impl", "peers.vllm:make_0_30_0"], "diffmoe peers fetch vllm==0.30.0"),
    # a module's factory that builds a peer, met first by the fuzz's plan tier in the candidate's
    # process: it was an internal error (exit 3, a traceback)
    (["fuzz", "--impl", "bug_zoo:make_vllm_cache2_in_ws2", "--max-examples", "1", "--seed", "0"],
     "diffmoe peers fetch vllm"),
])
def test_a_peer_run_without_its_wheel_names_the_fetch(monkeypatch, tmp_path, capsys, argv, fetch):
    """It was a crash finding (exit 1) naming peer_wheels.py, for a kernel that never ran."""
    monkeypatch.setenv(peer_wheels.CACHE_ENV, str(tmp_path / "empty"))
    code = cli.main(argv)
    line = one_line(capsys.readouterr().err)
    assert code == cli.EXIT_USAGE and f"`{fetch}`" in line and str(tmp_path / "empty") in line


def test_a_factory_naming_its_wheel_is_asked_before_it_runs(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv(peer_wheels.CACHE_ENV, str(tmp_path / "empty"))
    assert cli.main(["check", *SMALL, "--impl", "test_cli_actionable:runs_from_a_missing_wheel"]) == cli.EXIT_USAGE
    assert "`diffmoe peers fetch vllm==0.28.0`" in one_line(capsys.readouterr().err)
    assert cli.main(["check", *SMALL, "--impl", "test_cli_actionable:runs_from_an_unknown_wheel"]) == cli.EXIT_USAGE
    assert "unknown peer 'no-such-peer'" in one_line(capsys.readouterr().err)


def test_every_peer_factory_names_its_wheel():
    """What the check above relies on: each alias's factory says which wheel it runs from."""
    from diffmoe.judge.runner import load_factory

    for alias in IMPLEMENTATION_ALIASES:
        wheel = getattr(load_factory(alias), "peer_wheel", None)
        assert wheel in peer_wheels.PEERS, (alias, wheel)
        assert peer_wheels.PEERS[wheel] is peer_wheels.PEERS[alias if alias in peer_wheels.PEERS else wheel]


def test_a_cached_wheel_is_quiet():
    cached = [name for name in ("vllm", "vllm==0.28.0", "liger", "lmdeploy") if peer_wheels.is_cached(name)]
    if not cached:
        pytest.skip("no peer wheel cached here (diffmoe peers fetch NAME)")
    for name in cached:
        factory, spec = cli.load_implementation(name)
        assert spec == name and factory.peer_wheel in peer_wheels.PEERS


# ---- the interpreter before an --impl module ---------------------------------------------------


ADAPTER = '''
import triton  # first, before anything of diffmoe: the case of issue 28
import triton.language as tl
import torch


@triton.jit
def add_one(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=mask) + 1.0, mask=mask)


def make(config):
    raise RuntimeError("not built")


def plan(config, num_tokens):
    x = torch.zeros(4)
    add_one[(1,)](x, 4, BLOCK=4)
    raise RuntimeError(f"the kernel ran: {x.tolist()}")


make.plan_workspaces = plan
'''


@pytest.mark.skipif(torch.cuda.is_available(), reason="on CUDA the kernel is compiled, as it should be")
def test_an_adapter_importing_triton_first_runs_under_the_interpreter_on_a_cpu(tmp_path):
    """Without the interpreter switched on before the import, the kernel is compiled and its launch
    fails ("0 active drivers" here; "Cannot call @triton.jit'd outside of the scope of a kernel" from a
    jit helper), reported as the implementation's failure."""
    (tmp_path / "tri_adapter.py").write_text(textwrap.dedent(ADAPTER))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run([sys.executable, "-m", "diffmoe", "plan", "--impl", f"{tmp_path / 'tri_adapter.py'}:make"],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=SUBPROCESS_HANG_S)
    assert "the kernel ran: [1.0, 1.0, 1.0, 1.0]" in done.stderr, done.stderr


# ---- a variant is in the spec: replay lines carry it --------------------------------------------


@pytest.mark.parametrize("spec", [*IMPLEMENTATION_ALIASES, "peers.vllm:make_0_28_0", "tests/support/spec_moe.py:make"])
def test_the_replay_line_carries_the_whole_spec(spec):
    line = check_command(MoEConfig(), spec)
    assert is_factory_spec(spec) and "#" not in line
    args = cli.build_parser().parse_args(shlex.split(line)[1:])
    assert args.impl == spec  # the release (`==0.28.0`) and the file path come back whole


def test_a_release_factory_passed_from_python_replays_as_its_release():
    """A factory object (no spec given) is named `module:make`, the module that pins the release."""
    from diffmoe.judge.runner import factory_name, load_factory

    for alias in ("vllm==0.28.0", "vllm==0.30.0"):
        name = factory_name(load_factory(alias))
        assert name == IMPLEMENTATION_ALIASES[alias] and load_factory(name) is load_factory(alias)


# Every environment read of the implementations, and why it selects no variant of the kernel under
# test (a variant chosen by environment would replay as the unmodified kernel: issue 28).
ENVIRONMENT_READS = {
    "peers/common.py": "TRITON_INTERPRET: the interpreter on a CPU, set before triton is imported",
    "optimized/backend.py": "TRITON_INTERPRET, and DIFFMOE_ALLOW_SOFTWARE_FALLBACK: on CUDA, run the correct but "
                            "slow software path instead of refusing; without it the run refuses, it never passes",
    "peers/liger/core.py": "Liger's autotune switch, set off while its files load and restored: always off, no choice",
}


def test_no_implementation_reads_a_variant_from_the_environment():
    reads = re.compile(r"os\.environ|os\.getenv|environ\.get")
    found = {str(p.relative_to(ROOT)) for folder in ("peers", "optimized") for p in (ROOT / folder).rglob("*.py")
             if reads.search(p.read_text())}
    assert found <= set(ENVIRONMENT_READS), f"environment reads to review (a variant is a spec suffix): {found - set(ENVIRONMENT_READS)}"
