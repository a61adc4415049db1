"""The overflow watch (diffmoe/interpreter/wrap_watch.py) and the overflow oracle
(diffmoe/oracles/overflow.py).

Plain Triton kernels written here hold the watch's rules: an int32 product that wraps and reaches
a load or a store with its mask on is recorded with its line, its operands and both values; a
wrapped lane the mask turns off, a lane `tl.where` replaces, a wrap a later operation cancels and
an offset cast to int64 before the product are quiet; the mark survives a cast to int64 after the
product (the classic late fix), a division, broadcasting into 2-D tiles and a store. Then a whole
check: a reduce whose row offsets wrap is named by the oracle, in the judge's process and behind
the isolation boundary; the shipped kernel is quiet. Headroom: a 32-bit pointer offset of 2^26
elements (within 32x of 2^31) is recorded with its launch and line, and a check words it as a
warning that leaves the verdict alone; below the floor, or in 64 bits, nothing is said.

A real shape's wrap needs a tensor past 2^31 elements; here a planted multiplier (`ROW_PAD`)
takes the same int32 product past 2^31 at T = 2, the way `offs_token * stride_cm` passes it at
T = 100000, N = 2048, top-6 in vllm-project/vllm#34279.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before Triton is imported

import pytest
import torch
import triton
import triton.language as tl

from diffmoe.findings import Oracles
from diffmoe.judge.runner import run_differential
from diffmoe.interpreter import bounds_guard
from diffmoe.interpreter.bounds_guard import MemoryGuard, guard_for_call

SUPPORTED = guard_for_call({})[1]
pytestmark = pytest.mark.skipif(SUPPORTED is not None, reason=str(SUPPORTED))

STRIDE = 2**30  # row r's offset r * STRIDE wraps int32 from r = 2 on (and is 0 again at r = 4)


@triton.jit
def _gather_rows(x_ptr, o_ptr, stride, N: tl.constexpr, LIVE: tl.constexpr, WHERE: tl.constexpr,
                 CANCEL: tl.constexpr, WIDE_FIRST: tl.constexpr, WIDE_LATE: tl.constexpr):
    rows = tl.arange(0, N)
    if WIDE_FIRST:
        offs = rows.to(tl.int64) * stride
    elif CANCEL:
        offs = (rows * stride + rows) - rows * stride
    elif WIDE_LATE:
        offs = (rows * stride).to(tl.int64) // stride
    else:
        offs = rows * stride
    if WHERE:
        offs = tl.where(rows < 2, offs, 0)
    v = tl.load(x_ptr + offs, mask=rows < LIVE, other=0.0)
    tl.store(o_ptr + rows, v)


def _gather(live=8, where=False, cancel=False, wide_first=False, wide_late=False, stride=STRIDE):
    x, o = torch.arange(8, dtype=torch.float32), torch.zeros(8)
    with MemoryGuard({"x": x, "o": o}) as guard:
        _gather_rows[(1,)](x, o, stride, N=8, LIVE=live, WHERE=where, CANCEL=cancel, WIDE_FIRST=wide_first,
                           WIDE_LATE=wide_late)
    return guard


def test_a_wrapped_product_that_reaches_a_load_is_recorded_with_its_line_operands_and_values():
    guard = _gather(live=5)  # rows 2, 3, 4 live and wrapped; 4 * 2^30 wraps to 0: a load of row 0, in bounds
    [event] = guard.wraps
    assert (event.kernel, event.kind, event.lanes, event.programs) == ("_gather_rows", "load", 3, 1)
    w = event.wrap
    assert (w.op, w.dtype, w.function, w.code) == ("*", "int32", "_gather_rows", "offs = rows * stride")
    assert w.file == os.path.abspath(__file__)
    assert (w.lhs, w.rhs, w.exact, w.wrapped) == (2, STRIDE, 2**31, -(2**31))
    from diffmoe.oracles.overflow import overflow_finding  # here: the candidate's process imports this module

    finding = overflow_finding(event)
    assert finding.oracle == Oracles.OVERFLOW
    assert "2 * 1073741824 = 2147483648 does not fit int32 and became -2147483648" in finding.message
    assert "tests/oracles/test_overflow.py" in finding.message and "`offs = rows * stride`" in finding.message
    assert finding.figures["line"] == w.line and finding.figures["lanes"] == 3


def test_lanes_the_mask_turns_off_are_not_judged():
    assert _gather(live=2).wraps == []  # rows 0 and 1 fit; 2..7 wrap, masked off


def test_a_wrapped_lane_that_tl_where_replaces_is_quiet():
    guard = _gather(live=8, where=True)  # rows 2..7 live, their offsets replaced by 0
    assert guard.wraps == []
    assert [e.kind for e in guard.events] == ["load"]  # row 1's 2^30, past x's end: the bounds guard's


def test_a_wrap_a_later_operation_cancels_is_quiet():
    """(r * s + r) - r * s is r again in int32: the address is the exact one."""
    guard = _gather(cancel=True)
    assert guard.wraps == [] and guard.events == []


def test_an_operand_cast_to_int64_before_the_product_is_quiet():
    guard = _gather(wide_first=True, stride=1)
    assert guard.wraps == [] and guard.events == []


def test_a_cast_to_int64_after_the_product_still_carries_the_wrap():
    """The fix that comes too late: the product wrapped before the cast, and the division after
    it divides the wrapped value (rows 2 and 3 give -2 and -1: also refused by the bounds guard)."""
    guard = _gather(live=4, wide_late=True)
    [event] = guard.wraps
    assert event.wrap.code == "offs = (rows * stride).to(tl.int64) // stride" and event.lanes == 2
    assert len(guard.events) == 1  # the bounds guard refused the same two lanes


@triton.jit
def _tile_copy(x_ptr, o_ptr, stride, ROWS: tl.constexpr, COLS: tl.constexpr):
    """A 2-D tile: row offsets broadcast against columns, stored at the wrapped rows."""
    rows = tl.arange(0, ROWS)[:, None]
    cols = tl.arange(0, COLS)[None, :]
    v = tl.load(x_ptr + cols + rows * 0)
    tl.store(o_ptr + rows * stride + cols, v, mask=(rows == 4) & (cols < COLS))


def test_a_wrap_broadcast_into_a_tile_reaches_a_store():
    x, o = torch.arange(4, dtype=torch.float32), torch.zeros(4)
    with MemoryGuard({"x": x, "o": o}) as guard:
        _tile_copy[(1,)](x, o, STRIDE, ROWS=8, COLS=4)
    [event] = guard.wraps
    assert event.kind == "store" and event.lanes == 4 and event.wrap.code.startswith("tl.store(o_ptr + rows * stride")


def test_the_watch_is_undone_with_the_guard():
    from triton.runtime import interpreter

    from diffmoe.interpreter import wrap_watch

    before = {name: interpreter.InterpreterBuilder.__dict__[name] for name in wrap_watch.HOOKS}
    _gather(live=5)
    assert not bounds_guard.instrumentation_installed()
    assert {name: interpreter.InterpreterBuilder.__dict__[name] for name in wrap_watch.HOOKS} == before


# ---- a whole check ------------------------------------------------------------------------------
@triton.jit
def _padded_row_reduce_kernel(
    # Pointers
    down_ptr,  # [TK, H] bf16, row t*K + k
    out_ptr,  # [T, H] bf16
    # Dimensions
    T, H, TOPK,
    # Strides
    stride_dm, stride_om,
    # Meta-parameters
    ROW_PAD: tl.constexpr,
    FAR: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    """Grid: (1,); the one program sums the K rows of every token. Its row offsets are int32
    products scaled by ROW_PAD and scaled back: the scaled product passes 2^31 at token 1 (H=128,
    K=2, ROW_PAD=2^23), as the unscaled one does past 2^31 elements. The rows are read through a
    pointer moved FAR elements away and back by 32-bit offsets (correct at any FAR below 2^31)."""
    tokens = tl.arange(0, BLOCK_T)
    cols = tl.arange(0, BLOCK_H)
    mask = (tokens < T)[:, None] & (cols < H)[None, :]
    rows = (tokens * TOPK * (stride_dm * ROW_PAD)) // ROW_PAD
    far = down_ptr + FAR
    acc = tl.zeros((BLOCK_T, BLOCK_H), dtype=tl.float32)
    for k in range(0, TOPK):
        acc += tl.load(far + (rows[:, None] - FAR) + k * stride_dm + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + tokens[:, None] * stride_om + cols[None, :], acc.to(tl.bfloat16), mask=mask)


def _padded_reduce_factory(row_pad: int, far: int):
    from optimized.launch import launch
    from optimized.moe import TritonFP8MoE

    class PaddedRowReduce(TritonFP8MoE):
        """The shipped MoE with the reduce above (the module docstring)."""

        def _reduce(self, stage, ctx, down, out):
            (down_name, down_t), (out_name, out_t) = down, out
            t, h = out_t.shape
            launch(ctx, _padded_row_reduce_kernel, 1, stage=stage, reads={down_name: down_t}, writes={out_name: out_t},
                   down_ptr=down_t, out_ptr=out_t, T=t, H=h, TOPK=self.config.topk, stride_dm=down_t.stride(0),
                   stride_om=out_t.stride(0), ROW_PAD=row_pad, FAR=far, BLOCK_T=triton.next_power_of_2(t),
                   BLOCK_H=triton.next_power_of_2(h))

    return PaddedRowReduce


def padded_row_reduce(config, device="cpu"):
    """Row offsets that wrap (a factory the candidate's process can import: this test's folder is on its path under pytest)."""
    return _padded_reduce_factory(2**23, 0)(config, device)


def far_row_reduce(config, device="cpu"):
    """Row offsets that do not wrap, read through a pointer 2^26 elements away: 32x from 2^31."""
    return _padded_reduce_factory(1, 2**26)(config, device)


def _config(**fields):
    from diffmoe.problem.config import MoEConfig

    return MoEConfig(num_tokens=2, num_experts=2, topk=2, hidden=128, inter=128, quant="fp8-token", **fields)


@pytest.mark.parametrize("isolation", ["none", "process"])
def test_a_check_names_the_wrapped_reduce_by_kernel_and_line(isolation):
    report = run_differential(_config(), padded_row_reduce, oracles=[Oracles.OVERFLOW, Oracles.BOUNDS],
                              isolation=isolation)
    overflow = [f for f in report.findings if f.oracle == Oracles.OVERFLOW]
    assert overflow, report.render()
    first = overflow[0]
    assert first.stage == "reduce" and first.figures["kernel"] == "_padded_row_reduce_kernel"
    assert "rows = (tokens * TOPK * (stride_dm * ROW_PAD)) // ROW_PAD" in first.message
    assert first.figures["dtype"] == "int32" and first.figures["exact"] > 2**31 - 1
    assert not report.passed


def test_the_overflow_oracle_is_quiet_on_the_shipped_implementation():
    report = run_differential(_config(fused=True), oracles=[Oracles.OVERFLOW, Oracles.TEACHER_FORCING])
    assert report.passed, report.render()
    assert not report.warnings, report.warnings  # its row and expert offsets are 64-bit: no headroom to speak of


# ---- headroom: offsets near 2^31 that did not wrap -----------------------------------------------
@triton.jit
def _strided_rows(x_ptr, o_ptr, stride, N: tl.constexpr, WIDE: tl.constexpr):
    rows = tl.arange(0, N)
    if WIDE:
        offs = rows.to(tl.int64) * stride
    else:
        offs = rows * stride
    v = tl.load(x_ptr + offs)
    tl.store(o_ptr + rows, v)


def _strided(stride: int, wide: bool = False):
    x, o = torch.zeros(stride + 1, dtype=torch.int8), torch.zeros(2, dtype=torch.int8)  # untouched pages cost nothing
    with MemoryGuard({"x": x, "o": o}) as guard:
        _strided_rows[(1,)](x, o, stride, N=2, WIDE=wide)
    return guard


def test_a_32_bit_offset_near_2_31_is_recorded_with_its_launch_and_line():
    from diffmoe.interpreter.wrap_watch import HEADROOM_FLOOR

    guard = _strided(2**26)
    [near] = guard.headroom
    assert (near.kernel, near.peak, near.function, near.code) == ("_strided_rows", 2**26, "_strided_rows", "v = tl.load(x_ptr + offs)")
    assert near.file == os.path.abspath(__file__) and not guard.wraps and not guard.events
    assert not _strided(HEADROOM_FLOOR // 2).headroom  # below the floor: quiet
    assert not _strided(2**26, wide=True).headroom  # a 64-bit offset cannot wrap: quiet


@pytest.mark.parametrize("isolation", ["none", "process"])
def test_a_check_warns_of_an_offset_32x_from_wrapping_and_passes(isolation):
    report = run_differential(_config(), far_row_reduce, oracles=[Oracles.OVERFLOW, Oracles.BOUNDS, Oracles.DIFFERENTIAL],
                              isolation=isolation)
    assert report.passed, report.render()
    [warning] = report.warnings
    assert warning.startswith("_padded_row_reduce_kernel moves a pointer by a 32-bit offset of")
    assert "(reduce)" in warning and "32.0x that offset wraps int32" in warning and "from about T = 64 " in warning
    assert "tests/oracles/test_overflow.py" in warning
    assert f"warning:   {warning}" in report.render()
    from diffmoe.check.report import Report

    assert Report.from_json(report.to_json()).warnings == report.warnings
    quiet = run_differential(_config(), far_row_reduce, oracles=[Oracles.BOUNDS], isolation=isolation)
    assert not quiet.warnings and "warnings" not in quiet.to_dict()  # the overflow oracle not selected: no warning
