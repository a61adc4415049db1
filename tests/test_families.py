"""The fused_experts family without an adapter (diffmoe/adapters/families.py): a function with
vLLM's or SGLang's signature judged as it is, from Python (`function_factory`), from an `--impl`
spec (`MODULE:FUNCTION@FAMILY`) and from the command line (`--fn ... --family ...`): a correct
function passes, a planted bug is caught at the reduce, and SGLang's own fused_experts (from the
peer cache) passes called with the sglang family's signature."""

from __future__ import annotations

import pytest

from diffmoe.adapters import families, peer_wheels
from diffmoe.check.report import Oracles
from diffmoe.check.runner import load_factory, run_differential
from diffmoe.frontends.cli import main
from diffmoe.problem.config import MoEConfig
from diffmoe.problem.vocabulary import Stages

import family_experts

SMALL = dict(num_tokens=4, num_experts=4, topk=2, hidden=128, inter=128, quant="bf16", fused=False)


def test_a_correct_function_passes_and_a_planted_bug_is_caught():
    good = families.function_factory(family_experts.fused_experts, "vllm")
    assert run_differential(MoEConfig(**SMALL), good).passed
    bad = families.function_factory(family_experts.fused_experts_last_k_dropped, "vllm")
    report = run_differential(MoEConfig(**SMALL), bad, oracles=[Oracles.DIFFERENTIAL])
    assert not report.passed and report.findings[0].stage == Stages.REDUCE, report.render()


def test_the_impl_spec_names_the_function_and_its_family():
    make = load_factory("family_experts:fused_experts@vllm")
    assert make.name == "family_experts:fused_experts@vllm"
    with pytest.raises(ValueError, match=r"--family must be one of \['vllm', 'sglang'\], got 'triton'"):
        load_factory("family_experts:fused_experts@triton")
    assert "fused must be False" in make.supports(MoEConfig(**{**SMALL, "quant": "fp8-block", "fused": True}))


def test_the_cli_runs_fn_and_family_and_replays_it(capsys):
    argv = ["check", "--fn", "family_experts:fused_experts_last_k_dropped", "--family", "vllm", "--tokens", "4",
            "--experts", "4", "--topk", "2", "--hidden", "128", "--inter", "128", "--quant", "bf16", "--unfused",
            "--oracles", "differential"]
    assert main(argv) == 1
    assert "--impl family_experts:fused_experts_last_k_dropped@vllm" in capsys.readouterr().out
    assert main(argv[:3] + argv[5:]) == 2  # --fn without --family
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--fn and --family go together" in err


def test_sglangs_own_fused_experts_passes_as_the_sglang_family():
    try:
        root_files = __import__("peers.sglang_core", fromlist=["SglangFiles"]).SglangFiles.get("sglang==0.5.23", True)
    except peer_wheels.PeerError as exc:
        pytest.skip(f"{exc}")
    fused_moe = root_files.fused_moe

    def fused_experts(*args, **kwargs):
        with root_files.installed():
            return fused_moe.fused_experts(*args, **kwargs)

    make = families.function_factory(fused_experts, "sglang", "sglang 0.5.23 fused_experts@sglang")
    config = MoEConfig(**{**SMALL, "hidden": 256, "inter": 256, "quant": "fp8-token", "numerics": "sglang"})
    report = run_differential(config, make)
    assert report.passed, report.render()
