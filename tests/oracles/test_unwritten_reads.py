"""A read of bytes no launch of the call wrote is reported as exactly that (issue 28 item 5).

SGLang's non-CUDA top-1 path sums its never-written `intermediate_cache3`; the check used to say
"depends on workspace bytes" and "changes with the program order", though no workspace was
involved. Planted here in the shipped implementation: its reduce reads a tensor it allocated
itself and never wrote. The poison oracle must name the buffer, the stage and the bytes, and say
nothing about workspaces or program order; the same read of a tensor host code filled first
(a copy, as a torch stand-in op would) is quiet.
"""

from __future__ import annotations

import torch

from optimized.moe import TritonFP8MoE

from diffmoe.findings import Oracles
from diffmoe.judge.runner import run_differential
from diffmoe.problem.config import MoEConfig

CONFIG = MoEConfig(num_tokens=2, num_experts=2, topk=2, hidden=128, inter=128, quant="fp8-token", fused=True)


class ReduceReadsItsOwnUnwrittenBuffer(TritonFP8MoE):
    """The reduce sums a [TK, H] tensor the implementation allocated for it and no launch wrote
    (the down GEMM wrote down_output elsewhere)."""

    HOST_FILLED = False

    def _reduce(self, stage, ctx, down, out):
        down_name, down_t = down
        cache = torch.empty_like(down_t)
        if self.HOST_FILLED:
            cache.copy_(down_t)
        super()._reduce(stage, ctx, (down_name, cache), out)


class ReduceReadsItsOwnHostFilledBuffer(ReduceReadsItsOwnUnwrittenBuffer):
    HOST_FILLED = True


def test_a_read_of_a_buffer_no_launch_wrote_is_reported_as_exactly_that():
    report = run_differential(CONFIG, ReduceReadsItsOwnUnwrittenBuffer)
    poison = [f for f in report.findings if f.oracle == Oracles.POISON]
    assert len(poison) == 1, report.render()
    f = poison[0]
    tk_h_bytes = CONFIG.num_tokens * CONFIG.topk * CONFIG.hidden * 2
    assert f.stage == "reduce" and f.buffers == ["down_output"]
    assert f.message.startswith(f"reduce (moe_reduce_kernel, launch ")
    assert (f"reads {tk_h_bytes} bytes of down_output (allocated by the implementation, written by no launch) "
            "that no launch of this call wrote") in f.message
    assert f.figures["unwritten_bytes"] == tk_h_bytes
    # not as a dependence on workspaces or on the program order: the fill is the same in every run
    assert not any("workspace bytes" in g.message for g in report.findings)
    assert Oracles.SCHEDULE not in report.oracles_with_findings()


def test_the_same_read_of_a_buffer_host_code_filled_is_quiet():
    report = run_differential(CONFIG, ReduceReadsItsOwnHostFilledBuffer)
    assert report.passed, report.render()
