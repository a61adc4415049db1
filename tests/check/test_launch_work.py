"""Launches that must do their work (issue 43, item 3): under the interpreter, a launch reported as
a Triton kernel must store, from its Triton programs, the bytes of every view it declares it
writes (diffmoe/interpreter/store_coverage.py records them, the contract oracle judges them), and
bytes of those views that change during it with no store of it touching them are host writes.

The three hostile implementations (tests/support/hostile_kernels.py) PASS `diffmoe check` on commit
723a2d1, whose only check of a Triton launch was that it ran a Triton program; honest kernels stay
quiet (the shipped kernel here, the peers and the bug zoo's controls in their own files).
"""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from diffmoe.judge.runner import run_differential
from diffmoe.problem.config import MoEConfig
from diffmoe.problem.vocabulary import pipeline_stages
from hostile_kernels import RunsADoNothingKernel, StoresHalfItsViews, WritesItsViewsFromTheHost
from fresh_cli import _cli  # the CLI in a fresh process, tests/support/ importable

CONFIG = MoEConfig(num_tokens=4, num_experts=2, topk=2, hidden=128, inter=128, quant="fp8-token", fused=False)


def _contract(report, text: str) -> list:
    return [f for f in report.findings if f.oracle == "contract" and text in f.message]


def test_a_do_nothing_launch_is_a_contract_finding_per_stage():
    report = run_differential(CONFIG, RunsADoNothingKernel, isolation="process")
    found = _contract(report, "nowhere")
    assert found, report.render()
    assert {f.stage for f in found} == {s.name for s in pipeline_stages(CONFIG)}, report.render()
    gemm = next(f for f in found if f.figures["buffer"] == "gate_up_output")
    # every byte of the [T*K, 2I] bf16 view, named with its launch and kernel
    assert gemm.figures["unstored_bytes"] == gemm.figures["declared_bytes"] == 4 * 2 * 2 * 128 * 2
    assert gemm.figures["first_bytes"] == [0, 4096]
    assert "launch 1 (grouped_gemm_kernel, stage gate_up_gemm) is reported as a Triton kernel" in gemm.message


def test_a_kernel_storing_half_its_views_is_found_with_the_other_half():
    report = run_differential(CONFIG, StoresHalfItsViews, isolation="process")
    found = _contract(report, "nowhere")
    assert found and not _contract(report, "host code"), report.render()
    for f in found:
        declared = f.figures["declared_bytes"]
        assert f.figures["unstored_bytes"] == declared - declared // 2, f.message
        assert f.figures["first_bytes"] == [declared // 2, declared], f.message


def test_a_view_written_by_host_code_inside_the_launch_is_named():
    report = run_differential(CONFIG, WritesItsViewsFromTheHost, isolation="process")
    found = _contract(report, "written by host code during launch")
    assert found, report.render()
    assert {f.stage for f in found} == {s.name for s in pipeline_stages(CONFIG)}, report.render()
    assert all(f.figures["host_written_bytes"] > 0 for f in found)
    # one finding a view: its host write, not also its unchanged unstored bytes
    assert not [f for f in _contract(report, "nowhere") if (f.stage, f.buffers) in {(h.stage, h.buffers) for h in found}]


SHIPPED = [MoEConfig(num_tokens=5, num_experts=4, topk=2, hidden=128, inter=128, quant=q, fused=f)
           for q in ("fp8-token", "fp8-tensor", "fp8-block", "bf16") for f in ((False,) if q == "bf16" else (False, True))]
SHIPPED += [
    MoEConfig(num_tokens=5, num_experts=4, topk=2, hidden=128, inter=128, expert_map=(0, -1, 1, -1)),
    MoEConfig(num_tokens=5, num_experts=4, topk=2, hidden=128, inter=128, quant="fp8-block", fused=True,
              expert_map=(0, -1, 1, -1), call_tokens=2),
    MoEConfig(num_tokens=9, num_experts=8, topk=2, hidden=128, inter=128, skew="empty-experts", call_tokens=3),
    MoEConfig(num_tokens=5, num_experts=4, topk=2, hidden=128, inter=128, call_tokens=0),
]


@pytest.mark.parametrize("config", SHIPPED, ids=lambda c: c.short())
def test_the_shipped_kernel_stores_every_declared_byte(config):
    report = run_differential(config, oracles=("contract",))
    assert report.passed, report.render()


def test_every_triton_launch_of_the_shipped_kernel_is_watched():
    """The record the contract oracle judges exists: a watch that saw nothing would pass anything."""
    from diffmoe.check.execution import Check

    seen = []
    judge = Check.judge_run

    def spy(self, run, first):
        seen.extend((launch.triton, launch.unstored, launch.host_written) for launch in run.log if first)
        return judge(self, run, first)

    Check.judge_run = spy
    try:
        assert run_differential(CONFIG, oracles=("contract",)).passed
    finally:
        Check.judge_run = judge
    assert seen and all(triton and unstored == () and host == () for triton, unstored, host in seen), seen


@triton.jit
def _store_rows(dst_ptr, stride_row, stride_col, cols, ROWS: tl.constexpr, BLOCK: tl.constexpr):
    c = tl.arange(0, BLOCK)
    for r in tl.static_range(ROWS):
        tl.store(dst_ptr + r * stride_row + c * stride_col, c.to(tl.float32), mask=c < cols)


def test_a_strided_view_counts_its_own_elements_only():
    """A view with gaps between its elements declares its elements, not the gaps: stored whole it
    has nothing unstored; one row left out is that row's bytes."""
    from diffmoe.interpreter.store_coverage import StoreWatch, watch_problem

    if watch_problem() is not None:
        pytest.skip(watch_problem())
    base = torch.zeros(3, 8, dtype=torch.float32)
    view = base[:, ::2]  # [3, 4], every other column
    with StoreWatch() as watch:
        views = watch.begin({"v": view})
        _store_rows[(1,)](view, view.stride(0), view.stride(1), 4, ROWS=3, BLOCK=4)
        unstored, host = watch.end(views)
        assert unstored == () and host == ()
        views = watch.begin({"v": view})
        _store_rows[(1,)](view, view.stride(0), view.stride(1), 4, ROWS=2, BLOCK=4)
        view[2].fill_(7.0)  # host code inside the launch's window
        unstored, host = watch.end(views)
    assert unstored == ()
    assert len(host) == 1 and host[0].rows == (2,) and host[0].nbytes == 16 and host[0].declared == 48


def test_diffmoe_check_fails_a_do_nothing_launch():
    code, report, text = _cli("check", "--tokens", "4", "--experts", "2", "--topk", "2", "--hidden", "128", "--inter",
                              "128", "--quant", "fp8-token", "--impl", "hostile_kernels:RunsADoNothingKernel", "--json")
    assert code == 1 and report is not None, text
    assert any(f["oracle"] == "contract" and "unstored_bytes" in f["figures"] for f in report["findings"]), text


def test_diffmoe_fuzz_finds_a_do_nothing_launch():
    code, _, text = _cli("fuzz", "--impl", "hostile_kernels:RunsADoNothingKernel", "--seed", "0", "--max-examples", "5")
    assert code == 1 and "stored" in text and "nowhere" in text, text
