"""`Check`: the state of one check and the services every oracle uses to run the implementation.

Owns: building instances (with poisoned private buffers), calling the implementation's
methods so that any exception becomes a finding, one guarded call (`Check.execute`: poison,
launch recording, red-zone and input watchers, and the program order: an implementation that
does not apply the schedule itself runs inside diffmoe.interpreter.grid_order's control), the reference's
stage on a candidate's buffers, bitwise comparison of two runs, and progress. It judges nothing itself: the
oracles (`diffmoe/oracles/`) do, through the hooks the runner dispatches (`Check.judge_run`).
It must not import an oracle module or an implementation: the runner hands it the active
oracles and the factory.

Robustness: nothing the implementation does ends the check without a Report.
  * An exception from the implementation (Triton compile and interpreter errors included),
    in its factory, `workspace_plan`, `workspace_shapes`, `run` or `run_stage`, becomes a
    `crash` finding with the exception type, message, the phase and, inside a launch, the
    stage. So does any other BaseException but KeyboardInterrupt: `sys.exit(0)` in `run` is
    "the implementation called sys.exit(0) during ...", never a silent exit 0 of the harness
    `os._exit` is intercepted while the implementation runs (call_environment.py), so it is one
    too; a process ended from below Python cannot be caught in process, and a worker that dies
    is a crash finding (diffmoe/check/worker.py). A factory that returns an object without the contract's methods, a
    run that returns no RunResult with a tensor output, an output or intermediate on another
    device than the check's, and workspaces that cannot be allocated are `contract` findings.
  * Every input is kept as a bitwise copy, compared after each run (and, in the first run,
    before and after each launch, so the finding names the stage), and restored, so the later
    runs still see the original inputs; a changed input is a `contract` finding.
  * Every call runs under the bounds guard (`memory_guarded`): under the interpreter an access
    outside the allocation it addresses is refused, never performed, so no call corrupts the heap.

Longer than 400 lines because `execute` composes every watch on one call (poison, the recorders,
the red-zone and input watchers, the program order, the bounds guard) with the state the other
services share (the instance, its workspaces, the runs); split, each half would need the other's.
"""

from __future__ import annotations

import os
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import torch

from diffmoe.check.call_environment import HardExit, allocations_poisoned, exits_intercepted, numpy_quiet
from diffmoe.tolerance.compare import Comparison, Rule, compare
from diffmoe.problem.config import MoEConfig, quoted
from diffmoe.interpreter import grid_order
from diffmoe.adapters.contract import (  # noqa: F401 - default_device, interpreter_enabled: used through this module too
    ImplementationFactory, Schedule, WorkspacePlan, applies_own_order, default_device, interpreter_enabled,
)
from diffmoe.oracles.guards import POISON_PATTERNS, GuardedTensor, GuardedWorkspaces
from diffmoe.problem.inputs import Problem, make_problem, settle_uncomputed_rows, tokens_of
from diffmoe.check.recording import ChainedRecorder, LaunchLog
from diffmoe.check.report import Finding, Oracles
from reference import reference_moe  # pure PyTorch, Triton-free like the harness
from reference.moe import reference_stage

from diffmoe.problem.vocabulary import Buffers, materialised_buffers
from diffmoe.check.watchers import InputWatch, RedZoneWatch, StageTracker, UnwrittenReads

ProgressCallback = Callable[[str, "str | None", "list[Finding]"], None]
"""progress(phase, stage or None, findings so far): called at every phase change and launch."""


@dataclass
class Run:
    """One call of the implementation, as the oracles see it afterwards."""

    schedule: Schedule
    red_zones: list[Finding]  # guard bytes changed, per launch (judged by the red-zone oracle)
    output: torch.Tensor
    buffers: dict[str, torch.Tensor]  # every materialised buffer, snapshotted after its stage
    log: LaunchLog
    returned: torch.Tensor | None = None  # the tensor run() returned (not a copy)
    reported: set[str] = field(default_factory=set)  # intermediates run() returned itself
    addresses: Any = None  # the interpreter's per-program address record (RaceRecorder), first run only
    out_of_bounds: list = field(default_factory=list)  # accesses the bounds guard refused (bounds_guard.OutOfBounds)
    unwritten_reads: list = field(default_factory=list)  # reads of bytes nothing wrote (watchers.UnwrittenReads)


class Judge(Protocol):
    """What a check asks of an active oracle (every diffmoe.oracles.base.Oracle is one): its
    verdict on one order's run. A protocol, not that class: the oracles import this module."""

    def judge_run(self, check: Check, run: Run, first: bool) -> list[Finding]: ...


class Crash(Exception):
    """The implementation failed in a way that ends this part of the check; carries the finding."""

    def __init__(self, finding: Finding):
        super().__init__(finding.message)
        self.finding = finding


# The contract's methods an implementation must have (run_stage is optional).
REQUIRED_METHODS = ("workspace_plan", "workspace_shapes", "run")


def implementation_failed(exc: BaseException) -> bool:
    """True for everything the implementation may raise that is its own failure: any
    BaseException but KeyboardInterrupt (a real Ctrl-C, or SIGTERM turned into one by the
    CLI, must stop the harness). SystemExit, GeneratorExit and custom BaseExceptions are
    findings: an implementation that calls sys.exit(0) must not end the check with a pass."""
    return not isinstance(exc, KeyboardInterrupt)


def crash_finding(exc: BaseException, stage: str | None, what: str) -> Finding:
    frames = traceback.extract_tb(exc.__traceback__)
    where = f"{frames[-1].filename}:{frames[-1].lineno}" if frames else "?"
    if isinstance(exc, HardExit):
        if len(frames) >= 2:  # the implementation's call, not the interceptor's raise
            where = f"{frames[-2].filename}:{frames[-2].lineno}"
        return Finding(
            oracle=Oracles.CRASH,
            stage=stage,
            message=f"the implementation called os._exit({quoted(exc.code)}) during {what}",
            figures={"exception": "os._exit", "exit_code": quoted(exc.code), "where": where, "phase": what},
        )
    if isinstance(exc, SystemExit):
        return Finding(
            oracle=Oracles.CRASH,
            stage=stage,
            message=f"the implementation called sys.exit({quoted(exc.code)}) during {what}",
            figures={"exception": "SystemExit", "exit_code": quoted(exc.code), "where": where, "phase": what},
        )
    # Triton's compile errors span many lines (source excerpt, caret); the message keeps the
    # first line with text in it, the figures keep the rest.
    text = str(exc).strip()
    lines = [line for line in text.splitlines() if line.strip()]
    figures: dict = {"exception": type(exc).__name__, "where": where, "phase": what}
    if len(lines) > 1:
        figures["detail"] = text
    return Finding(
        oracle=Oracles.CRASH,
        stage=stage,
        message=f"{what} raised {type(exc).__name__}: {lines[0] if lines else ''}".strip(),
        figures=figures,
    )


def _first_line(exc: BaseException) -> str:
    lines = [line for line in str(exc).splitlines() if line.strip()]
    return lines[0].strip() if lines else ""


def first_tokens(problem: Problem, num_tokens: int) -> Problem:
    """The call made of the first `num_tokens` tokens of `problem` (fresh tensors, same weights),
    as make_problem(config, num_tokens=...) builds it, for generated and given problems alike."""
    return replace(problem, **tokens_of(problem, slice(num_tokens)))


class Check:
    """One check's state and services. The oracles read `config`, `problem`, `reference`,
    `device`, `schedules`, `tolerance_backend`, the first instance (`impl`), its workspaces
    (`guarded`, `output`, `shapes`) and add to `findings`; they run the implementation again
    only through `build` and `execute`."""

    def __init__(self, config: MoEConfig, factory: ImplementationFactory, oracles: Sequence[str],
                 schedules: list[Schedule], device: torch.device, name: str,
                 problem: Problem | None = None, progress: ProgressCallback | None = None,
                 active: Sequence[Judge] = ()):
        self.config = config
        self.factory = factory
        self.oracles = list(oracles)
        self.active = list(active)  # the selected oracles' objects, in the order their findings come
        self.schedules = schedules
        self.device = device
        # the tolerance table's backend axis: compiled CUDA kernels, or the interpreter on any device
        self.tolerance_backend = "cuda" if device.type == "cuda" and not interpreter_enabled() else "interpreter"
        self.name = name
        self.findings: list[Finding] = []
        self._progress = progress
        self.phase = "building the problem and the reference"
        self.report_progress(None)
        self.problem: Problem = make_problem(config, device) if problem is None else problem
        self.reference = reference_moe(self.problem)
        self.problem_inputs = set(self.problem.inputs())
        self.inputs = InputWatch(self.problem.inputs())
        # set by the runner once the first instance and its workspaces exist
        self.impl: Any = None
        self.plan: WorkspacePlan | None = None
        self.shapes: tuple[int, ...] = ()
        self.guarded: GuardedWorkspaces | None = None
        self.output: GuardedTensor | None = None
        self.runs: list[Run] = []  # one per program order, first order first
        # True when the call-sequence oracle makes the last order's run and the poison oracle's
        # second run (oracles/call_sequence.py): one T call serves three oracles
        self.sequenced = False
        # selected oracles that could not run on this check, and why (the report says so)
        self.skipped: dict[str, str] = {}
        self.out_of_bounds: list = []  # every access the bounds guard refused, every call, in order

    def selected(self, oracle: str) -> bool:
        return oracle in self.oracles

    @contextmanager
    def memory_guarded(self, named: dict[str, torch.Tensor], stage: str | None = None) -> Iterator[Any]:
        """One call under the bounds guard (diffmoe/interpreter/bounds_guard.py: on under the interpreter
        whatever the selection), its refused accesses added to `out_of_bounds`; yields the guard (a
        LaunchRecorder) or None where it cannot hook. The bounds oracle words what it refused."""
        from diffmoe.interpreter.bounds_guard import guard_for_call  # imports triton

        guard, why = guard_for_call(named, stage)
        if guard is None and self.selected(Oracles.BOUNDS):
            self.skipped.setdefault(Oracles.BOUNDS, why)
        with guard or nullcontext():
            try:
                yield guard
            finally:
                self.out_of_bounds += guard.events if guard else []

    # ---- progress -------------------------------------------------------------------
    def report_progress(self, stage: str | None) -> None:
        if self._progress is not None:
            self._progress(self.phase, stage, self.findings)

    def enter(self, phase: str) -> None:
        self.phase = phase
        self.report_progress(None)

    # ---- running the implementation -------------------------------------------------
    def call(self, what: str, fn, *args):
        """fn(*args) for one of the implementation's own methods; an exception is a crash finding."""
        self.enter(what)
        try:
            with exits_intercepted():
                return fn(*args)
        except BaseException as exc:  # noqa: BLE001 - every failure of the implementation is a finding
            if not implementation_failed(exc):
                raise
            raise Crash(crash_finding(exc, None, what)) from exc

    def method(self, impl, name: str, what: str):
        """impl.<name>, looked up as part of the implementation's call: a missing method is a
        contract finding, a property that raises a crash finding."""
        try:
            fn = getattr(impl, name)
        except AttributeError:
            fn = None
        except BaseException as exc:  # noqa: BLE001
            if not implementation_failed(exc):
                raise
            raise Crash(crash_finding(exc, None, what)) from exc
        if not callable(fn):
            raise Crash(Finding(
                oracle=Oracles.CONTRACT,
                message=f"{what}: the implementation ({type(impl).__name__}) has no callable {name}() (diffmoe/adapters/contract.py)",
            ))
        return fn

    def build(self, config: MoEConfig):
        """A new instance, its private buffers poisoned: every torch.empty it makes while being
        built is filled (NaN floats, the largest integers), so a run that reads a private
        buffer (a scale, sorted ids) before writing it computes on poison, not on zeros or
        on what an earlier instance happened to leave in the allocator."""
        what = f"building the implementation for {config.short()}"
        with allocations_poisoned():
            impl = self.call(what, self.factory, config)
        missing = [name for name in REQUIRED_METHODS if not callable(getattr(impl, name, None))]
        if missing:
            raise Crash(Finding(
                oracle=Oracles.CONTRACT,
                message=f"{what}: the factory returned {quoted(impl) if impl is None else type(impl).__name__}, "
                        f"which has no {', '.join(m + '()' for m in missing)}; an implementation must have "
                        f"{', '.join(m + '()' for m in REQUIRED_METHODS)} (diffmoe/adapters/contract.py)",
            ))
        return impl

    def allocate(self, shapes: Sequence[int], what: str) -> GuardedWorkspaces:
        """Guarded workspaces of the implementation's `shapes`; a size that cannot be allocated
        (MemoryError, or torch's RuntimeError) is a contract finding, not a harness traceback."""
        try:
            return GuardedWorkspaces(tuple(shapes), self.device)
        except (MemoryError, RuntimeError, OverflowError, ValueError) as exc:
            raise Crash(Finding(
                oracle=Oracles.CONTRACT,
                message=f"{what} asks for workspaces of {', '.join(str(n) for n in shapes)} bytes, which cannot be "
                        f"allocated on {self.device}: {type(exc).__name__}: {_first_line(exc)}",
                figures={"shapes": list(shapes), "exception": type(exc).__name__},
            )) from exc

    def workspace_shapes(self, impl, max_tokens: int) -> tuple[int, ...]:
        what = f"workspace_shapes({max_tokens})"
        shapes = self.call(what, self.method(impl, "workspace_shapes", what), max_tokens)
        try:
            counted = tuple(int(n) for n in shapes)
        except (TypeError, ValueError):
            counted = ()
        if len(counted) != 2 or min(counted) < 0:
            raise Crash(Finding(
                oracle=Oracles.CONTRACT,
                message=f"workspace_shapes({max_tokens}) must return two byte counts (ws1, ws2), got {quoted(shapes)}",
            ))
        return counted

    def workspace_plan(self, impl, num_tokens: int) -> WorkspacePlan:
        what = f"workspace_plan({num_tokens})"
        plan = self.call(what, self.method(impl, "workspace_plan", what), num_tokens)
        if not isinstance(plan, WorkspacePlan):
            raise Crash(Finding(
                oracle=Oracles.CONTRACT,
                message=f"workspace_plan({num_tokens}) must return a diffmoe.adapters.contract.WorkspacePlan, got {type(plan).__name__}",
            ))
        return plan

    def execute_fresh(self, config: MoEConfig, problem: Problem, what: str) -> Run:
        """One call on a fresh instance for `config`, fresh workspaces (and output), the first order
        and poison pattern: the metamorphic sibling's and batch invariance's other-batch runs."""
        impl = self.build(config)
        guarded = self.allocate(self.workspace_shapes(impl, config.num_tokens), f"workspace_shapes({config.num_tokens})")
        output = None if config.output != "separate" else \
            GuardedTensor((problem.num_tokens, config.hidden), torch.bfloat16, self.device)
        return self.execute(impl, guarded, output, self.schedules[0], POISON_PATTERNS[0], problem=problem, what=what)

    def execute(self, impl, guarded: GuardedWorkspaces, output: GuardedTensor | None, schedule: Schedule,
                poison: int | None, extra_recorder=None, problem: Problem | None = None, what: str | None = None,
                attribute_input_writes: bool = False, poison_workspaces: int | None = None) -> Run:
        """One call. poison: the pattern for the workspaces and the output, or None to keep what
        the previous call left (call-sequence); poison_workspaces: a pattern for the workspaces
        alone (the output keeps its own)."""
        what = what or f"the run under schedule {schedule}"
        self.enter(what)
        if poison is not None:
            guarded.poison(poison)
            if output is not None:
                output.poison(poison)
        elif poison_workspaces is not None:
            guarded.poison(poison_workspaces)
        log = LaunchLog(snapshot=True)
        tracker = StageTracker(self.report_progress)
        watch = RedZoneWatch(guarded, output)
        run = self.method(impl, "run", what)
        self.inputs.start(attribute_input_writes)
        named = {**(problem or self.problem).inputs(), **dict(zip(("ws1", "ws2"), guarded.workspaces)),
                 **({Buffers.OUTPUT: output.tensor} if output is not None else {})}
        unwritten = UnwrittenReads(t.untyped_storage().data_ptr() for t in named.values())
        try:
            # the call's own allocations poisoned, so a tensor nobody wrote is told from one written;
            # the guard innermost: a race recorder entered around this call records only what it let through
            with numpy_quiet(), exits_intercepted(), allocations_poisoned(), self.program_order(impl, schedule), \
                    self.memory_guarded(named) as guard:
                recorder = ChainedRecorder(tracker, log, watch, self.inputs if attribute_input_writes else None, unwritten,
                                           guard, extra_recorder)
                result = run(problem or self.problem, guarded.workspaces, output=output.tensor if output else None,
                             schedule=schedule, recorder=recorder)
        except BaseException as exc:  # noqa: BLE001 - SystemExit included: see implementation_failed
            if not implementation_failed(exc):
                raise
            self.findings += self.inputs.finish(what, log)
            raise Crash(crash_finding(exc, tracker.stage, what)) from exc
        self.findings += self.inputs.finish(what, log)
        returned = getattr(result, "output", None)
        intermediates = getattr(result, "intermediates", {})
        if not isinstance(returned, torch.Tensor) or not isinstance(intermediates, dict):
            raise Crash(Finding(
                oracle=Oracles.CONTRACT, stage=tracker.stage, buffers=[Buffers.OUTPUT],
                message=f"{what} returned {type(result).__name__}; run() must return a RunResult whose output is a "
                        "tensor and whose intermediates are a dict",
            ))
        elsewhere = [name for name, tensor in ((Buffers.OUTPUT, returned), *intermediates.items())
                     if isinstance(tensor, torch.Tensor) and tensor.device.type != self.device.type]
        if elsewhere:  # a meta or foreign-device tensor holds nothing the oracles could compare
            devices = sorted({str((returned if n == Buffers.OUTPUT else intermediates[n]).device) for n in elsewhere})
            raise Crash(Finding(
                oracle=Oracles.CONTRACT, stage=tracker.stage, buffers=elsewhere,
                message=f"{what} returned {', '.join(elsewhere)} on {', '.join(devices)}, not on the check's device "
                        f"{self.device}",
            ))
        out = returned.detach().clone()
        buffers = dict(log.snapshots)
        for name, tensor in intermediates.items():
            if isinstance(tensor, torch.Tensor):
                buffers.setdefault(name, tensor.detach().clone())
        buffers[Buffers.OUTPUT] = out
        self.settle_uncomputed_rows(buffers, problem)
        watch.check()  # writes made outside any reported launch
        return Run(schedule, watch.findings, out, buffers, log, returned, set(intermediates),
                   out_of_bounds=guard.events if guard else [], unwritten_reads=unwritten.found)

    def program_order(self, impl, schedule: Schedule):
        """The control `run` is called in: diffmoe.interpreter.grid_order's, which reorders the programs of every
        interpreter launch, unless the schedule is the identity or the implementation applies it
        itself (`orders_programs`). Compiled launches have no grid loop to steer: nothing is
        added, the hardware orders them. Where the interpreter's grid loop cannot be hooked
        (another Triton release) the schedule oracle is reported skipped with the reason, since
        its later orders would rerun the first."""
        if schedule.is_identity or applies_own_order(impl) or not grid_order.interpreting():
            return nullcontext()
        problem = grid_order.control_problem()
        if problem is not None:
            if self.selected(Oracles.SCHEDULE):
                self.skipped.setdefault(Oracles.SCHEDULE, f"programs cannot be reordered: {problem}")
            return nullcontext()
        return grid_order.program_order(schedule)

    # ---- what oracles share -------------------------------------------------------------
    def judge_run(self, run: Run, first: bool) -> list[Finding]:
        """Every active oracle's verdict on one order's run (the runner's, and call-sequence's
        last order); later orders are judged against the first by the schedule oracle."""
        return [f for oracle in self.active for f in oracle.judge_run(self, run, first)]

    def settle_uncomputed_rows(self, buffers: dict[str, torch.Tensor], problem: Problem | None = None) -> None:
        """diffmoe.problem.inputs.settle_uncomputed_rows for one call of this check (another call's problem,
        call-sequence's smaller ones, gets its own reference, once)."""
        problem = problem or self.problem
        if problem is not self.problem and getattr(self, "_other", (None,))[0] is not problem:
            self._other = (problem, reference_moe(problem))
        settle_uncomputed_rows(problem, (self.reference if problem is self.problem else self._other[1]).intermediates, buffers)

    def reference_stage(self, stage: str, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor] | str:
        """The reference's stage on the candidate's buffers, or why it cannot run on them."""
        try:
            with numpy_quiet():
                return reference_stage(stage, inputs, self.problem)
        except Exception as exc:  # noqa: BLE001 - a malformed candidate buffer is the candidate's fault
            return f"the reference cannot run stage {stage} on the candidate's buffers ({type(exc).__name__}: {exc})"

    def first_bitwise_divergence(self, first: Run, second: Run, why: str) -> Comparison | None:
        """The first buffer, pipeline order, whose bits differ between two runs of this config."""
        for name in materialised_buffers(self.config):
            if name in first.buffers and name in second.buffers:
                c = compare(name, first.buffers[name], second.buffers[name], Rule.bitwise(why))
                if not c.ok:
                    return c
        return None
