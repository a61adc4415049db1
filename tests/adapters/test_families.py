"""The fused_experts family without an adapter (diffmoe/adapters/families.py): a function with
vLLM's or SGLang's signature judged as it is, from Python (`function_factory`), from an `--impl`
spec (`MODULE:FUNCTION@FAMILY`) and from the command line (`--fn ... --family ...`): a correct
function passes, a planted bug is caught at the reduce; and SGLang's own fused_experts, named
inside its pinned wheel (`sglang==0.5.23:fused_experts@sglang`), passes every scheme with no user
code, its replay line rebuilds it, and what it cannot run is refused with the reason."""

from __future__ import annotations

import pytest

from diffmoe.adapters import families, peer_wheels
from diffmoe.findings import Oracles
from diffmoe.judge.runner import load_factory, run_differential
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


@pytest.mark.parametrize("fields,words", [
    (dict(quant="fp8-token", weight_scales="tensor"), "weight_scales must be fp8-token's own"),
    (dict(swiglu_limit=7.0), "swiglu_limit must be None"),
])
@pytest.mark.parametrize("family", families.FAMILIES)
def test_a_family_refuses_what_its_call_cannot_pass(fields, words, family):
    """Issue 49: the vllm family passed per_channel_quant=True for per-tensor weights beside per-token
    activations and no clamp for a SwiGLU limit, judging the function on a config it never ran."""
    make = families.function_factory(family_experts.fused_experts, family)
    assert words in make.supports(MoEConfig(**{**SMALL, **fields}))
    with pytest.raises(ValueError, match=words):
        make(MoEConfig(**{**SMALL, **fields}))
    assert make.supports(MoEConfig(**{**SMALL, "quant": fields.get("quant", "bf16")})) is None


def test_the_cli_runs_fn_and_family_and_replays_it(capsys):
    argv = ["check", "--fn", "family_experts:fused_experts_last_k_dropped", "--family", "vllm", "--tokens", "4",
            "--experts", "4", "--topk", "2", "--hidden", "128", "--inter", "128", "--quant", "bf16", "--unfused",
            "--oracles", "differential"]
    assert main(argv) == 1
    assert "--impl family_experts:fused_experts_last_k_dropped@vllm" in capsys.readouterr().out
    assert main(argv[:3] + argv[5:]) == 2  # --fn without --family
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--fn and --family go together" in err


@pytest.fixture(scope="module")
def sglang_wheel():
    """SGLang 0.5.23's files in the peer cache, fetched on first use as tests/peers/test_peers_sglang.py does."""
    try:
        peer_wheels.fetch("sglang==0.5.23")
    except peer_wheels.PeerError as exc:
        pytest.skip(f"{exc}")


SGLANG = "sglang==0.5.23:fused_experts@sglang"  # the function at the release's default path
SGLANG_PATH = "sglang==0.5.23:sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe:fused_experts@sglang"
SGLANG_SMALL = dict(SMALL, hidden=256, inter=256)


@pytest.mark.parametrize("quant", ["bf16", "fp8-tensor", "fp8-token", "fp8-block"])
def test_sglangs_own_fused_experts_passes_from_its_wheel_with_no_user_code(sglang_wheel, quant):
    """`sglang==0.5.23:fused_experts@sglang`: the wheel's function loaded with the SGLang peer's stubs and
    stand-ins, judged under its own profile (the factory carries it), every scheme its Triton path has."""
    make = load_factory(SGLANG)
    assert make.name == SGLANG and make.numerics == "sglang" and make.peer_wheel == "sglang==0.5.23"
    report = run_differential(MoEConfig(**{**SGLANG_SMALL, "quant": quant}), make)
    assert report.passed, report.render()


def test_the_other_release_is_named_the_same_way():
    try:
        peer_wheels.fetch("sglang==0.5.20")
    except peer_wheels.PeerError as exc:
        pytest.skip(f"{exc}")
    report = run_differential(MoEConfig(**{**SGLANG_SMALL, "quant": "fp8-block"}), load_factory("sglang==0.5.20:fused_experts@sglang"))
    assert report.passed and report.implementation == "sglang==0.5.20:fused_experts@sglang", report.render()


@pytest.mark.slow  # 28 s on 2 cores (2026-12-05): two command-line checks, each in its own candidate process
def test_the_cli_runs_a_wheel_function_and_its_replay_line_rebuilds_it(sglang_wheel, capsys):
    from diffmoe.check.report import check_command, is_factory_spec

    argv = ["check", "--fn", SGLANG_PATH.rpartition("@")[0], "--family", "sglang", "--tokens", "4", "--experts", "4",
            "--topk", "2", "--hidden", "256", "--inter", "256", "--quant", "fp8-token", "--unfused", "--oracles", "differential"]
    assert main(argv) == 0, capsys.readouterr()
    assert SGLANG_PATH in capsys.readouterr().out
    assert is_factory_spec(SGLANG) and is_factory_spec(SGLANG_PATH)  # replay lines carry them, not MODULE:FACTORY
    config = MoEConfig(**{**SGLANG_SMALL, "quant": "fp8-block", "numerics": "sglang"})
    replay = check_command(config, SGLANG_PATH) + " --oracles differential"
    assert f"--impl {SGLANG_PATH}" in replay
    assert main(replay.split()[1:]) == 0, capsys.readouterr()  # `diffmoe check ...`: the same function rebuilt


@pytest.mark.parametrize("spec, message", [
    ("sglang==0.5.23:fused_experts@vllm", "--family must be 'sglang'"),
    ("sglang==0.5.23:sglang.srt.utils:fused_experts@sglang", "must be one of the files diffmoe keeps"),
    ("sglang==0.5.23:fused_expertz@sglang", "it has no 'fused_expertz'"),
    ("sglang==0.5.23:fused_experts", "name its signature, --fn sglang==0.5.23:fused_experts --family"),
])
def test_a_wheel_function_spec_that_names_nothing_is_one_clear_error(sglang_wheel, spec, message):
    with pytest.raises(ValueError, match=message):
        load_factory(spec)


def test_the_pair_sglang_does_not_take_is_refused_with_its_reason(sglang_wheel):
    """SGLang's per_channel_quant ties per-token activations to per-channel weights: per-tensor weights
    beside per-token activations is refused through `supports`; the schemes' own pairs are not."""
    make = load_factory(SGLANG)
    reason = make.supports(MoEConfig(**{**SGLANG_SMALL, "quant": "fp8-token", "weight_scales": "tensor"}))
    assert reason is not None and reason.startswith("weight_scales") and "per_channel_quant" in reason, reason
    with pytest.raises(ValueError, match="^weight_scales"):
        make(MoEConfig(**{**SGLANG_SMALL, "quant": "fp8-token", "weight_scales": "tensor"}))
    assert all(make.supports(MoEConfig(**{**SGLANG_SMALL, "quant": q})) is None
               for q in ("bf16", "fp8-tensor", "fp8-token", "fp8-block"))


def test_a_wheel_function_without_its_wheel_names_the_fetch(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv(peer_wheels.CACHE_ENV, str(tmp_path / "empty"))
    argv = ["check", "--fn", "sglang==0.5.23:fused_experts", "--family", "sglang", "--quant", "bf16", "--unfused"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "diffmoe peers fetch sglang==0.5.23" in err, err
