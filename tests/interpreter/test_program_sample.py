"""A chosen few of each launch's programs (diffmoe/interpreter/program_sample.py), on plain Triton
kernels written here.

What is held: only the chosen programs run (their stores and no others), `tl.num_programs` reads the
real grid and `tl.program_id` the real program; every corner of a 1-, 2- and 3-D grid and the ends of
its flattened numbering are chosen, the rest drawn from the seed (same seed, same programs; another
seed, others); a small launch runs whole; a schedule orders the chosen programs; the interpreter is
put back after. And what it is for: an int32 row offset that wraps past 2^31 elements in a launch of
655,360 programs over a 2.5 Gi-element buffer, committed lazily, is found by the overflow watch in the
last programs, in a fraction of a second and without the buffer's pages becoming resident.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before Triton is imported

import pytest
import torch
import triton
import triton.language as tl

from diffmoe.contract import Schedule
from diffmoe.interpreter import grid_order
from diffmoe.interpreter.bounds_guard import MemoryGuard, guard_for_call
from diffmoe.interpreter.grid_order import program_order
from diffmoe.interpreter.program_sample import FULL_BELOW, ProgramSample, sampled_programs

SUPPORTED, WHY = grid_order.status()
pytestmark = pytest.mark.skipif(not SUPPORTED, reason=WHY)


@triton.jit
def _linear_id():
    return tl.program_id(0) + tl.num_programs(0) * (tl.program_id(1) + tl.num_programs(1) * tl.program_id(2))


@triton.jit
def _mark(out_ptr, total_ptr):
    """Program p writes p + 1 at p, and the grid's size it reads from tl.num_programs."""
    p = _linear_id()
    tl.store(out_ptr + p, p + 1)
    tl.store(total_ptr, tl.num_programs(0) * tl.num_programs(1) * tl.num_programs(2))


@triton.jit
def _run_order(counter_ptr, seen_ptr):
    slot = tl.atomic_add(counter_ptr, 1)
    tl.store(seen_ptr + slot, _linear_id())


def _marked(grid, sample):
    total = grid[0] * (grid[1] if len(grid) > 1 else 1) * (grid[2] if len(grid) > 2 else 1)
    out, seen_total = torch.zeros(total, dtype=torch.int32), torch.zeros(1, dtype=torch.int32)
    with sampled_programs(sample) as run:
        _mark[grid](out, seen_total)
    ran = (out.nonzero().flatten()).tolist()
    return run, ran, int(seen_total.item()), out


@pytest.mark.parametrize("grid", [(100_000,), (1000, 300), (40, 30, 20)])
def test_only_the_chosen_programs_run_and_each_reads_the_real_grid(grid):
    run, ran, seen_total, out = _marked(grid, ProgramSample(seed=1))
    [launch] = run.launches
    assert launch.kernel == "_mark" and launch.grid == (tuple(grid) + (1, 1))[:3]
    assert ran == list(launch.programs) and seen_total == launch.total
    assert all(out[p].item() == p + 1 for p in ran)  # program p computed what program p computes
    nx, ny, nz = launch.grid
    corners = {x + nx * (y + ny * z) for x in (0, nx - 1) for y in (0, ny - 1) for z in (0, nz - 1)}
    assert corners | {0, 1, launch.total - 2, launch.total - 1} <= set(ran)
    assert len(ran) == len(corners | {0, 1, launch.total - 2, launch.total - 1}) + ProgramSample().seeded
    assert "programs ran over 1 launches (1 sampled, seed 1)" in run.summary()


def test_the_same_seed_runs_the_same_programs_and_another_seed_others():
    first = _marked((100_000,), ProgramSample(seed=4))[1]
    assert _marked((100_000,), ProgramSample(seed=4))[1] == first
    assert _marked((100_000,), ProgramSample(seed=5))[1] != first


def test_a_small_launch_runs_whole():
    run, ran, seen_total, _ = _marked((FULL_BELOW,), ProgramSample())
    assert run.launches[0].programs is None and ran == list(range(FULL_BELOW)) and seen_total == FULL_BELOW


def test_a_schedule_orders_the_chosen_programs():
    counter, seen = torch.zeros(1, dtype=torch.int32), torch.full((10_000,), -1, dtype=torch.int32)
    with sampled_programs(ProgramSample(seed=2)) as run, program_order(Schedule("reversed")):
        _run_order[(10_000,)](counter, seen)
    chosen = list(run.launches[0].programs)
    assert seen[: len(chosen)].tolist() == chosen[::-1] and int(counter.item()) == len(chosen)


def test_the_interpreter_is_put_back():
    from triton.runtime import interpreter

    call = interpreter.GridExecutor.__dict__["__call__"]
    _marked((1000,), ProgramSample())
    assert interpreter.GridExecutor.__dict__["__call__"] is call and not grid_order.installed()
    out = torch.zeros(1000, dtype=torch.int32)
    _mark[(1000,)](out, torch.zeros(1, dtype=torch.int32))
    assert bool((out != 0).all())  # every program runs again


@pytest.mark.parametrize("field, value, error", [("seed", -1, ValueError), ("seeded", 2.0, TypeError),
                                                 ("full_below", True, TypeError)])
def test_a_bad_sample_is_refused_naming_its_field(field, value, error):
    with pytest.raises(error, match=f"ProgramSample.{field}"):
        ProgramSample(**{field: value})
    with pytest.raises(TypeError, match="ProgramSample"):
        with sampled_programs(3):
            pass


@triton.jit
def _fill_rows(out_ptr, stride_om, N: tl.constexpr):
    """Row r of an [R, N] int8 buffer: the int32 product r * stride_om wraps once r * N >= 2^31."""
    row = tl.program_id(0)
    cols = tl.arange(0, N)
    tl.store(out_ptr + row * stride_om + cols, (row % 100).to(tl.int8) + 1)


def _resident_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(guard_for_call({})[1] is not None, reason=str(guard_for_call({})[1]))
def test_a_wrap_past_two_to_the_31_elements_is_found_in_the_last_programs_of_a_lazily_committed_buffer():
    rows, n = 2**19 + 2**17, 4096  # 2.5 Gi elements; rows from 2^19 on wrap
    out = torch.empty(rows * n, dtype=torch.int8)  # untouched pages are never committed
    before = _resident_bytes()
    with MemoryGuard({"out": out}) as guard, sampled_programs(ProgramSample(seed=0)) as run:
        _fill_rows[(rows,)](out, n, N=n)
    assert _resident_bytes() - before < 256 * 2**20  # the chosen rows' pages only, not 2.5 GiB
    [launch] = run.launches
    wrapping = [p for p in launch.programs if p >= 2**19]
    assert wrapping and launch.ran < 64
    [event] = guard.wraps
    assert event.kernel == "_fill_rows" and event.kind == "store" and event.grid == (rows, 1, 1)
    assert event.program in wrapping and event.programs == len(wrapping)
    w = event.wrap
    assert (w.op, w.dtype, w.rhs) == ("*", "int32", n) and w.exact == w.lhs * n >= 2**31
    assert w.code.startswith("tl.store(out_ptr + row * stride_om")
