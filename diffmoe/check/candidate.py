"""The candidate's side of a check: everything that touches the implementation, and nothing that judges it.

Owns: building instances (with poisoned private buffers), calling the implementation's methods
so that any exception becomes a finding, allocating guarded workspaces and outputs, and one
guarded call (`Candidate.execute`: poison, launch recording, red-zone and input watchers, the
program order, the interpreter's address recorder), a teacher-forced stage
(`Candidate.run_stage`), the call-sequence series' lightly watched calls (`Candidate.series`),
and what changed after a call returned (`Candidate.late_findings`). It returns what it saw (a `Run`, findings of the watchers); the judge
(diffmoe/check/execution.py and the oracles) decides what it means.

Longer than 400 lines because one watched call composes every watch (poison, the recorders, the
red-zone, input and unwritten-read watchers, the program order, the bounds guard, the address
recorder) with the instance services they share; split, each half would need the other's.

Under isolation it runs in the candidate's process (diffmoe/isolation/): it must not import the
reference (tests/isolation/test_isolation.py imports it under the isolation's import guard).

Robustness: nothing the implementation does ends the check without a Report.
  * An exception from the implementation (Triton compile and interpreter errors included),
    in its factory, `workspace_plan`, `workspace_shapes`, `run` or `run_stage`, becomes a
    `crash` finding with the exception type, message, the phase and, inside a launch, the
    stage. So does any other BaseException but KeyboardInterrupt: `sys.exit(0)` in `run` is
    "the implementation called sys.exit(0) during ...", never a silent exit 0 of the harness.
    `os._exit` is intercepted while the implementation runs (call_environment.py), so it is one
    too; a process ended from below Python cannot be caught in process, and a worker that dies
    is a crash finding (diffmoe/check/worker.py). A factory that returns an object without the
    contract's methods, a run that returns no RunResult with a tensor output, an output or
    intermediate on another device than the check's, and workspaces that cannot be allocated
    are `contract` findings.
  * Every input is kept as a bitwise copy, compared after each run (and, in the first run,
    before and after each launch, so the finding names the stage), and restored, so the later
    runs still see the original inputs; a changed input is a `contract` finding.
  * Every call runs under the bounds guard (`memory_guarded`): under the interpreter an access
    outside the allocation it addresses is refused, never performed, so no call corrupts the heap.
"""

from __future__ import annotations

import os
import sys
import threading
import traceback
from collections.abc import Callable, Sequence
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch

from diffmoe.contract import ImplementationFactory, Schedule, WorkspacePlan, applies_own_order
from diffmoe.check.call_environment import HardExit, allocations_poisoned, exits_intercepted, numpy_quiet
from diffmoe.check.recording import ChainedRecorder, LaunchLog
from diffmoe.findings import Finding, Oracles
from diffmoe.check.watchers import InputWatch, LateWatch, RedZoneWatch, StageTracker, UnwrittenReads
from diffmoe.interpreter import grid_order
from diffmoe.check.guards import GuardedTensor, GuardedWorkspaces, WritesPoisoned
from diffmoe.problem.config import MoEConfig, quoted
from diffmoe.problem.inputs import TOKEN_FIELDS, Problem
from diffmoe.problem.vocabulary import Buffers, Stages

CandidateProgress = Callable[["str | None", "str | None"], None]
"""progress(phase or None, stage or None): a phase starting, or a launch of a stage starting."""

@contextmanager
def _sampling(sample, tracker: StageTracker) -> Iterator[Any]:
    """A program sample's context (diffmoe/interpreter/program_sample.py) around a call, or
    nothing. The alignment's launches run whole: every later stage reads the index it writes."""
    if sample is None:
        yield None
        return
    from diffmoe.interpreter.program_sample import sampled_programs  # imports triton

    with sampled_programs(sample, whole=lambda: tracker.stage == Stages.ALIGN, label=lambda: tracker.stage) as sampling:
        yield sampling


# The contract's methods an implementation must have (run_stage is optional).
REQUIRED_METHODS = ("workspace_plan", "workspace_shapes", "run")


@dataclass
class Run:
    """One call of the implementation, as the oracles see it afterwards."""

    schedule: Schedule
    red_zones: list[Finding]  # guard bytes changed, per launch (judged by the red-zone oracle)
    output: torch.Tensor
    buffers: dict[str, torch.Tensor]  # every materialised buffer, snapshotted after its stage
    log: LaunchLog
    returned: Any = None  # the tensor run() returned (not a copy; isolated: its TensorIdentity)
    reported: set[str] = field(default_factory=set)  # intermediates run() returned itself
    addresses: Any = None  # the interpreter's per-program address record (RaceRecorder), first run only
    out_of_bounds: list = field(default_factory=list)  # accesses the bounds guard refused (bounds_guard.OutOfBounds)
    wraps: list = field(default_factory=list)  # accesses through wrapped integer offsets (wrap_watch.AddressWrap)
    headroom: list = field(default_factory=list)  # launches whose 32-bit pointer offsets came near 2^31 (wrap_watch.Headroom)
    unwritten_reads: list = field(default_factory=list)  # reads of bytes nothing wrote (watchers.UnwrittenReads)
    storages: dict = field(default_factory=dict)  # first address of each named tensor of the call -> its name
    sampled: list = field(default_factory=list)  # under a program sample, each launch and the programs that ran (SampledLaunch)


@dataclass(frozen=True)
class TensorIdentity:
    """Where a tensor of the candidate's process lives, for the judge in another process: the
    contract oracle asks whether run() returned the caller's output (same address and shape)."""

    address: int
    shape: tuple[int, ...]

    @classmethod
    def of(cls, tensor: torch.Tensor) -> TensorIdentity:
        return cls(tensor.data_ptr(), tuple(tensor.shape))

    def data_ptr(self) -> int:
        return self.address


class Crash(Exception):
    """The implementation failed in a way that ends this part of the check; carries the finding."""

    def __init__(self, finding: Finding):
        super().__init__(finding.message)
        self.finding = finding


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


def first_line(exc: BaseException) -> str:
    lines = [line for line in str(exc).splitlines() if line.strip()]
    return lines[0].strip() if lines else ""


@dataclass
class Executed:
    """What one call handed back: the run, the input watch's findings, and the oracles that
    could not run as asked (name -> why)."""

    run: Run
    findings: list[Finding]
    skipped: dict[str, str]


class Candidate:
    """The implementation's side of one check, in this process: the factory, the check's device
    and problem (inputs watched), and the services the judge asks for. Every method that calls
    the implementation raises `Crash` with the finding when the implementation fails; findings
    the watchers made before a crash are in `pending` (the judge collects them)."""

    def __init__(self, factory: ImplementationFactory, device: torch.device, problem: Problem,
                 progress: CandidateProgress | None = None) -> None:
        self.factory = factory
        self.device = device
        self.problem = problem
        self.inputs = InputWatch(problem.inputs())
        self._progress = progress
        self.pending: list[Finding] = []  # the watchers' findings of a call that then crashed
        self.refused: list = []  # every access the bounds guard refused, every call, not yet taken
        self.late = LateWatch()  # what every call returned and was given, compared again at the end
        self.late.given(self.inputs.inputs, "the check's own calls", pristine=self.inputs.pristine)

    def take_pending(self) -> list[Finding]:
        found, self.pending = self.pending, []
        return found

    def take_refused(self) -> list:
        """The bounds guard's refused accesses since the last take: of calls that crashed, and of
        teacher-forced stages (a run's own are in its Run)."""
        found, self.refused = self.refused, []
        return found

    # ---- progress -------------------------------------------------------------------
    def enter(self, phase: str) -> None:
        if self._progress is not None:
            self._progress(phase, None)

    def stage(self, stage: str | None) -> None:
        if self._progress is not None:
            self._progress(None, stage)

    # ---- the implementation's methods -------------------------------------------------
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
                message=f"{what}: the implementation ({type(impl).__name__}) has no callable {name}() (diffmoe/contract.py)",
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
                        f"{', '.join(m + '()' for m in REQUIRED_METHODS)} (diffmoe/contract.py)",
            ))
        return impl

    def has_run_stage(self, impl) -> bool:
        return hasattr(impl, "run_stage")

    def allocate(self, shapes: Sequence[int], what: str) -> GuardedWorkspaces:
        """Guarded workspaces of the implementation's `shapes`; a size that cannot be allocated
        (MemoryError, or torch's RuntimeError) is a contract finding, not a harness traceback."""
        try:
            return GuardedWorkspaces(tuple(shapes), self.device)
        except (MemoryError, RuntimeError, OverflowError, ValueError) as exc:
            raise Crash(Finding(
                oracle=Oracles.CONTRACT,
                message=f"{what} asks for workspaces of {', '.join(str(n) for n in shapes)} bytes, which cannot be "
                        f"allocated on {self.device}: {type(exc).__name__}: {first_line(exc)}",
                figures={"shapes": list(shapes), "exception": type(exc).__name__},
            )) from exc

    def new_output(self, num_tokens: int, hidden: int, pattern: int | None = None) -> GuardedTensor:
        """A caller's output of num_tokens x hidden bf16 with guard bytes, poisoned with `pattern`."""
        out = GuardedTensor((num_tokens, hidden), torch.bfloat16, self.device)
        if pattern is not None:
            out.poison(pattern)
        return out

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
                message=f"workspace_plan({num_tokens}) must return a diffmoe.contract.WorkspacePlan, got {type(plan).__name__}",
            ))
        return plan

    @contextmanager
    def memory_guarded(self, named: dict[str, torch.Tensor], skipped: dict[str, str],
                       stage: str | None = None) -> Iterator[Any]:
        """One call under the bounds guard (diffmoe/interpreter/bounds_guard.py: on under the interpreter
        whatever the selection); yields the guard (a LaunchRecorder, its refused accesses in `events`)
        or None where it cannot hook (the reason in `skipped` under the bounds and overflow oracles'
        names: the overflow watch runs inside the guard, diffmoe/interpreter/wrap_watch.py)."""
        from diffmoe.interpreter.bounds_guard import guard_for_call  # imports triton

        guard, why = guard_for_call(named, stage)
        if guard is None:
            skipped.setdefault(Oracles.BOUNDS, why)
            skipped.setdefault(Oracles.OVERFLOW, why)
        with guard or nullcontext():
            yield guard

    # ---- one call -----------------------------------------------------------------------
    def execute(self, impl, guarded: GuardedWorkspaces, output: GuardedTensor | None, schedule: Schedule,
                poison: int | None, problem: Problem | None = None, what: str | None = None,
                attribute_input_writes: bool = False, poison_workspaces: int | None = None,
                address_oracles: Sequence[str] = (), schedule_selected: bool = False, sample=None) -> Executed:
        """One call. poison: the pattern for the workspaces and the output, or None to keep what
        the previous call left (call-sequence); poison_workspaces: a pattern for the workspaces
        alone (the output keeps its own); address_oracles: the selected oracles that judge the
        interpreter's per-program address record (it is made when they can run; otherwise each
        is reported skipped with the reason); sample: a ProgramSample, each interpreter launch then
        runs only the programs it chooses (diffmoe/interpreter/program_sample.py, issue 42)."""
        what = what or f"the run under schedule {schedule}"
        skipped: dict[str, str] = {}
        addresses = self._address_recorder(guarded, output, address_oracles, skipped) if address_oracles else None
        order = self.program_order(impl, schedule, skipped if schedule_selected else {})
        with addresses if addresses is not None else nullcontext():
            run = self._execute(impl, guarded, output, schedule, poison, problem, what, attribute_input_writes,
                                poison_workspaces, order, addresses, skipped, sample)
        run.addresses = addresses
        return Executed(run, self.take_pending(), skipped)

    def _execute(self, impl, guarded, output, schedule, poison, problem, what, attribute_input_writes,
                 poison_workspaces, order, extra_recorder, skipped, sample=None) -> Run:
        self.enter(what)
        # the harness rewrites these now: what an earlier call returned in them is no longer the caller's
        self.late.forget([*guarded.workspaces, *([output.tensor] if output is not None else [])])
        if poison is not None:
            guarded.poison(poison)
            if output is not None:
                output.poison(poison)
        elif poison_workspaces is not None:
            guarded.poison(poison_workspaces)
        # the first order's run (attribute_input_writes: the run the contract oracle judges) watches which
        # declared bytes each Triton launch stores (diffmoe/interpreter/store_coverage.py, issue 43)
        # (not under a program sample: the programs that did not run leave declared bytes unstored by design)
        stores = self._store_watch() if attribute_input_writes and sample is None else None
        log = LaunchLog(snapshot=True, stores=stores)
        tracker = StageTracker(self.stage)
        watch = RedZoneWatch(guarded, output)
        run = self.method(impl, "run", what)
        self.inputs.start(attribute_input_writes)
        named = {**(problem or self.problem).inputs(), **dict(zip(("ws1", "ws2"), guarded.workspaces)),
                 **({Buffers.OUTPUT: output.tensor} if output is not None else {})}
        unwritten = UnwrittenReads(t.untyped_storage().data_ptr() for t in named.values())
        guard = None
        try:
            # the call's own allocations poisoned, so a tensor nobody wrote is told from one written;
            # the guard innermost: a race recorder or store watch entered around it records only what it let through
            with numpy_quiet(), exits_intercepted(), allocations_poisoned(), order, stores or nullcontext(), \
                    _sampling(sample, tracker) as sampling, self.memory_guarded(named, skipped) as guard:
                # a sampled run: each launch's write views poisoned first (guards.WritesPoisoned says why)
                poisoned = WritesPoisoned(poison if poison is not None else poison_workspaces) if sample is not None else None
                recorder = ChainedRecorder(tracker, log, watch, self.inputs if attribute_input_writes else None,
                                           unwritten, guard, extra_recorder, poisoned)
                result = run(problem or self.problem, guarded.workspaces, output=output.tensor if output else None,
                             schedule=schedule, recorder=recorder)
        except BaseException as exc:  # noqa: BLE001 - SystemExit included: see implementation_failed
            if not implementation_failed(exc):
                raise
            self.pending += self.inputs.finish(what, log)
            self.refused += guard.events if guard else []
            raise Crash(crash_finding(exc, tracker.stage, what)) from exc
        self.pending += self.inputs.finish(what, log)
        log.stores = None  # its record is in the launches; the watch stays in this process
        refused = guard.events if guard else []  # delivered with the run (its objects: the bounds oracle tells runs apart by them)
        returned, intermediates = self._returned(result, what, tracker.stage)
        out = returned.detach().clone()
        buffers = dict(log.snapshots)
        for name, tensor in intermediates.items():
            if isinstance(tensor, torch.Tensor):
                buffers.setdefault(name, tensor.detach().clone())
        buffers[Buffers.OUTPUT] = out
        watch.check()  # writes made outside any reported launch
        storages = {t.untyped_storage().data_ptr(): name for name, t in named.items()}
        self.late.returned(returned, what)
        if problem is not None and problem is not self.problem:
            # its per-token inputs: its weights are the check's (in this process) or a copy made
            # for this call alone (sent to the candidate's process), which no later call reads
            self.late.given({n: t for n, t in problem.inputs().items() if n in TOKEN_FIELDS}, what,
                            covered=self.problem.inputs().values())
        return Run(schedule, watch.findings, out, buffers, log, returned, set(intermediates),
                   out_of_bounds=refused, wraps=guard.wraps if guard else [], headroom=guard.headroom if guard else [],
                   unwritten_reads=unwritten.found,
                   storages=storages, sampled=list(sampling.launches) if sampling is not None else [])

    def series(self, config: MoEConfig, problems: dict[int, Problem], calls: Sequence[tuple[int, bool]],
               schedule: Schedule, whats: Sequence[str],
               pattern: int) -> tuple[list[tuple[dict[str, torch.Tensor], list]], list[Finding]]:
        """The call-sequence series (diffmoe/oracles/call_series.py) in one go: a fresh instance of
        `config` and one pair of workspaces (poisoned with `pattern` once, before the first call),
        then `calls` (T, from another thread) on them, each with a fresh output poisoned with
        `pattern` where the config has one. The lightest watch: each call under the bounds guard,
        exits intercepted and its allocations poisoned, its launches only named for the time limit;
        no launch log, snapshot, address record or per-launch watcher (the check's own calls have
        them). Per call: (its output and the intermediates it returned, copied; the accesses the
        bounds guard refused; the series stops after a call with refused accesses, a first call's
        refusals leaving nothing to judge and a later call's being its finding); and the
        `contract` findings of inputs a call wrote (each restored before the next call, so a
        later divergence is not the input's). Every answer and the
        problems' inputs are kept for the late compare."""
        impl = self.build(config)
        guarded = self.allocate(self.workspace_shapes(impl, config.num_tokens), f"workspace_shapes({config.num_tokens})")
        guarded.poison(pattern)
        run = self.method(impl, "run", whats[0])
        given: set[int] = set()
        for t, problem in problems.items():  # weights shared by the sizes: kept once
            fresh = {n: v for n, v in problem.inputs().items() if v.untyped_storage().data_ptr() not in given}
            given.update(v.untyped_storage().data_ptr() for v in fresh.values())
            self.late.given(fresh, f"the series' calls of T={t}")
        watches = {t: InputWatch(problem.inputs()) for t, problem in problems.items()}
        answers, written = [], {}
        for (t, on_thread), what in zip(calls, whats):
            output = self.new_output(t, config.hidden, pattern) if config.output == "separate" else None

            def call(problem=problems[t], output=output, what=what):
                return self._light_call(run, problem, guarded, output, schedule, what, impl)

            answers.append(_on_a_thread(call) if on_thread else call())
            for finding in watches[t].finish(what):  # restored: the next call sees the caller's inputs
                written.setdefault(finding.buffers[0], finding)
            if answers[-1][1]:
                break  # accesses the bounds guard refused: that call is what the judge is told of
        return answers, list(written.values())

    def _light_call(self, run, problem: Problem, guarded: GuardedWorkspaces, output: GuardedTensor | None,
                    schedule: Schedule, what: str, impl) -> tuple[dict[str, torch.Tensor], list]:
        self.enter(what)
        tracker = StageTracker(self.stage)
        named = {**problem.inputs(), **dict(zip(("ws1", "ws2"), guarded.workspaces)),
                 **({Buffers.OUTPUT: output.tensor} if output is not None else {})}
        guard = None
        try:
            with numpy_quiet(), exits_intercepted(), allocations_poisoned(), self.program_order(impl, schedule, {}), \
                    self.memory_guarded(named, {}) as guard:
                result = run(problem, guarded.workspaces, output=output.tensor if output else None, schedule=schedule,
                             recorder=ChainedRecorder(tracker, guard))
        except BaseException as exc:  # noqa: BLE001 - as in _execute
            if not implementation_failed(exc):
                raise
            self.refused += guard.events if guard else []
            raise Crash(crash_finding(exc, tracker.stage, what)) from exc
        returned, intermediates = self._returned(result, what, tracker.stage)
        self.late.returned(returned, what)
        buffers = {n: v.detach().clone() for n, v in intermediates.items() if isinstance(v, torch.Tensor)}
        buffers[Buffers.OUTPUT] = returned.detach().clone()
        return buffers, guard.events if guard else []

    def _returned(self, result, what: str, stage: str | None) -> tuple[torch.Tensor, dict]:
        """What a call of `run` returned, (its output, its intermediates), or Crash with the
        `contract` finding: not a RunResult of a tensor and a dict, or tensors off the check's device."""
        returned = getattr(result, "output", None)
        intermediates = getattr(result, "intermediates", {})
        if not isinstance(returned, torch.Tensor) or not isinstance(intermediates, dict):
            raise Crash(Finding(
                oracle=Oracles.CONTRACT, stage=stage, buffers=[Buffers.OUTPUT],
                message=f"{what} returned {type(result).__name__}; run() must return a RunResult whose output is a "
                        "tensor and whose intermediates are a dict",
            ))
        elsewhere = [name for name, tensor in ((Buffers.OUTPUT, returned), *intermediates.items())
                     if isinstance(tensor, torch.Tensor) and tensor.device.type != self.device.type]
        if elsewhere:  # a meta or foreign-device tensor holds nothing the oracles could compare
            devices = sorted({str((returned if n == Buffers.OUTPUT else intermediates[n]).device) for n in elsewhere})
            raise Crash(Finding(
                oracle=Oracles.CONTRACT, stage=stage, buffers=elsewhere,
                message=f"{what} returned {', '.join(elsewhere)} on {', '.join(devices)}, not on the check's device "
                        f"{self.device}",
            ))
        return returned, intermediates

    def late_findings(self) -> list[Finding]:
        """What changed after its call returned, compared once more now (the check's end, before the
        candidate's process closes): every call's output, the check's inputs and every other call's."""
        return self.late.findings()

    @staticmethod
    def _store_watch():
        if "triton" not in sys.modules and not torch.cuda.is_available():
            os.environ.setdefault("TRITON_INTERPRET", "1")  # as the bounds guard assumes (guard_for_call)
        from diffmoe.interpreter.store_coverage import watch_for_call

        return watch_for_call()

    def program_order(self, impl, schedule: Schedule, skipped: dict[str, str]):
        """The control `run` is called in: diffmoe.interpreter.grid_order's, which reorders the programs of every
        interpreter launch, unless the schedule is the identity or the implementation applies it
        itself (`orders_programs`). Compiled launches have no grid loop to steer: nothing is
        added, the hardware orders them. Where the interpreter's grid loop cannot be hooked
        (another Triton release) the schedule oracle is reported skipped with the reason (in
        `skipped`, given when it is selected), since its later orders would rerun the first."""
        if schedule.is_identity or applies_own_order(impl) or not grid_order.interpreting():
            return nullcontext()
        problem = grid_order.control_problem()
        if problem is not None:
            skipped.setdefault(Oracles.SCHEDULE, f"programs cannot be reordered: {problem}")
            return nullcontext()
        return grid_order.program_order(schedule)

    def _address_recorder(self, guarded: GuardedWorkspaces, output: GuardedTensor | None,
                          oracles: Sequence[str], skipped: dict[str, str]):
        """The interpreter's per-program address recorder for the oracles that judge it, or None
        (each of them then skipped with the reason)."""
        if "triton" not in sys.modules and not torch.cuda.is_available():
            # no GPU and nothing imported Triton yet (a torch implementation, a peer not yet
            # loaded): Triton here can only be the interpreter, and the recorder hooks it
            os.environ.setdefault("TRITON_INTERPRET", "1")
        from diffmoe.interpreter import address_recorder  # imports triton: only when these oracles run

        supported, why = address_recorder.races_supported()
        if not supported:
            for name in oracles:
                skipped[name] = why
            return None
        ws1, ws2 = guarded.workspaces
        named = {"ws1": ws1, "ws2": ws2, **({Buffers.OUTPUT: output.tensor} if output is not None else {})}
        return address_recorder.RaceRecorder(named)

    # ---- one stage, teacher-forced ------------------------------------------------------
    def run_stage(self, impl, stage: str, inputs: dict[str, torch.Tensor], what: str,
                  sample=None) -> tuple[object, list[Finding]]:
        """impl.run_stage(stage, inputs, problem): (what it returned, the input watch's findings);
        a failure raises Crash (the watch's findings in `pending`). sample: a ProgramSample, the
        stage's launches then run its programs, and what the stage allocates is poisoned (NaN: an
        element no chosen program wrote is told apart, diffmoe/oracles/teacher_forcing.py)."""
        self.inputs.start(False)
        named, guard = {**self.problem.inputs(), **inputs}, None
        tracker = StageTracker()
        tracker.stage = stage
        try:
            with numpy_quiet(), exits_intercepted(), allocations_poisoned() if sample is not None else nullcontext(), \
                    _sampling(sample, tracker), self.memory_guarded(named, {}, stage) as guard:
                outputs = impl.run_stage(stage, inputs, self.problem)
        except BaseException as exc:  # noqa: BLE001 - SystemExit included: see implementation_failed
            if not implementation_failed(exc):
                raise
            self.pending += self.inputs.finish(what)
            self.refused += guard.events if guard else []
            raise Crash(crash_finding(exc, stage, what)) from exc
        self.refused += guard.events if guard else []
        return outputs, self.inputs.finish(what)


def _on_a_thread(call: Callable[[], Any]) -> Any:
    """call() on a thread of its own, waited for; what it raised is raised here."""
    result: list = []

    def target() -> None:
        try:
            result.append((True, call()))
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread as it was raised
            result.append((False, exc))

    thread = threading.Thread(target=target, name="diffmoe-other-thread", daemon=True)
    thread.start()
    thread.join()
    ok, value = result[0]
    if not ok:
        raise value
    return value
