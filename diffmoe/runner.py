"""`run_differential`: one problem, the reference, one implementation, every oracle, one Report.

Order of work for a config:
  1. build the problem and run the reference (fresh tensor per stage);
  2. static checks of the declared plan (aliasing, workspace fit), no execution needed;
  3. run the implementation once per schedule inside guarded, poisoned workspaces, recording
     every launch (views for runtime aliasing, snapshots of the intermediates, and under the
     interpreter the per-program addresses for the race oracle);
  4. judge: differential per buffer in pipeline order, schedule dependence, red zones;
  5. rerun with the second poison pattern (stale reads), teacher-force each stage, and run
     the fused/unfused sibling for the metamorphic check.

Robustness: nothing the implementation does ends the check without a Report.
  * An exception from the implementation (Triton compile and interpreter errors included),
    in its factory, `workspace_plan`, `workspace_shapes`, `run` or `run_stage`, becomes a
    `crash` finding with the exception type, message, the phase and, inside a launch, the
    stage. A run that returns no RunResult with a tensor output is a `contract` finding.
  * Contract violations are `contract` findings: an output of the wrong shape, dtype or
    device, or other than the tensor the caller passed; a launch writing a buffer the
    pipeline does not declare (or writing an input); a materialised buffer no launch wrote;
    workspaces too small for the plan; and any change to the problem's input tensors. Every
    input is kept as a bitwise copy, compared after each run (and, in the first run, before
    and after each launch, so the finding names the stage), and restored, so the later runs
    still see the original inputs.
  * `time_limit`: the check runs in a worker process that is killed when the limit passes;
    the Report then holds a `timeout` finding naming the phase and the stage in flight, plus
    every finding the worker had already made. A worker that dies (a segfault, the OOM
    killer) gives a `crash` finding. See `run_differential`.

Inputs a caller may hand over (`problem=`) beyond what `make_problem` generates: a call with
fewer tokens than the config's T, zero included (`make_problem(config, num_tokens=0)`; only
the [0, H] output and the inputs are then judged, teacher forcing and the metamorphic run
have nothing to look at), and NaN/Inf inputs, whose propagation reference/moe.py specifies
and the NaN-aware compare judges.
"""

from __future__ import annotations

import importlib
import math
import multiprocessing
import os
import pickle
import signal
import time
import traceback
import warnings
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch

from .compare import Comparison, Rule, compare
from .config import MoEConfig, quoted
from .contract import ImplementationFactory, LaunchInfo, Schedule, WorkspacePlan
from .oracles.guards import POISON_PATTERNS, GuardedTensor, GuardedWorkspaces
from .oracles.runtime_aliasing import check_runtime_aliasing
from .oracles.static_aliasing import check_static_aliasing, check_workspace_fit
from .problem import Problem, make_problem
from .recording import ChainedRecorder, LaunchLog, region_of
from .report import Finding, Oracles, Report
from .tolerances import END_TO_END, FORCED, rule_for
from reference import reference_moe  # pure PyTorch, Triton-free like the harness
from reference.moe import reference_stage

from .vocabulary import Buffers, Stages, materialised_buffers, pipeline_stages, producer_stage

# ---- time limits --------------------------------------------------------------------------

# The CLI's limit per check when --time-limit is not given, on the Triton interpreter, where a
# kernel that waits for another program instance spins forever (programs run one at a time).
# The largest configs the fuzzing strategies draw take well under a minute there; 120 s
# leaves room for a slow machine. On CUDA the default is no limit: compiled checks are quick,
# and a CUDA check's worker must be spawned (a forked child cannot use CUDA), which re-imports
# torch and Triton: seconds per check.
DEFAULT_INTERPRETER_TIME_LIMIT = 120.0
MAX_TIME_LIMIT = 7 * 24 * 3600.0  # a week; beyond it a limit is a typo, and poll() overflows
WORKER_START_METHODS = ("fork", "spawn")
# None: fork where the platform has it and the device is not CUDA, otherwise spawn.
WORKER_START_METHOD: str | None = None
# After a report or a kill, how long to wait for the worker to be gone before SIGKILL again.
_WORKER_JOIN_SECONDS = 5.0

ProgressCallback = Callable[[str, "str | None", "list[Finding]"], None]
"""progress(phase, stage or None, findings so far): called at every phase change and launch."""


def interpreter_enabled() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def default_time_limit(device: str | torch.device | None = None) -> float | None:
    """The documented per-check limit for `device`: DEFAULT_INTERPRETER_TIME_LIMIT seconds on
    the Triton interpreter, None (no limit) on CUDA."""
    dev = torch.device(device) if device is not None else default_device()
    if dev.type == "cuda" and not interpreter_enabled():
        return None
    return DEFAULT_INTERPRETER_TIME_LIMIT


def check_time_limit(time_limit: object) -> float | None:
    """None, or a finite number of seconds in (0, MAX_TIME_LIMIT]; TypeError/ValueError otherwise."""
    if time_limit is None:
        return None
    if isinstance(time_limit, bool) or not isinstance(time_limit, (int, float)):
        raise TypeError(f"time_limit must be None or a number of seconds in (0, {MAX_TIME_LIMIT:g}], got {time_limit!r}")
    if not math.isfinite(time_limit) or not 0 < time_limit <= MAX_TIME_LIMIT:
        raise ValueError(f"time_limit must be None or a number of seconds in (0, {MAX_TIME_LIMIT:g}], got {time_limit!r}")
    return float(time_limit)


FIXED_SCHEDULES = ("identity", "reversed")
# The call-sequence oracle's smaller call has T // 16 tokens (at least 1): a decode-sized call
# beside a prefill-sized one, as an engine makes them. The interpreter's cost of a call is mostly
# per launch and per expert block, not per token: measured at E=8 K=2 H=I=128 fp8-token fused,
# a T=16 call takes 0.48 s, T=8 0.42 s, T=2 0.24 s, T=1 0.19 s, so T // 2 would make the oracle's
# two small calls cost nearly two full runs.
SMALL_CALL_DIVISOR = 16


def default_schedules(config: MoEConfig) -> tuple[str, ...]:
    """identity, reversed, then config.random_orders random orders seeded seed+1, seed+2, ...:
    different configs of a fuzz campaign get different orders, one config always the same."""
    return (*FIXED_SCHEDULES, *(f"random:{config.seed + 1 + i}" for i in range(config.random_orders)))


# The end-to-end output's derived bound (DifferentialRun._derived_output_bound): the effect of the
# candidate's own down-GEMM input, plus the down GEMM's per-stage slack (its forced row in the
# tolerance table) per routed row and the output's own rounding.
DERIVED_OUTPUT_REASON = (
    "the reference's down GEMM and reduce run on the candidate's own down-GEMM input give the exact effect of every "
    "upstream difference (moved e4m3 codes, silu ulps); plus the down GEMM's per-stage rule (ulps and floor) per "
    "routed row and 1 ulp for the output's rounding"
)
DEFAULT_IMPLEMENTATION = "optimized:make_implementation"
ALL_ORACLES = (
    Oracles.DIFFERENTIAL,
    Oracles.TEACHER_FORCING,
    Oracles.METAMORPHIC,
    Oracles.STATIC_ALIASING,
    Oracles.RUNTIME_ALIASING,
    Oracles.RACES,
    Oracles.STORE_EXTENT,
    Oracles.SCHEDULE,
    Oracles.POISON,
    Oracles.CALL_SEQUENCE,
    Oracles.RED_ZONE,
    Oracles.CONTRACT,
)


def load_factory(spec: str) -> ImplementationFactory:
    """'MODULE:FACTORY' -> the factory callable; a clear ValueError when it cannot be found."""
    if not isinstance(spec, str) or spec.count(":") != 1:
        raise ValueError(f"--impl must be MODULE:FACTORY (e.g. optimized:make_implementation), got {spec!r}")
    module_name, attr = spec.split(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"--impl module {module_name!r} cannot be imported: {exc}") from None
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise ValueError(f"--impl {spec!r}: module {module_name!r} has no callable {attr!r}")
    return factory


def resolve_oracles(oracles: Collection[str] | None) -> list[str]:
    if oracles is None:
        return list(ALL_ORACLES)
    unknown = sorted(set(oracles) - set(ALL_ORACLES))
    if unknown:
        raise ValueError(f"oracles must be among {list(ALL_ORACLES)}, got unknown {unknown}")
    return [o for o in ALL_ORACLES if o in oracles]


def resolve_schedules(schedules: Sequence[Schedule | str] | None, config: MoEConfig | None = None) -> list[Schedule]:
    """The schedules to run: the given ones, or default_schedules(config) (config=None: the
    default config's)."""
    items = default_schedules(config or MoEConfig()) if schedules is None else schedules
    parsed = [s if isinstance(s, Schedule) else Schedule.parse(s) for s in items]
    if not parsed:
        raise ValueError("schedules must name at least one schedule")
    return parsed


class _StageTracker:
    """Remembers the stage of the launch in flight, so a crash can name it, and tells the
    progress callback (a worker reports it to the parent, so a timeout can name it too)."""

    def __init__(self, on_stage: Callable[[str | None], None] | None = None) -> None:
        self.stage: str | None = None
        self.on_stage = on_stage

    def before_launch(self, launch: LaunchInfo) -> None:
        self.stage = launch.stage
        if self.on_stage is not None:
            self.on_stage(launch.stage)

    def after_launch(self, launch: LaunchInfo) -> None:
        pass


def _byte_view(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor's bytes as a flat uint8 tensor (a copy when it is not contiguous)."""
    return tensor.detach().reshape(-1).view(torch.uint8)


def _same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.equal(_byte_view(a), _byte_view(b))


class _InputWatch:
    """Bitwise copies of the problem's inputs: which input a run wrote, when, and restoring it.

    `attribute=True` (the first run) also compares every input before and after each launch,
    so a write made by host code between launches is told apart from one made by a launch.
    """

    def __init__(self, inputs: dict[str, torch.Tensor]) -> None:
        self.inputs = inputs
        self.pristine = {name: tensor.detach().clone() for name, tensor in inputs.items()}
        self.reported: set[str] = set()
        self.attribute = False
        self.blame: dict[str, tuple[str, str | None]] = {}

    def start(self, attribute: bool) -> None:
        self.attribute = attribute
        self.blame = {}

    def _newly_changed(self) -> list[str]:
        return [n for n, t in self.inputs.items() if n not in self.blame and not _same_bytes(t, self.pristine[n])]

    def before_launch(self, launch: LaunchInfo) -> None:
        if self.attribute:
            for name in self._newly_changed():
                self.blame[name] = (f"by code outside any launch, before {launch.kernel} (stage {launch.stage})", launch.stage)

    def after_launch(self, launch: LaunchInfo) -> None:
        if self.attribute:
            for name in self._newly_changed():
                self.blame[name] = (f"during the launch of {launch.kernel} (stage {launch.stage})", launch.stage)

    def _writer(self, name: str, log: LaunchLog | None) -> tuple[str, str | None] | None:
        """The first recorded launch whose writes cover bytes of input `name`."""
        if log is None:
            return None
        target = region_of(name, self.inputs[name])
        for launch in log:
            for region in launch.writes:
                if region.overlap(target) is not None:
                    return (f"by the launch of {launch.kernel} (stage {launch.stage}), which writes {region.name} "
                            f"over its bytes", launch.stage)
        return None

    def finish(self, what: str, log: LaunchLog | None = None) -> list[Finding]:
        """Findings for inputs changed since the copies were taken; every changed input is restored."""
        findings: list[Finding] = []
        for name, tensor in self.inputs.items():
            before = self.pristine[name]
            if _same_bytes(tensor, before):
                continue
            changed = int((_byte_view(tensor) != _byte_view(before)).sum())
            first = int((_byte_view(tensor) != _byte_view(before)).nonzero()[0, 0])
            how, stage = self._writer(name, log) or self.blame.get(name) or ("outside any reported launch", None)
            tensor.copy_(before)  # later runs, and the reference's view of the problem, see the original
            if name in self.reported:
                continue
            self.reported.add(name)
            findings.append(Finding(
                oracle=Oracles.CONTRACT, stage=stage, buffers=[name],
                message=f"input {name} was written during {what}, {how}: {changed} of {before.numel() * before.element_size()} "
                        "bytes changed (inputs belong to the caller and must not be written)",
                figures={"changed_bytes": changed, "first_changed_byte": first},
            ))
        return findings


class _RedZoneWatch:
    """Checks the guard bytes after every launch, so an out-of-bounds write is pinned to the
    stage and the buffers of the launch that made it (guards are re-armed after a hit)."""

    def __init__(self, guarded: GuardedWorkspaces, output: GuardedTensor | None) -> None:
        self.guarded, self.output = guarded, output
        self.findings: list[Finding] = []

    def check(self, stage: str | None = None, writes: Collection[str] = ()) -> None:
        found = self.guarded.check_red_zones() + (self.output.check_red_zones(Buffers.OUTPUT) if self.output else [])
        for f in found:
            f.stage = f.stage or stage
            if stage is not None:
                f.message += f" by a launch of stage {stage} writing {', '.join(writes)}"
                f.buffers = list(dict.fromkeys([*f.buffers, *writes]))
        if found:
            self.guarded.reset_guards()
            if self.output is not None:
                self.output.reset_guards()
        self.findings += found

    def before_launch(self, launch: LaunchInfo) -> None:
        pass

    def after_launch(self, launch: LaunchInfo) -> None:
        self.check(launch.stage, list(launch.writes))


@dataclass
class _Run:
    schedule: Schedule
    red_zones: list[Finding]
    output: torch.Tensor
    buffers: dict[str, torch.Tensor]  # every materialised buffer, snapshotted after its stage
    log: LaunchLog
    returned: torch.Tensor | None = None  # the tensor run() returned (not a copy)
    reported: set[str] = field(default_factory=set)  # intermediates run() returned itself


class _Crash(Exception):
    def __init__(self, finding: Finding):
        super().__init__(finding.message)
        self.finding = finding


def _crash_finding(exc: BaseException, stage: str | None, what: str) -> Finding:
    frames = traceback.extract_tb(exc.__traceback__)
    where = f"{frames[-1].filename}:{frames[-1].lineno}" if frames else "?"
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


class DifferentialRun:
    """The state of one `run_differential` call; each oracle is one method."""

    def __init__(self, config: MoEConfig, factory: ImplementationFactory, oracles: list[str],
                 schedules: list[Schedule], device: torch.device, name: str,
                 problem: Problem | None = None, progress: ProgressCallback | None = None):
        self.config = config
        self.factory = factory
        self.oracles = oracles
        self.schedules = schedules
        self.device = device
        # the tolerance table's backend axis: compiled CUDA kernels, or the interpreter on any device
        self._tolerance_backend = "cuda" if device.type == "cuda" and not interpreter_enabled() else "interpreter"
        self.name = name
        self.findings: list[Finding] = []
        self._progress = progress
        self.phase = "building the problem and the reference"
        self._report_progress(None)
        self.problem: Problem = make_problem(config, device) if problem is None else problem
        self.reference = reference_moe(self.problem)
        self._problem_inputs = set(self.problem.inputs())
        self.inputs = _InputWatch(self.problem.inputs())

    # ---- progress -------------------------------------------------------------------
    def _report_progress(self, stage: str | None) -> None:
        if self._progress is not None:
            self._progress(self.phase, stage, self.findings)

    def _enter(self, phase: str) -> None:
        self.phase = phase
        self._report_progress(None)

    # ---- running the implementation -------------------------------------------------
    def _call(self, what: str, fn, *args):
        """fn(*args) for one of the implementation's own methods; an exception is a crash finding."""
        self._enter(what)
        try:
            return fn(*args)
        except Exception as exc:  # noqa: BLE001 - every failure of the implementation is a finding
            raise _Crash(_crash_finding(exc, None, what)) from exc

    def _build(self, config: MoEConfig):
        """A new instance, its private buffers poisoned: every torch.empty it makes while being
        built is filled (NaN floats, the largest integers), so a run that reads a private
        buffer (a scale, sorted ids) before writing it computes on poison, not on zeros or
        on what an earlier instance happened to leave in the allocator."""
        with _allocations_poisoned():
            return self._call(f"building the implementation for {config.short()}", self.factory, config)

    def _shapes(self, impl, max_tokens: int) -> tuple[int, ...]:
        shapes = self._call(f"workspace_shapes({max_tokens})", impl.workspace_shapes, max_tokens)
        try:
            counted = tuple(int(n) for n in shapes)
        except (TypeError, ValueError):
            counted = ()
        if len(counted) != 2 or min(counted) < 0:
            raise _Crash(Finding(
                oracle=Oracles.CONTRACT,
                message=f"workspace_shapes({max_tokens}) must return two byte counts (ws1, ws2), got {quoted(shapes)}",
            ))
        return counted

    def _plan(self, impl, num_tokens: int) -> WorkspacePlan:
        plan = self._call(f"workspace_plan({num_tokens})", impl.workspace_plan, num_tokens)
        if not isinstance(plan, WorkspacePlan):
            raise _Crash(Finding(
                oracle=Oracles.CONTRACT,
                message=f"workspace_plan({num_tokens}) must return a diffmoe.contract.WorkspacePlan, got {type(plan).__name__}",
            ))
        return plan

    def _execute(self, impl, guarded: GuardedWorkspaces, output: GuardedTensor | None, schedule: Schedule,
                 poison: int | None, extra_recorder=None, problem: Problem | None = None, what: str | None = None,
                 attribute_input_writes: bool = False, poison_workspaces: int | None = None) -> _Run:
        """One call. poison: the pattern for the workspaces and the output, or None to keep what
        the previous call left (call-sequence); poison_workspaces: a pattern for the workspaces
        alone (the output keeps its own)."""
        what = what or f"the run under schedule {schedule}"
        self._enter(what)
        if poison is not None:
            guarded.poison(poison)
            if output is not None:
                output.poison(poison)
        elif poison_workspaces is not None:
            guarded.poison(poison_workspaces)
        log = LaunchLog(snapshot=True)
        tracker = _StageTracker(self._report_progress)
        watch = _RedZoneWatch(guarded, output)
        self.inputs.start(attribute_input_writes)
        recorder = ChainedRecorder(tracker, log, watch, self.inputs if attribute_input_writes else None, extra_recorder)
        try:
            with _numpy_quiet():
                result = impl.run(problem or self.problem, guarded.workspaces, output=output.tensor if output else None,
                                  schedule=schedule, recorder=recorder)
        except Exception as exc:  # noqa: BLE001
            self.findings += self.inputs.finish(what, log)
            raise _Crash(_crash_finding(exc, tracker.stage, what)) from exc
        self.findings += self.inputs.finish(what, log)
        returned = getattr(result, "output", None)
        intermediates = getattr(result, "intermediates", {})
        if not isinstance(returned, torch.Tensor) or not isinstance(intermediates, dict):
            raise _Crash(Finding(
                oracle=Oracles.CONTRACT, stage=tracker.stage, buffers=[Buffers.OUTPUT],
                message=f"{what} returned {type(result).__name__}; run() must return a RunResult whose output is a "
                        "tensor and whose intermediates are a dict",
            ))
        out = returned.detach().clone()
        buffers = dict(log.snapshots)
        for name, tensor in intermediates.items():
            if isinstance(tensor, torch.Tensor):
                buffers.setdefault(name, tensor.detach().clone())
        buffers[Buffers.OUTPUT] = out
        watch.check()  # writes made outside any reported launch
        return _Run(schedule, watch.findings, out, buffers, log, returned, set(intermediates))

    def run(self) -> None:
        cfg = self.config
        impl = self._build(cfg)
        t = self.problem.num_tokens
        plan = self._plan(impl, t)
        # workspaces are allocated once for the largest batch, as an engine does; the plan is the call's
        shapes = self._shapes(impl, cfg.num_tokens)
        if Oracles.STATIC_ALIASING in self.oracles:
            self._enter("the static aliasing check")
            self.findings += check_static_aliasing(plan)
        fit = check_workspace_fit(plan, shapes)
        if fit:
            self.findings += fit  # an undersized workspace is reported before any launch
            return
        guarded = GuardedWorkspaces(shapes, self.device)
        output = None
        if cfg.output == "separate":
            output = GuardedTensor((t, cfg.hidden), torch.bfloat16, self.device)
        runs: list[_Run] = []
        # With call-sequence selected, the last order's run is made by that oracle, on a fresh
        # instance right after a smaller call (see _check_call_sequence): one run serves both.
        sequenced = Oracles.CALL_SEQUENCE in self.oracles and t >= 2
        merged_order = self.schedules[-1] if sequenced and len(self.schedules) >= 2 else None
        for index, schedule in enumerate(self.schedules[:-1] if merged_order is not None else self.schedules):
            # every order after the first on a fresh instance: state the first run left in a
            # private buffer must not mask a wrong order in the next
            instance = impl if index == 0 else self._build(cfg)
            race_recorder = self._race_recorder(guarded, output) if index == 0 else None
            if race_recorder is not None:
                with race_recorder:
                    run = self._execute(instance, guarded, output, schedule, POISON_PATTERNS[0], race_recorder,
                                        attribute_input_writes=True)
                if Oracles.RACES in self.oracles:
                    self.findings += race_recorder.findings()
                if Oracles.STORE_EXTENT in self.oracles:
                    self.findings += race_recorder.store_extent_findings()
            else:
                run = self._execute(instance, guarded, output, schedule, POISON_PATTERNS[0],
                                    attribute_input_writes=index == 0)
            runs.append(run)
            self._check_run(run, guarded, output, first=index == 0)
        if sequenced:
            self._check_call_sequence(impl, guarded, output, runs, shapes, poison=Oracles.POISON in self.oracles,
                                      merged_order=merged_order)
        self._check_schedules(runs)
        # with call-sequence selected, the poison oracle's second run was its T call on a fresh pair
        if Oracles.POISON in self.oracles and not sequenced:
            again = self._execute(self._build(cfg), guarded, output, self.schedules[0], POISON_PATTERNS[1],
                                  what=f"the run under schedule {self.schedules[0]} and the second poison")
            self._check_poison(runs[0], again)
        if t == 0:
            return  # a zero-token call: no stage has anything to teacher-force or compare across fusion
        if Oracles.TEACHER_FORCING in self.oracles and hasattr(impl, "run_stage"):
            self._teacher_force(impl)
        if Oracles.METAMORPHIC in self.oracles and cfg.is_fp8:
            try:
                self._metamorphic(runs[0])
            except _Crash as crash:  # the sibling's crash is this check's finding; the rest stands
                crash.finding.message = f"metamorphic sibling (fused={not cfg.fused}): {crash.finding.message}"
                self.findings.append(crash.finding)

    def _race_recorder(self, guarded: GuardedWorkspaces, output: GuardedTensor | None):
        """The interpreter's address recorder, behind the races and store-extent oracles."""
        if Oracles.RACES not in self.oracles and Oracles.STORE_EXTENT not in self.oracles:
            return None
        from .oracles import interpreter_races  # imports triton: only when these oracles run

        supported, _why = interpreter_races.races_supported()
        if not supported:
            return None
        ws1, ws2 = guarded.workspaces
        named = {"ws1": ws1, "ws2": ws2, **({Buffers.OUTPUT: output.tensor} if output is not None else {})}
        return interpreter_races.RaceRecorder(named)

    # ---- oracles ------------------------------------------------------------------------
    def _check_run(self, run: _Run, guarded: GuardedWorkspaces, output: GuardedTensor | None, first: bool) -> None:
        """The checks of one run. The differential, the contract and runtime aliasing judge the
        first order's run; every later order is judged against it, bitwise, by the schedule
        oracle (a later order that computes something else is an order dependence, reported as
        one, not a second differential finding)."""
        if Oracles.RED_ZONE in self.oracles:
            for f in run.red_zones:
                f.figures["schedule"] = str(run.schedule)
            self.findings += run.red_zones
        if Oracles.CONTRACT in self.oracles and first:
            self._check_contract(run, output)
        if Oracles.RUNTIME_ALIASING in self.oracles and first:
            names = guarded.region_names()
            if output is not None:
                names.update(output.region_names(Buffers.OUTPUT))
            for name, tensor in self.problem.inputs().items():
                names[tensor.untyped_storage().data_ptr()] = name
            self.findings += check_runtime_aliasing(run.log, names)
        if Oracles.DIFFERENTIAL in self.oracles and first:
            self._differential(run)

    def _differential(self, run: _Run) -> None:
        """Every stage judged on the candidate's own inputs, pipeline order, the first divergent
        stage named; then the output against the reference's, within the derived bound.

        Each stage's writes are compared with the reference stage run on the very buffers the
        candidate's stage read (its snapshots), under the tight per-stage rules of the tolerance
        table (quantisation bitwise, GEMMs ULP-bounded), so a legitimate one-ulp difference early
        on is never carried into a later stage's verdict: the rules compose. The end-to-end output
        is then held to the effect of the differences the candidate legitimately has (see
        _derived_output_bound), not to a fixed elementwise tolerance."""
        failed: list[tuple[str, Comparison]] = []
        for stage in pipeline_stages(self.config):
            if not all(n in run.buffers or n in self._problem_inputs for n in stage.reads):
                continue  # an input the candidate never reported: nothing to feed the reference
            written = [n for n in stage.writes if n in run.buffers]
            if not written:
                continue
            want = self._reference_stage(stage.name, {n: run.buffers[n] for n in stage.reads if n in run.buffers})
            for name in written:
                rule = rule_for(self.config.quant, name, FORCED, fused=stage.name == Stages.ACT_QUANT,
                                backend=self._tolerance_backend)
                if isinstance(want, str):
                    c = Comparison(name, False, rule, 0, run.buffers[name].numel(), 0, 0.0, problem=want)
                else:
                    c = compare(name, want[name], run.buffers[name], rule)
                if not c.ok:
                    failed.append((stage.name, c))
        extra: dict[str, Any] = {}
        if not failed:
            derived = self._derived_output_bound(run)
            if derived is None:
                return
            bound, extra = derived
            c = compare(Buffers.OUTPUT, self.reference.output, run.buffers[Buffers.OUTPUT],
                        Rule.derived(DERIVED_OUTPUT_REASON), bound=bound)
            if c.ok:
                return
            failed.append((Stages.REDUCE, c))
            extra["judged_against"] = "the reference's own output"
        stage, first = failed[0]
        figures = {"schedule": str(run.schedule), "judged_on": "the candidate's own inputs", **first.figures(), **extra}
        if len(failed) > 1:
            figures["also_divergent"] = [c.name for _, c in failed[1:]]
        self.findings.append(Finding(
            oracle=Oracles.DIFFERENTIAL, stage=stage, buffers=[first.name],
            message=f"first divergent stage is {stage}: {first.summary()}", figures=figures,
        ))

    def _reference_stage(self, stage: str, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor] | str:
        """The reference's stage on the candidate's buffers, or why it cannot run on them."""
        try:
            with _numpy_quiet():
                return reference_stage(stage, inputs, self.problem)
        except Exception as exc:  # noqa: BLE001 - a malformed candidate buffer is the candidate's fault
            return f"the reference cannot run stage {stage} on the candidate's buffers ({type(exc).__name__}: {exc})"

    def _derived_output_bound(self, run: _Run) -> tuple[torch.Tensor, dict] | None:
        """The bound the end-to-end output is held to, per element, and the figures behind it.

        Every upstream difference a candidate may legitimately have (a silu ulp, a moved e4m3
        code) reaches the output only through the down GEMM's input, so the reference's down GEMM
        and reduce are run on the candidate's down-GEMM input: |that output - the reference's|
        is exactly the effect of those differences. On top: what the down GEMM's per-stage rule
        allows (on the interpreter 2 bf16 ulp + 2^-10 per routed row, summed over K; the reduce's is
        bitwise) and the output's own bf16 rounding (1 ulp). None when the candidate did not
        report the buffers."""
        cfg = self.config
        down_in = ((Buffers.QUANTED_DOWN_INPUT, Buffers.QUANTED_DOWN_INPUT_SCALES) if cfg.is_fp8
                   else (Buffers.ACTIVATION_OUTPUT,))
        if not all(n in run.buffers for n in (*down_in, Buffers.OUTPUT)):
            return None
        down = self._reference_stage(Stages.DOWN_GEMM, {n: run.buffers[n] for n in down_in})
        if isinstance(down, str):
            return None
        via = self._reference_stage(Stages.REDUCE, down)
        if isinstance(via, str):
            return None
        t, k, h = self.problem.num_tokens, cfg.topk, cfg.hidden
        down_v = down[Buffers.DOWN_OUTPUT].double().view(t, k, h)  # [T, K, H]
        via_v = via[Buffers.OUTPUT].double()  # [T, H]
        effect = (via_v - self.reference.output.double()).abs()  # [T, H] what the candidate's inputs change
        down_rule = rule_for(cfg.quant, Buffers.DOWN_OUTPUT, FORCED, backend=self._tolerance_backend)
        slack = (down_rule.max_ulp * _bf16_ulp(down_v) + down_rule.atol).sum(dim=1) + _bf16_ulp(via_v)  # [T, H]
        bound = torch.nan_to_num(effect + slack, nan=math.inf)  # a NaN input is judged per stage, not here
        figures: dict[str, Any] = {"max_effect_of_inputs": float(torch.nan_to_num(effect, nan=0.0).max()) if effect.numel() else 0.0}
        if cfg.is_fp8 and Buffers.QUANTED_DOWN_INPUT in self.reference.intermediates:
            moved = run.buffers[Buffers.QUANTED_DOWN_INPUT].view(torch.uint8) != \
                self.reference.intermediates[Buffers.QUANTED_DOWN_INPUT].view(torch.uint8)
            figures["moved_down_input_codes"] = int(moved.sum())
        return bound, figures

    def _check_schedules(self, runs: list[_Run]) -> None:
        if Oracles.SCHEDULE not in self.oracles or len(runs) < 2:
            return
        base = runs[0]
        for other in runs[1:]:
            c = self._first_bitwise_divergence(base, other, "the same inputs under another program order")
            if c is not None:
                self.findings.append(Finding(
                    oracle=Oracles.SCHEDULE, stage=producer_stage(self.config, c.name), buffers=[c.name],
                    message=f"{c.name} changes with the program order: {base.schedule} vs {other.schedule} "
                            f"differ in {c.differing} of {c.total} elements (first divergent buffer)",
                    figures={"schedules": [str(base.schedule), str(other.schedule)], **c.figures()},
                ))

    def _first_bitwise_divergence(self, first: _Run, second: _Run, why: str) -> Comparison | None:
        """The first buffer, pipeline order, whose bits differ between two runs of this config."""
        for name in materialised_buffers(self.config):
            if name in first.buffers and name in second.buffers:
                c = compare(name, first.buffers[name], second.buffers[name], Rule.bitwise(why))
                if not c.ok:
                    return c
        return None

    def _check_poison(self, first: _Run, again: _Run, tokens: int | None = None) -> None:
        c = self._first_bitwise_divergence(first, again, "the same call under another poison")
        if c is not None:
            call = "" if tokens is None else f" (the T={tokens} call)"
            self.findings.append(Finding(
                oracle=Oracles.POISON, stage=producer_stage(self.config, c.name), buffers=[c.name],
                message=f"{c.name}{call} depends on workspace bytes written before this call (stale or uninitialised "
                        f"read): poison 0x{POISON_PATTERNS[0]:02X} vs 0x{POISON_PATTERNS[1]:02X} differ in "
                        f"{c.differing} of {c.total} elements",
                figures={**({"tokens": tokens} if tokens is not None else {}), **c.figures()},
            ))

    def _check_call_sequence(self, impl, guarded: GuardedWorkspaces, output: GuardedTensor | None, runs: list[_Run],
                             shapes: tuple[int, ...], poison: bool, merged_order: Schedule | None) -> None:
        """A call must not depend on the calls before it. An engine reuses one implementation and
        one pair of workspaces for every batch, and the seed bug lived in that reuse: a kernel that
        reduces over the workspace capacity, or keeps a scale from an earlier call, is right on a
        lone call. So, bitwise:

        1. a small call (T // SMALL_CALL_DIVISOR tokens, at least 1) right after the T call
           (runs[0]), on the same instance and unpoisoned workspaces, against the small call on
           a fresh instance and fresh workspaces;
        2. on that fresh pair, the T call right after the small call, against the T call on its own.

        The T call of (2) does three jobs, so a passing check pays for two small runs and no
        extra T run: it runs under `merged_order` (the last program order, whose run the
        schedule oracle then judges, appended to `runs`), and with the poison oracle selected
        the fresh pair is poisoned with the second pattern, making it the poison oracle's second
        run too (a T call that reads bytes written before it sees the first pattern in runs[0],
        and the small call's bytes or the second pattern here). Only when it diverges from runs[0]
        are the runs made that tell the causes apart: the T call on its own under that order
        (the schedule oracle's run, judged bitwise against runs[0]), then under the second pattern
        (the poison oracle's), each on a fresh instance and fresh workspaces."""
        large = runs[0]
        t_large = self.problem.num_tokens
        t_small = max(1, t_large // SMALL_CALL_DIVISOR)
        small = _first_tokens(self.problem, t_small)
        first_order = self.schedules[0]
        order = merged_order or first_order
        fresh_poison = POISON_PATTERNS[1] if poison else POISON_PATTERNS[0]

        def out_for(t: int, pattern: int) -> GuardedTensor | None:
            """A caller's fresh output for a call, poisoned: the workspaces carry state from call to
            call, the output is the caller's new tensor each time."""
            if output is None:
                return None
            out = GuardedTensor((t, self.config.hidden), torch.bfloat16, self.device)
            out.poison(pattern)
            return out

        def alone(problem: Problem | None, t: int, pattern: int, schedule: Schedule) -> _Run:
            return self._execute(self._build(self.config), GuardedWorkspaces(shapes, self.device), out_for(t, pattern), schedule,
                                 pattern, problem=problem,
                                 what=f"the T={t} call under schedule {schedule} on a fresh instance and fresh "
                                      f"workspaces, poison 0x{pattern:02X}")

        def diverges(a: _Run, b: _Run) -> bool:
            return self._first_bitwise_divergence(a, b, "") is not None

        after_large = self._execute(impl, guarded, out_for(t_small, POISON_PATTERNS[0]), first_order, None, problem=small,
                                    what=f"the T={t_small} call right after the T={t_large} call (same workspaces)")
        fresh = self._build(self.config)
        fresh_ws = GuardedWorkspaces(shapes, self.device)
        # the small call's output under the first pattern, as after_large's: its comparison is
        # about the workspaces' state, not the output's
        small_alone = self._execute(fresh, fresh_ws, out_for(t_small, POISON_PATTERNS[0]), first_order, None,
                                    problem=small, poison_workspaces=fresh_poison,
                                    what=f"the T={t_small} call on a fresh instance and fresh workspaces")
        after_small = self._execute(fresh, fresh_ws, out_for(t_large, fresh_poison), order, None,
                                    what=f"the T={t_large} call under schedule {order} right after the T={t_small} "
                                         "call (same workspaces)")
        diverged = diverges(large, after_small)

        # (2)'s T call on its own, under the order of after_small and the first pattern
        large_alone = large
        if merged_order is not None:
            ordered = alone(None, t_large, POISON_PATTERNS[0], order) if diverged else after_small
            self._check_run(ordered, guarded, output, first=False)
            runs.append(ordered)
            large_alone = ordered
        if diverged and poison:
            second = alone(None, t_large, fresh_poison, order)
            self._check_poison(large_alone, second)
            large_alone = second
        # (1)'s small call on its own under the first pattern (the earlier T call ran on it), when
        # the one under the second pattern differs
        if poison and diverges(small_alone, after_large):
            small_first = alone(small, t_small, POISON_PATTERNS[0], first_order)
            if not any(f.oracle == Oracles.POISON for f in self.findings):
                self._check_poison(small_first, small_alone, tokens=t_small)
            small_alone = small_first
        comparisons = [(after_large, small_alone, t_large, t_small)]
        if diverged:  # otherwise after_small is bitwise the T call on its own (runs[0])
            comparisons.append((after_small, large_alone, t_small, t_large))
        for run, reference, earlier, t_call in comparisons:
            c = self._first_bitwise_divergence(reference, run, "the same call, with or without an earlier call")
            if c is None:
                continue
            self.findings.append(Finding(
                oracle=Oracles.CALL_SEQUENCE, stage=producer_stage(self.config, c.name), buffers=[c.name],
                message=f"{c.name} of a T={t_call} call changes when a T={earlier} call ran before it on the same "
                        f"implementation and workspaces: {c.differing} of {c.total} elements differ from the call "
                        "made on its own (state left by the earlier call: stale rows, scales or private buffers)",
                figures={"tokens": t_call, "earlier_tokens": earlier, **c.figures()},
            ))

    def _check_contract(self, run: _Run, output: GuardedTensor | None) -> None:
        cfg = self.config
        t = self.problem.num_tokens
        out = run.output
        want = (t, cfg.hidden)
        if tuple(out.shape) != want or out.dtype != torch.bfloat16 or out.device.type != self.device.type:
            self.findings.append(Finding(
                oracle=Oracles.CONTRACT, stage=Stages.REDUCE, buffers=[Buffers.OUTPUT],
                message=f"output must be {list(want)} bfloat16 on {self.device.type}, got {list(out.shape)} "
                        f"{out.dtype} on {out.device.type}",
            ))
        if output is not None and run.returned is not None and (
            run.returned.data_ptr() != output.tensor.data_ptr() or run.returned.shape != output.tensor.shape
        ):
            self.findings.append(Finding(
                oracle=Oracles.CONTRACT, stage=Stages.REDUCE, buffers=[Buffers.OUTPUT],
                message="run() was given an output tensor but returned a different tensor; the result must be "
                        "written into the caller's output",
            ))
        declared = set(materialised_buffers(cfg))
        inputs = set(self.problem.inputs())
        for launch in run.log:
            for region in launch.writes:
                if region.name in inputs:
                    self.findings.append(Finding(
                        oracle=Oracles.CONTRACT, stage=launch.stage, buffers=[region.name],
                        message=f"launch {launch.kernel} declares a write to the input {region.name}; inputs belong "
                                "to the caller and must not be written",
                    ))
                elif region.name not in declared and region.name not in _PRIVATE_BUFFERS:
                    self.findings.append(Finding(
                        oracle=Oracles.CONTRACT, stage=launch.stage, buffers=[region.name],
                        message=f"launch {launch.kernel} writes {region.name!r}, which the pipeline does not declare",
                    ))
        # A materialised buffer that no launch reports writing was never snapshotted, so the
        # differential could not judge it. Not applicable to a zero-token call (nothing is
        # written) or to an implementation that reports no launch at all (it computes outside
        # launches and returns its intermediates).
        if t == 0 or not len(run.log):
            return
        written = {region.name for launch in run.log for region in launch.writes} | run.reported
        for name in materialised_buffers(cfg):
            if name not in written:
                stage = producer_stage(cfg, name)
                self.findings.append(Finding(
                    oracle=Oracles.CONTRACT, stage=stage, buffers=[name],
                    message=f"{name} is materialised by stage {stage}, but no launch reported writing it (nor did run() "
                            "return it among its intermediates), so the bytes compared were never computed",
                ))

    def _teacher_force(self, impl) -> None:
        """Each stage on the reference's inputs, judged with the forced rules."""
        ref = self.reference.intermediates
        self._enter("teacher forcing")
        for stage in pipeline_stages(self.config):
            self._report_progress(stage.name)
            # copies: a stage writing into its inputs must not change the reference for later stages
            inputs = {n: ref[n].clone() for n in stage.reads if n in ref}
            what = f"teacher-forced stage {stage.name}"
            self.inputs.start(False)
            try:
                with _numpy_quiet():
                    outputs = impl.run_stage(stage.name, inputs, self.problem)
            except Exception as exc:  # noqa: BLE001
                self.findings += self.inputs.finish(what)
                self.findings.append(_crash_finding(exc, stage.name, what))
                continue
            self.findings += self.inputs.finish(what)
            if not isinstance(outputs, dict):
                self.findings.append(Finding(
                    oracle=Oracles.CONTRACT, stage=stage.name,
                    message=f"{what}: run_stage must return a dict of its outputs, got {type(outputs).__name__}",
                ))
                continue
            for name in stage.writes:
                if name not in outputs or name not in ref:
                    continue
                rule = rule_for(self.config.quant, name, FORCED, fused=stage.name == Stages.ACT_QUANT,
                                backend=self._tolerance_backend)
                c = compare(name, ref[name], outputs[name], rule)
                if not c.ok:
                    self.findings.append(Finding(
                        oracle=Oracles.TEACHER_FORCING, stage=stage.name, buffers=[name],
                        message=f"stage {stage.name} on the reference's inputs: {c.summary()}",
                        figures=c.figures(),
                    ))

    def _metamorphic(self, run: _Run) -> None:
        """fused and unfused optimized runs must give bitwise the same quanted_down_input."""
        sibling_cfg = self.config.replace(fused=not self.config.fused)
        sibling = self._build(sibling_cfg)
        shapes = self._shapes(sibling, sibling_cfg.num_tokens)
        guarded = GuardedWorkspaces(shapes, self.device)
        t = self.problem.num_tokens
        output = GuardedTensor((t, sibling_cfg.hidden), torch.bfloat16, self.device) \
            if sibling_cfg.output == "separate" else None
        # the same inputs (the fused flag does not enter problem generation), under the sibling's config
        other = self._execute(sibling, guarded, output, self.schedules[0], POISON_PATTERNS[0],
                              problem=replace(self.problem, config=sibling_cfg),
                              what=f"the metamorphic run with fused={sibling_cfg.fused}")
        for name in (Buffers.QUANTED_DOWN_INPUT, Buffers.QUANTED_DOWN_INPUT_SCALES):
            if name not in run.buffers or name not in other.buffers:
                continue
            c = compare(name, run.buffers[name], other.buffers[name], Rule.bitwise("fusion must not change the bits"))
            if not c.ok:
                self.findings.append(Finding(
                    oracle=Oracles.METAMORPHIC, stage=producer_stage(self.config, name), buffers=[name],
                    message=f"fused={self.config.fused} and fused={sibling_cfg.fused} disagree on {c.summary()}",
                    figures=c.figures(),
                ))


def _bf16_ulp(x: torch.Tensor) -> torch.Tensor:
    """One bf16 ulp at |x| (float64; the subnormal step below 2^-126)."""
    exponent = torch.floor(torch.log2(x.abs().clamp_min(2.0**-126)))
    return torch.pow(2.0, exponent - 7)


def _first_tokens(problem: Problem, num_tokens: int) -> Problem:
    """The call made of the first `num_tokens` tokens of `problem` (fresh tensors, same weights),
    as make_problem(config, num_tokens=...) builds it, for generated and given problems alike."""
    return replace(problem, **{name: getattr(problem, name)[:num_tokens].clone()
                               for name in ("hidden_states", "topk_ids", "topk_weights")})


# Implementation-private buffers a launch may write besides the declared pipeline buffers.
_PRIVATE_BUFFERS = {Buffers.AMAX_PARTIALS, Buffers.SORTED_TOKEN_IDS, Buffers.EXPERT_IDS, Buffers.NUM_TOKENS_POST_PADDED}


def default_device() -> torch.device:
    # with an index: tensors report cuda:N, and torch.device("cuda") != torch.device("cuda:0")
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


def _check_problem_argument(problem: object, config: MoEConfig) -> Problem:
    if not isinstance(problem, Problem):
        raise TypeError(f"problem must be None or a diffmoe.problem.Problem, got {type(problem).__name__}")
    if problem.config != config:
        raise ValueError(f"problem.config must be the config being checked ({config.short()}), got {problem.config.short()}")
    if not 0 <= problem.num_tokens <= config.num_tokens:
        raise ValueError(f"problem must have 0..{config.num_tokens} tokens (config.num_tokens), got {problem.num_tokens}")
    return problem


def _inputs_note(problem: Problem | None) -> str | None:
    if problem is None:
        return None
    return f"given to run_differential (T={problem.num_tokens} of {problem.config.num_tokens}), not regenerated by the replay command"


def run_differential(
    config: MoEConfig,
    implementation: ImplementationFactory | None = None,
    *,
    schedules: Sequence[Schedule | str] | None = None,
    oracles: Collection[str] | None = None,
    device: str | torch.device | None = None,
    implementation_name: str = "optimized",
    problem: Problem | None = None,
    time_limit: float | None = None,
) -> Report:
    """Run the reference and `implementation` (default: the optimized Triton MoE) on the
    problem of `config` and judge them with the selected oracles.

    problem: the inputs to judge instead of `make_problem(config)`; its config must be
        `config` and it may hold 0..config.num_tokens tokens (`make_problem(config,
        num_tokens=0)` is a zero-token call). The report says the inputs were given, since
        its replay command rebuilds the generated ones.
    time_limit: None (default) runs the check in this process, so an implementation's state
        and a debugger behave as usual. A number of seconds runs it in a worker process
        (fork on a CPU device where the platform has it, spawn otherwise: a forked child
        cannot use CUDA; under spawn the factory must be picklable), which is killed, with
        everything it started, once the limit passes; the Report then has a `timeout`
        finding naming the phase and stage in flight, after the findings made so far. The
        limit bounds the silence between progress events (a phase or a launch starting), not
        the whole check: a slow check that keeps launching is never a timeout, a launch that
        runs `time_limit` seconds without finishing is. `default_time_limit()` is the limit
        the CLI applies when none is given.
    """
    if not isinstance(config, MoEConfig):
        raise TypeError(f"config must be a MoEConfig, got {type(config).__name__}")
    config.validate()
    limit = check_time_limit(time_limit)
    chosen = resolve_oracles(oracles)
    parsed = resolve_schedules(schedules, config)
    if problem is not None:
        _check_problem_argument(problem, config)
    if implementation is not None and not callable(implementation):
        raise TypeError(f"implementation must be a factory callable (config -> implementation), got {implementation!r}")
    dev = torch.device(device) if device is not None else default_device()
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    if problem is not None and problem.device != dev:
        problem = problem.to(dev)
    job = _Job(config, implementation, chosen, parsed, dev, implementation_name, problem)
    if limit is None:
        return job.run()
    return _run_in_worker(job, limit)


@dataclass
class _Job:
    """Everything one check needs; what a worker process receives."""

    config: MoEConfig
    implementation: ImplementationFactory | None
    oracles: list[str]
    schedules: list[Schedule]
    device: torch.device
    implementation_name: str
    problem: Problem | None

    def report(self, findings: list[Finding], seconds: float) -> Report:
        return Report(
            config=self.config,
            implementation=self.implementation_name,
            oracles=list(self.oracles),
            schedules=[str(s) for s in self.schedules],
            findings=findings,
            seconds=seconds,
            inputs=_inputs_note(self.problem),
        )

    def run(self, progress: ProgressCallback | None = None) -> Report:
        start = time.perf_counter()
        factory = self.implementation or load_factory(DEFAULT_IMPLEMENTATION)
        state = DifferentialRun(self.config, factory, self.oracles, self.schedules, self.device,
                                self.implementation_name, self.problem, progress)
        try:
            state.run()
        except _Crash as crash:
            state.findings.append(crash.finding)
        return self.report(state.findings, time.perf_counter() - start)


# ---- the worker process -------------------------------------------------------------------


class WorkerError(RuntimeError):
    """run_differential itself failed inside the worker (not the implementation: that is a
    finding); carries the worker's traceback text."""


def worker_start_method(device: torch.device) -> str:
    """WORKER_START_METHOD if set, else fork on a CPU device where available, else spawn."""
    if WORKER_START_METHOD is not None:
        if WORKER_START_METHOD not in WORKER_START_METHODS:
            raise ValueError(f"WORKER_START_METHOD must be None or one of {list(WORKER_START_METHODS)}, got {WORKER_START_METHOD!r}")
        return WORKER_START_METHOD
    if device.type == "cuda" or "fork" not in multiprocessing.get_all_start_methods():
        return "spawn"
    return "fork"


_DEFERRED_SIGNALS = {signal.SIGINT, signal.SIGTERM}


@contextmanager
def _allocations_poisoned() -> Iterator[None]:
    """torch's fill_uninitialized_memory, which needs deterministic mode (warn_only: an op
    without a deterministic kernel still runs); both restored afterwards.

    The mode is set through torch._C: the public torch.use_deterministic_algorithms also
    imports torch._inductor to mirror the flag there, which costs 4.3 s on first use (measured,
    torch 2.13 CPU, `python -X importtime`), once per check process; nothing here compiles."""
    set_mode = getattr(torch._C, "_set_deterministic_algorithms", None) or torch.use_deterministic_algorithms
    mode, warn_only = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    fill = torch.utils.deterministic.fill_uninitialized_memory
    set_mode(True, warn_only=True)
    torch.utils.deterministic.fill_uninitialized_memory = True
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*does not have a deterministic implementation.*")
            yield
    finally:
        torch.utils.deterministic.fill_uninitialized_memory = fill
        set_mode(mode, warn_only=warn_only)


@contextmanager
def _numpy_quiet() -> Iterator[None]:
    """Poisoned workspaces and NaN/Inf input rows are NaN on purpose; the interpreter computes on
    them with numpy, whose floating-point warnings (and nanmax's "All-NaN slice") would only bury
    the findings."""
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="All-NaN slice encountered", category=RuntimeWarning)
        yield


@contextmanager
def _signals_deferred() -> Iterator[None]:
    """Hold SIGINT and SIGTERM while a worker is forked or stopped; they arrive when the block
    ends. A Python handler (the CLI turns SIGTERM into KeyboardInterrupt) that ran inside
    fork's at-fork hooks would have its exception printed and dropped, so the interrupt would
    be lost; one that ran halfway through stopping the worker could leave it running."""
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, _DEFERRED_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _worker_main(conn, job, env: dict[str, str], forked: bool) -> None:
    """The worker: run the job, stream progress and findings, send the Report as JSON."""
    # Before anything imports Triton: under spawn the job (its factory) is still pickled bytes.
    os.environ.update(env)
    if forked:
        # GNU OpenMP's thread pool does not survive fork: the child's first parallel torch op
        # waits forever for threads that do not exist. One thread never enters the pool.
        # The reference and the implementation both run in this process, so they still see
        # the same numerics as each other.
        torch.set_num_threads(1)
    try:
        os.setpgid(0, 0)  # its own process group: the parent kills the group, a terminal's Ctrl-C reaches the parent only
    except OSError:
        pass
    for signum in _DEFERRED_SIGNALS:
        signal.signal(signum, signal.SIG_DFL)  # not the CLI's handlers, inherited by fork
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _DEFERRED_SIGNALS)  # blocked by the parent across the start
    sent = [0]

    def progress(phase: str, stage: str | None, findings: list[Finding]) -> None:
        fresh = findings[sent[0]:]
        sent[0] = len(findings)
        conn.send(("progress", phase, stage, [f.to_dict() for f in fresh]))

    try:
        if isinstance(job, bytes):
            job = pickle.loads(job)
        report = job.run(progress)
        conn.send(("report", report.to_json()))
    except BaseException as exc:  # noqa: BLE001 - everything goes back to the parent
        conn.send(("error", f"{type(exc).__name__}: {exc}", traceback.format_exc()))
    finally:
        conn.close()


def _stop_worker(proc) -> None:
    """Kill the worker's process group and the worker, and reap it: nothing outlives the check."""
    if proc.pid is None:
        return  # never started
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # exists only once the worker made its own group
    except (OSError, AttributeError):
        pass
    if proc.is_alive():
        proc.kill()
    proc.join(_WORKER_JOIN_SECONDS)


def _exit_description(exitcode: int | None) -> str:
    if exitcode is None:
        return "still running"
    if exitcode < 0:
        try:
            return f"killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exit code {exitcode}"


def _run_in_worker(job: _Job, limit: float) -> Report:
    method = worker_start_method(job.device)
    context = multiprocessing.get_context(method)
    if method == "fork":
        payload: object = job  # inherited, not pickled: any factory works, closures included
    else:
        try:
            payload = pickle.dumps(job)
        except Exception as exc:  # noqa: BLE001 - pickling failures come in many types
            raise TypeError(
                f"time_limit under the spawn start method needs a picklable job (a module-level factory); "
                f"{type(exc).__name__}: {exc}"
            ) from None
    env = {k: v for k, v in os.environ.items() if k == "TRITON_INTERPRET"}
    receiver, sender = context.Pipe(duplex=False)
    proc = context.Process(target=_worker_main, args=(sender, payload, env, method == "fork"), name="diffmoe-check",
                           daemon=True)
    start = time.perf_counter()
    findings: list[Finding] = []
    phase, stage = "starting the worker process", None
    try:
        with _signals_deferred(), warnings.catch_warnings():
            # Python >= 3.12 warns about forking a process with threads (torch's OpenMP pool
            # counts); the one hazard it means is handled in _worker_main (one thread).
            warnings.filterwarnings("ignore", message=r".*multi-threaded.*fork", category=DeprecationWarning)
            proc.start()
            sender.close()  # the worker holds the only sending end: EOF means it is gone
        # The limit bounds silence, not the check: every phase and every launch the worker starts
        # is a progress message that restarts the clock, so a slow check that keeps launching is
        # never a timeout (a 2-core machine under load made large checks look like hangs); a launch
        # or a phase that goes quiet for `limit` seconds is one.
        last_progress = start
        while True:
            remaining = last_progress + limit - time.perf_counter()
            if remaining <= 0 or not receiver.poll(remaining):
                findings.append(Finding(
                    oracle=Oracles.TIMEOUT, stage=stage,
                    message=f"no progress within the time limit of {limit:g} s; the worker was stopped during {phase}"
                            + (f", in a launch of stage {stage}" if stage else "")
                            + f" ({time.perf_counter() - start:.1f} s into the check)",
                    figures={"time_limit_s": limit, "phase": phase, "worker_pid": proc.pid, "start_method": method,
                             "seconds_since_progress": round(time.perf_counter() - last_progress, 3)},
                ))
                break
            last_progress = time.perf_counter()
            try:
                message = receiver.recv()
            except EOFError:
                proc.join(_WORKER_JOIN_SECONDS)
                findings.append(Finding(
                    oracle=Oracles.CRASH, stage=stage,
                    message=f"the worker process died ({_exit_description(proc.exitcode)}) during {phase}"
                            + (f", in a launch of stage {stage}" if stage else ""),
                    figures={"exitcode": proc.exitcode, "phase": phase, "worker_pid": proc.pid},
                ))
                break
            kind = message[0]
            if kind == "progress":
                _, phase, stage, fresh = message
                findings += [Finding.from_dict(f) for f in fresh]
            elif kind == "report":
                report = Report.from_json(message[1])
                report.seconds = time.perf_counter() - start
                return report
            else:
                raise WorkerError(f"run_differential failed in the worker: {message[1]}\n{message[2]}")
    finally:
        with _signals_deferred():
            _stop_worker(proc)
            sender.close()
            receiver.close()
    return job.report(findings, time.perf_counter() - start)
