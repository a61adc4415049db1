"""The 30-line adapter of SGLang 0.5.23 in examples/sglang_adapter.py (the adapter kit's automatic
launch attribution, docs/plugging-in.md): at most 30 lines; every scheme SGLang's Triton path has
passes every default oracle on unmodified SGLang; each launch is judged at its own stage, so a bug
planted in a copy of SGLang's file is named at the stage it is in, not only at the output."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from diffmoe.adapters import peer_wheels
from diffmoe.contract import Schedule
from diffmoe.check.recording import LaunchLog
from diffmoe.findings import Oracles
from diffmoe.judge.runner import load_factory, run_differential
from diffmoe.problem.config import MoEConfig
from diffmoe.problem.inputs import make_problem
from diffmoe.problem.vocabulary import Stages

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "sglang_adapter.py"
SPEC = f"{EXAMPLE}:make"


@pytest.fixture(scope="module", autouse=True)
def sglang_wheel():
    try:
        peer_wheels.fetch("sglang==0.5.23")
    except peer_wheels.PeerError as exc:
        pytest.skip(f"{exc}")


def config(**kw) -> MoEConfig:
    return MoEConfig(**{**dict(num_tokens=4, num_experts=4, topk=2, hidden=256, inter=256, quant="bf16", fused=False), **kw})


def test_the_adapter_is_at_most_30_lines():
    assert len(EXAMPLE.read_text().splitlines()) <= 30


@pytest.mark.parametrize("quant", ["bf16", "fp8-tensor", "fp8-token", "fp8-block"])
def test_every_scheme_passes_every_default_oracle(quant):
    report = run_differential(config(quant=quant), load_factory(SPEC))
    assert report.passed, report.render()


def test_each_launch_is_attributed_to_its_stage():
    c = config(quant="fp8-token")
    log = LaunchLog(snapshot=False)
    empty = torch.empty(0, dtype=torch.uint8)
    load_factory(SPEC)(c).run(make_problem(c), (empty, empty), recorder=log, schedule=Schedule())
    assert [launch.stage for launch in log.launches] == [
        Stages.ALIGN, Stages.QUANT_INPUT, Stages.GATE_UP_GEMM, Stages.ACTIVATION, Stages.QUANT_DOWN_INPUT,
        Stages.DOWN_GEMM, Stages.REDUCE]
    assert [launch.triton for launch in log.launches].count(True) == 2  # the two fused_moe_kernel launches


def test_the_refusals_name_the_field():
    make = load_factory(SPEC)
    assert make.supports(config(quant="fp8-block", hidden=128)).startswith("hidden and inter")
    assert make.supports(config(quant="fp8-token", weight_scales="tensor")).startswith("weight_scales")
    assert make.supports(config(quant="fp8-block", fused=True)).startswith("fused")


def test_a_bug_in_sglangs_gate_up_gemm_is_named_at_that_stage(tmp_path, monkeypatch):
    """A copy of the cache whose invoke_fused_moe_kernel tells the gate/up GEMM one routed row fewer is
    valid: output-only judging would see the reduce; attributed, the gate/up GEMM is named."""
    source = peer_wheels.peer_root("sglang==0.5.23")
    copy = tmp_path / "cache" / source.name
    shutil.copytree(source, copy)
    kernels = copy / "sglang/kernels/ops/moe/fused_moe_triton_kernels.py"
    needle = ("            B.shape[2] - padded_size,\n            sorted_token_ids.shape[0],\n"
              "            topk_ids.numel(),\n")  # fused_moe_kernel's EM and num_valid_tokens
    text = kernels.read_text()
    assert text.count(needle) == 1
    kernels.write_text(text.replace(needle, needle.replace("topk_ids.numel(),", "topk_ids.numel() - 1,")))
    monkeypatch.setenv(peer_wheels.CACHE_ENV, str(tmp_path / "cache"))
    make = load_factory(SPEC)
    files = _example_files()
    files.cache_clear()
    try:
        report = run_differential(config(), make, oracles=[Oracles.DIFFERENTIAL])
    finally:
        files.cache_clear()  # the next test loads the unmodified files
    assert not report.passed and report.findings[0].stage == Stages.GATE_UP_GEMM, report.render()


def _example_files():
    """The example module's cached loader (loaded by path: diffmoe.adapters.loading)."""
    import sys

    return next(m.files for m in list(sys.modules.values())
                if getattr(m, "__file__", None) == str(EXAMPLE) and hasattr(m, "files"))


def test_the_readme_counts_it_and_the_docs_show_the_self_allocating_helpers():
    """The README's own-kernel section used to show only the carve-from-workspaces case, the helpers for a
    kernel that allocates its own buffers known only from docstrings (issue 28)."""
    root = EXAMPLE.parents[1]
    lines = len(EXAMPLE.read_text().splitlines())
    assert f"in **{lines} lines**" in (root / "README.md").read_text()
    page = (root / "docs" / "plugging-in.md").read_text()
    assert f"**{lines} lines**" in page
    for name in ("SelfAllocatingPeer", "fresh_allocations_plan", "kit.ReportingKernel", "kit.launch_grid",
                 "kit.Attribution", "examples/sglang_adapter.py"):
        assert name in page, name
