"""The plan tier: a static fuzzer that judges declared workspace plans, never running anything.

Execution fuzzing (diffmoe.fuzz.driver) costs seconds per config, so its domains stay tiny. What
needs no execution (static aliasing of the declared plan, and whether the plan fits the
workspaces allocated for the largest batch) is judged here over a domain far wider, at
thousands of configs per second, drawn with a plain `random.Random(seed)` (Hypothesis's
per-example overhead is far above a plan's cost); the same seed gives the same sequence.

Domain of `draw_config` (every config satisfies MoEConfig.validate() by construction: each
bound is derived from the fields already drawn and values are clipped, nothing is rejected):

* quant: every scheme of config.QUANT_SCHEMES, uniformly.
* num_tokens T: 1..PLAN_MAX_TOKENS (65536); a third from ``TOKEN_SPECIALS`` (1, the row-block
  boundaries 15..17, 31..33, 63..65, 129, 4095..4097, 65536), the rest log-uniform.
* num_experts E: 1..256, log-uniform; topk K: 1..min(E, 16, PLAN_MAX_ROUTED_ROWS // T), a quarter
  of the draws at that cap (K == E whenever E <= 16 allows it).
* expert_map: a quarter of the draws hold a valid map (L in 1..E local experts at random
  global positions, numbered 0..L-1 in random order, the rest -1), else None.
* hidden H, inter I: log-uniform in 16..8192 (odd values included); fp8-block: multiples of
  128 in 128..8192. Both clipped so that config.problem_bytes stays within MAX_PROBLEM_BYTES.
* fused: drawn for FP8 schemes, False for bf16; output: separate or workspace; router_weight:
  "input" (half the draws) only when K == 1, else "down".
* planner: pinned by the `planner` argument (None draws fixed or legacy).
* call_tokens: a quarter of the draws with T > 1 call with 1..T-1 tokens, else None.
* skew, seed and the opt-in inputs stay at their defaults (uniform, 0): a plan ignores them.

A config is judged by `judge_config`: plan = the factory's cheap `plan_workspaces(config,
call_T)` (contract.PLAN_WORKSPACES; an implementation without it cannot be judged here, the
tier builds no implementation); findings = check_static_aliasing(plan) +
check_workspace_fit(plan, capacity), capacity being the declared workspace_bytes of the plan
for config.num_tokens (workspaces are allocated for the largest batch, the plan is the call's).

The first failing config is shrunk by `shrink_config`, a deterministic greedy shrinker: field
by field it tries simpler candidates (quant earlier in strategies.QUANT_ORDER; T, E, K, H, I
their minimum, then values closing in on the current one; expert_map, call_tokens to None;
fused to False; output to separate; router_weight to down; the planner stays), accepting the
first valid one that still has a finding of the same oracle, until none is accepted.

Owns the plan tier's domain, its sampler and shrinker. Must not run or build an implementation.
Longer than 400 lines because the domain, its bounded form (a fuzz's field bounds, issue 48) and the
shrinker that must stay inside both are read together.
"""

from __future__ import annotations

import math
import random
import time
from typing import Any, Callable, Iterator

from diffmoe.problem.config import (
    MAX_PROBLEM_BYTES, MAX_SEED, PLANNERS, QUANT_BLOCK, QUANT_SCHEMES, MoEConfig, check_int,
)
from diffmoe.contract import DEFAULT_IMPLEMENTATION, DEFAULT_IMPLEMENTATION_NAME, PLAN_WORKSPACES, SUPPORTS, factory_attribute, resolve_factory
from diffmoe.fuzz.bounds import FieldBounds
from diffmoe.fuzz.driver import FuzzOutcome
from diffmoe.fuzz.waivers import Waivers
from diffmoe.check.report import Report
from diffmoe.findings import Finding, Oracles
from diffmoe.fuzz.strategies import MIN_SIZE, QUANT_ORDER

PHASE_GENERATE = "generate"
PHASE_SHRINK = "shrink"
MAX_PLAN_EXAMPLES = 10**9
PLAN_MAX_EXPERTS = 256
PLAN_MAX_TOPK = 16
PLAN_MAX_SIZE = 8192
# The plan tier's own token cap: the config's was 65536 when this domain was drawn, and the domain (and
# every seed's draws) stays what it was when the config's grew to the sizes engines run (issue 42).
PLAN_MAX_TOKENS = 65536
PLAN_MAX_ROUTED_ROWS = 131072
TOKEN_SPECIALS = (1, 15, 16, 17, 31, 32, 33, 63, 64, 65, 129, 4095, 4096, 4097, PLAN_MAX_TOKENS)
PROGRESS_INTERVAL = 0.2  # seconds between progress calls
_CLOCK_EVERY = 64  # configs between looks at the clock
_PLAN_ORACLES = [Oracles.STATIC_ALIASING, Oracles.CONTRACT]
_ELEMENTS_BUDGET = MAX_PROBLEM_BYTES // 4  # problem_bytes counts float32 elements

PlanFn = Callable[[MoEConfig, int], Any]
ProgressCallback = Callable[[int, str, float, str], None]
"""progress(examples_so_far, phase, elapsed_seconds, config.short()), at most every PROGRESS_INTERVAL s"""


def _log_int(rng: random.Random, lo: int, hi: int) -> int:
    """An int in lo..hi, log-uniform (small values as likely per octave as large ones)."""
    return min(hi, int(lo * ((hi + 1) / lo) ** rng.random()))


def _size(rng: random.Random, step: int, cap: int) -> int:
    if step == 1:
        return _log_int(rng, MIN_SIZE, cap)
    return _log_int(rng, 1, cap // step) * step


def draw_config(rng: random.Random, planner: str | None = "fixed") -> MoEConfig:
    """One config of the module's domain (see the docstring), valid by construction."""
    r = rng.random
    quant = QUANT_SCHEMES[int(r() * len(QUANT_SCHEMES))]
    step = QUANT_BLOCK if quant == "fp8-block" else 1
    floor = QUANT_BLOCK if step > 1 else MIN_SIZE
    t = TOKEN_SPECIALS[int(r() * len(TOKEN_SPECIALS))] if r() < 1 / 3 else _log_int(rng, 1, PLAN_MAX_TOKENS)
    e = _log_int(rng, 1, PLAN_MAX_EXPERTS)
    k_cap = min(e, PLAN_MAX_TOPK, PLAN_MAX_ROUTED_ROWS // t)
    k = k_cap if r() < 0.25 else 1 + int(r() * k_cap)
    expert_map = None
    local = e
    if r() < 0.25:
        local = 1 + int(r() * e)
        mapping = [-1] * e
        for index, position in enumerate(rng.sample(range(e), local)):
            mapping[position] = index
        expert_map = tuple(mapping)
    tk = t * k
    # problem_bytes/4 = L*3*I*H + T*H + TK*(3I + H): H's cap leaves room for I = floor, I's for the drawn H
    h_cap = min(PLAN_MAX_SIZE, (_ELEMENTS_BUDGET - 3 * floor * tk) // (t + tk + 3 * floor * local))
    h = _size(rng, step, h_cap)
    i_cap = min(PLAN_MAX_SIZE, (_ELEMENTS_BUDGET - t * h - tk * h) // (3 * (local * h + tk)))
    i = _size(rng, step, i_cap)
    fused = quant != "bf16" and r() < 0.5
    output = "workspace" if r() < 0.5 else "separate"
    router_weight = "input" if k == 1 and r() < 0.5 else "down"
    chosen = planner if planner is not None else PLANNERS[int(r() * len(PLANNERS))]
    call_tokens = 1 + int(r() * (t - 1)) if t > 1 and r() < 0.25 else None
    return MoEConfig.unchecked(  # valid by construction; test_plan_tier validates every draw
        num_tokens=t, num_experts=e, topk=k, hidden=h, inter=i, quant=quant, fused=fused, router_weight=router_weight,
        planner=chosen, output=output, expert_map=expert_map, call_tokens=call_tokens,
    )


# Fields of the plan domain a fuzz's bounds (diffmoe.fuzz.bounds) may pin or range; a plan ignores the rest.
PLAN_INT_FIELDS = ("num_tokens", "num_experts", "topk", "hidden", "inter", "call_tokens")
PLAN_CHOICE_FIELDS = ("quant", "fused", "output", "router_weight", "planner", "expert_map")
# Draws tried for one config within bounds before the tier gives up: `--quant bf16 --unfused` keeps
# a quarter of the draws, `--tokens 1..4 --topk 8` one in a few dozen.
MAX_BOUNDED_TRIES = 10_000


def _plan_bounds(bounds: FieldBounds | None) -> FieldBounds | None:
    """The bounds' plan fields only (None when they bound none): a bound on the seed or the skew
    leaves every plan as it is."""
    if not bounds:
        return None
    kept = FieldBounds({n: r for n, r in bounds.ranges.items() if n in PLAN_INT_FIELDS},
                       {n: v for n, v in bounds.values.items() if n in PLAN_CHOICE_FIELDS})
    return kept or None


def bounded_config(rng: random.Random, planner: str | None, bounds: FieldBounds) -> MoEConfig | None:
    """A config of the domain within `bounds` (plan fields): a draw with each bounded field moved
    inside its bound (a choice redrawn from the allowed values, an int clipped; fp8-block sizes
    rounded to a block), redrawn while the config refuses the result; None after MAX_BOUNDED_TRIES."""
    for _ in range(MAX_BOUNDED_TRIES):
        c = draw_config(rng, planner)
        fields: dict[str, Any] = {}
        for name, allowed in bounds.values.items():
            if getattr(c, name) not in allowed:
                fields[name] = allowed[int(rng.random() * len(allowed))]
        quant = fields.get("quant", c.quant)
        for name, (lo, hi) in bounds.ranges.items():
            value = getattr(c, name)
            value = min(max(lo if value is None else value, lo), hi)
            if name in ("hidden", "inter") and quant == "fp8-block":
                value = min(-(-value // QUANT_BLOCK) * QUANT_BLOCK, hi // QUANT_BLOCK * QUANT_BLOCK)
            fields[name] = value
        if quant == "bf16":
            fields["fused"] = False
        try:
            bounded = c.replace(**fields)
        except (TypeError, ValueError):
            continue
        if bounds.holds(bounded):
            return bounded
    return None


def plan_configs(seed: int, planner: str | None = "fixed", bounds: FieldBounds | None = None) -> Iterator[MoEConfig]:
    """The endless sequence of configs `fuzz_plans` judges for this seed, planner and bounds (none
    when no config of the domain lies within the bounds)."""
    rng = random.Random(seed)
    kept = _plan_bounds(bounds)
    while True:
        config = draw_config(rng, planner) if kept is None else bounded_config(rng, planner, kept)
        if config is None:
            return
        yield config


def plan_function(factory: Callable) -> PlanFn:
    """The factory's cheap plan (contract.PLAN_WORKSPACES); ValueError when it declares none."""
    plan = factory_attribute(factory, PLAN_WORKSPACES)
    if plan is None:
        raise ValueError(
            f"implementation {resolve_factory(factory).qualname or factory!r} declares no cheap plan (no callable "
            f"{PLAN_WORKSPACES!r} attribute on its factory): the plan tier judges plans without building an "
            "implementation per config, so it needs plan_workspaces(config, num_tokens)"
        )
    return plan


def judge_config(plan: PlanFn, config: MoEConfig) -> list[Finding]:
    """Static aliasing of the call's plan, and its fit in the workspaces declared for max T."""
    # imported here: a module that defines a factory may import this one, and loads in the
    # candidate's process, where diffmoe.oracles is refused (issue 43)
    from diffmoe.oracles.static_aliasing import check_static_aliasing, check_workspace_fit

    full = plan(config, config.num_tokens)
    if full is None:  # a config the implementation refuses (contract.SUPPORTS): nothing to judge
        return []
    call = full if config.call_tokens is None or config.call_tokens == config.num_tokens else plan(config, config.call_tokens)
    return check_static_aliasing(call) + check_workspace_fit(call, tuple(full.workspace_bytes))


# ---- shrinking -----------------------------------------------------------------------
def _toward(value: int, lo: int, unit: int = 1) -> list[int]:
    """Candidates below `value` down to `lo` (multiples of `unit`): lo first, then ever closer."""
    if value <= lo:
        return []
    out, gap = [lo], (value - lo) // unit
    while gap > 1:
        gap //= 2
        out.append(value - gap * unit)
    return out + ([value - unit] if value - unit > lo else [])


def _shrunk_map(expert_map: tuple[int, ...], e: int) -> tuple[int, ...]:
    """The first e entries of a map, renumbered 0..L-1 (entry 0 local when none is)."""
    head = list(expert_map[:e])
    order = sorted((v, n) for n, v in enumerate(head) if v >= 0)
    if not order:
        return (0, *([-1] * (e - 1)))
    for index, (_, n) in enumerate(order):
        head[n] = index
    return tuple(head)


def _candidates(c: MoEConfig) -> Iterator[dict[str, Any]]:
    """Simpler variants of c, field by field, simplest first within a field."""
    for q in QUANT_ORDER[: QUANT_ORDER.index(c.quant)]:
        yield {"quant": q}
    for t in dict.fromkeys(_toward(c.num_tokens, 1)):
        ct = c.call_tokens
        yield {"num_tokens": t, "call_tokens": None if ct is None or t == 1 else min(ct, t - 1)}
    for e in dict.fromkeys(_toward(c.num_experts, 1)):
        yield {"num_experts": e, "expert_map": None if c.expert_map is None else _shrunk_map(c.expert_map, e)}
    for k in dict.fromkeys(_toward(c.topk, 1)):
        yield {"topk": k}
    unit = QUANT_BLOCK if c.quant == "fp8-block" else 1
    lo = QUANT_BLOCK if unit > 1 else MIN_SIZE
    for name in ("hidden", "inter"):
        for v in dict.fromkeys(_toward(getattr(c, name), lo, unit)):
            yield {name: v}
    if c.expert_map is not None:
        yield {"expert_map": None}
    if c.call_tokens is not None:
        yield {"call_tokens": None}
    if c.fused:
        yield {"fused": False}
    if c.output != "separate":
        yield {"output": "separate"}
    if c.router_weight != "down":
        yield {"router_weight": "down"}


def shrink_config(plan: PlanFn, config: MoEConfig, oracle: str,
                  on_step: Callable[[MoEConfig], None] | None = None,
                  on_accept: Callable[[MoEConfig, list[Finding]], None] | None = None,
                  findings: list[Finding] | None = None, bounds: FieldBounds | None = None,
                  waivers: Waivers | None = None) -> tuple[MoEConfig, list[Finding], int]:
    """Greedy shrink of a failing config (see the module doc): (minimal config, its findings,
    configs tried). on_step(candidate) is called before each candidate is judged, on_accept(config,
    findings) for each accepted one, so a caller interrupted mid-shrink keeps the smallest so far.
    findings: config's own, when the caller has them (not judged again). bounds: candidates outside
    them are not tried; waivers: findings they cover do not count."""
    kept = _plan_bounds(bounds)

    def judged(config: MoEConfig) -> list[Finding]:
        found = judge_config(plan, config)
        return found if waivers is None else waivers.unwaived(found)
    current = config
    findings = judged(config) if findings is None else findings
    tried = 0
    progressed = True
    while progressed:
        progressed = False
        for changes in _candidates(current):
            try:
                candidate = current.replace(**changes)
            except (TypeError, ValueError):
                continue  # not a valid config
            if kept is not None and not kept.holds(candidate):
                continue  # outside the fuzz's bounds
            tried += 1
            if on_step is not None:
                on_step(candidate)
            got = judged(candidate)
            if any(f.oracle == oracle for f in got):
                current, findings, progressed = candidate, got, True
                if on_accept is not None:
                    on_accept(current, findings)
                break
    return current, findings, tried


# ---- the driver ------------------------------------------------------------------------
class PlanFuzzOutcome(FuzzOutcome):
    """What a plan-tier session found: FuzzOutcome's fields (examples counts every config judged,
    generation and shrinking; shrink_examples those after the first failure), without the
    execution tier's counts (nothing here runs an implementation)."""

    @property
    def configs_per_second(self) -> float | None:
        return self.examples / self.seconds if self.seconds > 0 else None

    def to_dict(self) -> dict[str, Any]:
        data = super().to_dict()
        for key in ("full_examples", "escalations", "sibling_runs"):
            del data[key]
        return data


def _check_arguments(max_examples, seed, planner, implementation, implementation_name, progress, time_budget) -> None:
    check_int("max_examples", max_examples, 1, MAX_PLAN_EXAMPLES)
    check_int("seed", seed, 0, MAX_SEED)
    if planner is not None and planner not in PLANNERS:
        raise ValueError(f"planner must be None or one of {list(PLANNERS)}, got {planner!r}")
    if implementation is not None and not callable(implementation):
        raise TypeError(f"implementation must be None or a factory callable, got {type(implementation).__name__}")
    if implementation_name is not None and not isinstance(implementation_name, str):
        raise TypeError(f"implementation_name must be None or a str, got {type(implementation_name).__name__}")
    if progress is not None and not callable(progress):
        raise TypeError(f"progress must be None or a callable, got {type(progress).__name__}")
    if time_budget is not None and (
        isinstance(time_budget, bool) or not isinstance(time_budget, (int, float)) or not 0 < time_budget < math.inf
    ):
        raise ValueError(f"time_budget must be None or a finite number of seconds > 0, got {time_budget!r}")


def fuzz_plans(
    *,
    max_examples: int,
    seed: int,
    planner: str | None = "fixed",
    implementation: Callable | None = None,
    implementation_name: str | None = None,
    progress: ProgressCallback | None = None,
    time_budget: float | None = None,
    bounds: FieldBounds | None = None,
    waive: Waivers | None = None,
) -> PlanFuzzOutcome:
    """Judge up to `max_examples` drawn configs' plans (module doc); shrink the first failure.

    implementation: a factory with the cheap plan_workspaces attribute (None: the default,
    contract.DEFAULT_IMPLEMENTATION); without one a ValueError says so. time_budget: stop
    drawing after that many seconds (a note says so). Ctrl-C stops at once and keeps the
    smallest failure so far, with interrupted=True. bounds: the execution tier's field bounds,
    drawn and shrunk within (`bounded_config`); waive: findings they cover are not failures."""
    _check_arguments(max_examples, seed, planner, implementation, implementation_name, progress, time_budget)
    # imported here: the runner (torch, the oracles) and the default implementation (Triton)
    # only when a session starts, never when this module is imported
    from diffmoe.judge import runner

    factory = runner.load_factory(DEFAULT_IMPLEMENTATION) if implementation is None else implementation
    plan = plan_function(factory)
    supports = factory_attribute(factory, SUPPORTS)  # draw around what it refuses (contract.SUPPORTS)
    if supports is None:
        shrink_plan = plan
    else:  # the generate loop skips refused draws; shrink candidates are refused here

        def shrink_plan(config: MoEConfig, num_tokens: int):
            return None if supports(config) is not None else plan(config, num_tokens)
    refused = 0
    if implementation_name is not None:
        name = implementation_name
    else:
        name = DEFAULT_IMPLEMENTATION_NAME if implementation is None else runner.factory_name(factory)
    outcome = PlanFuzzOutcome(seed=seed)
    start = time.perf_counter()
    deadline = math.inf if time_budget is None else start + time_budget
    last_progress = [start]
    failure: list[tuple[MoEConfig, list[Finding]]] = []  # the smallest failure so far
    first_failure_at: float | None = None

    def report_progress(phase: str, config: MoEConfig, now: float) -> None:
        if progress is not None and now - last_progress[0] >= PROGRESS_INTERVAL:
            last_progress[0] = now
            progress(outcome.examples, phase, now - start, config.short())

    try:
        configs = plan_configs(seed, planner, bounds)
        for n in range(max_examples):
            config = next(configs, None)
            if config is None:
                outcome.notes.append(f"no config of the plan domain within the bounds ({bounds.describe()}) after "
                                     f"{MAX_BOUNDED_TRIES} draws: no plan judged")
                break
            if supports is not None and supports(config) is not None:
                refused += 1  # not a plan of this implementation: not counted as judged
                continue
            outcome.examples += 1
            findings = judge_config(plan, config)
            if findings and waive:
                findings = waive.unwaived(findings)
            if findings:
                failure.append((config, findings))
                first_failure_at = time.perf_counter()
                break
            if not n % _CLOCK_EVERY:
                now = time.perf_counter()
                report_progress(PHASE_GENERATE, config, now)
                if now >= deadline:
                    outcome.notes.append(f"time_budget of {time_budget} s spent after {outcome.examples} configs")
                    break
        if failure:
            def on_step(candidate: MoEConfig) -> None:
                outcome.examples += 1
                outcome.shrink_examples += 1
                report_progress(PHASE_SHRINK, candidate, time.perf_counter())

            def on_accept(config: MoEConfig, findings: list[Finding]) -> None:
                failure[:] = [(config, findings)]

            config, findings = failure[0]
            shrink_config(shrink_plan, config, findings[0].oracle, on_step=on_step, on_accept=on_accept, findings=findings,
                          bounds=bounds, waivers=waive or None)
    except KeyboardInterrupt:
        outcome.interrupted = True
    end = time.perf_counter()
    outcome.seconds = end - start
    if refused:
        outcome.notes.append(f"{refused} drawn configs skipped: the implementation's {SUPPORTS} refuses them")
    if failure:
        config, findings = failure[-1]
        outcome.report = Report(config=config, implementation=name, oracles=list(_PLAN_ORACLES), schedules=[],
                                findings=findings, seconds=end - first_failure_at)
        outcome.seconds_to_first_failure = first_failure_at - start
        outcome.seconds_shrinking = end - first_failure_at
    return outcome
