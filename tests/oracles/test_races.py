"""The interpreter race oracle on small hand-written kernels with known access patterns."""

from __future__ import annotations

import os

# The interpreter is chosen when a kernel is decorated, so this must precede the kernels below.
os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch
import triton
import triton.language as tl

from diffmoe.contract import LaunchInfo
from diffmoe.interpreter import address_recorder as races
from diffmoe.interpreter.address_recorder import RaceRecorder, instrumentation_installed, races_supported
from diffmoe.findings import ByteRange, Oracles

SUPPORTED, WHY = races_supported()
needs_interpreter = pytest.mark.skipif(not SUPPORTED, reason=WHY)


# ---------------------------------------------------------------------------------------------
# Kernels


@triton.jit
def scale_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    """Clean elementwise: one block per program."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=m) * 2.0, mask=m)


@triton.jit
def shift_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    """out[i + 1] = x[i]: the last element a program stores is the first the next one loads
    when out aliases x."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    v = tl.load(x_ptr + offs, mask=offs < n)
    tl.store(out_ptr + offs + 1, v, mask=offs + 1 < n)


@triton.jit
def same_block_kernel(out_ptr, BLOCK: tl.constexpr):
    """Every program stores the same block, with its own id."""
    offs = tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.zeros((BLOCK,), tl.int32) + tl.program_id(0))


@triton.jit
def same_value_kernel(out_ptr, VALUE: tl.constexpr, BLOCK: tl.constexpr):
    """Every program stores the same block with the same value."""
    offs = tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.zeros((BLOCK,), tl.int32) + VALUE)


@triton.jit
def store_then_load_kernel(out_ptr, copy_ptr, BLOCK: tl.constexpr):
    """Each program stores its block, reads it back, copies it elsewhere."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, offs.to(tl.float32))
    tl.store(copy_ptr + offs, tl.load(out_ptr + offs) + 1.0)


@triton.jit
def wide_masked_kernel(x_ptr, out_ptr, LIVE: tl.constexpr, BLOCK: tl.constexpr):
    """Each program's pointer block is BLOCK wide (twice its share, overlapping the next
    program's), but only the first LIVE lanes are enabled."""
    offs = tl.program_id(0) * (BLOCK // 2) + tl.arange(0, BLOCK)
    m = tl.arange(0, BLOCK) < LIVE
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=m) + 1.0, mask=m)


@triton.jit
def act_quant_kernel(x_ptr, y_ptr, C: tl.constexpr, BLOCK_M: tl.constexpr):
    """A fused activation + quant shape: reads rows [BLOCK_M, 2C] of x (fp16), writes rows
    [BLOCK_M, C] of y (uint8 codes). With x and y views at offset 0 of one workspace, program
    p's y rows lie inside x rows of a lower program."""
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, C)
    gate = tl.load(x_ptr + rows[:, None] * (2 * C) + cols[None, :]).to(tl.float32)
    up = tl.load(x_ptr + rows[:, None] * (2 * C) + C + cols[None, :]).to(tl.float32)
    codes = (gate * up).to(tl.int32) & 0x7F
    tl.store(y_ptr + rows[:, None] * C + cols[None, :], codes.to(tl.uint8))


@triton.jit
def grid2d_kernel(out_ptr, EXTRA: tl.constexpr):
    """Program (x, y) stores out[x + 2y]; program (1, 1) also stores out[1], owned by (1, 0)."""
    px = tl.program_id(0)
    py = tl.program_id(1)
    tl.store(out_ptr + px + 2 * py, px + 10 * py)
    if EXTRA:
        if px == 1 and py == 1:
            tl.store(out_ptr + 1, 99)


@triton.jit
def atomic_count_kernel(counter_ptr, peek_ptr, PEEK: tl.constexpr):
    """All programs add to one counter; with PEEK, program 1 also reads it with a plain load."""
    tl.atomic_add(counter_ptr, 1)
    if PEEK:
        if tl.program_id(0) == 1:
            tl.store(peek_ptr, tl.load(counter_ptr))


def _launch(rec, stage, kernel, grid, reads, writes, *args, **meta):
    """Launch as an implementation does: announce, run, close."""
    info = LaunchInfo(stage=stage, kernel=kernel.__name__, grid=grid, reads=reads, writes=writes)
    rec.before_launch(info)
    kernel[grid](*args, **meta)
    rec.after_launch(info)


# ---------------------------------------------------------------------------------------------
# Tests


@needs_interpreter
def test_clean_elementwise_kernel_has_no_findings():
    x = torch.randn(200)
    out = torch.empty_like(x)
    with RaceRecorder() as rec:
        _launch(rec, "scale", scale_kernel, (4,), {"x": x}, {"out": out}, x, out, 200, BLOCK=64)
    assert rec.findings() == []
    assert torch.equal(out, x * 2)
    (run,) = rec.runs
    assert (run.kernel, run.stage, run.launch, run.programs) == ("scale_kernel", "scale", 0, 4)
    assert run.bytes_read == run.bytes_written == 200 * 4
    assert run.conflicting_bytes == 0


@needs_interpreter
def test_in_place_shift_is_a_read_write_race_between_neighbours():
    x = torch.arange(256, dtype=torch.float32)
    with RaceRecorder() as rec:
        _launch(rec, "shift", shift_kernel, (4,), {"x": x}, {"out": x}, x, x, 256, BLOCK=64)
    (f,) = rec.findings()
    assert f.oracle == Oracles.RACES
    assert f.stage == "shift"
    assert f.buffers == ["out", "x"]
    # Program 0 stores element 64, which program 1 loads; the first conflicting span.
    assert f.byte_ranges == [ByteRange("out", 256, 260), ByteRange("x", 256, 260)]
    assert f.figures["kernel"] == "shift_kernel"
    assert (f.figures["writer_program"], f.figures["other_program"]) == (0, 1)
    assert f.figures["conflicting_bytes"] == 3 * 4  # one element at each of 3 block boundaries
    assert f.figures["kind"] == "write-read"
    assert "program 0" in f.message and "program 1" in f.message


@needs_interpreter
def test_same_shift_into_a_separate_buffer_is_clean():
    x = torch.arange(256, dtype=torch.float32)
    out = torch.zeros_like(x)
    with RaceRecorder() as rec:
        _launch(rec, "shift", shift_kernel, (4,), {"x": x}, {"out": out}, x, out, 256, BLOCK=64)
    assert rec.findings() == []


@needs_interpreter
def test_two_programs_storing_the_same_bytes_is_a_write_write_race():
    out = torch.zeros(32, dtype=torch.int32)
    with RaceRecorder() as rec:
        _launch(rec, "fill", same_block_kernel, (3,), {}, {"out": out}, out, BLOCK=32)
    (f,) = rec.findings()
    assert f.buffers == ["out", "out"]
    assert f.byte_ranges == [ByteRange("out", 0, 128)]
    assert (f.figures["writer_program"], f.figures["other_program"]) == (0, 1)
    assert f.figures["conflicting_bytes"] == 128
    assert f.figures["kind"] == "write-write"


@needs_interpreter
def test_a_write_write_race_of_different_bytes_says_the_result_depends_on_the_order():
    out = torch.zeros(32, dtype=torch.int32)
    with RaceRecorder() as rec:  # program 0 stores 0 over zeros (no change), 1 and 2 store 1 and 2
        _launch(rec, "fill", same_block_kernel, (3,), {}, {"out": out}, out, BLOCK=32)
    (f,) = rec.findings()
    assert f.figures["identical_bytes"] is False
    assert f.message.endswith("so the result depends on the order the programs run in")
    out = torch.zeros(32, dtype=torch.int32)
    with RaceRecorder() as rec:  # only the second program changes the bytes: still different bytes
        _launch(rec, "fill", same_block_kernel, (2,), {}, {"out": out}, out, BLOCK=32)
    (f,) = rec.findings()
    assert f.figures["identical_bytes"] is False and "identical" not in f.message


@needs_interpreter
@pytest.mark.parametrize("before", [0, 7])
def test_a_write_write_race_of_identical_bytes_says_they_were_identical_this_time(before):
    """Issue 48 item 4: programs storing identical bytes race, but this run's result does not
    depend on their order; the finding says so (whether or not the first store changed the bytes)."""
    out = torch.full((32,), before, dtype=torch.int32)
    with RaceRecorder() as rec:
        _launch(rec, "fill", same_value_kernel, (3,), {}, {"out": out}, out, VALUE=7, BLOCK=32)
    (f,) = rec.findings()
    assert f.figures["kind"] == "write-write" and f.figures["identical_bytes"] is True
    assert "stored identical bytes there this time" in f.message
    assert "does not depend on the order" in f.message


@needs_interpreter
def test_a_program_reading_its_own_stores_is_not_a_race():
    out = torch.zeros(256)
    copy = torch.zeros(256)
    with RaceRecorder() as rec:
        _launch(rec, "own", store_then_load_kernel, (4,), {"out": out}, {"out": out, "copy": copy}, out, copy, BLOCK=64)
    assert rec.findings() == []
    assert torch.equal(copy, torch.arange(256, dtype=torch.float32) + 1)


@needs_interpreter
def test_masked_off_lanes_are_not_counted():
    x = torch.zeros(64 * 5)
    out = torch.zeros(64 * 5)
    with RaceRecorder() as rec:
        # Pointer blocks overlap the next program's by 64 elements, but those lanes are masked.
        _launch(rec, "masked", wide_masked_kernel, (4,), {"x": x}, {"out": out}, x, out, LIVE=64, BLOCK=128)
    assert rec.findings() == []
    assert rec.runs[0].bytes_written == 4 * 64 * 4
    with RaceRecorder() as rec:
        # Control: the same kernel with every lane live does overlap.
        _launch(rec, "masked", wide_masked_kernel, (4,), {"x": x}, {"out": out}, x, out, LIVE=128, BLOCK=128)
    (f,) = rec.findings()  # x and out are separate: only the stores collide
    assert f.buffers == ["out", "out"]
    assert f.figures["conflicting_bytes"] == 3 * 64 * 4


def _alias_views(rows, cols, shared):
    """x [rows, 2*cols] fp16 and y [rows, cols] uint8, views at offset 0 of one uint8 workspace
    when `shared`, as a workspace planner carves them; separate workspaces otherwise."""
    x_bytes, y_bytes = rows * 2 * cols * 2, rows * cols
    ws = torch.zeros(max(x_bytes, y_bytes), dtype=torch.uint8)
    ws2 = ws if shared else torch.zeros(y_bytes, dtype=torch.uint8)
    x = ws[:x_bytes].view(torch.float16).view(rows, 2 * cols)
    y = ws2[:y_bytes].view(rows, cols)
    x.copy_(torch.randint(0, 4, (rows, 2 * cols)).to(torch.float16))
    return x, y


@needs_interpreter
def test_workspace_alias_between_read_and_written_views_is_flagged():
    rows, cols, block_m = 64, 32, 16
    x, y = _alias_views(rows, cols, shared=True)
    with RaceRecorder() as rec:
        _launch(
            rec,
            "act_quant",
            act_quant_kernel,
            (rows // block_m,),
            {"gate_up_output": x},
            {"quanted_down_input": y},
            x,
            y,
            C=cols,
            BLOCK_M=block_m,
        )
    (f,) = rec.findings()
    assert f.stage == "act_quant"
    assert f.buffers == ["quanted_down_input", "gate_up_output"]
    # y rows of program 1 start at byte 16*32 = 512, inside x rows 0..15 that program 0 reads.
    assert f.byte_ranges[0].region == "quanted_down_input" and f.byte_ranges[1].region == "gate_up_output"
    assert f.byte_ranges[0].start == f.byte_ranges[1].start == block_m * cols
    assert (f.figures["writer_program"], f.figures["other_program"]) == (1, 0)
    # Programs 1..3 write y bytes [512, 2048) which all lie in x rows of program 0 ([0, 2048)).
    assert f.figures["conflicting_bytes"] == (rows - block_m) * cols


@needs_interpreter
def test_workspace_views_in_separate_workspaces_are_clean():
    rows, cols, block_m = 64, 32, 16
    x, y = _alias_views(rows, cols, shared=False)
    with RaceRecorder() as rec:
        _launch(rec, "act_quant", act_quant_kernel, (4,), {"gate_up_output": x}, {"quanted_down_input": y}, x, y, C=cols, BLOCK_M=block_m)
    assert rec.findings() == []


@needs_interpreter
def test_unannounced_launch_is_checked_and_names_the_argument_not_the_address():
    x = torch.arange(128, dtype=torch.float32)
    with RaceRecorder() as rec:
        shift_kernel[(2,)](x, x, 128, BLOCK=64)
    (f,) = rec.findings()
    assert f.stage is None
    assert f.figures["launch"] == "unannounced"
    # issue 28: a tensor no launch declared is named by the argument that received it, never "0x..."
    name = "the buffer argument `x_ptr, out_ptr` of an unannounced launch of shift_kernel"
    assert f.buffers == [name] * 2
    assert f.byte_ranges == [ByteRange(name, 256, 260)]
    assert "0x" not in f.message
    # Both arguments pass the same view, so the bytes are named after both.
    assert f.figures["written_kernel_arg"] == f.figures["other_kernel_arg"] == "x_ptr, out_ptr"


@needs_interpreter
def test_an_undeclared_tensor_is_named_after_the_announced_launch_that_first_received_it():
    # issue 28: "the buffer argument `C` of launch 3 (stage down_gemm)", never an address
    x = torch.arange(128, dtype=torch.float32)
    y = torch.zeros(128, dtype=torch.float32)
    with RaceRecorder() as rec:
        _launch(rec, "quant_input", shift_kernel, (2,), {}, {}, y, y, 128, BLOCK=64)  # y: first received here
        _launch(rec, "reduce", shift_kernel, (2,), {}, {}, x, y, 128, BLOCK=64)
        _launch(rec, "reduce", shift_kernel, (2,), {}, {}, y, y, 128, BLOCK=64)
    findings = rec.findings()
    assert [f.buffers[0] for f in findings] == ["the buffer argument `x_ptr, out_ptr` of launch 0 (stage quant_input)"] * 2
    assert all("0x" not in f.message for f in findings)


@needs_interpreter
def test_program_id_is_the_flattened_grid_index():
    out = torch.zeros(4, dtype=torch.int32)
    with RaceRecorder() as rec:
        _launch(rec, "grid", grid2d_kernel, (2, 2), {}, {"out": out}, out, EXTRA=False)
        _launch(rec, "grid", grid2d_kernel, (2, 2), {}, {"out": out}, out, EXTRA=True)
    (f,) = rec.findings()
    assert f.figures["launch"] == 1
    # (x=1, y=0) is program 1 and (x=1, y=1) is program 1 + 1*2 = 3.
    assert (f.figures["writer_program"], f.figures["other_program"]) == (1, 3)
    assert f.byte_ranges == [ByteRange("out", 4, 8)]


@needs_interpreter
def test_atomics_among_programs_are_not_races_but_a_plain_load_of_them_is():
    counter = torch.zeros(1, dtype=torch.int32)
    peek = torch.zeros(1, dtype=torch.int32)
    with RaceRecorder() as rec:
        _launch(rec, "count", atomic_count_kernel, (4,), {}, {"counter": counter}, counter, peek, PEEK=False)
    assert rec.findings() == []
    assert int(counter) == 4
    with RaceRecorder() as rec:
        _launch(rec, "count", atomic_count_kernel, (4,), {"counter": counter}, {"counter": counter, "peek": peek}, counter, peek, PEEK=True)
    (f,) = rec.findings()
    assert f.buffers == ["counter", "counter"]
    assert f.figures["kind"] == "write-read"
    assert f.figures["writer_program"] != f.figures["other_program"] == 1


@needs_interpreter
def test_sequential_kernels_inside_one_announced_launch_are_not_races():
    """A producer kernel then a consumer kernel reported as one launch are ordered."""
    x = torch.randn(128)
    tmp = torch.empty(128)
    info = LaunchInfo(stage="two", kernel="scale_kernel", grid=(2,), reads={"x": x}, writes={"tmp": tmp})
    with RaceRecorder() as rec:
        rec.before_launch(info)
        scale_kernel[(2,)](x, tmp, 128, BLOCK=64)
        shift_kernel[(2,)](tmp, x, 128, BLOCK=64)  # reads tmp block p, writes x shifted by one
        rec.after_launch(info)
    assert [r.launch for r in rec.runs] == [0, 0]
    # The second kernel's shift writes x element 64 (program 0) that program 0 of the first
    # kernel read: ordered, no race. Within the second kernel x is only written.
    assert rec.findings() == []


@needs_interpreter
def test_instrumentation_is_removed_after_the_context_exits():
    from triton.runtime import interpreter

    original = interpreter.InterpreterBuilder.__dict__["create_masked_load"]
    x = torch.arange(128, dtype=torch.float32)
    rec = RaceRecorder()
    with rec:
        assert instrumentation_installed()
        assert interpreter.InterpreterBuilder.__dict__["create_masked_load"] is not original
        scale_kernel[(2,)](x, torch.empty_like(x), 128, BLOCK=64)
    assert not instrumentation_installed()
    assert interpreter.InterpreterBuilder.__dict__["create_masked_load"] is original
    shift_kernel[(2,)](x, x, 128, BLOCK=64)  # racy, but launched after the context
    assert len(rec.runs) == 1
    assert rec.findings() == []


@needs_interpreter
def test_recorders_nest_and_reenter():
    x = torch.arange(128, dtype=torch.float32)
    outer, inner = RaceRecorder(), RaceRecorder()
    with outer:
        with inner:
            with inner:  # re-entering keeps the hooks until the outermost exit
                pass
            assert instrumentation_installed()
            shift_kernel[(2,)](x, x, 128, BLOCK=64)
        assert instrumentation_installed()
        shift_kernel[(2,)](x, x, 128, BLOCK=64)
    assert not instrumentation_installed()
    assert len(inner.findings()) == 1
    assert len(outer.findings()) == 2


def test_unsupported_triton_version_is_refused(monkeypatch):
    monkeypatch.setattr(triton, "__version__", "3.10.0")
    ok, why = races_supported()
    assert not ok
    assert why == "interpreter race recording supports triton 3.9.x, found 3.10.0"
    with pytest.raises(RuntimeError, match=r"supports triton 3\.9\.x, found 3\.10\.0"):
        with RaceRecorder():
            pass
    assert not instrumentation_installed()


def test_missing_interpreter_is_refused(monkeypatch):
    monkeypatch.setattr(triton, "__version__", "3.9.0")
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    ok, why = races_supported()
    assert not ok and "TRITON_INTERPRET=1" in why
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        RaceRecorder().__enter__()
    assert not instrumentation_installed()


def test_hooked_names_are_listed_for_the_version_pin():
    assert races.SUPPORTED_TRITON == (3, 9)
    assert "create_masked_load" in races.HOOKED_BUILDER_METHODS
    assert "create_masked_store" in races.HOOKED_BUILDER_METHODS


@needs_interpreter
def test_a_failing_launch_still_removes_the_hooks():
    x = torch.arange(64, dtype=torch.float32)
    with pytest.raises(Exception):
        with RaceRecorder() as rec:
            scale_kernel[(1,)](x, x, BLOCK=64)  # n is missing
    assert not instrumentation_installed()
    assert rec.findings() == []


def test_a_program_seen_twice_still_counts_once():
    """The sweep counts programs per byte; a program whose accesses arrive in two pieces must
    not look like two programs."""
    import numpy as np

    run = races._Run(0, "k", (), None)
    grid = (2, 1, 1)
    block = (np.array([0], dtype=np.int64), np.array([64], dtype=np.int64))
    run.add(races._WRITE, 0, grid, *block)
    run.add(races._READ, 1, grid, np.array([64], dtype=np.int64), np.array([128], dtype=np.int64))
    run.add(races._READ, 0, grid, *block)  # program 0 again, reading its own bytes
    summary, conflicts = races._analyse(run)
    assert conflicts == [] and summary.programs == 2
    run = races._Run(1, "k", (), None)
    run.add(races._WRITE, 0, grid, *block)
    run.add(races._READ, 1, grid, *block)
    run.add(races._READ, 0, grid, *block)
    summary, (c,) = races._analyse(run)
    assert (c.writer, c.other_program, c.nbytes) == (0, 1, 64)


# ---------------------------------------------------------------------------------------------
# Store extent: the same addresses, judged against the views a launch declared it writes


@needs_interpreter
def test_stores_inside_the_declared_views_have_no_store_extent_finding():
    x = torch.randn(200)
    out = torch.empty_like(x)
    with RaceRecorder() as rec:
        _launch(rec, "scale", scale_kernel, (4,), {"x": x}, {"out": out}, x, out, 200, BLOCK=64)
    assert rec.store_extent_findings() == []


@needs_interpreter
def test_a_store_past_the_declared_view_is_named_in_the_workspace():
    """out is declared as the first 199 elements of a workspace; the kernel stores 200."""
    ws = torch.zeros(256, dtype=torch.float32)
    x = torch.randn(200)
    declared = ws[:199]
    with RaceRecorder({"ws1": ws}) as rec:
        _launch(rec, "scale", scale_kernel, (4,), {"x": x}, {"out": declared}, x, ws, 200, BLOCK=64)
    assert rec.findings() == []  # no two programs meet: not a race
    (f,) = rec.store_extent_findings()
    assert f.oracle == Oracles.STORE_EXTENT and f.stage == "scale" and f.buffers == ["ws1"]
    assert f.byte_ranges == [ByteRange("ws1", 199 * 4, 200 * 4)]
    assert f.figures["stray_bytes"] == 4 and f.figures["declared_writes"] == ["out"]
    assert "scale_kernel stores 4 bytes outside the views it declared it writes (out)" in f.message


@needs_interpreter
def test_a_store_into_a_declared_read_view_is_named_by_that_view():
    x = torch.arange(256, dtype=torch.float32)
    with RaceRecorder() as rec:
        # in place but declared as writing nothing: every store lands in the read view x
        _launch(rec, "shift", shift_kernel, (4,), {"x": x}, {}, x, x, 256, BLOCK=64)
    (f,) = rec.store_extent_findings()
    assert f.buffers == ["x"] and f.byte_ranges == [ByteRange("x", 4, 256 * 4)]
    assert f.figures["stray_bytes"] == 255 * 4


@needs_interpreter
def test_atomic_stores_count_and_unannounced_launches_are_not_judged():
    counter = torch.zeros(1, dtype=torch.int32)
    peek = torch.zeros(4, dtype=torch.int32)
    with RaceRecorder() as rec:
        _launch(rec, "count", atomic_count_kernel, (4,), {}, {"peek": peek}, counter, peek, PEEK=False)
        atomic_count_kernel[(4,)](counter, peek, PEEK=False)  # no LaunchInfo: nothing declared to judge
    (f,) = rec.store_extent_findings()
    assert f.stage == "count" and f.figures["stray_bytes"] == 4  # the counter, written atomically
