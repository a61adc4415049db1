"""diffmoe.interpreter.program_count: the Triton programs the interpreter ran, counted at the grid
loop, and the launch log's count per reported launch (the contract oracle judges a launch
reported as Triton that ran none: tests/isolation/test_exploits.py)."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from diffmoe.contract import LaunchInfo, Schedule
from diffmoe.check.recording import LaunchLog
from diffmoe.interpreter.grid_order import program_order
from diffmoe.interpreter.program_count import programs_run
from optimized.backend import interpreter_enabled

pytestmark = pytest.mark.skipif(not interpreter_enabled(), reason="counts at the Triton interpreter's grid loop")


@triton.jit
def _fill_kernel(out_ptr, NX: tl.constexpr):
    """Grid (NX, NY): each program writes its flattened id."""
    p = tl.program_id(0) + NX * tl.program_id(1)
    tl.store(out_ptr + p, p)


def test_every_program_of_a_launch_is_counted_in_any_order():
    out = torch.zeros(6, dtype=torch.int32)
    before = programs_run()
    _fill_kernel[(3, 2)](out, NX=3)
    assert programs_run() - before == 6
    with program_order(Schedule("reversed")):
        _fill_kernel[(3, 2)](out, NX=3)
    assert programs_run() - before == 12
    assert out.tolist() == list(range(6))


def test_the_launch_log_keeps_each_launch_s_programs_and_claim():
    out = torch.zeros(6, dtype=torch.int32)
    log = LaunchLog()
    kernel = LaunchInfo("reduce", "_fill_kernel", (3, 2), {}, {"output": out}, triton=True)
    log.before_launch(kernel)
    _fill_kernel[(3, 2)](out, NX=3)
    log.after_launch(kernel)
    torch_op = LaunchInfo("reduce", "torch fill", (1,), {}, {"output": out})
    log.before_launch(torch_op)
    out.fill_(0)
    log.after_launch(torch_op)
    first, second = log
    assert (first.triton, first.programs) == (True, 6)
    assert (second.triton, second.programs) == (False, 0)
