"""`run_differential`: one problem, the reference, one implementation, every oracle, one Report.

This module only orchestrates a check; it judges nothing. The oracles are modules under
diffmoe/oracles/, registered in diffmoe/oracles/registry.py; the services they use to run
the implementation (guarded calls, watchers, crash findings) are diffmoe/check/execution.py's; worker
processes, time limits and signals are diffmoe/check/worker.py's. It reaches the implementation only
through the plug-in contract (diffmoe/contract.py): a factory, by default the one
DEFAULT_IMPLEMENTATION names.

Order of work for a config:
  0. resolve the config's numerics profile against the implementation (contract.judged_config:
     numerics=None takes the profile the factory declares), so the report's config and its
     replay line name the rounding the reference followed;
  1. build the problem and run the reference (fresh tensor per stage);
  2. build the implementation, ask for its plan and workspace shapes; `judge_plan` hooks
     (static aliasing); a plan that does not fit the workspaces ends the check before any launch;
  3. run the implementation once per program order inside guarded, poisoned workspaces,
     recording every launch (views, snapshots of the intermediates, and under the interpreter
     the per-program addresses when an active oracle records them); `judge_run` hooks after each;
  4. `finish` hooks: oracles that compare runs or run the implementation again (call sequence,
     schedule, poison, teacher forcing, the metamorphic sibling).
See diffmoe/oracles/base.py for the hooks and the order findings come in.

Robustness (diffmoe/check/execution.py): an exception from the implementation is a `crash` finding,
a broken contract a `contract` finding; with `time_limit` the check runs in a worker process
that is killed when the limit passes without progress (a `timeout` finding naming the phase and
stage in flight, after every finding already made); a worker that dies is a `crash` finding.

Inputs a caller may hand over (`problem=`) beyond what `make_problem` generates: a call with
fewer tokens than the config's T, zero included (`make_problem(config, num_tokens=0)`; only
the [0, H] output and the inputs are then judged, teacher forcing and the metamorphic run
have nothing to look at), and NaN/Inf inputs, whose propagation reference/moe.py specifies
and the NaN-aware compare judges.

Must not judge: a verdict in this module belongs in an oracle module (tests/oracles/test_oracle_registry.py).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import sys
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass

import torch

from diffmoe.interpreter import fast_path as interpreter_speed
from diffmoe.problem.config import MoEConfig, quoted
from diffmoe.contract import (
    DEFAULT_IMPLEMENTATION, DEFAULT_IMPLEMENTATION_NAME, IMPLEMENTATION_ALIASES, ConfigRefused, ImplementationFactory, Schedule,
    judged_config, resolve_factory, unsupported,
)
from diffmoe.contract import default_device, interpreter_enabled  # noqa: F401 - this module's API
from diffmoe.adapters.loading import load_factory
from diffmoe.check.candidate import Crash
from diffmoe.isolation import boundary, integrity
from diffmoe.isolation.client import RemoteCandidate, check_isolation, factory_reference, zygote
from diffmoe.problem.inputs import Problem
from diffmoe.interpreter.program_sample import ProgramSample
from diffmoe.check.report import Report, is_factory_spec, launch_rows
from diffmoe.findings import Finding
from diffmoe.check.worker import (  # noqa: F401 - part of this module's API since before worker.py existed
    DEFAULT_INTERPRETER_TIME_LIMIT,
    MAX_TIME_LIMIT,
    WorkerError,
    check_time_limit,
    default_time_limit,
    run_in_worker,
    worker_start_method,
)

__all__ = [
    "ALL_ORACLES", "DEFAULT_IMPLEMENTATION", "DEFAULT_INTERPRETER_TIME_LIMIT", "DERIVED_OUTPUT_REASON", "MAX_TIME_LIMIT",
    "SMALL_CALL_DIVISOR", "DifferentialRun", "WorkerError", "check_time_limit", "default_device", "default_schedules",
    "default_time_limit", "factory_name", "interpreter_enabled", "load_factory", "resolve_oracles", "resolve_schedules",
    "run_differential", "sampled_selection",
]

# The judge's names this module offers (its API since before the oracles were out of the candidate's
# view), resolved when first read (PEP 562): a module that imports this one beside its factory (a test
# file, a user's plug-in) loads in the candidate's process, where diffmoe.oracles and
# diffmoe.tolerance are refused (issue 43, diffmoe/isolation/import_guard.py).
_LAZY = {
    "ALL_ORACLES": "diffmoe.oracles.registry", "resolve_oracles": "diffmoe.oracles.registry",
    "SMALL_CALL_DIVISOR": "diffmoe.oracles.call_sequence", "DERIVED_OUTPUT_REASON": "diffmoe.oracles.differential",
    "DifferentialRun": "diffmoe.judge.differential_run", "ProgressCallback": "diffmoe.check.execution",
}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


FIXED_SCHEDULES = ("identity", "reversed")


def default_schedules(config: MoEConfig) -> tuple[str, ...]:
    """identity, reversed, then config.random_orders random orders seeded seed+1, seed+2, ...:
    different configs of a fuzz campaign get different orders, one config always the same."""
    return (*FIXED_SCHEDULES, *(f"random:{config.seed + 1 + i}" for i in range(config.random_orders)))


def _is_default_factory(factory: object) -> bool:
    """Whether `factory` is DEFAULT_IMPLEMENTATION's (asked without importing it: whoever holds
    that factory has imported its module already)."""
    module_name, _, attr = DEFAULT_IMPLEMENTATION.partition(":")
    module = sys.modules.get(module_name)
    return module is not None and getattr(module, attr, None) is factory


def factory_name(factory: ImplementationFactory | None) -> str:
    """What reports and replay lines call an implementation passed as a factory.

    None (the default implementation) and the default factory itself: DEFAULT_IMPLEMENTATION_NAME.
    A factory its module exports, `getattr(importlib.import_module(module), qualname) is factory`:
    the spec `module:qualname`, which `--impl` loads, so the replay line reproduces it. Otherwise
    (a lambda, a closure, a bound method, a factory defined in `__main__`): its `name` attribute
    when it has a string one, else its qualified name or repr; the replay line then says no
    command can load it (diffmoe.check.report.check_command)."""
    if factory is None or _is_default_factory(factory):
        return DEFAULT_IMPLEMENTATION_NAME
    handle = resolve_factory(factory)
    module, qualname = handle.module, handle.qualname
    if isinstance(module, str) and isinstance(qualname, str) and module != "__main__":
        spec = f"{module}:{qualname}"
        try:
            loaded = importlib.import_module(module)
            exported = getattr(loaded, qualname, None) is factory
        except Exception:  # noqa: BLE001 - any import failure only means "not importable by name"
            loaded, exported = None, False
        origin = getattr(loaded, "__file__", None)
        if exported and module.startswith("diffmoe_impl_") and isinstance(origin, str):
            spec = f"{origin}:{qualname}"  # loaded from a file by load_factory: replayed by its path
        if exported and is_factory_spec(spec):
            return spec
    label = handle.label
    if not isinstance(label, str) or not label.strip():
        label = qualname if isinstance(qualname, str) else repr(factory)
    label = " ".join(label.split())
    return label if len(label) <= 200 else label[:197] + "..."


def resolve_schedules(schedules: Sequence[Schedule | str] | None, config: MoEConfig | None = None) -> list[Schedule]:
    """The schedules to run: the given ones, or default_schedules(config) (config=None: the
    default config's)."""
    items = default_schedules(config or MoEConfig()) if schedules is None else schedules
    parsed = [s if isinstance(s, Schedule) else Schedule.parse(s) for s in items]
    if not parsed:
        raise ValueError("schedules must name at least one schedule")
    return parsed


def _check_problem_argument(problem: object, config: MoEConfig) -> Problem:
    if not isinstance(problem, Problem):
        raise TypeError(f"problem must be None or a diffmoe.problem.inputs.Problem, got {type(problem).__name__}")
    if problem.config != config:
        raise ValueError(f"problem.config must be the config being checked ({config.short()}), got {problem.config.short()}")
    if not 0 <= problem.num_tokens <= config.num_tokens:
        raise ValueError(f"problem must have 0..{config.num_tokens} tokens (config.num_tokens), got {problem.num_tokens}")
    return problem


def sampled_selection(sample: object, config: MoEConfig, schedules: Sequence[Schedule | str] | None,
                      oracles: Collection[str] | None) -> tuple[list[str], list[Schedule]]:
    """A sampled check's oracles and schedule (run_differential's `sample`), or a TypeError or a
    ValueError naming what a sampled check cannot take: the CLI asks before it loads anything."""
    from diffmoe.oracles.registry import resolve_sampled_oracles

    chosen = resolve_sampled_oracles(oracles)
    parsed = resolve_schedules(schedules or ("identity",), config)
    _check_sample(sample, config, parsed)
    return chosen, parsed


def _check_sample(sample: object, config: MoEConfig, schedules: list[Schedule]) -> None:
    if not isinstance(sample, ProgramSample):
        raise TypeError(f"sample must be None or a diffmoe.interpreter.program_sample.ProgramSample, got {type(sample).__name__}")
    if not interpreter_enabled():
        raise ValueError("sample needs the Triton interpreter (TRITON_INTERPRET=1): compiled launches run every program")
    if len(schedules) != 1:
        raise ValueError(f"a sampled check runs one schedule, got {len(schedules)} ({', '.join(map(str, schedules))})")
    rows = {name: getattr(config, name) for name in ("nan_rows", "inf_rows") if getattr(config, name)}
    if rows:
        raise ValueError(f"a sampled check needs nan_rows=0 and inf_rows=0 (an element both runs leave NaN is "
                         f"one no program wrote), got {', '.join(f'{k}={v}' for k, v in rows.items())}")


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
    implementation_name: str | None = None,
    problem: Problem | None = None,
    time_limit: float | None = None,
    isolation: str = "none",
    sample: ProgramSample | None = None,
) -> Report:
    """Run the reference and `implementation` (default: the optimized Triton MoE) on the
    problem of `config` and judge them with the selected oracles.

    config.numerics: None judges under the profile the implementation declares (its factory's
        `numerics` attribute: contract.judged_config; the default implementation declares
        none, diffmoe's profile); the report's config names the profile it resolved to.
    problem: the inputs to judge instead of `make_problem(config)`; its config must be
        `config` and it may hold 0..config.num_tokens tokens (`make_problem(config,
        num_tokens=0)` is a zero-token call). The report says the inputs were given, since
        its replay command rebuilds the generated ones.
    implementation_name: what the report calls the implementation, and what its replay
        command passes as `--impl` (a MODULE:FACTORY spec) unless it is the default's name.
        None (default): `factory_name(implementation)`: "optimized" for the default, the
        factory's `module:qualname` when its module exports it, else its `name` attribute or
        qualified name, and then the replay line says no command can load it.
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
    isolation: "none" (default) calls the implementation in the judge's process, where a
        debugger and its state behave as usual. "process" (the CLI's default) runs it in a
        process that holds neither the reference, its results, nor the judge (diffmoe/isolation/):
        problems go in and runs come out as bytes, importing the reference or the judging code
        there is refused and is a `contract` finding. The factory must then pickle by reference
        (a module-level class or function) or be named by `implementation_name` as a spec.
    sample: a ProgramSample (diffmoe/interpreter/program_sample.py; issue 42): each interpreter
        launch but the alignment's runs only the programs it chooses, and the differential and
        teacher forcing judge the elements they wrote (Check.settle_unsampled: those equal, and not
        NaN, in a second run over another poison; docs/models.md, "Sampled checks"). Needs the
        interpreter, one schedule, no NaN or Inf rows, and the oracles of SAMPLED_ORACLES (None:
        all of them). The report says what ran and how many elements of each buffer were judged.
    """
    if not isinstance(config, MoEConfig):
        raise TypeError(f"config must be a MoEConfig, got {type(config).__name__}")
    config.validate()
    limit = check_time_limit(time_limit)
    from diffmoe.oracles.registry import resolve_oracles

    if sample is None:
        chosen = resolve_oracles(oracles)
        parsed = resolve_schedules(schedules, config)
    else:
        chosen, parsed = sampled_selection(sample, config, schedules, oracles)
    if problem is not None:
        _check_problem_argument(problem, config)
    if implementation is not None and not callable(implementation):
        raise TypeError(f"implementation must be a factory callable (config -> implementation), got {implementation!r}")
    if implementation_name is None:
        implementation_name = factory_name(implementation)
    elif not isinstance(implementation_name, str):
        raise TypeError(f"implementation_name must be None or a string, got {implementation_name!r}")
    isolation = check_isolation(isolation)
    # before the declared numerics are taken: a profile that describes one scheme refused the
    # others as an internal error (`diffmoe check --impl lmdeploy` at the default fp8-token, exit 3)
    refused = unsupported(implementation, config)
    if refused is not None:  # its own `supports` says it does not run this config: nothing to judge
        raise ConfigRefused(f"{implementation_name} does not run this config: {refused}")
    config = judged_config(config, implementation)  # before the problem: the reference reads its profile there
    if problem is not None and problem.config != config:
        problem = dataclasses.replace(problem, config=config)  # same tensors: no input depends on numerics
    dev = torch.device(device) if device is not None else default_device()
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    if problem is not None and problem.device != dev:
        problem = problem.to(dev)
    sent = None
    if isolation == "process":
        sent = factory_reference(implementation or load_factory(DEFAULT_IMPLEMENTATION),
                                 implementation_name if is_factory_spec(implementation_name) else None)
        integrity.prepare()  # the judge's modules imported and its sources hashed before any candidate runs
        zygote(sent[1])  # here, before a worker is forked: every worker forks its candidates from it
    job = _Job(config, implementation, chosen, parsed, dev, implementation_name, problem, sent, sample)
    if limit is None:
        return job.run()
    if worker_start_method(dev) == "fork":
        interpreter_speed.warm_rewrites()  # the forked worker starts from this process's rewritten kernels
    return run_in_worker(job, limit)


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
    isolated: tuple | None = None  # isolation.client.factory_reference's (how the factory travels, preload)
    sample: ProgramSample | None = None  # a sampled check's programs (run_differential's `sample`)

    def report(self, findings: list[Finding], seconds: float, skipped: dict[str, str] | None = None) -> Report:
        return Report(
            config=self.config,
            implementation=self.implementation_name,
            oracles=list(self.oracles),
            schedules=[str(s) for s in self.schedules],
            findings=findings,
            seconds=seconds,
            inputs=_inputs_note(self.problem),
            skipped=dict(skipped or {}),
            # a check stopped before its record (a timeout): the sample alone, so the replay line chooses the same programs
            sample=None if self.sample is None else {"seed": self.sample.seed, "seeded": self.sample.seeded},
        )

    def learned(self) -> list:
        """What a worker process's check learned that the next checks of its parent may reuse
        (diffmoe/check/worker.py sends it back): the call-sequence series that passed there."""
        from diffmoe.oracles import call_series

        return call_series.passed_keys()

    def learn(self, learned: object) -> None:
        """In the parent: take what a worker's check learned (learned()); forked workers inherit it."""
        from diffmoe.oracles import call_series

        call_series.learn(learned)

    def run(self, progress: ProgressCallback | None = None) -> Report:
        start = time.perf_counter()
        factory = self.implementation or load_factory(DEFAULT_IMPLEMENTATION)
        candidate = None
        if self.isolated is not None:
            candidate = functools.partial(RemoteCandidate, factory_ref=self.isolated[0], preload=self.isolated[1])
        from diffmoe.judge.differential_run import DifferentialRun

        state = DifferentialRun(self.config, factory, self.oracles, self.schedules, self.device,
                                self.implementation_name, self.problem, progress, candidate, self.sample)
        try:
            try:
                state.run()
            except Crash as crash:
                state.findings += state.candidate.take_pending()
                for oracle in state.active:
                    state.findings += oracle.after_crash(state)
                state.findings.append(crash.finding)
            # every output and input compared once more, just before the candidate's process closes
            state.findings += state.late_findings()
        finally:
            if hasattr(state.candidate, "close"):
                state.candidate.close()
        if self.isolated is not None:
            state.findings += integrity.changed_findings()
        report = self.report(state.findings, time.perf_counter() - start, state.skipped)
        report.isolation = boundary.notice() if self.isolated is not None else None
        report.warnings = [w for oracle in state.active for w in oracle.warnings(state)]
        report.launches = launch_rows(state.runs[0].log.launches) if state.runs else []
        report.sample = state.sample_record() or report.sample
        return report


