"""What each rounding point's menu explains of one candidate run: the per-stage search of
`diffmoe numerics fit`.

The candidate runs once per calibration config (one guarded call, the first program order, as a
check's first run). Then, stage by stage, the reference's stage is computed on the candidate's own
inputs of that stage (the buffers it read, as the differential oracle feeds it), once per
assignment of the rounding points acting in that stage, and each assignment is scored by the
elements it does not explain. An element is explained when the reference's bits equal the
candidate's (any NaN equal to any NaN, as every comparison of the harness), or, for a stage whose
forced rule is derived (the GEMMs' interval, the activation of the unstored float32 product,
diffmoe.tolerance.gemm_interval), when it lies in that interval: a float32 accumulation's order is
outside every profile, so a GEMM is reproduced up to it, never bit for bit.

The points acting in a stage are STAGE_POINTS (those of the config's scheme). A point whose every
choice gives the stage the very same bits (the other points at the base profile's choices) does
not act on this config (a NaN code without a NaN, a clamp without a limit) and is left out of the
stage's joint search; the rest are searched jointly, every combination of their menus, since the
choices of one stage interact (a scale floor and the codes' division). A choice the config cannot
describe (MoEConfig.validate refuses it) explains nothing there, and neither does one under which the
reference makes a NaN of finite inputs (NAN_OF_FINITE: that reproduces a failure, not a rounding).

Owns the candidate's calibration runs and the scoring of assignments. Must not decide the profile
(diffmoe/numerics_fit/solve.py does) or print anything.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from diffmoe.contract import Schedule
from diffmoe.check.execution import Check, Crash
from diffmoe.check.guards import POISON_PATTERNS
from diffmoe.problem.config import MoEConfig
from diffmoe.problem.numerics import MENUS, POINT, Profile
from diffmoe.problem.vocabulary import Stages, pipeline_stages
from diffmoe.tolerance.compare import DERIVED, Comparison, Rule, compare
from diffmoe.tolerance.gemm_interval import stage_bound
from diffmoe.tolerance.table import FORCED, rule_for
from diffmoe.check.call_environment import numpy_quiet
from diffmoe.findings import Finding, Oracles
from diffmoe.numerics_fit.watchdog import Silence, silence_limit
from reference.moe import reference_stage  # pure PyTorch, as diffmoe.check.execution imports it

_UNIT = {"fp8-tensor": "tensor", "fp8-token": "token", "fp8-block": "group"}
_QUANT = ("amax", "{unit}_scale", "{unit}_codes", "{unit}_nan_code")
_ACTIVATION = ("activation_input", "swiglu_clamp", "silu", "silu_rounding")
# The points each stage's reference calls (reference/moe.py's reference_stage), `{unit}` the scaling
# unit of the config's scheme. fp8_gemm reaches the activation through activation_input=fp32_product
# (the activation of the GEMM's unstored product).
STAGE_POINTS: dict[str, tuple[str, ...]] = {
    Stages.QUANT_INPUT: (*_QUANT, "input_weight"),
    Stages.GATE_UP_GEMM: ("fp8_gemm", "input_weight"),
    Stages.ACTIVATION: (*_ACTIVATION, "fp8_gemm", "input_weight"),
    Stages.ACT_QUANT: ("fused_act_quant", *_ACTIVATION, *_QUANT, "fp8_gemm", "input_weight"),
    Stages.QUANT_DOWN_INPUT: _QUANT,
    Stages.DOWN_GEMM: ("fp8_gemm", "router_weight"),
    Stages.REDUCE: ("router_weight", "reduce"),
}
# A joint search larger than this is a bug of STAGE_POINTS, not a search to run. The largest a
# calibration feature can make is a fused FP8 stage on a NaN row: fused_act_quant (2),
# activation_input (2), silu (4), silu_rounding (2), amax (2), the unit's scale (4), codes (3) and
# NaN code (3), and fp8_gemm through the float32 product (3): 13,824 assignments (the SwiGLU clamp
# acts only with a limit and input_weight only with router_weight='input', other features). The
# shipped kernel's default set searches at most 288 (a fused fp8-token stage on a NaN row, measured
# 2026-12-05).
MAX_ASSIGNMENTS = 2**15
ORACLE = "numerics-fit"
# No rounding makes a NaN of finite numbers: an assignment whose reference does (a scale without its
# floor dividing an all-zero token, 0 / 0) reproduces a failure, not a rounding, and explains
# nothing. Without it the bug zoo's scale-floor-dropped was fitted to token_scale=no_floor and then
# passed every oracle.
CANNOT_DESCRIBE = "the config cannot take this choice"  # MoEConfig.validate refuses it
NAN_OF_FINITE = "the reference under this choice makes a NaN of the stage's finite inputs"


def stage_points(stage: str, config: MoEConfig) -> tuple[str, ...]:
    """The rounding points `stage` calls for `config`, those of its scheme only."""
    unit = _UNIT.get(config.quant)
    names = []
    for name in STAGE_POINTS[stage]:
        if "{unit}" in name:
            if unit is None:
                continue
            name = name.format(unit=unit)
        if config.quant in POINT[name].schemes:
            names.append(name)
    return tuple(names)


@dataclass
class Score:
    """One assignment's verdict on one stage: elements it leaves unexplained of `compared`, the
    largest distance in ulps among them, and why it could not run (None when it ran)."""

    unexplained: int
    compared: int
    max_ulp: int = 0
    problem: str | None = None

    @property
    def explains(self) -> bool:
        return self.problem is None and self.unexplained == 0


@dataclass
class StageSearch:
    """One (config, stage): the points searched jointly (`points`), the points that did not act
    (`inert`), and every assignment of `points` with its score (the other points at the base's)."""

    config_index: int
    config: MoEConfig
    stage: str
    buffers: tuple[str, ...]
    points: tuple[str, ...]
    inert: tuple[str, ...]
    scores: dict[tuple[str, ...], Score] = field(default_factory=dict)
    invalid: dict[str, tuple[str, ...]] = field(default_factory=dict)  # point -> choices this config refuses
    scorer: Any = field(default=None, repr=False, compare=False)  # scores a whole profile on this stage (Scorer)

    @property
    def compared(self) -> int:
        return next(iter(self.scores.values())).compared if self.scores else 0

    def explaining(self) -> list[tuple[str, ...]]:
        return [a for a, s in self.scores.items() if s.explains]

    def best(self) -> tuple[tuple[str, ...], Score]:
        """The assignment leaving the fewest elements unexplained (menu order breaks ties)."""
        return min(self.scores.items(), key=lambda kv: (kv[1].problem is not None, kv[1].unexplained, kv[1].max_ulp))


@dataclass
class ConfigRun:
    """One calibration config: its stage searches, or the finding that stopped the run."""

    index: int
    config: MoEConfig
    feature: str
    stages: list[StageSearch] = field(default_factory=list)
    failure: Finding | None = None


def run_candidate(config: MoEConfig, factory: Callable, device: torch.device, name: str,
                  time_limit: float | None = None) -> tuple[Check, dict] | Finding:
    """(the check, the candidate's buffers) of one guarded call of the first program order, or the
    finding (crash, contract; a run silent for `time_limit` seconds: watchdog.py) that stopped it."""
    try:
        with silence_limit(time_limit) as beat:
            return _run_candidate(config, factory, device, name, beat)
    except Silence as exc:  # outside the implementation's guarded calls (its calls make it a crash finding)
        return Finding(oracle=Oracles.TIMEOUT, message=f"the candidate's run on {config.short()}: {exc}",
                       figures={"time_limit_s": time_limit})


def _run_candidate(config: MoEConfig, factory: Callable, device: torch.device, name: str, beat) -> tuple[Check, dict] | Finding:
    check = Check(config, factory, [], [Schedule.parse("identity")], device, name, progress=beat)
    try:
        impl = check.build(config)
        shapes = check.workspace_shapes(impl, config.num_tokens)
        guarded = check.allocate(shapes, f"workspace_shapes({config.num_tokens})")
        output = None if config.output != "separate" else check.new_output(check.problem.num_tokens)
        run = check.execute(impl, guarded, output, check.schedules[0], POISON_PATTERNS[0])
    except Crash as exc:
        return exc.finding
    return check, run.buffers


def _with_profile(problem, config: MoEConfig, spec: str):
    """The problem judged under profile `spec`, or None when the config cannot take it."""
    try:
        judged = config.replace(numerics=spec)
        judged.validate()
    except (TypeError, ValueError):
        return None
    return dataclasses.replace(problem, config=judged)


class Scorer:
    """Scores assignments of one (config, stage) on the candidate's buffers, with a cache by
    profile spec (the inert pass and the joint search share assignments)."""

    def __init__(self, check: Check, buffers: dict, stage, base: Profile):
        self.check, self.buffers, self.stage, self.base = check, buffers, stage, base
        self.written = tuple(n for n in stage.writes if n in buffers)
        # every buffer of the candidate but this stage's writes: the stage's reads, and the upstream
        # buffers an activation of the float32 product recomputes the GEMM from
        self.inputs = {n: t for n, t in buffers.items() if n not in stage.writes}
        self._cache: dict[str, tuple[dict | None, Score]] = {}
        self._finite: bool | None = None

    def spec(self, choices: dict[str, str]) -> str:
        return Profile(self.base.base, tuple((p, choices.get(p, c)) for p, c in self.base.choices)).spec

    def evaluate(self, choices: dict[str, str]) -> tuple[dict | None, Score]:
        spec = self.spec(choices)
        if spec in self._cache:
            return self._cache[spec]
        compared = sum(self.buffers[n].numel() for n in self.written)
        problem = _with_profile(self.check.problem, self.check.config, spec)
        if problem is None:
            result = (None, Score(compared, compared, problem=CANNOT_DESCRIBE))
        else:
            result = self._score(problem, spec, compared)
        self._cache[spec] = result
        return result

    def _score(self, problem, spec: str, compared: int) -> tuple[dict | None, Score]:
        try:
            with numpy_quiet():
                want = reference_stage(self.stage.name, dict(self.inputs), problem)
        except Exception as exc:  # noqa: BLE001 - a malformed candidate buffer is the candidate's, not a fit's
            return None, Score(compared, compared, problem=f"{type(exc).__name__}: {exc}")
        if self._finite_reads() and any(want[n].is_floating_point() and bool(torch.isnan(want[n].float()).any())
                                        for n in self.written):
            return want, Score(compared, compared, problem=NAN_OF_FINITE)
        unexplained, worst = 0, 0
        for name in self.written:
            c = self._compare(name, want[name], problem, spec)
            if c.problem:
                return want, Score(compared, compared, problem=c.problem)
            unexplained += c.mismatches
            worst = max(worst, c.max_ulp)
        return want, Score(unexplained, compared, worst)

    def _finite_reads(self) -> bool:
        """Whether every floating buffer the stage reads (the candidate's, or the problem's inputs) is finite."""
        if self._finite is None:
            given = {**self.check.problem.inputs(), **self.inputs}
            reads = [given[n] for n in self.stage.reads if n in given]
            self._finite = all(bool(torch.isfinite(t.float()).all()) for t in reads if t.is_floating_point())
        return self._finite

    def _compare(self, name: str, want: torch.Tensor, problem, spec: str) -> Comparison:
        cfg = problem.config
        rule = rule_for(cfg.quant, name, FORCED, fused=self.stage.name == Stages.ACT_QUANT,
                        backend=self.check.tolerance_backend, numerics=spec)
        if rule.mode != DERIVED:
            rule = Rule.bitwise("a rounding point's choice reproduces the candidate's bits")
            return compare(name, want, self.buffers[name], rule)
        try:
            bound = stage_bound(rule, name, want, self.inputs, problem)
        except Exception as exc:  # noqa: BLE001 - the candidate's buffers cannot bound it: nothing explained
            return Comparison(name, False, rule, 0, want.numel(), 0, 0.0, problem=f"{type(exc).__name__}: {exc}")
        return compare(name, want, self.buffers[name], rule, bound=bound)


def search_stage(index: int, check: Check, buffers: dict, stage, base: Profile) -> StageSearch | None:
    """The StageSearch of one stage, None when the candidate reported nothing it writes or not every
    buffer it reads."""
    if not all(n in buffers or n in check.problem_inputs for n in stage.reads):
        return None
    scorer = Scorer(check, buffers, stage, base)
    if not scorer.written:
        return None
    points = stage_points(stage.name, check.config)
    acting, inert, invalid = [], [], {}
    for point in points:
        outputs = []
        refused = []
        for choice in MENUS[point]:
            want, score = scorer.evaluate({point: choice})
            if want is None and score.problem == CANNOT_DESCRIBE:
                refused.append(choice)
                continue
            outputs.append(want)
        if refused:
            invalid[point] = tuple(refused)
        if _all_same(outputs, scorer.written):
            inert.append(point)
        else:
            acting.append(point)
    menus = [MENUS[p] for p in acting]
    count = 1
    for menu in menus:
        count *= len(menu)
    if count > MAX_ASSIGNMENTS:
        raise RuntimeError(f"stage {stage.name}: {count} assignments of {acting} exceed MAX_ASSIGNMENTS")
    search = StageSearch(index, check.config, stage.name, scorer.written, tuple(acting), tuple(inert), invalid=invalid,
                         scorer=scorer)
    for assignment in itertools.product(*menus):
        search.scores[assignment] = scorer.evaluate(dict(zip(acting, assignment)))[1]
    return search


def _all_same(outputs: list, written: tuple[str, ...]) -> bool:
    """Whether every output (None: the reference could not run) holds the same bits."""
    if any(o is None for o in outputs):
        return all(o is None for o in outputs)
    first = outputs[0] if outputs else None
    for other in outputs[1:]:
        for name in written:
            a, b = first[name], other[name]
            if a.shape != b.shape or not _same_bits(a, b):
                return False
    return True


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.is_floating_point() and a.element_size() >= 2:
        both_nan = torch.isnan(a.float()) & torch.isnan(b.float())
        return bool(((a.view(_INT[a.element_size()]) == b.view(_INT[b.element_size()])) | both_nan).all())
    if a.element_size() == 1 and a.dtype != torch.uint8 and a.dtype != torch.int8 and a.dtype != torch.bool:
        both_nan = torch.isnan(a.float()) & torch.isnan(b.float())
        return bool(((a.view(torch.uint8) == b.view(torch.uint8)) | both_nan).all())
    return bool(torch.equal(a, b))


_INT = {2: torch.int16, 4: torch.int32, 8: torch.int64}


def search_config(index: int, config: MoEConfig, feature: str, factory: Callable, device: torch.device, name: str,
                  base: Profile, progress: Callable[[str], None] | None = None,
                  time_limit: float | None = None) -> ConfigRun:
    """Run the candidate on one calibration config and search every stage it reports."""
    judged = config.replace(numerics=base.spec)
    result = run_candidate(judged, factory, device, name, time_limit)
    out = ConfigRun(index, judged, feature)
    if isinstance(result, Finding):
        out.failure = result
        return out
    check, buffers = result
    for stage in pipeline_stages(judged):
        if progress is not None:
            progress(stage.name)
        found = search_stage(index, check, buffers, stage, base)
        if found is not None:
            out.stages.append(found)
    return out
