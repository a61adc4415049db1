"""SGLang's Triton fused MoE (`fused_experts`, its CUDA branch and its non-CUDA fallback) under
diffmoe's oracles, from the pinned wheels of 0.5.23 and 0.5.20 (peers/sglang/core.py). Each wheel is
fetched once (network, 39 MB and 27 MB; the cache each leaves, 1.5 MB, is reused:
diffmoe/adapters/peer_wheels.py); without network and cache the module skips naming the fetch
command.

What is held: every scheme SGLang's CUDA branch runs passes every default oracle on small configs
under the `sglang` numerics profile, in both releases; the profile is what makes the difference
(fp8-block under diffmoe's profile is flagged at the down input's quant; on an all-zero token
the group scale's 1e-10 floor and the reduce's +0 start past K = 2 are SGLang's); every launch is
reported at its stage; a planted off-by-one in SGLang's own file (the count of valid routed rows
the gate/up GEMM is given) is caught; the non-CUDA fallback's top-1 path, which sums a
never-written intermediate_cache3 over the output its down GEMM stored, is caught; the CUDA
branch given a routed scaling factor (make_scaled, the museum's SGLang exhibit) passes where the
release is right and is caught at 0.5.20's top-1 (SGLang PR #40187); refused configs name the field.
"""

from __future__ import annotations

import shutil

import pytest
import torch

from diffmoe.adapters import peer_wheels
from diffmoe.adapters.loading import load_factory
from diffmoe.contract import (
    IMPLEMENTATION_ALIASES, Schedule, factory_batch_invariant, factory_numerics, peer_factory_spec, unsupported,
)
from diffmoe.check.recording import LaunchLog
from diffmoe.findings import Oracles
from diffmoe.judge.runner import run_differential
from diffmoe.problem.config import MoEConfig
from diffmoe.problem.inputs import make_problem
from diffmoe.problem.vocabulary import Stages

RELEASES = ("sglang==0.5.23", "sglang==0.5.20")
QUANTS = ("bf16", "fp8-tensor", "fp8-token", "fp8-block")
NO_WORKSPACES = (torch.empty(0, dtype=torch.uint8), torch.empty(0, dtype=torch.uint8))


@pytest.fixture(scope="module", autouse=True)
def sglang_files():
    """Both pinned wheels' files in the peer cache: downloaded and verified on first use only."""
    for name in RELEASES:
        try:
            peer_wheels.fetch(name)
        except peer_wheels.PeerError as exc:
            pytest.skip(f"{name} is not in the peer cache and cannot be fetched ({exc}); run "
                        f"`{peer_wheels.fetch_command(name)}`")
    from peers.sglang.core import SglangFiles

    for name in RELEASES:  # the files loaded once here, not in the first test's time
        SglangFiles.get(name, True)


def factory(release: str = "sglang==0.5.23", fallback: bool = False):
    return load_factory(peer_factory_spec(release, "make_fallback" if fallback else "make"))


def config(**kw) -> MoEConfig:
    return MoEConfig(**{**dict(num_tokens=8, num_experts=4, topk=2, hidden=256, inter=256, quant="bf16", fused=False), **kw})


def test_the_aliases_and_the_factory_attributes():
    from diffmoe.judge.runner import factory_name

    assert factory_name(factory(fallback=True)) == "peers.sglang:make_fallback_0_5_23"  # replay lines name it
    assert IMPLEMENTATION_ALIASES["sglang"] == IMPLEMENTATION_ALIASES["sglang==0.5.23"] == "peers.sglang:make_0_5_23"
    assert IMPLEMENTATION_ALIASES["sglang==0.5.20"] == "peers.sglang:make_0_5_20"
    assert factory_numerics(factory()) == "sglang" and factory_numerics(factory(fallback=True)) == "sglang_fallback"
    assert factory_batch_invariant(factory()) is False  # the tile config follows the token count


CHECKS = [(r, q) for r in RELEASES for q in QUANTS]


@pytest.mark.parametrize("release, quant", CHECKS, ids=[f"{r}-{q}" for r, q in CHECKS])
def test_every_scheme_passes_every_default_oracle(release, quant):
    report = run_differential(config(quant=quant), factory(release))
    assert report.passed, report.render()


@pytest.mark.parametrize("changes", [dict(topk=1, quant="fp8-token"), dict(topk=3, num_tokens=5, quant="fp8-block",
                                                                          num_experts=6),
                                     dict(topk=3, num_tokens=40, quant="bf16", hidden=128, inter=128)],
                         ids=["k1", "k3", "k3-moe_sum_reduce"])
def test_other_top_k_paths_pass(changes):
    """K = 1 (the down GEMM stores the output), K = 3 at <= 32 tokens (the torch.sum SGLang
    compiles, run eagerly) and above (moe_sum_reduce)."""
    report = run_differential(config(**changes), factory())
    assert report.passed, report.render()


@pytest.mark.parametrize("quant", ["bf16", "fp8-block"])
def test_the_fallback_branch_passes_at_k2(quant):
    report = run_differential(config(quant=quant), factory(fallback=True))
    assert report.passed, report.render()


def test_the_fallbacks_top1_path_is_caught_at_the_reduce():
    """SGLang's non-CUDA combine runs moe_sum_reduce_triton over intermediate_cache3 at K = 1 too,
    though the down GEMM stored into the output and never wrote that cache: the output is
    overwritten with unwritten bytes (both releases)."""
    for release in RELEASES:
        report = run_differential(config(topk=1), factory(release, fallback=True), oracles=[Oracles.DIFFERENTIAL])
        assert not report.passed and report.findings[0].stage == Stages.REDUCE, report.render()


@pytest.mark.parametrize("release, topk", [("sglang==0.5.23", 1), ("sglang==0.5.23", 2), ("sglang==0.5.20", 2)])
def test_a_routed_scaling_factor_is_quiet_where_the_release_is_right(release, topk):
    """make_scaled: factor 2, the router weights halved; the scaling combine's result is the
    reference's bit for bit, and the down GEMM's store times the factor is the down_output."""
    import importlib

    scaled = load_factory(peer_factory_spec(release, "make_scaled"))
    assert scaled.__name__ == "make_scaled" and scaled(config()).routed_scaling_factor == 2.0
    report = run_differential(config(num_tokens=2, num_experts=2, topk=topk, hidden=64, inter=64), scaled)
    assert report.passed, report.render()


def test_a_routed_scaling_factor_at_top1_is_caught_in_0_5_20():
    """SGLang PR #40187: 0.5.20's down GEMM stores into the output at top-1, then the scaling
    combine sums the never-written intermediate_cache3 over it (NaN under every poison: the
    differential names it at the reduce, the call-sequence oracle sees the same bytes for other values)."""
    from peers.sglang import make_scaled_0_5_20 as make_scaled

    report = run_differential(config(num_tokens=2, num_experts=2, topk=1, hidden=64, inter=64), make_scaled)
    found = {(f.oracle, f.stage) for f in report.findings}
    assert {(Oracles.DIFFERENTIAL, Stages.REDUCE), (Oracles.CALL_SEQUENCE, Stages.REDUCE)} <= found, report.render()


def test_the_profile_makes_the_difference():
    """The group quant's scale amax * (1/448) and codes x * (448/amax) are SGLang's: under diffmoe's
    profile (amax / 448, x / scale) a code moves by one ulp at the down input's quant."""
    report = run_differential(config(quant="fp8-block", numerics="diffmoe"), factory(), oracles=[Oracles.DIFFERENTIAL])
    assert not report.passed and report.findings[0].stage == Stages.QUANT_DOWN_INPUT, report.render()


@pytest.mark.parametrize("quant, other, stage", [
    ("fp8-token", "reduce=fp32", Stages.REDUCE),  # torch.sum from +0 at K = 3: an all -0.0 column sums to +0.0
    ("fp8-block", "group_scale=min_amax_product", Stages.QUANT_INPUT),  # lmdeploy's 1e-6 floor, not SGLang's 1e-10
])
def test_the_zero_row_choices_are_sglangs(quant, other, stage):
    """An all-zero token (the false-alarm campaign's finds): under the sglang profile it passes; the
    neighbouring choice of that point is flagged at its stage."""
    c = config(quant=quant, num_tokens=3, topk=3, zero_rows=1)
    assert run_differential(c, factory(), oracles=[Oracles.DIFFERENTIAL]).passed
    report = run_differential(c.replace(numerics=f"sglang+{other}"), factory(), oracles=[Oracles.DIFFERENTIAL])
    assert not report.passed and report.findings[0].stage == stage, report.render()


def test_every_launch_is_reported_at_its_stage():
    c = config(quant="fp8-token")
    log = LaunchLog(snapshot=False)
    factory()(c).run(make_problem(c), NO_WORKSPACES, recorder=log, schedule=Schedule())
    assert [launch.stage for launch in log.launches] == [
        Stages.ALIGN, Stages.QUANT_INPUT, Stages.GATE_UP_GEMM, Stages.ACTIVATION, Stages.QUANT_DOWN_INPUT,
        Stages.DOWN_GEMM, Stages.REDUCE]
    assert [launch.kernel for launch in log.launches if "GEMM" in launch.stage.upper()] == ["fused_moe_kernel"] * 2


def test_a_planted_off_by_one_in_sglangs_file_is_caught(tmp_path, monkeypatch):
    """SGLang's own invoke_fused_moe_kernel, patched in a copy of the cache: the gate/up GEMM told
    one routed row fewer is valid (num_valid_tokens = topk_ids.numel() - 1), so the last sorted
    row reads as padding and its gate_up_output row is never computed."""
    source = peer_wheels.peer_root("sglang==0.5.23")
    copy = tmp_path / "cache" / source.name
    shutil.copytree(source, copy)
    kernels = copy / "sglang/kernels/ops/moe/fused_moe_triton_kernels.py"
    text = kernels.read_text()
    needle = ("            B.shape[2] - padded_size,\n            sorted_token_ids.shape[0],\n"
              "            topk_ids.numel(),\n")  # fused_moe_kernel's EM and num_valid_tokens
    assert text.count(needle) == 1
    kernels.write_text(text.replace(needle, needle.replace("topk_ids.numel(),", "topk_ids.numel() - 1,")))
    monkeypatch.setenv(peer_wheels.CACHE_ENV, str(tmp_path / "cache"))
    report = run_differential(config(), factory())
    assert not report.passed and Stages.GATE_UP_GEMM in {f.stage for f in report.findings}, report.render()


@pytest.mark.parametrize("fallback, changes, field", [
    (False, dict(fused=True, quant="fp8-block"), "fused"),
    (False, dict(router_weight="input", topk=1), "router_weight"),
    (False, dict(expert_map=(0, 1, -1, 2, 3), num_experts=5), "expert_map"),
    (False, dict(quant="fp8-block", hidden=128), "hidden must be other than 128"),
    (False, dict(output="workspace"), "output"),
    (True, dict(quant="fp8-token"), "quant"),
])
def test_refused_configs_name_the_field(fallback, changes, field):
    c = config(**changes)
    reason = unsupported(factory(fallback=fallback), c)
    assert reason is not None and reason.startswith(field), reason
    with pytest.raises(ValueError, match=f"^{field}"):
        factory(fallback=fallback)(c)


def test_without_the_cache_a_run_fails_with_one_line_naming_the_fetch(monkeypatch, tmp_path):
    monkeypatch.setenv(peer_wheels.CACHE_ENV, str(tmp_path / "empty"))
    with pytest.raises(peer_wheels.PeerError) as exc:
        factory()(config())
    assert "\n" not in str(exc.value) and "`diffmoe peers fetch sglang==0.5.23`" in str(exc.value)
