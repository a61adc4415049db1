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

A metamorphic finding compares two runs, the drawn config and its sibling under the other
`fused` flag, and two runs cannot tell whose bits are wrong; the finding names the sibling
(`figures["sibling_config"]`). Rule: when every finding of an example comes from the sibling
run (metamorphic findings, or a crash of the sibling, both carrying `sibling_config`), the
sibling is judged too, by `run_differential` like any example. If it fails on its own (a
finding of another oracle, not merely its own metamorphic disagreement), the failure of the
example is the sibling's report: that is what the property raises, so the config reported,
saved and replayed is the one the other oracles catch, and the shrinker keeps only examples
whose sibling still fails that way. Otherwise (the usual symmetric disagreement) the drawn
config's report stands. The extra runs are counted in `FuzzOutcome.sibling_runs` and a note
says when the reported config is a sibling. Hypothesis still shrinks the drawn config, so the
reported sibling is the sibling of the smallest drawn config whose metamorphic finding still
shows; a smaller config of the sibling's own shape may exist below it.

max_examples bounds the configs drawn in the generate phase only (Hypothesis's meaning):
shrinking runs, a database replay and sibling runs come on top and are counted apart.

A database replay resumes shrinking (diffmoe/fuzz/database.py: `ResumingDatabase`).

Known findings (diffmoe/fuzz/waivers.py): an example whose every finding a waiver covers
(`waive=["differential@down_gemm"]`) is not a failure; the search goes on, and
`FuzzOutcome.waived_examples` counts the distinct configs that had only waived findings.
`keep_going=N` collects up to N distinct failures: once a failure is shrunk, the keys of its
unwaived findings (`oracle@stage`) become known and the search starts again from the same
seed, an example failing only with known keys passing; each round's failure holds at least
one key no earlier failure had. A round replays the examples of the rounds before it (same
seed, same draws) from their memoised reports, so each config is run once and
max_examples still bounds the configs generated over all rounds. Rounds stop at N failures,
at a round that finds nothing, or at an interrupt; `FuzzOutcome.failures` holds them in the
order found, `report` the first.

Crashes, timeouts and contract violations of the implementation are findings of the report
(diffmoe.judge.runner), so they shrink like any other failure. A crash of the harness itself on
some config (an exception out of `run_differential`) is treated as a failure too, reported
under the crash oracle. `time_limit` bounds every example (a `timeout` finding past it), so
a hanging implementation cannot stall the search.

Owns driving Hypothesis and shrinking. Must not judge: every verdict is run_differential's.
Longer than 400 lines because the property, its rounds (keep_going) and the outcome share one
search's state (the tier policy, the memo, the failures so far); split, each would take all of it.
"""

from __future__ import annotations

import importlib
import os
import time
import traceback
import unittest
from dataclasses import dataclass, field
from typing import Any, Callable, Collection, Sequence

from hypothesis import HealthCheck, Phase, Verbosity, given, reject, settings, statistics
from hypothesis import seed as hypothesis_seed
from hypothesis.database import ExampleDatabase
from hypothesis.errors import Unsatisfiable

from diffmoe.problem.config import MoEConfig
from diffmoe.contract import DEFAULT_IMPLEMENTATION_NAME, ImplementationFactory, Schedule, judged_config, unsupported
from diffmoe.fuzz.database import ResumingDatabase
from diffmoe.fuzz.draws import seed_only_draws
from diffmoe.fuzz.database_spec import open_database
from diffmoe.fuzz.tiers import FULL_EVERY, TIER_RUN, Judging, TierPolicy
from diffmoe.check.report import Report
from diffmoe.findings import Finding, Oracles
from diffmoe.fuzz.bounds import FieldBounds
from diffmoe.fuzz import shrink_limits
from diffmoe.fuzz.descent import descend
from diffmoe.fuzz.pairs import PairForcing, floors_hold, forced_note
from diffmoe.fuzz.strategies import DEFAULT_MAX_TOKENS, MAX_EXPERTS
from diffmoe.fuzz.waivers import Waiver, Waivers, finding_key, report_keys
from diffmoe.fuzz.request import MAX_EXAMPLES_LIMIT, MAX_KEEP_GOING, FuzzRequest

PHASE_GENERATE = "generate"
PHASE_SHRINK = "shrink"

ProgressCallback = Callable[[int, str, float, str], None]
"""progress(examples_run_so_far, phase, elapsed_seconds, config.short())"""


class FailingReport(AssertionError):
    """Raised inside the property when a config has findings; carries the Report."""

    def __init__(self, report: Report, drawn: MoEConfig | None = None) -> None:
        super().__init__(report.render())
        self.report = report
        self.drawn = report.config if drawn is None else drawn  # differs when the report is the sibling's


@dataclass
class FuzzOutcome:
    """What a fuzzing session found.

    examples counts every drawn config run (generation, shrinking and the final replay);
    shrink_examples the ones after the first failure, so generated_examples (examples minus
    shrink_examples) is what max_examples bounds; sibling_runs the metamorphic siblings
    judged on top (not in examples). Seconds are wall clock;
    seconds_to_first_failure and seconds_shrinking are None when nothing failed.
    """

    examples: int = 0
    shrink_examples: int = 0
    full_examples: int = 0  # examples judged by every oracle (diffmoe/fuzz/tiers.py); the rest by the cheap set
    escalations: int = 0  # cheap checks that failed and were judged again by every oracle (counted in full_examples)
    sibling_runs: int = 0
    seconds: float = 0.0
    seconds_to_first_failure: float | None = None
    seconds_shrinking: float | None = None
    report: Report | None = None  # the minimal failing report (smallest so far if interrupted)
    interrupted: bool = False
    seed: int | None = None
    notes: list[str] = field(default_factory=list)
    waived_examples: int = 0  # distinct configs whose every finding a waiver covered (the search went on)
    failures: list[Report] = field(default_factory=list)  # keep_going: the distinct failures, in the order found
    failure_keys: list[tuple[str, ...]] = field(default_factory=list)  # per failure: the keys no earlier one had
    # why the shrink stopped before it was done (diffmoe's run limits, diffmoe/fuzz/shrink_limits.py, or
    # Hypothesis's 500-shrink limit), None when it ran to its end: the report is then the smallest
    # failure found, not a minimal one
    shrink_cut: str | None = None
    first_failing_config: MoEConfig | None = None  # the first failure met, before any shrinking

    @property
    def passed(self) -> bool:
        return self.report is None

    @property
    def generated_examples(self) -> int:
        """Configs run in the generate phase (a database replay included): what max_examples bounds."""
        return self.examples - self.shrink_examples

    @property
    def failing_config(self) -> MoEConfig | None:
        return None if self.report is None else self.report.config

    def to_dict(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "interrupted": self.interrupted,
            "examples": self.examples,
            "generated_examples": self.generated_examples,
            "shrink_examples": self.shrink_examples,
            "full_examples": self.full_examples,
            "escalations": self.escalations,
            "sibling_runs": self.sibling_runs,
            "seconds": round(self.seconds, 4),
            "seconds_to_first_failure": None if self.seconds_to_first_failure is None else round(self.seconds_to_first_failure, 4),
            "seconds_shrinking": None if self.seconds_shrinking is None else round(self.seconds_shrinking, 4),
            "seed": self.seed,
            "notes": list(self.notes),
            "waived_examples": self.waived_examples,
            "failures": [dict(keys=list(k), report=r.to_dict()) for r, k in zip(self.failures, self.failure_keys)],
            "report": None if self.report is None else self.report.to_dict(),
            "shrink_cut": self.shrink_cut,
            "first_failing_config": None if self.first_failing_config is None else self.first_failing_config.to_dict(),
        }


def _database(database: ExampleDatabase | str | os.PathLike | None) -> ExampleDatabase | None:
    """A request's database (its type checked by FuzzRequest) opened: a folder, or redis://HOST:PORT/N
    (diffmoe/fuzz/database_spec.py)."""
    return open_database(database) if isinstance(database, (str, os.PathLike)) else database


def _sibling_of(report: Report) -> MoEConfig | None:
    """The sibling config when every finding comes from the metamorphic sibling run, else None."""
    siblings = []
    for f in report.findings:
        named = (f.figures or {}).get("sibling_config")
        if named is None and f.oracle != Oracles.METAMORPHIC:
            return None
        sibling = report.config.replace(fused=not report.config.fused) if named is None else MoEConfig.from_dict(named)
        if sibling not in siblings:
            siblings.append(sibling)
    return siblings[0] if len(siblings) == 1 else None


def _fails_on_its_own(report: Report) -> bool:
    """A finding that is not merely a disagreement with (or a crash of) its own sibling."""
    return any((f.figures or {}).get("sibling_config") is None and f.oracle != Oracles.METAMORPHIC for f in report.findings)


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
    implementation_name: str | None = None,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    max_experts: int = MAX_EXPERTS,
    database: ExampleDatabase | str | os.PathLike | None = None,
    progress: ProgressCallback | None = None,
    oracles: Collection[str] | None = None,
    schedules: Sequence[Schedule | str] | None = None,
    device: str | None = None,
    time_limit: float | None = None,
    special_rows: bool = True,
    features: bool = False,
    tier: str = TIER_RUN,
    full_every: int = FULL_EVERY,
    full_offset: int | None = None,
    shrink: bool = True,
    bounds: FieldBounds | None = None,
    waive: Waivers | Sequence[Waiver | str] = (),
    keep_going: int = 1,
    isolation: str = "none",
) -> FuzzOutcome:
    """Draw up to `max_examples` configs; stop at the first failure and shrink it.

    max_examples counts the configs of the generate phase; the shrinking runs (and a database
    replay, and metamorphic siblings judged on top, see the module doc) are not counted in it.

    seed: an int makes the run reproducible (Hypothesis's @seed); None draws a fresh one.
    planner: pins the planner of every config ("legacy" to watch the known bug get caught;
    None draws both). max_tokens, max_experts: bound T and E of the drawn configs (the
    interpreter's cost grows with both). database: None (nothing stored), a directory, a redis://HOST:PORT/N
    URL (diffmoe/fuzz/database_spec.py) or an ExampleDatabase:
    failures are stored there and replayed first on the next run. A seeded run replays
    nothing by design (Hypothesis's @seed turns the database off), so seed and database
    are exclusive. special_rows: draw all-zero, NaN and Inf rows at the default shares
    (diffmoe.fuzz.strategies; False: never). features: also draw the MoE-model features
    (swiglu_limit, dropped_slots, shared_experts; `moe_configs(features=True)`). oracles, schedules, device, time_limit, isolation: passed to `run_differential`
    unchanged (None: its defaults; time_limit None runs each example in this process).
    tier: "run" (default) judges most generated examples with the cheap oracle set and every
    `full_every`-th, every failing one, every shrinking run and every database replay with all
    of them; "full" judges every example with every oracle (diffmoe/fuzz/tiers.py). full_offset:
    the full set's first generated example is the (full_offset + 1)-th; None: the seed's phase,
    `full_phase(seed)` (seed % full_every; 0 unseeded). Naming
    `oracles` or `schedules` turns the tiers off. shrink: False reports the first failing
    example as found, unshrunk (Hypothesis's shrink phase off). bounds: pins and ranges of config
    fields (diffmoe.fuzz.bounds), drawn only within them. waive: findings searched past
    (diffmoe.fuzz.waivers: `oracle@stage`). keep_going: collect up to this many distinct failures
    (module doc), 1..MAX_KEEP_GOING.
    """
    return run_request(FuzzRequest(
        max_examples=max_examples, seed=seed, planner=planner, implementation=implementation,
        implementation_name=implementation_name, max_tokens=max_tokens, max_experts=max_experts, database=database,
        oracles=oracles, schedules=schedules, device=device, time_limit=time_limit, special_rows=special_rows,
        features=features, tier=tier, full_every=full_every, full_offset=full_offset, shrink=shrink, bounds=bounds,
        waive=waive, keep_going=keep_going, isolation=isolation), progress)


def run_request(request: FuzzRequest, progress: ProgressCallback | None = None) -> FuzzOutcome:
    """The search `request` describes (`fuzz()`'s docstring says what each field does); progress:
    called after each example (ProgressCallback)."""
    if not isinstance(request, FuzzRequest):
        raise TypeError(f"request must be a FuzzRequest, got {type(request).__name__}")
    if progress is not None and not callable(progress):
        raise TypeError(f"progress must be a callable or None, got {progress!r}")
    r = request
    seed, planner, implementation, implementation_name = r.seed, r.planner, r.implementation, r.implementation_name
    max_tokens, max_experts, max_examples, bounds = r.max_tokens, r.max_experts, r.max_examples, r.bounds
    oracles, schedules, device, time_limit, isolation = r.oracles, r.schedules, r.device, r.time_limit, r.isolation
    tier, full_every, full_offset = r.tier, r.full_every, r.resolved_full_offset()
    shrink, keep_going, waivers = r.shrink, r.keep_going, r.waive
    db = _database(r.database)
    if db is not None:
        db = ResumingDatabase(db)
    policy = r.policy()
    strategy = r.strategy()
    # Imported here, not at module import: tests replace the module, and importing the
    # runner pulls in the optimized implementation only when a fuzz actually starts.
    runner = importlib.import_module("diffmoe.judge.runner")
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
    smallest: list[FailingReport] = []

    known: set[str] = set()  # keys of the failures collected so far (keep_going)
    memo: dict[tuple, Report] = {}  # (config, judging) -> report: a later round replays, not reruns
    waived_configs: set[MoEConfig] = set()
    round_index = [0]
    earlier_rounds: set[MoEConfig] = set()  # configs the rounds before this one ran

    def failing(report: Report) -> bool:
        """Whether the report holds a finding no waiver covers and no earlier failure had."""
        return any(finding_key(f) not in known for f in waivers.unwaived(report.findings))

    def judge(config: MoEConfig, how: Judging) -> Report:
        key = (config, how.oracles, None if how.schedules is None else tuple(str(s) for s in how.schedules))
        if round_index[0] and key in memo:
            return memo[key]
        report = judge_afresh(config, how)
        if keep_going > 1:  # only a later round reads it: a single search keeps no reports
            memo[key] = report
        return report

    def judge_afresh(config: MoEConfig, how: Judging) -> Report:
        try:
            report = runner.run_differential(
                config,
                implementation,
                schedules=how.schedules,
                oracles=how.oracles,
                device=device,
                # None: run_differential names the factory (module:qualname)
                **({} if implementation_name is None else {"implementation_name": implementation_name}),
                # only when set: a stand-in runner need not know the argument
                **({} if time_limit is None else {"time_limit": time_limit}),
                **({} if isolation == "none" else {"isolation": isolation}),
            )
        except Exception as exc:  # a harness crash is a finding to shrink, not the end of the search
            name = implementation_name
            if name is None:  # as run_differential names it
                namer = getattr(runner, "factory_name", None)
                name = namer(implementation) if namer is not None else DEFAULT_IMPLEMENTATION_NAME
            report = _crash_report(config, exc, name, how.oracles, how.schedules)
        return report

    replaying = [False]  # inside the database-replay pass (see below)
    forcing = PairForcing(lambda c: (bounds is None or bounds.holds(c)) and c.num_tokens <= max_tokens
                          and c.num_experts <= max_experts and unsupported(implementation, c) is None)

    def count_run(phase: str, label: str) -> None:
        outcome.examples += 1
        if first_failure_at:
            outcome.shrink_examples += 1
        if progress is not None:
            progress(outcome.examples, phase, time.perf_counter() - start, label)

    def pin_mode(drawn: MoEConfig, failed: MoEConfig, mode, how: Judging) -> None:
        """At the first failure of an example forced by `mode` (config `failed`): the first mode of its
        ladder whose config fails maps every shrinking run (diffmoe/fuzz/pairs.py)."""
        for tried in forcing.ladder(mode):
            config = judged_config(forcing.mapped(drawn, tried), implementation)
            if config != failed:  # the failing config itself needs no second run
                if config not in earlier_rounds:
                    count_run(PHASE_SHRINK, f"{config.short()} (the failing example's draw, less forced)")
                if not failing(judge(config, how)):
                    continue
            forcing.pinned = tried
            return

    stopped: list[dict] = []  # Hypothesis's statistics of each test run: why its engine stopped
    shrink_start = [0]  # shrink_examples when this round's first failure was met
    runs_spent = [False]  # this round's shrink reached SHRINK_RUNS (diffmoe/fuzz/shrink_limits.py)

    def run_one(drawn: MoEConfig) -> None:
        generating = not first_failure_at and not replaying[0]
        # a forced granularity pair (diffmoe/fuzz/pairs.py): the slot's while generating, the pinned one shrinking
        if unsupported(implementation, drawn) is not None:
            # the implementation's own `supports` refuses it: not an example (contract.SUPPORTS). The draw,
            # not its forced config: Hypothesis then meets the same rejections as in a search without
            # forced pairs, and every example outside the forced slots is that search's own
            reject()
        mode = forcing.slot_mode() if generating else forcing.pinned if first_failure_at else None
        config = forcing.mapped(drawn, mode)  # a forced config the fuzz may not run: the draw
        mode = mode if config is not drawn else None
        forcing.slot += generating
        config = judged_config(config, implementation)  # as run_differential resolves it: drawn == reported
        if first_failure_at and outcome.shrink_examples - shrink_start[0] >= shrink_limits.SHRINK_RUNS:
            # the shrink's runs are spent: nothing more is judged, so every candidate passes at once
            # and Hypothesis's shrink ends on the smallest failure, which its last replay raises again
            runs_spent[0] = True
            if config == smallest[0].drawn:
                raise smallest[0]
            return
        report = verdict(config)
        if not report.passed and not failing(report):
            # only waived findings, or only failures already collected: the search goes on
            if waivers and not waivers.unwaived(report.findings):
                waived_configs.add(config)
            return
        if not report.passed:
            if not first_failure_at:
                first_failure_at.append(time.perf_counter())
                shrink_start[0] = outcome.shrink_examples
                if outcome.first_failing_config is None:
                    outcome.first_failing_config = report.config
                if generating and mode is not None:
                    pin_mode(drawn, config, mode, policy.judging(config, failed_before=True, replaying=False))
            failure = FailingReport(report, drawn=config)
            smallest[:] = [failure]  # the shrinker only tries smaller examples
            raise failure

    def verdict(config: MoEConfig) -> Report:
        """The report one run stands by, counted: the full set's where the cheap set failed, the
        metamorphic sibling's where only the sibling run disagreed and the sibling fails on its own."""
        phase = PHASE_SHRINK if first_failure_at else PHASE_GENERATE
        how = policy.judging(config, failed_before=bool(first_failure_at), replaying=replaying[0])
        fresh = config not in earlier_rounds
        if fresh:  # a config an earlier round ran is replayed from its report, not counted again
            count_run(phase, config.short() if how.full or not policy.tiered else f"{config.short()} (cheap oracle set)")
        report = judge(config, how)
        if not report.passed and not how.full and policy.tiered:  # escalate: the full set's report
            how = policy.full_judging()
            outcome.escalations += fresh
            full_report = judge(config, how)
            report = full_report if not full_report.passed else report
        outcome.full_examples += how.full and fresh
        sibling = None if not failing(report) else _sibling_of(report)
        if sibling is not None:  # only the metamorphic oracle saw it: judge the sibling too
            outcome.sibling_runs += fresh
            if progress is not None:
                progress(outcome.examples, phase, time.perf_counter() - start, f"{sibling.short()} (metamorphic sibling)")
            sibling_report = judge(sibling, how)
            if _fails_on_its_own(sibling_report) and failing(sibling_report):
                report = sibling_report
        return report

    def failing_oracles(report: Report) -> set[str]:
        return {f.oracle for f in waivers.unwaived(report.findings) if finding_key(f) not in known}

    def below_floors(final: FailingReport) -> tuple[FailingReport, bool, str | None]:
        """A shrink held at a forced pair's floors, walked below them (diffmoe/fuzz/descent.py): (the
        smallest failure found, whether an interrupt stops the fuzz, why the descent was cut or None).
        A candidate is kept when it fails with an oracle of the failure the shrink ended on."""
        oracles = failing_oracles(final.report)

        def fails(candidate: MoEConfig) -> Report | None:
            candidate = judged_config(candidate, implementation)
            report = verdict(candidate)
            if not (failing(report) and failing_oracles(report) & oracles):
                return None
            smallest[:] = [FailingReport(report, drawn=candidate)]  # what an interrupt reports
            return report

        try:
            drawn, report, cut = descend(final.drawn, final.report, fails, forcing.runs)
        except KeyboardInterrupt:
            outcome.interrupted = True
            return smallest[0], True, None
        if floors_hold(drawn):
            outcome.notes.append(forced_note(forcing.pinned[0]))
        cut = f"the descent below the forced floors' {shrink_limits.DESCENT_RUNS}-run limit" if cut else None
        return FailingReport(report, drawn=judged_config(drawn, implementation)), False, cut

    shrinking = [Phase.shrink] if shrink else []

    def hypothesis_test(phases: list):
        test = settings(
            max_examples=max_examples,
            derandomize=False,
            database=db,
            deadline=None,
            phases=phases,
            verbosity=Verbosity.quiet,  # the outcome is the report; nothing goes to stdout
            report_multiple_bugs=False,
            print_blob=False,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example,
                                   HealthCheck.filter_too_much],  # an implementation refusing much of the domain
        )(given(strategy)(run_one))
        return test if seed is None else hypothesis_seed(seed)(test)

    def search() -> None:
        # A database's failures are replayed in a pass of their own, every oracle judging them
        # (one may have been stored by a full check the cheap set cannot repeat), then the search;
        # the draws depend on the seed alone, not on the modules this process has loaded (draws.py)
        with seed_only_draws(), shrink_limits.clock_lifted(), statistics.collector.with_value(stopped.append):
            if db is not None:
                replaying[0] = True
                try:
                    hypothesis_test([Phase.reuse, *shrinking])()
                except unittest.SkipTest:  # nothing stored: Hypothesis says it was told to run nothing
                    pass
                replaying[0] = False
            hypothesis_test([Phase.generate, *shrinking])()

    found_first: list[float] = []  # when the first round's failure was met
    while True:
        stopped.clear()
        runs_spent[0] = False
        final, stop = search_round(search, db, smallest, outcome,
                                   shrink_done=lambda: not runs_spent[0] and shrink_cut(stopped) is None)
        cut = shrink_cut(stopped) if final is not None and not stop else None
        if final is not None and not stop and runs_spent[0]:
            cut = f"diffmoe's {shrink_limits.SHRINK_RUNS}-run shrink limit"
        if final is not None and not stop and shrink and forcing.pinned is not None and forcing.pinned[1]:
            final, stop, descent_cut = below_floors(final)
            cut = cut or descent_cut
        if cut is not None and outcome.shrink_cut is None:
            outcome.shrink_cut = cut
            outcome.notes.append(
                f"shrinking was cut short ({cut}) after {outcome.shrink_examples} shrinking runs: the config reported "
                f"is the smallest failure found, not a minimal one (first failure {_first_short(outcome)}; "
                f"reported {final.report.config.short()}); run the fuzz again to resume with a database, or "
                "replay the config with check")
        if first_failure_at and not found_first:
            found_first.append(first_failure_at[0])
        if final is None:
            break
        if final.drawn != final.report.config:
            outcome.notes.append(
                f"the drawn config {final.drawn.short()} failed only the metamorphic oracle; its sibling "
                f"(fused={final.report.config.fused}) fails other oracles on its own and is the config reported"
            )
        new = tuple(k for k in report_keys(waivers.unwaived(final.report.findings)) if k not in known)
        outcome.failures.append(final.report)
        outcome.failure_keys.append(new)
        known.update(new)
        if stop or len(outcome.failures) >= keep_going:
            break
        # the next round: the same seed draws the same examples, replayed from `memo`
        round_index[0] += 1
        earlier_rounds.update(k[0] for k in memo)
        policy = TierPolicy(tier, oracles, schedules, full_every, full_offset)
        forcing.reset()
        first_failure_at.clear()
        smallest.clear()
    outcome.waived_examples = len(waived_configs)
    if outcome.failures:
        outcome.report = outcome.failures[0]
    end = time.perf_counter()
    outcome.seconds = end - start
    if found_first:
        outcome.seconds_to_first_failure = found_first[0] - start
        outcome.seconds_shrinking = end - found_first[0]
    return outcome


# Hypothesis's engine stops a shrink at MAX_SHRINKING_SECONDS (five minutes, lifted in diffmoe's
# searches: diffmoe/fuzz/shrink_limits.py) or MAX_SHRINKS (500 successful shrinks) and reports the
# smallest failure so far as it would a minimal one; its statistics name the reason ("shrinking was
# very slow", "shrunk test case 500 times").
_CUT_REASONS = ("shrinking was very slow", "shrunk test case")


def shrink_cut(stats: Sequence[dict]) -> str | None:
    """Why a search's shrink stopped before its end, from Hypothesis's statistics; None when it did not."""
    for s in stats:
        reason = str(s.get("stopped-because", ""))
        if reason.startswith(_CUT_REASONS):
            return reason.replace("shrinking was very slow", "Hypothesis's five-minute shrink limit")
    return None


def _first_short(outcome: FuzzOutcome) -> str:
    return "unknown" if outcome.first_failing_config is None else outcome.first_failing_config.short()


def search_round(search: Callable[[], None], db, smallest: list[FailingReport], outcome: FuzzOutcome,
                 shrink_done: Callable[[], bool] = lambda: True) -> tuple[FailingReport | None, bool]:
    """One search: (its shrunk failure or None, whether the fuzz must stop here: an interrupt).
    shrink_done(): whether the shrink ran to its end (not cut by a limit): only then is what the
    database holds marked minimal, so a run cut short resumes on the next run (diffmoe/fuzz/database.py)."""
    try:
        search()
        if db is not None and shrink_done():
            db.mark_shrunk()
    except FailingReport as exc:
        if db is not None and shrink_done():
            db.mark_shrunk()  # the shrink completed: what the database holds is minimal
        return exc, False
    except KeyboardInterrupt:
        outcome.interrupted = True
        return (smallest[0] if smallest else None), True
    except Unsatisfiable:
        if not smallest:
            raise ValueError("the field bounds leave no config the implementation runs: Hypothesis found no valid "
                             "example (widen a bound, or pin fields that fit together)") from None
        return smallest[0], True
    except Exception as exc:
        # Hypothesis reports a failure it could not replay (a flaky implementation) as its own
        # error; the failures seen are still real, so keep the smallest and say so.
        if not smallest:
            raise
        outcome.notes.append(f"the minimal example did not fail again on replay ({type(exc).__name__}): flaky")
        return smallest[0], False
    return None, False
