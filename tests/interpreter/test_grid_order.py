"""Program order at the Triton interpreter's grid loop (diffmoe/interpreter/grid_order.py), on plain Triton
kernels written here that read no order table.

What is held: an order-dependent kernel (last writer wins) ends differently under reversed and
random orders and the schedule oracle reports it behind the contract, while the same kernel in
place is quiet; an order-independent kernel gives the same bits under every order; 1-D, 2-D and
3-D grids run every program exactly once in the schedule's order, per launch index; nested
contexts never compose; the race recorder, entered inside or outside, names the programs that
really ran; an implementation that declares `orders_programs` is not reordered again; compiled
launches and the identity schedule are left alone; another triton release is refused.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before Triton is imported

from pathlib import Path

import pytest
import torch
import triton
import triton.language as tl

from diffmoe.interpreter import grid_order
from diffmoe.problem.config import MoEConfig
from diffmoe.contract import LaunchInfo, Schedule
from diffmoe.interpreter.grid_order import program_order
from diffmoe.interpreter.address_recorder import RaceRecorder
from diffmoe.findings import Oracles
from diffmoe.judge.runner import load_factory, run_differential
from diffmoe.problem.vocabulary import Buffers, Stages

SUPPORTED, WHY = grid_order.status()
pytestmark = pytest.mark.skipif(not SUPPORTED, reason=WHY)

ORDERS = (Schedule("identity"), Schedule("reversed"), Schedule("random", 5), Schedule("random", 6))
GRIDS = ((7,), (3, 4), (2, 3, 2))


@triton.jit
def _linear_id():
    """CUDA's linear block id, the number grid_order permutes."""
    return tl.program_id(0) + tl.num_programs(0) * (tl.program_id(1) + tl.num_programs(1) * tl.program_id(2))


@triton.jit
def _last_writer(out_ptr):
    tl.store(out_ptr, _linear_id())


@triton.jit
def _run_order(counter_ptr, seen_ptr):
    """Each program takes the next slot of a counter and writes its id there: `seen` is the run order."""
    slot = tl.atomic_add(counter_ptr, 1)
    tl.store(seen_ptr + slot, _linear_id())


@triton.jit
def _affine(x_ptr, y_ptr, BLOCK: tl.constexpr):
    offs = _linear_id() * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs) * 3.0 + 0.1)


@triton.jit
def _one_writer_one_reader(buf_ptr, sink_ptr, WRITER: tl.constexpr, READER: tl.constexpr):
    pid = _linear_id()
    if pid == WRITER:
        tl.store(buf_ptr, pid)
    if pid == READER:
        tl.store(sink_ptr, tl.load(buf_ptr))


def run_order(grid) -> list[int]:
    n = 1
    for g in grid:
        n *= g
    counter = torch.zeros(1, dtype=torch.int32)
    seen = torch.full((n,), -1, dtype=torch.int32)
    _run_order[grid](counter, seen)
    return seen.tolist()


def last_writer(grid) -> int:
    out = torch.full((1,), -1, dtype=torch.int32)
    _last_writer[grid](out)
    return int(out)


@pytest.mark.parametrize("grid", GRIDS, ids=str)
@pytest.mark.parametrize("schedule", ORDERS, ids=str)
def test_every_program_runs_once_in_the_schedules_order(grid, schedule):
    n = len(run_order(grid))
    natural = run_order(grid)  # the interpreter's own loop: x outermost
    with program_order(schedule) as control:
        first, second = run_order(grid), run_order(grid)
    assert sorted(first) == sorted(second) == list(range(n))
    if schedule.is_identity:
        assert first == second == natural and control.launches == 0  # nothing is steered
    else:
        # launch index counted from the context's start: the second launch draws its own order
        assert (first, second) == (schedule.order(n, 0), schedule.order(n, 1)) and control.launches == 2
        assert first != natural
    assert run_order(grid) == natural and not grid_order.installed()  # the interpreter is restored


@pytest.mark.parametrize("grid", GRIDS, ids=str)
def test_an_order_dependent_kernel_ends_differently_under_another_order(grid):
    ends = {}
    for schedule in ORDERS:
        with program_order(schedule):
            ends[str(schedule)] = last_writer(grid)
    n = len(run_order(grid))
    assert ends["identity"] == n - 1
    for schedule in ORDERS[1:]:
        assert ends[str(schedule)] == schedule.order(n, 0)[-1]
    assert ends["reversed"] != ends["identity"]


def test_an_order_independent_kernel_gives_the_same_bits_under_every_order():
    x = torch.randn(12 * 16, generator=torch.Generator().manual_seed(0))
    outs = []
    for schedule in ORDERS:
        y = torch.full_like(x, float("nan"))
        with program_order(schedule):
            _affine[(3, 4)](x, y, BLOCK=16)
        outs.append(y)
    assert all(torch.equal(outs[0].view(torch.int32), o.view(torch.int32)) for o in outs[1:])
    assert torch.equal(outs[0], x * 3.0 + 0.1)


def test_nested_contexts_never_compose_the_innermost_wins():
    n = 9
    with program_order(Schedule("reversed")):
        with program_order(Schedule("random", 2)):
            inner = run_order((n,))
        with program_order(Schedule("identity")):
            natural = run_order((n,))
        outer = run_order((n,))
    assert inner == Schedule("random", 2).order(n, 0)
    assert natural == list(range(n))
    assert outer == Schedule("reversed").order(n, 0)  # the outer context's first launch
    assert not grid_order.installed()


@pytest.mark.parametrize("recorder_outside", (True, False), ids=("recorder-outside", "recorder-inside"))
@pytest.mark.parametrize("schedule", ORDERS, ids=str)
def test_the_race_recorder_names_the_programs_that_ran(schedule, recorder_outside):
    """Program 1 stores, program 4 loads the same word of a (3, 2) grid: the race finding names
    exactly those two, whatever step of the loop each ran at."""
    buf, sink = torch.zeros(1, dtype=torch.int32), torch.full((1,), -1, dtype=torch.int32)
    recorder = RaceRecorder()
    if recorder_outside:
        with recorder, program_order(schedule):
            _one_writer_one_reader[(3, 2)](buf, sink, WRITER=1, READER=4)
    else:
        with program_order(schedule), recorder:
            _one_writer_one_reader[(3, 2)](buf, sink, WRITER=1, READER=4)
    found = recorder.findings()
    assert [(f.figures["writer_program"], f.figures["other_program"]) for f in found] == [(1, 4)]
    # the reader ran after the writer exactly when the order puts program 1 first
    order = schedule.order(6, 0)
    assert int(sink) == (1 if order.index(1) < order.index(4) else 0)


def test_compiled_launches_and_the_identity_schedule_are_left_alone(monkeypatch):
    from triton.runtime import interpreter

    builder = interpreter.interpreter_builder
    with program_order(Schedule("identity")):
        assert not grid_order.installed() and "set_grid_idx" not in vars(builder)
    monkeypatch.setattr(grid_order, "interpreting", lambda: False)  # as on a GPU without the interpreter
    with program_order(Schedule("reversed")) as control:
        assert not grid_order.installed() and "set_grid_idx" not in vars(builder)
        assert run_order((5,)) == list(range(5)) and control.launches == 0


def test_another_triton_release_is_refused_and_identity_still_runs(monkeypatch):
    monkeypatch.setattr(triton, "__version__", "3.10.0")
    with pytest.raises(RuntimeError, match=r"triton 3\.9.*this is triton 3\.10\.0.*identity schedule"):
        with program_order(Schedule("reversed")):
            pass  # never reached
    assert not grid_order.installed()
    with program_order(Schedule("identity")):
        assert run_order((4,)) == [0, 1, 2, 3]
    ok, why = grid_order.status()
    assert not ok and "3.10.0" in why


def test_a_schedule_must_be_a_schedule():
    with pytest.raises(TypeError, match="schedule must be a diffmoe.contract.Schedule"):
        with program_order("reversed"):
            pass


# ---- behind the contract: the schedule oracle on a plug-in whose kernel has no order table ----

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "torch_moe.py"
BLOCK = 128
CONFIG = MoEConfig(num_tokens=4, num_experts=2, topk=1, hidden=128, inter=128, quant="bf16")


@triton.jit
def _rewrite_output(bits_ptr, BLOCK: tl.constexpr, LAST_WRITER: tl.constexpr):
    """Program p loads block p of the output and stores it back (order-free); with LAST_WRITER
    every program also copies its block's first element over element 0 (the last one wins)."""
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    tl.store(bits_ptr + offs, tl.load(bits_ptr + offs))
    if LAST_WRITER:
        tl.store(bits_ptr, tl.load(bits_ptr + pid * BLOCK))


def _plugin(last_writer: bool, declares_order: bool = False):
    """The worked example with one Triton launch over its output at the end of each call."""
    example = load_factory(f"{EXAMPLE}:make")
    base = type(example(CONFIG))

    class RewritesOutput(base):
        orders_programs = declares_order  # True: a claim the harness trusts, no reordering

        def run(self, problem, workspaces, *, output=None, schedule=None, recorder=None):
            result = super().run(problem, workspaces, output=output, schedule=schedule, recorder=recorder)
            out = result.output
            if out.numel():
                info = LaunchInfo(Stages.REDUCE, "_rewrite_output", (out.numel() // BLOCK,), {Buffers.OUTPUT: out},
                                  {Buffers.OUTPUT: out})
                recorder.before_launch(info)
                _rewrite_output[(out.numel() // BLOCK,)](out.view(torch.int16), BLOCK=BLOCK, LAST_WRITER=last_writer)
                recorder.after_launch(info)
            return result

    return RewritesOutput


def test_the_schedule_oracle_reports_a_plugins_order_dependent_kernel():
    report = run_differential(CONFIG, _plugin(last_writer=True), oracles=[Oracles.SCHEDULE, Oracles.RACES])
    schedule = [f for f in report.findings if f.oracle == Oracles.SCHEDULE]
    assert schedule and all(f.buffers == [Buffers.OUTPUT] for f in schedule), report.render()
    assert {tuple(f.figures["schedules"]) for f in schedule} <= {("identity", s) for s in report.schedules[1:]}
    assert any(f.oracle == Oracles.RACES and f.stage == Stages.REDUCE for f in report.findings), report.render()


def test_the_schedule_oracle_is_quiet_on_the_order_free_kernel():
    report = run_differential(CONFIG, _plugin(last_writer=False), oracles=[Oracles.SCHEDULE, Oracles.RACES])
    assert report.passed and not report.skipped, report.render()


def test_an_implementation_that_orders_its_own_programs_is_not_reordered_again():
    """The same order-dependent kernel behind `orders_programs = True` (which it does not honour):
    the harness trusts the claim and leaves the grid loop alone, so every order runs the same."""
    report = run_differential(CONFIG, _plugin(last_writer=True, declares_order=True), oracles=[Oracles.SCHEDULE])
    assert report.passed, report.render()


def test_the_shipped_implementation_keeps_its_order_table_and_no_grid_loop_control(monkeypatch):
    """optimized declares `orders_programs`: its runs never enter the control, so their bits and
    speed are what its order table gives, as before the control existed."""
    entered = []
    real = grid_order.program_order

    def watched(schedule):
        entered.append(str(schedule))
        return real(schedule)

    monkeypatch.setattr(grid_order, "program_order", watched)
    report = run_differential(CONFIG, oracles=[Oracles.SCHEDULE])
    assert report.passed and len(report.schedules) > 2 and entered == [], report.render()
    report = run_differential(CONFIG, _plugin(last_writer=False), oracles=[Oracles.SCHEDULE])
    assert entered == report.schedules[1:]  # the plug-in's non-identity orders do


def test_the_schedule_oracle_says_it_is_skipped_where_the_grid_loop_cannot_be_hooked(monkeypatch):
    monkeypatch.setattr(triton, "__version__", "3.10.0")
    report = run_differential(CONFIG, _plugin(last_writer=True), oracles=[Oracles.SCHEDULE])
    assert "3.10.0" in report.skipped.get(Oracles.SCHEDULE, ""), report.render()


# ---- the doctor's row ----------------------------------------------------------------------


def test_the_doctor_finds_the_grid_loop_control_working():
    from diffmoe.backend import conformance

    r = conformance.probe_grid_order(torch.device("cpu"), True)
    assert (r.status, r.mismatches, r.total) == (conformance.OK, 0, 32), r.detail


def test_the_doctor_reports_a_control_that_reorders_nothing(monkeypatch):
    from contextlib import nullcontext

    from diffmoe.backend import conformance

    monkeypatch.setattr(grid_order, "program_order", lambda schedule: nullcontext())
    r = conformance.probe_grid_order(torch.device("cpu"), True)
    assert r.status == conformance.DEFECT and r.mismatches > 0 and "reversed: ran" in r.detail


def test_the_doctor_reports_another_triton_release(monkeypatch):
    from diffmoe.backend import conformance

    monkeypatch.setattr(triton, "__version__", "3.10.0")
    r = conformance.probe_grid_order(torch.device("cpu"), True)
    assert r.status == conformance.DEFECT and "3.10.0" in r.detail
