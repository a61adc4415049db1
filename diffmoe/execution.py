"""`Check`: the state of one check and the services every oracle uses to run the implementation.

Owns: building instances (with poisoned private buffers), calling the implementation's
methods so that any exception becomes a finding, one guarded call (`Check.execute`: poison,
launch recording, red-zone and input watchers), the reference's stage on a candidate's
buffers, bitwise comparison of two runs, and progress. It judges nothing itself: the
oracles (`diffmoe/oracles/`) do, through the hooks the runner dispatches (`Check.judge_run`).
It must not import an oracle module or an implementation: the runner hands it the active
oracles and the factory.

Robustness: nothing the implementation does ends the check without a Report.
  * An exception from the implementation (Triton compile and interpreter errors included),
    in its factory, `workspace_plan`, `workspace_shapes`, `run` or `run_stage`, becomes a
    `crash` finding with the exception type, message, the phase and, inside a launch, the
    stage. A run that returns no RunResult with a tensor output is a `contract` finding.
  * Every input is kept as a bitwise copy, compared after each run (and, in the first run,
    before and after each launch, so the finding names the stage), and restored, so the later
    runs still see the original inputs; a changed input is a `contract` finding.
"""

from __future__ import annotations

import os
import traceback
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from .compare import Comparison, Rule, compare
from .config import MoEConfig, quoted
from .contract import ImplementationFactory, Schedule, WorkspacePlan
from .oracles.guards import GuardedTensor, GuardedWorkspaces
from .problem import Problem, make_problem
from .recording import ChainedRecorder, LaunchLog
from .report import Finding, Oracles
from reference import reference_moe  # pure PyTorch, Triton-free like the harness
from reference.moe import reference_stage

from .vocabulary import Buffers, materialised_buffers
from .watchers import InputWatch, RedZoneWatch, StageTracker

if TYPE_CHECKING:
    from .oracles.base import Oracle

ProgressCallback = Callable[[str, "str | None", "list[Finding]"], None]
"""progress(phase, stage or None, findings so far): called at every phase change and launch."""


def interpreter_enabled() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def default_device() -> torch.device:
    # with an index: tensors report cuda:N, and torch.device("cuda") != torch.device("cuda:0")
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


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


class Crash(Exception):
    """The implementation failed in a way that ends this part of the check; carries the finding."""

    def __init__(self, finding: Finding):
        super().__init__(finding.message)
        self.finding = finding


def crash_finding(exc: BaseException, stage: str | None, what: str) -> Finding:
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


@contextmanager
def allocations_poisoned() -> Iterator[None]:
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
def numpy_quiet() -> Iterator[None]:
    """Poisoned workspaces and NaN/Inf input rows are NaN on purpose; the interpreter computes on
    them with numpy, whose floating-point warnings (and nanmax's "All-NaN slice") would only bury
    the findings."""
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="All-NaN slice encountered", category=RuntimeWarning)
        yield


def first_tokens(problem: Problem, num_tokens: int) -> Problem:
    """The call made of the first `num_tokens` tokens of `problem` (fresh tensors, same weights),
    as make_problem(config, num_tokens=...) builds it, for generated and given problems alike."""
    return replace(problem, **{name: getattr(problem, name)[:num_tokens].clone()
                               for name in ("hidden_states", "topk_ids", "topk_weights")})


class Check:
    """One check's state and services. The oracles read `config`, `problem`, `reference`,
    `device`, `schedules`, `tolerance_backend`, the first instance (`impl`), its workspaces
    (`guarded`, `output`, `shapes`) and add to `findings`; they run the implementation again
    only through `build` and `execute`."""

    def __init__(self, config: MoEConfig, factory: ImplementationFactory, oracles: Sequence[str],
                 schedules: list[Schedule], device: torch.device, name: str,
                 problem: Problem | None = None, progress: ProgressCallback | None = None,
                 active: Sequence[Oracle] = ()):
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

    def selected(self, oracle: str) -> bool:
        return oracle in self.oracles

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
            return fn(*args)
        except Exception as exc:  # noqa: BLE001 - every failure of the implementation is a finding
            raise Crash(crash_finding(exc, None, what)) from exc

    def build(self, config: MoEConfig):
        """A new instance, its private buffers poisoned: every torch.empty it makes while being
        built is filled (NaN floats, the largest integers), so a run that reads a private
        buffer (a scale, sorted ids) before writing it computes on poison, not on zeros or
        on what an earlier instance happened to leave in the allocator."""
        with allocations_poisoned():
            return self.call(f"building the implementation for {config.short()}", self.factory, config)

    def workspace_shapes(self, impl, max_tokens: int) -> tuple[int, ...]:
        shapes = self.call(f"workspace_shapes({max_tokens})", impl.workspace_shapes, max_tokens)
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
        plan = self.call(f"workspace_plan({num_tokens})", impl.workspace_plan, num_tokens)
        if not isinstance(plan, WorkspacePlan):
            raise Crash(Finding(
                oracle=Oracles.CONTRACT,
                message=f"workspace_plan({num_tokens}) must return a diffmoe.contract.WorkspacePlan, got {type(plan).__name__}",
            ))
        return plan

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
        self.inputs.start(attribute_input_writes)
        recorder = ChainedRecorder(tracker, log, watch, self.inputs if attribute_input_writes else None, extra_recorder)
        try:
            with numpy_quiet():
                result = impl.run(problem or self.problem, guarded.workspaces, output=output.tensor if output else None,
                                  schedule=schedule, recorder=recorder)
        except Exception as exc:  # noqa: BLE001
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
        out = returned.detach().clone()
        buffers = dict(log.snapshots)
        for name, tensor in intermediates.items():
            if isinstance(tensor, torch.Tensor):
                buffers.setdefault(name, tensor.detach().clone())
        buffers[Buffers.OUTPUT] = out
        watch.check()  # writes made outside any reported launch
        return Run(schedule, watch.findings, out, buffers, log, returned, set(intermediates))

    # ---- what oracles share -------------------------------------------------------------
    def judge_run(self, run: Run, first: bool) -> list[Finding]:
        """Every active oracle's verdict on one order's run (the runner's, and call-sequence's
        last order); later orders are judged against the first by the schedule oracle."""
        return [f for oracle in self.active for f in oracle.judge_run(self, run, first)]

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
