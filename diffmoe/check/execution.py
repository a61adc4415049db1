"""`Check`: the state of one check and the services every oracle uses to run the implementation.

Owns: the problem and the reference's results, the findings so far, and the judge's view of
the candidate (diffmoe/check/candidate.py): every call of the implementation goes through
`Check.candidate`, in this process or, isolated, in the candidate's own process
(diffmoe/isolation/), which returns what it saw as data. Here: the reference's stage on a
candidate's buffers, the rows no call computes settled from the reference, bitwise comparison of
two runs, and progress. It judges nothing itself: the oracles (`diffmoe/oracles/`) do, through
the hooks the runner dispatches (`Check.judge_run`). It must not import an oracle module or an
implementation: the runner hands it the active oracles and the candidate.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, Protocol

import torch

from diffmoe.check.call_environment import numpy_quiet
from diffmoe.tolerance.compare import Comparison, Rule, compare
from diffmoe.problem.config import MoEConfig
from diffmoe.contract import (  # noqa: F401 - default_device, interpreter_enabled: used through this module too
    ImplementationFactory, Schedule, WorkspacePlan, default_device, interpreter_enabled,
)
from diffmoe.check.candidate import (  # noqa: F401 - Crash, crash_finding, implementation_failed, Run: the oracles' names
    REQUIRED_METHODS, Candidate, Crash, Run, crash_finding, implementation_failed,
)
from diffmoe.check.guards import POISON_PATTERNS, GuardedTensor, GuardedWorkspaces
from diffmoe.problem.inputs import ROUTED_ROW_BUFFERS, Problem, make_problem, settle_uncomputed_rows, tokens_of
from diffmoe.findings import Finding, Oracles

# The reference (pure PyTorch, Triton-free like the harness) is imported where it runs, not with
# this module: a module that imports diffmoe's API beside its factory (a test file) must load in
# the candidate's process, where importing the reference is refused (diffmoe/isolation/).


def reference_moe(problem: Problem):
    from reference import reference_moe as run

    return run(problem)

from diffmoe.problem.vocabulary import Buffers, materialised_buffers, pipeline_stages


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Elementwise: the same bits (NaN included), whatever the dtype."""
    if a.element_size() in (1, 2, 4, 8) and a.dtype != torch.bool:
        view = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
        return a.contiguous().view(view) == b.contiguous().view(view).to(a.device)
    return a == b.to(a.device)


def written_elements(mine: torch.Tensor, theirs: torch.Tensor, expected: torch.Tensor) -> torch.Tensor:
    """In a sampled check, which elements of a buffer a chosen program wrote: the same bits in two
    runs of the same programs over different poison (`theirs`), and not NaN unless the reference's
    element (`expected`) is NaN (a NaN both runs hold is poison: torch's poisoned allocations)."""
    written = _same_bits(mine, theirs)
    if mine.is_floating_point():
        written &= ~torch.isnan(mine.float()) | torch.isnan(expected.float()).to(mine.device)
    return written


ProgressCallback = Callable[[str, "str | None", "list[Finding]"], None]
"""progress(phase, stage or None, findings so far): called at every phase change and launch."""


class Judge(Protocol):
    """What a check asks of an active oracle (every diffmoe.oracles.base.Oracle is one): its
    verdict on one order's run. A protocol, not that class: the oracles import this module."""

    def judge_run(self, check: Check, run: Run, first: bool) -> list[Finding]: ...


def first_tokens(problem: Problem, num_tokens: int) -> Problem:
    """The call made of the first `num_tokens` tokens of `problem` (fresh tensors, same weights),
    as make_problem(config, num_tokens=...) builds it, for generated and given problems alike."""
    return replace(problem, **tokens_of(problem, slice(num_tokens)))


class Check:
    """One check's state and services. The oracles read `config`, `problem`, `reference`,
    `device`, `schedules`, `tolerance_backend`, the first instance (`impl`), its workspaces
    (`guarded`, `output`, `shapes`) and add to `findings`; they run the implementation again
    only through `build`, `allocate`, `new_output`, `execute` and `run_stage`. Isolated, the
    instances and workspaces are handles to objects of the candidate's process."""

    def __init__(self, config: MoEConfig, factory: ImplementationFactory, oracles: Sequence[str],
                 schedules: list[Schedule], device: torch.device, name: str,
                 problem: Problem | None = None, progress: ProgressCallback | None = None,
                 active: Sequence[Judge] = (), candidate: Callable[..., Any] | None = None, sample: Any = None):
        self.config = config
        self.sample = sample  # a ProgramSample: every run of this check runs its programs (issue 42)
        self.judged: dict[str, tuple[int, int]] = {}  # sampled: per buffer, (elements judged, elements)
        self.judged_forced: dict[str, tuple[int, int]] = {}  # the same, for teacher forcing's stage outputs
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
        # candidate(factory, device, problem, progress): Candidate in this process, or the
        # isolation's client of the candidate's process
        self.candidate = (candidate or Candidate)(factory, device, self.problem, self._candidate_progress)
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
        # the call-sequence oracle's small call on a fresh instance and fresh workspaces (its first
        # T // 16 tokens) and that call's problem: the batch-invariance oracle judges it, at no cost
        self.sub_batch: tuple[Problem, Run] | None = None
        # selected oracles that could not run on this check, and why (the report says so)
        self.skipped: dict[str, str] = {}
        self.out_of_bounds: list = []  # every access the bounds guard refused, every call, in order
        self.wraps: list = []  # every access through a wrapped integer offset, every run, in order (wrap_watch.py)
        self.headroom: list = []  # every launch whose 32-bit pointer offsets came near 2^31, every run (wrap_watch.py)
        self.storages: dict[int, str] = {}  # first address of each named tensor of a call -> its name (the candidate's addresses)

    def selected(self, oracle: str) -> bool:
        return oracle in self.oracles

    # ---- progress -------------------------------------------------------------------
    def report_progress(self, stage: str | None) -> None:
        if self._progress is not None:
            self._progress(self.phase, stage, self.findings)

    def enter(self, phase: str) -> None:
        self.phase = phase
        self.report_progress(None)

    def _candidate_progress(self, phase: str | None, stage: str | None) -> None:
        if phase is not None:
            self.enter(phase)
        else:
            self.report_progress(stage)

    # ---- running the implementation (through the candidate) -----------------------------
    def build(self, config: MoEConfig):
        return self.candidate.build(config)

    def allocate(self, shapes: Sequence[int], what: str) -> GuardedWorkspaces:
        return self.candidate.allocate(shapes, what)

    def new_output(self, num_tokens: int, pattern: int | None = None) -> GuardedTensor:
        """A caller's fresh output of num_tokens rows (guarded), poisoned with `pattern`."""
        return self.candidate.new_output(num_tokens, self.config.hidden, pattern)

    def workspace_shapes(self, impl, max_tokens: int) -> tuple[int, ...]:
        return self.candidate.workspace_shapes(impl, max_tokens)

    def workspace_plan(self, impl, num_tokens: int) -> WorkspacePlan:
        return self.candidate.workspace_plan(impl, num_tokens)

    def has_run_stage(self, impl) -> bool:
        return self.candidate.has_run_stage(impl)

    def execute_fresh(self, config: MoEConfig, problem: Problem, what: str) -> Run:
        """One call on a fresh instance for `config`, fresh workspaces (and output), the first order
        and poison pattern: the metamorphic sibling's and batch invariance's other-batch runs."""
        impl = self.build(config)
        guarded = self.allocate(self.workspace_shapes(impl, config.num_tokens), f"workspace_shapes({config.num_tokens})")
        output = None if config.output != "separate" else self.new_output(problem.num_tokens)
        return self.execute(impl, guarded, output, self.schedules[0], POISON_PATTERNS[0], problem=problem, what=what)

    def execute(self, impl, guarded: GuardedWorkspaces, output: GuardedTensor | None, schedule: Schedule,
                poison: int | None, problem: Problem | None = None, what: str | None = None,
                attribute_input_writes: bool = False, poison_workspaces: int | None = None,
                record_addresses: bool = False) -> Run:
        """One call (Candidate.execute). record_addresses: the interpreter's address record for the
        active oracles that judge it (the first order's run). The watchers' findings join the
        check's; the rows no call computes are settled from the reference."""
        address_oracles = [o.name for o in self.active if getattr(o, "records_addresses", False)] if record_addresses else []
        try:
            executed = self.candidate.execute(impl, guarded, output, schedule, poison, problem, what,
                                              attribute_input_writes, poison_workspaces, address_oracles,
                                              self.selected(Oracles.SCHEDULE), self.sample)
        except Crash:
            self.findings += self.candidate.take_pending()
            self.out_of_bounds += self.candidate.take_refused()
            raise
        self.findings += executed.findings
        self.out_of_bounds += executed.run.out_of_bounds
        self.wraps += executed.run.wraps
        self.headroom += executed.run.headroom
        self.storages.update(executed.run.storages)
        for name, why in executed.skipped.items():
            if name not in (Oracles.BOUNDS, Oracles.OVERFLOW) or self.selected(name):
                self.skipped.setdefault(name, why)
        self.settle_uncomputed_rows(executed.run.buffers, problem)
        return executed.run

    def series(self, config: MoEConfig, problems: dict[int, Problem], calls: Sequence[tuple[int, bool]],
               whats: Sequence[str]) -> list[tuple[dict[str, torch.Tensor], list]]:
        """The call-sequence series' calls in one request (Candidate.series), under the first
        schedule: per call, its output and returned intermediates, and the accesses the bounds
        guard refused (the caller decides which join the check's); the inputs a call wrote join
        the check's findings. A crash raises Crash, its call's watch findings and refused accesses
        taken from the candidate (`series_crash_findings`)."""
        answers, written = self.candidate.series(config, problems, calls, self.schedules[0], whats, POISON_PATTERNS[0])
        self.findings += written
        return answers

    def series_crash_findings(self) -> tuple[list[Finding], list]:
        """After a crash in the series: the crashed call's watch findings and refused accesses."""
        return self.candidate.take_pending(), self.candidate.take_refused()

    def late_findings(self) -> list[Finding]:
        """Every call's output and inputs compared once more, at the check's end (Candidate.late_findings):
        what changed after its call returned."""
        try:
            return self.candidate.late_findings()
        except Crash as crash:  # the candidate's process ended meanwhile: that is the finding
            return [*self.candidate.take_pending(), crash.finding]

    def run_stage(self, impl, stage: str, inputs: dict[str, torch.Tensor], what: str) -> tuple[object, list[Finding]]:
        """The implementation's run_stage on `inputs` (Candidate.run_stage): (its outputs, the input
        watch's findings); a failure raises Crash, whose watch findings join the check's. In a
        sampled check its launches run the check's sample."""
        try:
            return self.candidate.run_stage(impl, stage, inputs, what, self.sample)
        except Crash:
            self.findings += self.candidate.take_pending()
            raise
        finally:
            self.out_of_bounds += self.candidate.take_refused()

    # ---- what oracles share -------------------------------------------------------------
    def judge_run(self, run: Run, first: bool) -> list[Finding]:
        """Every active oracle's verdict on one order's run (the runner's, and call-sequence's
        last order); later orders are judged against the first by the schedule oracle."""
        return [f for oracle in self.active for f in oracle.judge_run(self, run, first)]

    def settle_uncomputed_rows(self, buffers: dict[str, torch.Tensor], problem: Problem | None = None) -> None:
        """diffmoe.problem.inputs.settle_uncomputed_rows for one call of this check (another call's problem,
        call-sequence's smaller ones, gets its own reference, once)."""
        problem = problem or self.problem
        if bool(problem.computed_slots().all()):
            return  # nothing to settle: no reference to run (a fifth of a one-token call's cost, issue 48)
        if problem is not self.problem and getattr(self, "_other", (None,))[0] is not problem:
            self._other = (problem, reference_moe(problem))
        settle_uncomputed_rows(problem, (self.reference if problem is self.problem else self._other[1]).intermediates, buffers)

    def settle_unsampled(self, run: Run, other: Run) -> None:
        """In place, for a sampled check: the elements of `run`'s buffers that carry no value the
        chosen programs computed take the value the reference's stage computes from `run`'s own
        (settled) inputs, stage by stage in pipeline order, so the oracles judge exactly what was
        computed: the stage on its own inputs holds bit for bit there, and end to end the settled
        values carry only the computed elements' error. `other` is a second run of the same
        programs whose workspaces and write views held another poison (guards.WritesPoisoned).

        In the first stage with a sampled launch, an element is computed where both runs agree bit
        for bit and it is not NaN (torch's poisoned allocations are NaN in both runs; a sampled
        problem has no NaN row, so no computed element is NaN where the reference is not). The
        stages before it ran whole on whole inputs and are judged whole, every element, as in a
        full check. Every stage after it is settled whole: what it computed from an element no
        program wrote cannot be told by its bits (silu(x) * 2 gave the poison back byte for byte,
        and vLLM's per-token quant gave both runs the same scales, 2026-12-08); teacher forcing
        judges those stages on the reference's inputs. With an unannounced sampled launch every
        buffer is settled where unwritten. What was judged, per buffer, goes to `judged`."""
        ref = {**self.reference.intermediates, Buffers.OUTPUT: self.reference.output}
        sampled = self.sampled_stages(run)
        stages = pipeline_stages(self.config)
        if sampled is not None:  # the first sampled stage and every stage after it
            first = next((i for i, s in enumerate(stages) if s.name in sampled), len(stages))
            stages = stages[first:]
        settled = {n for s in stages for n in s.writes} if sampled is not None else None
        downstream = {n for s in stages[1:] for n in s.writes} if sampled is not None else set()
        unwritten: dict[str, torch.Tensor] = {}
        for name, mine in run.buffers.items():
            theirs, expected = other.buffers.get(name), ref.get(name)
            if not isinstance(mine, torch.Tensor) or not isinstance(theirs, torch.Tensor) or expected is None \
                    or mine.shape != theirs.shape or mine.shape != expected.shape or mine.dtype != theirs.dtype:
                continue
            if name in downstream:
                settle = torch.ones(mine.shape, dtype=torch.bool, device=mine.device)
            elif settled is None or name in settled:
                settle = ~written_elements(mine, theirs, expected)
            else:
                settle = torch.zeros(mine.shape, dtype=torch.bool, device=mine.device)
            counted = self.computed_elements(name, mine)
            self.judged[name] = (int((counted & ~settle).sum()), int(counted.sum()))
            if bool(settle.any()):
                unwritten[name] = settle
        for stage in stages:
            names = [n for n in stage.writes if n in unwritten]
            if not names:
                continue
            want = self.reference_stage(stage.name, {n: run.buffers[n] for n in stage.reads if n in run.buffers})
            for name in names:
                source = ref[name] if isinstance(want, str) or name not in want else want[name]
                mask = unwritten.pop(name)
                run.buffers[name][mask] = source.to(run.buffers[name].device, run.buffers[name].dtype)[mask.to(source.device)]
        for name, mask in unwritten.items():  # written by no stage of the pipeline: the reference's own value
            run.buffers[name][mask] = ref[name].to(run.buffers[name].device, run.buffers[name].dtype)[mask.to(ref[name].device)]
        if isinstance(run.buffers.get(Buffers.OUTPUT), torch.Tensor):
            run.output = run.buffers[Buffers.OUTPUT]  # one tensor again where the message made two

    def computed_elements(self, name: str, buffer: torch.Tensor) -> torch.Tensor:
        """The elements of `buffer` a call computes: all but the rows of slots it does not compute
        (remote under an expert map, unrouted: settled from the reference before any oracle looks)."""
        slots = self.problem.computed_slots()
        if name in ROUTED_ROW_BUFFERS and buffer.dim() >= 1 and buffer.shape[0] == slots.numel():
            return slots.to(buffer.device).reshape(-1, *([1] * (buffer.dim() - 1))).expand(buffer.shape)
        return torch.ones(buffer.shape, dtype=torch.bool, device=buffer.device)

    def sampled_stages(self, run: Run | None = None) -> set[str] | None:
        """The stages of which some launch ran a sample of its programs in `run` (default: the first
        order's), or None when a sampled launch had no stage of the pipeline (an unannounced
        launch): then any buffer may hold elements no program was chosen to write."""
        run = run if run is not None else (self.runs[0] if self.runs else None)
        if run is None:
            return set()
        names = {s.name for s in pipeline_stages(self.config)}
        stages = {launch.stage for launch in run.sampled if launch.programs is not None}
        return stages if stages <= names else None

    def sample_record(self) -> dict[str, Any] | None:
        """A sampled check's part of the report (Report.sample), or None."""
        if self.sample is None:
            return None
        from diffmoe.interpreter.program_sample import launch_counts

        launches = self.runs[0].sampled if self.runs else []
        ran, total, cut = launch_counts(launches)
        return {"seed": self.sample.seed, "seeded": self.sample.seeded,
                "ran": f"{ran:,} of {total:,} programs ran in {len(launches)} launches ({cut} sampled)",
                "judged": {name: list(counts) for name, counts in self.judged.items()},
                **({"forced": {name: list(c) for name, c in self.judged_forced.items()}} if self.judged_forced else {})}

    def reference_stage(self, stage: str, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor] | str:
        """The reference's stage on the candidate's buffers, or why it cannot run on them."""
        try:
            from reference.moe import reference_stage

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
