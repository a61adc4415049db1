"""The memory-safe interpreter (diffmoe/interpreter/bounds_guard.py) and the bounds oracle
(diffmoe/oracles/bounds.py), on plain Triton kernels written here.

The tensors a kernel is given are numpy-backed views of a larger buffer (`torch.from_numpy` of a
slice: the tensor's storage is the slice, the bytes after it are the rest of the buffer), so a test
can see that a refused store left the bytes past a tensor alone and that a refused load did not
read them. What is held: a store and a load past the end are refused and recorded (kernel,
program, bytes, the argument), masked-off lanes are never judged, a correct kernel is quiet, lanes
landing in a neighbouring argument's storage are refused too, atomics (with and without a mask)
are guarded, the race recorder entered around the guard records only what was performed, the
interpreter is restored afterwards, and a check names the buffer, never an address.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before Triton is imported

import re

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

from diffmoe.findings import Oracles
from diffmoe.judge.runner import run_differential
from diffmoe.interpreter import address_recorder, bounds_guard
from diffmoe.interpreter.bounds_guard import MemoryGuard, guard_for_call
from diffmoe.oracles.bounds import bounds_finding

SUPPORTED = guard_for_call({})[1]
pytestmark = pytest.mark.skipif(SUPPORTED is not None, reason=str(SUPPORTED))

HEX_ADDRESS = re.compile(r"0x[0-9a-fA-F]{6,}")


@triton.jit
def _copy_plus_one(x_ptr, y_ptr, n, BLOCK: tl.constexpr, MASK_LOAD: tl.constexpr, MASK_STORE: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    if MASK_LOAD:
        v = tl.load(x_ptr + offs, mask=offs < n, other=-1.0)
    else:
        v = tl.load(x_ptr + offs)
    if MASK_STORE:
        tl.store(y_ptr + offs, v + 1, mask=offs < n)
    else:
        tl.store(y_ptr + offs, v + 1)


@triton.jit
def _atomics(x_ptr, n, BLOCK: tl.constexpr, CAS: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    if CAS:
        tl.atomic_cas(x_ptr + offs, tl.zeros((BLOCK,), dtype=tl.int32), tl.full((BLOCK,), 5, dtype=tl.int32))
    else:
        tl.atomic_add(x_ptr + offs, tl.full((BLOCK,), 3, dtype=tl.int32))


def _views(total: int, *sizes: int, dtype=np.float32, fill=0):
    """One numpy buffer of `total` elements and tensors over consecutive slices of it (each its own storage)."""
    buf = np.full(total, fill, dtype=dtype)
    out, at = [], 0
    for size in sizes:
        out.append(torch.from_numpy(buf[at:at + size]))
        at += size
    return buf, out


def test_a_store_past_the_end_is_refused_and_recorded():
    buf, (x, y) = _views(64, 10, 10)
    x.copy_(torch.arange(10, dtype=torch.float32))
    buf[20:] = 7.0
    with MemoryGuard() as guard:
        _copy_plus_one[(1,)](x, y, 10, BLOCK=16, MASK_LOAD=True, MASK_STORE=False)
    assert torch.equal(y, torch.arange(1, 11, dtype=torch.float32))
    assert (buf[20:] == 7.0).all(), "the refused store wrote past y"
    [event] = guard.events
    assert (event.kind, event.kernel, event.program, event.nbytes) == ("store", "_copy_plus_one", 0, 6 * 4)
    assert event.nearest.args == ("y_ptr",) and event.span[0] == event.nearest.end
    f = bounds_finding(event)
    assert f.oracle == Oracles.BOUNDS and f.buffers == ["y_ptr"]
    assert "program 0 of _copy_plus_one stores 24 bytes" in f.message and "`y_ptr`" in f.message
    assert "was not performed" in f.message and not HEX_ADDRESS.search(f.message)


def test_a_load_past_the_end_is_refused_and_reads_zero():
    buf, (x, y) = _views(64, 10, 16)
    x.copy_(torch.arange(10, dtype=torch.float32))
    y.fill_(7.0)  # what an unguarded load of 16 elements from x would read past its end
    with MemoryGuard() as guard:
        _copy_plus_one[(1,)](x, y, 16, BLOCK=16, MASK_LOAD=False, MASK_STORE=True)
    [event] = guard.events
    assert (event.kind, event.nearest.args, event.nbytes) == ("load", ("x_ptr",), 6 * 4)
    assert y[10:].tolist() == [1.0] * 6, "the refused lanes must read 0, not the bytes past x"


def test_masked_lanes_are_not_judged_and_a_correct_kernel_is_quiet():
    _, (x, y) = _views(64, 10, 10)
    with MemoryGuard() as guard:
        _copy_plus_one[(3,)](x, y, 10, BLOCK=8, MASK_LOAD=True, MASK_STORE=True)
    assert guard.events == []


def test_lanes_in_a_neighbouring_arguments_storage_are_refused_too():
    # y's storage starts where x's ends: an overflow of x lands in y, another argument; the verdict
    # must not depend on where the heap happens to put a neighbour
    buf, (x, y) = _views(32, 10, 10)
    y.fill_(5.0)
    with MemoryGuard() as guard:
        _copy_plus_one[(1,)](y, x, 10, BLOCK=16, MASK_LOAD=True, MASK_STORE=False)
    assert (y == 5.0).all(), "the store through y_ptr wrote into the other argument's storage"
    [event] = guard.events
    assert event.kind == "store" and event.nearest.args == ("y_ptr",) and event.nbytes == 6 * 4


@pytest.mark.parametrize("cas", [False, True], ids=["atomic_add", "atomic_cas"])
def test_atomics_past_the_end_are_refused(cas):
    buf, (x,) = _views(32, 4, dtype=np.int32)
    with MemoryGuard() as guard:
        _atomics[(1,)](x, 4, BLOCK=8, CAS=cas)
    assert (buf[4:] == 0).all()
    assert x.tolist() == ([5] * 4 if cas else [3] * 4)
    [event] = guard.events
    assert event.kind == "atomic" and event.nbytes == 16


def test_the_race_recorder_around_the_guard_records_only_what_ran_and_both_are_undone():
    from triton.runtime import interpreter

    before = {name: interpreter.InterpreterBuilder.__dict__[name] for name in bounds_guard.HOOKED_BUILDER_METHODS}
    _, (x, y) = _views(64, 10, 10)
    with address_recorder.RaceRecorder() as recorder:
        with MemoryGuard() as guard:
            _copy_plus_one[(1,)](x, y, 10, BLOCK=16, MASK_LOAD=True, MASK_STORE=False)
    assert len(guard.events) == 1
    assert recorder.runs[0].bytes_written == 40  # the 10 stored elements, not the 6 refused
    assert not bounds_guard.instrumentation_installed() and not address_recorder.instrumentation_installed()
    assert {name: interpreter.InterpreterBuilder.__dict__[name] for name in before} == before
    assert not hasattr(interpreter.GridExecutor._init_args_hst, "__wrapped__")


def test_accesses_are_not_judged_without_an_active_guard():
    # outside any guard the hooks are gone: an in-bounds kernel runs as triton runs it
    _, (x, y) = _views(64, 10, 10)
    _copy_plus_one[(2,)](x, y, 10, BLOCK=8, MASK_LOAD=True, MASK_STORE=True)
    assert not bounds_guard.instrumentation_installed()


@pytest.mark.parametrize("isolation", ["none", "process"])
def test_a_check_reports_the_dropped_store_mask_by_the_buffer_name_and_survives(isolation):
    """In the judge's process and in the candidate's (diffmoe/isolation/): the refused store travels
    with the run and is named at the candidate's addresses."""
    import bug_zoo

    mutant = bug_zoo.MUTANTS["reduce-store-mask-dropped"]
    report = run_differential(mutant.config, mutant.factory, oracles=[Oracles.BOUNDS, Oracles.DIFFERENTIAL],
                              isolation=isolation)
    [finding] = report.findings
    assert finding.oracle == Oracles.BOUNDS and finding.stage == "reduce" and finding.buffers == ["output"]
    assert "output (allocated by the implementation)" in finding.message
    assert "the store was not performed" in finding.message and not HEX_ADDRESS.search(finding.message)
    assert finding.figures["bytes_outside"] == 3 * 128 * 2  # three token rows of H=128 bf16 past T=1


def test_the_bounds_oracle_is_quiet_on_the_shipped_implementation():
    from diffmoe.problem.config import MoEConfig

    config = MoEConfig(num_tokens=3, num_experts=2, topk=2, hidden=128, inter=128, quant="fp8-token", fused=True)
    report = run_differential(config, oracles=[Oracles.BOUNDS, Oracles.TEACHER_FORCING])
    assert report.passed, report.render()


def test_a_crash_after_a_refused_store_is_reported_after_the_refusal():
    import bug_zoo

    class RaisesAfterTheReduce(bug_zoo.ReduceStoreMaskDropped):
        def _reduce(self, stage, ctx, down, out):
            super()._reduce(stage, ctx, down, out)
            raise RuntimeError("planted failure after the reduce")

    mutant = bug_zoo.MUTANTS["reduce-store-mask-dropped"]
    report = run_differential(mutant.config, RaisesAfterTheReduce, oracles=[Oracles.BOUNDS])
    assert [f.oracle for f in report.findings] == [Oracles.BOUNDS, Oracles.CRASH], report.render()
    assert report.findings[0].buffers == ["output"] and "planted failure" in report.findings[1].message


def test_a_refused_access_only_a_later_call_makes_is_reported_once_the_check_is_over():
    import bug_zoo

    class OnlyTheStageEntryDropsTheMask(bug_zoo.ReduceStoreMaskDropped):
        """The whole-pipeline path masks its store; the per-stage entry (teacher forcing) does not."""

        def run(self, *args, **kwargs):
            self.MASK_STORE = True
            try:
                return super().run(*args, **kwargs)
            finally:
                self.MASK_STORE = False

    mutant = bug_zoo.MUTANTS["reduce-store-mask-dropped"]
    report = run_differential(mutant.config, OnlyTheStageEntryDropsTheMask,
                              oracles=[Oracles.BOUNDS, Oracles.TEACHER_FORCING])
    [finding] = [f for f in report.findings if f.oracle == Oracles.BOUNDS]
    assert finding.stage == "reduce" and "stores 768 bytes" in finding.message, report.render()
    assert "of the 256-byte buffer argument `out_ptr` of the launch of _zoo_block_reduce_kernel" in finding.message


@triton.jit
def _store_iota(y_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, offs)


def test_a_reinterpreted_tensor_is_judged_by_the_storage_beneath_it():
    from triton.runtime.jit import reinterpret

    buf, (y,) = _views(32, 8)
    with MemoryGuard() as guard:
        _store_iota[(1,)](reinterpret(y, tl.int32), BLOCK=16)
    assert (buf[8:] == 0).all() and y.view(torch.int32).tolist() == list(range(8))
    [event] = guard.events
    assert (event.kind, event.nbytes, event.nearest.args) == ("store", 32, ("y_ptr",))
