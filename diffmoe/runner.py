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
An implementation that raises becomes a `crash` finding naming the stage it was in.
"""

from __future__ import annotations

import importlib
import time
import traceback
from collections.abc import Collection, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from .compare import Comparison, Rule, compare
from .config import MoEConfig
from .contract import ImplementationFactory, LaunchInfo, Schedule
from .oracles.guards import POISON_PATTERNS, GuardedTensor, GuardedWorkspaces
from .oracles.runtime_aliasing import check_runtime_aliasing
from .oracles.static_aliasing import check_static_aliasing, check_workspace_fit
from .problem import Problem, make_problem
from .recording import ChainedRecorder, LaunchLog
from .report import Finding, Oracles, Report
from .tolerances import END_TO_END, FORCED, rule_for
from reference import reference_moe  # pure PyTorch, Triton-free like the harness

from .vocabulary import Buffers, Stages, materialised_buffers, pipeline_stages, producer_stage

DEFAULT_SCHEDULES = ("identity", "reversed", "random:1")
DEFAULT_IMPLEMENTATION = "optimized:make_implementation"
ALL_ORACLES = (
    Oracles.DIFFERENTIAL,
    Oracles.TEACHER_FORCING,
    Oracles.METAMORPHIC,
    Oracles.STATIC_ALIASING,
    Oracles.RUNTIME_ALIASING,
    Oracles.RACES,
    Oracles.SCHEDULE,
    Oracles.POISON,
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


def resolve_schedules(schedules: Sequence[Schedule | str] | None) -> list[Schedule]:
    items = DEFAULT_SCHEDULES if schedules is None else schedules
    parsed = [s if isinstance(s, Schedule) else Schedule.parse(s) for s in items]
    if not parsed:
        raise ValueError("schedules must name at least one schedule")
    return parsed


class _StageTracker:
    """Remembers the stage of the launch in flight, so a crash can name it."""

    def __init__(self) -> None:
        self.stage: str | None = None

    def before_launch(self, launch: LaunchInfo) -> None:
        self.stage = launch.stage

    def after_launch(self, launch: LaunchInfo) -> None:
        pass


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


class _Crash(Exception):
    def __init__(self, finding: Finding):
        super().__init__(finding.message)
        self.finding = finding


def _crash_finding(exc: BaseException, stage: str | None, what: str) -> Finding:
    frames = traceback.extract_tb(exc.__traceback__)
    where = f"{frames[-1].filename}:{frames[-1].lineno}" if frames else "?"
    return Finding(
        oracle=Oracles.CRASH,
        stage=stage,
        message=f"{what} raised {type(exc).__name__}: {exc}".strip(),
        figures={"exception": type(exc).__name__, "where": where},
    )


class DifferentialRun:
    """The state of one `run_differential` call; each oracle is one method."""

    def __init__(self, config: MoEConfig, factory: ImplementationFactory, oracles: list[str],
                 schedules: list[Schedule], device: torch.device, name: str):
        self.config = config
        self.factory = factory
        self.oracles = oracles
        self.schedules = schedules
        self.device = device
        self.name = name
        self.findings: list[Finding] = []
        self.problem: Problem = make_problem(config, device)
        self.reference = reference_moe(self.problem)

    # ---- running the implementation -------------------------------------------------
    def _build(self, config: MoEConfig):
        try:
            return self.factory(config)
        except Exception as exc:  # noqa: BLE001 - every failure of the implementation is a finding
            raise _Crash(_crash_finding(exc, None, f"building the implementation for {config.short()}")) from exc

    def _execute(self, impl, guarded: GuardedWorkspaces, output: GuardedTensor | None, schedule: Schedule,
                 poison: int, extra_recorder=None, problem: Problem | None = None) -> _Run:
        guarded.poison(poison)
        if output is not None:
            output.poison(poison)
        log = LaunchLog(snapshot=True)
        tracker = _StageTracker()
        watch = _RedZoneWatch(guarded, output)
        recorder = ChainedRecorder(tracker, log, watch, extra_recorder)
        try:
            # Poisoned workspaces are NaN on purpose; the interpreter computes on them with numpy,
            # whose floating-point warnings would only bury the findings.
            with np.errstate(all="ignore"):
                result = impl.run(problem or self.problem, guarded.workspaces, output=output.tensor if output else None,
                                  schedule=schedule, recorder=recorder)
        except Exception as exc:  # noqa: BLE001
            raise _Crash(_crash_finding(exc, tracker.stage, f"run under schedule {schedule}")) from exc
        out = result.output.detach().clone()
        buffers = dict(log.snapshots)
        for name, tensor in result.intermediates.items():
            buffers.setdefault(name, tensor.detach().clone())
        buffers[Buffers.OUTPUT] = out
        watch.check()  # writes made outside any reported launch
        return _Run(schedule, watch.findings, out, buffers, log)

    def run(self) -> None:
        cfg = self.config
        impl = self._build(cfg)
        t = cfg.num_tokens
        plan = impl.workspace_plan(t)
        shapes = tuple(int(n) for n in impl.workspace_shapes(t))
        if Oracles.STATIC_ALIASING in self.oracles:
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
        for index, schedule in enumerate(self.schedules):
            race_recorder = self._race_recorder() if index == 0 else None
            if race_recorder is not None:
                with race_recorder:
                    run = self._execute(impl, guarded, output, schedule, POISON_PATTERNS[0], race_recorder)
                self.findings += race_recorder.findings()
            else:
                run = self._execute(impl, guarded, output, schedule, POISON_PATTERNS[0])
            runs.append(run)
            self._check_run(run, guarded, output, first=index == 0)
        self._check_schedules(runs)
        if Oracles.POISON in self.oracles:
            again = self._execute(impl, guarded, output, self.schedules[0], POISON_PATTERNS[1])
            self._check_poison(runs[0], again)
        if Oracles.TEACHER_FORCING in self.oracles and hasattr(impl, "run_stage"):
            self._teacher_force(impl)
        if Oracles.METAMORPHIC in self.oracles and cfg.is_fp8:
            self._metamorphic(runs[0])

    def _race_recorder(self):
        if Oracles.RACES not in self.oracles:
            return None
        from .oracles import interpreter_races  # imports triton: only when this oracle runs

        supported, _why = interpreter_races.races_supported()
        return interpreter_races.RaceRecorder() if supported else None

    # ---- oracles ------------------------------------------------------------------------
    def _check_run(self, run: _Run, guarded: GuardedWorkspaces, output: GuardedTensor | None, first: bool) -> None:
        if Oracles.RED_ZONE in self.oracles:
            for f in run.red_zones:
                f.figures["schedule"] = str(run.schedule)
            self.findings += run.red_zones
        if Oracles.CONTRACT in self.oracles and first:
            self._check_contract(run)
        if Oracles.RUNTIME_ALIASING in self.oracles and first:
            names = guarded.region_names()
            if output is not None:
                names.update(output.region_names(Buffers.OUTPUT))
            for name, tensor in self.problem.inputs().items():
                names[tensor.untyped_storage().data_ptr()] = name
            self.findings += check_runtime_aliasing(run.log, names)
        if Oracles.DIFFERENTIAL in self.oracles:
            self._differential(run)

    def _differential(self, run: _Run) -> None:
        """Every buffer both sides materialise, pipeline order; one finding at the first divergence."""
        failed: list[Comparison] = []
        for name in materialised_buffers(self.config):
            if name not in run.buffers or name not in self.reference.intermediates:
                continue
            rule = rule_for(self.config.quant, name, END_TO_END)
            c = compare(name, self.reference.intermediates[name], run.buffers[name], rule)
            if not c.ok:
                failed.append(c)
        if not failed:
            return
        first = failed[0]
        stage = producer_stage(self.config, first.name)
        figures = {"schedule": str(run.schedule), **first.figures()}
        if len(failed) > 1:
            figures["also_divergent"] = [c.name for c in failed[1:]]
        self.findings.append(Finding(
            oracle=Oracles.DIFFERENTIAL, stage=stage, buffers=[first.name],
            message=f"first divergent stage is {stage}: {first.summary()}", figures=figures,
        ))

    def _check_schedules(self, runs: list[_Run]) -> None:
        if Oracles.SCHEDULE not in self.oracles or len(runs) < 2:
            return
        base = runs[0]
        for other in runs[1:]:
            for name in materialised_buffers(self.config):
                if name not in base.buffers or name not in other.buffers:
                    continue
                c = compare(name, base.buffers[name], other.buffers[name], Rule.bitwise("the same inputs under another program order"))
                if not c.ok:
                    stage = producer_stage(self.config, name)
                    self.findings.append(Finding(
                        oracle=Oracles.SCHEDULE, stage=stage, buffers=[name],
                        message=f"{name} changes with the program order: {base.schedule} vs {other.schedule} "
                                f"differ in {c.differing} of {c.total} elements (first divergent buffer)",
                        figures={"schedules": [str(base.schedule), str(other.schedule)], **c.figures()},
                    ))
                    break

    def _check_poison(self, first: _Run, again: _Run) -> None:
        for name in materialised_buffers(self.config):
            if name not in first.buffers or name not in again.buffers:
                continue
            c = compare(name, first.buffers[name], again.buffers[name], Rule.bitwise("the same call under another poison"))
            if not c.ok:
                stage = producer_stage(self.config, name)
                self.findings.append(Finding(
                    oracle=Oracles.POISON, stage=stage, buffers=[name],
                    message=f"{name} depends on workspace bytes written before this call (stale or uninitialised "
                            f"read): poison 0x{POISON_PATTERNS[0]:02X} vs 0x{POISON_PATTERNS[1]:02X} differ in "
                            f"{c.differing} of {c.total} elements",
                    figures=c.figures(),
                ))
                return

    def _check_contract(self, run: _Run) -> None:
        cfg = self.config
        out = run.output
        want = (cfg.num_tokens, cfg.hidden)
        if tuple(out.shape) != want or out.dtype != torch.bfloat16 or out.device.type != self.device.type:
            self.findings.append(Finding(
                oracle=Oracles.CONTRACT, stage=Stages.REDUCE, buffers=[Buffers.OUTPUT],
                message=f"output must be {list(want)} bfloat16 on {self.device.type}, got {list(out.shape)} "
                        f"{out.dtype} on {out.device.type}",
            ))
        declared = set(materialised_buffers(cfg))
        for launch in run.log:
            for region in launch.writes:
                if region.name not in declared and region.name not in _PRIVATE_BUFFERS:
                    self.findings.append(Finding(
                        oracle=Oracles.CONTRACT, stage=launch.stage, buffers=[region.name],
                        message=f"launch {launch.kernel} writes {region.name!r}, which the pipeline does not declare",
                    ))

    def _teacher_force(self, impl) -> None:
        """Each stage on the reference's inputs, judged with the forced rules."""
        ref = self.reference.intermediates
        for stage in pipeline_stages(self.config):
            inputs = {n: ref[n] for n in stage.reads if n in ref}
            try:
                outputs = impl.run_stage(stage.name, inputs, self.problem)
            except Exception as exc:  # noqa: BLE001
                self.findings.append(_crash_finding(exc, stage.name, f"teacher-forced stage {stage.name}"))
                continue
            for name in stage.writes:
                if name not in outputs or name not in ref:
                    continue
                rule = rule_for(self.config.quant, name, FORCED, fused=stage.name == Stages.ACT_QUANT)
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
        shapes = tuple(int(n) for n in sibling.workspace_shapes(sibling_cfg.num_tokens))
        guarded = GuardedWorkspaces(shapes, self.device)
        output = GuardedTensor((sibling_cfg.num_tokens, sibling_cfg.hidden), torch.bfloat16, self.device) \
            if sibling_cfg.output == "separate" else None
        other = self._execute(sibling, guarded, output, self.schedules[0], POISON_PATTERNS[0],
                              problem=make_problem(sibling_cfg, self.device))
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


# Implementation-private buffers a launch may write besides the declared pipeline buffers.
_PRIVATE_BUFFERS = {Buffers.AMAX_PARTIALS, Buffers.SORTED_TOKEN_IDS, Buffers.EXPERT_IDS, Buffers.NUM_TOKENS_POST_PADDED}


def default_device() -> torch.device:
    # with an index: tensors report cuda:N, and torch.device("cuda") != torch.device("cuda:0")
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


def run_differential(
    config: MoEConfig,
    implementation: ImplementationFactory | None = None,
    *,
    schedules: Sequence[Schedule | str] | None = None,
    oracles: Collection[str] | None = None,
    device: str | torch.device | None = None,
    implementation_name: str = "optimized",
) -> Report:
    """Run the reference and `implementation` (default: the optimized Triton MoE) on the
    problem of `config` and judge them with the selected oracles."""
    if not isinstance(config, MoEConfig):
        raise TypeError(f"config must be a MoEConfig, got {type(config).__name__}")
    config.validate()
    chosen = resolve_oracles(oracles)
    parsed = resolve_schedules(schedules)
    factory = implementation or load_factory(DEFAULT_IMPLEMENTATION)
    dev = torch.device(device) if device is not None else default_device()
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    start = time.perf_counter()
    state = DifferentialRun(config, factory, chosen, parsed, dev, implementation_name)
    try:
        state.run()
    except _Crash as crash:
        state.findings.append(crash.finding)
    return Report(
        config=config,
        implementation=implementation_name,
        oracles=chosen,
        schedules=[str(s) for s in parsed],
        findings=state.findings,
        seconds=time.perf_counter() - start,
    )
