"""Fuzzing driven from code: Hypothesis draws configs, `run_differential` judges each one.

`fuzz()` wraps one property, "this config has no findings", in a Hypothesis test and runs
it. The first config with findings makes the property raise `FailingReport`, which carries
the Report; Hypothesis then stops generating and shrinks. Each failing example it executes
while shrinking is smaller than the one before, and once done it replays the minimal one
and re-raises its exception, so the Report that comes out is the minimal failing one.

Ctrl-C (and SIGTERM, which the CLI turns into KeyboardInterrupt) stops the search at once;
the outcome then carries the smallest failure seen so far, if any, and `interrupted=True`.
With a database, every failing example Hypothesis meets is saved as it is met (an atomic
file rename), so an interrupted run leaves a consistent database and the next run replays
its failure first.

Crashes, timeouts and contract violations of the implementation are findings of the report
(diffmoe.runner), so they shrink like any other failure. A crash of the harness itself on
some config (an exception out of `run_differential`) is treated as a failure too, reported
under the crash oracle. `time_limit` bounds every example (a `timeout` finding past it), so
a hanging implementation cannot stall the search.

Owns driving Hypothesis and shrinking. Must not judge: every verdict is run_differential's.
"""

from __future__ import annotations

import importlib
import os
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Collection, Sequence

from hypothesis import HealthCheck, Phase, Verbosity, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis.database import DirectoryBasedExampleDatabase, ExampleDatabase

from .config import MAX_SEED, MAX_TOKENS, PLANNERS, MoEConfig, check_int
from .contract import DEFAULT_IMPLEMENTATION_NAME, ImplementationFactory, Schedule
from .report import Finding, Oracles, Report
from .strategies import DEFAULT_MAX_TOKENS, MAX_EXPERTS, moe_configs

PHASE_GENERATE = "generate"
PHASE_SHRINK = "shrink"
MAX_EXAMPLES_LIMIT = 1_000_000

ProgressCallback = Callable[[int, str, float, str], None]
"""progress(examples_run_so_far, phase, elapsed_seconds, config.short())"""


class FailingReport(AssertionError):
    """Raised inside the property when a config has findings; carries the Report."""

    def __init__(self, report: Report) -> None:
        super().__init__(report.render())
        self.report = report


@dataclass
class FuzzOutcome:
    """What a fuzzing session found.

    examples counts every config run (generation, shrinking and the final replay);
    shrink_examples the ones after the first failure. Seconds are wall clock;
    seconds_to_first_failure and seconds_shrinking are None when nothing failed.
    """

    examples: int = 0
    shrink_examples: int = 0
    seconds: float = 0.0
    seconds_to_first_failure: float | None = None
    seconds_shrinking: float | None = None
    report: Report | None = None  # the minimal failing report (smallest so far if interrupted)
    interrupted: bool = False
    seed: int | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return self.report is None

    @property
    def failing_config(self) -> MoEConfig | None:
        return None if self.report is None else self.report.config

    def to_dict(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "interrupted": self.interrupted,
            "examples": self.examples,
            "shrink_examples": self.shrink_examples,
            "seconds": round(self.seconds, 3),
            "seconds_to_first_failure": None if self.seconds_to_first_failure is None else round(self.seconds_to_first_failure, 3),
            "seconds_shrinking": None if self.seconds_shrinking is None else round(self.seconds_shrinking, 3),
            "seed": self.seed,
            "notes": list(self.notes),
            "report": None if self.report is None else self.report.to_dict(),
        }


def _database(database: ExampleDatabase | str | os.PathLike | None) -> ExampleDatabase | None:
    if database is None or isinstance(database, ExampleDatabase):
        return database
    if isinstance(database, (str, os.PathLike)):
        return DirectoryBasedExampleDatabase(os.fspath(database))
    raise TypeError(f"database must be None, a directory path or a hypothesis ExampleDatabase, got {database!r}")


def _crash_report(
    config: MoEConfig, exc: Exception, implementation_name: str, oracles: Collection[str] | None, schedules
) -> Report:
    frames = traceback.format_exception(type(exc), exc, exc.__traceback__)
    return Report(
        config=config,
        implementation=implementation_name,
        oracles=sorted(oracles) if oracles else [Oracles.CRASH],
        schedules=[str(s) for s in schedules] if schedules else [],
        findings=[
            Finding(
                oracle=Oracles.CRASH,
                message=f"run_differential raised {type(exc).__name__}: {exc}",
                figures={"traceback": "".join(frames[-3:]).strip()},
            )
        ],
    )


def fuzz(
    *,
    max_examples: int,
    seed: int | None,
    planner: str | None = "fixed",
    implementation: ImplementationFactory | None = None,
    implementation_name: str = DEFAULT_IMPLEMENTATION_NAME,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    max_experts: int = MAX_EXPERTS,
    database: ExampleDatabase | str | os.PathLike | None = None,
    progress: ProgressCallback | None = None,
    oracles: Collection[str] | None = None,
    schedules: Sequence[Schedule | str] | None = None,
    device: str | None = None,
    time_limit: float | None = None,
    special_rows: bool = False,
) -> FuzzOutcome:
    """Run up to `max_examples` drawn configs; stop at the first failure and shrink it.

    seed: an int makes the run reproducible (Hypothesis's @seed); None draws a fresh one.
    planner: pins the planner of every config ("legacy" to watch the known bug get caught;
    None draws both). max_tokens, max_experts: bound T and E of the drawn configs (the
    interpreter's cost grows with both). database: None (nothing stored), a directory, or an ExampleDatabase:
    failures are stored there and replayed first on the next run. A seeded run replays
    nothing by design (Hypothesis's @seed turns the database off), so seed and database
    are exclusive. special_rows: also draw all-zero, NaN and Inf rows (the
    `moe_configs(special_rows=True)` profile). oracles, schedules, device, time_limit: passed to `run_differential`
    unchanged (None: its defaults; time_limit None runs each example in this process).
    """
    check_int("max_examples", max_examples, 1, MAX_EXAMPLES_LIMIT)
    if seed is not None:
        check_int("seed", seed, 0, MAX_SEED)
    if planner is not None and planner not in PLANNERS:
        raise ValueError(f"planner must be None or one of {list(PLANNERS)}, got {planner!r}")
    check_int("max_tokens", max_tokens, 1, MAX_TOKENS)
    if progress is not None and not callable(progress):
        raise TypeError(f"progress must be a callable or None, got {progress!r}")
    if time_limit is not None and (
        isinstance(time_limit, bool) or not isinstance(time_limit, (int, float)) or not 0 < time_limit < float("inf")
    ):
        raise ValueError(f"time_limit must be None or a number of seconds > 0, got {time_limit!r}")
    db = _database(database)
    if seed is not None and db is not None:
        raise ValueError("seed and database are exclusive: a seeded run is reproducible and replays no stored failure")
    if not isinstance(special_rows, bool):
        raise TypeError(f"special_rows must be a bool, got {special_rows!r}")
    strategy = moe_configs(planner=planner, max_tokens=max_tokens, max_experts=max_experts, special_rows=special_rows)
    # Imported here, not at module import: tests replace the module, and importing the
    # runner pulls in the optimized implementation only when a fuzz actually starts.
    runner = importlib.import_module("diffmoe.runner")
    # Bad oracle or schedule names would otherwise fail every example as a "crash".
    if oracles is not None and hasattr(runner, "resolve_oracles"):
        runner.resolve_oracles(oracles)
    if schedules is not None and hasattr(runner, "resolve_schedules"):
        runner.resolve_schedules(schedules)
    if time_limit is not None and hasattr(runner, "check_time_limit"):
        runner.check_time_limit(time_limit)  # its upper bound too, before the first example

    outcome = FuzzOutcome(seed=seed)
    start = time.perf_counter()
    first_failure_at: list[float] = []
    smallest: list[Report] = []

    def run_one(config: MoEConfig) -> None:
        outcome.examples += 1
        phase = PHASE_SHRINK if first_failure_at else PHASE_GENERATE
        if first_failure_at:
            outcome.shrink_examples += 1
        if progress is not None:
            progress(outcome.examples, phase, time.perf_counter() - start, config.short())
        try:
            report = runner.run_differential(
                config,
                implementation,
                schedules=schedules,
                oracles=oracles,
                device=device,
                implementation_name=implementation_name,
                # only when set: a stand-in runner need not know the argument
                **({} if time_limit is None else {"time_limit": time_limit}),
            )
        except Exception as exc:  # a harness crash is a finding to shrink, not the end of the search
            report = _crash_report(config, exc, implementation_name, oracles, schedules)
        if not report.passed:
            if not first_failure_at:
                first_failure_at.append(time.perf_counter())
            smallest[:] = [report]  # the shrinker only tries smaller examples
            raise FailingReport(report)

    phases = [Phase.generate, Phase.shrink]
    if db is not None:
        phases.insert(0, Phase.reuse)
    test = settings(
        max_examples=max_examples,
        derandomize=False,
        database=db,
        deadline=None,
        phases=phases,
        verbosity=Verbosity.quiet,  # the outcome is the report; nothing goes to stdout
        report_multiple_bugs=False,
        print_blob=False,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example],
    )(given(strategy)(run_one))
    if seed is not None:
        test = hypothesis_seed(seed)(test)

    try:
        test()
    except FailingReport as exc:
        outcome.report = exc.report
    except KeyboardInterrupt:
        outcome.interrupted = True
        outcome.report = smallest[0] if smallest else None
    except Exception as exc:
        # Hypothesis reports a failure it could not replay (a flaky implementation) as its own
        # error; the failures seen are still real, so keep the smallest and say so.
        if not smallest:
            raise
        outcome.report = smallest[0]
        outcome.notes.append(f"the minimal example did not fail again on replay ({type(exc).__name__}): flaky")
    end = time.perf_counter()
    outcome.seconds = end - start
    if first_failure_at:
        outcome.seconds_to_first_failure = first_failure_at[0] - start
        outcome.seconds_shrinking = end - first_failure_at[0]
    return outcome
