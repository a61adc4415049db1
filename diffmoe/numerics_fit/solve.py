"""From the stage searches to one profile: which choices explain every config, the residues no
choice explains, the base profile and the overrides, and each point's evidence.

Each (config, stage) search is a constraint over the points that acted there: the assignments
that explain every element. A constraint no assignment satisfies is a **residue**: the candidate
computes something no menu holds (a bug, or a rounding the reference does not know yet). It is
reported, with the assignment that explains the most and the largest distance left, and its
points are refused: a residue is never absorbed into a profile. The other constraints are joined
(generalized arc consistency, then a search): a point's explaining choices are those some
assignment satisfying every constraint makes; when the join is empty the points of the
constraints that conflict are refused too, each config's verdict shown.

The base profile is the built-in profile whose choices agree with the most fitted points, among
those that describe every calibration config (the implementation's declared profile, then the
order of PROFILES, breaking ties); a point that acted
nowhere on the calibration set keeps that base's choice and says so, and a point several choices
explain keeps the base's when it is one of them.

Owns the join, the residues, the base choice and the evidence. Must not run the candidate or the
reference (diffmoe/numerics_fit/search.py does).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from diffmoe.findings import Finding
from diffmoe.problem.config import MoEConfig
from diffmoe.problem.numerics import MENUS, POINT_NAMES, PROFILE_NAMES, PROFILES, Profile, parse_spec
from diffmoe.numerics_fit.search import NAN_OF_FINITE, ORACLE, ConfigRun, StageSearch


@dataclass
class PointEvidence:
    """What the calibration set says about one point: the choice printed, every choice that
    explains, the elements of the stages where it acted (explained by the chosen profile, and
    compared), the configs where it acted, and how it was decided."""

    point: str
    choice: str | None  # None: refused (a residue or a conflict)
    explaining: tuple[str, ...]
    explained: int = 0
    compared: int = 0
    configs: int = 0
    status: str = "fitted"  # fitted | base (did not act) | refused

    def to_dict(self) -> dict[str, Any]:
        return {"point": self.point, "choice": self.choice, "explaining": list(self.explaining),
                "explained": self.explained, "compared": self.compared, "configs": self.configs, "status": self.status}


@dataclass
class Solution:
    profile: Profile | None  # None when anything is refused
    base: str
    evidence: list[PointEvidence]
    residues: list[Finding] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        return not self.residues and self.profile is not None


def _residue(search: StageSearch) -> Finding:
    assignment, score = search.best()
    best = ", ".join(f"{p}={c}" for p, c in zip(search.points, assignment)) or "the base profile"
    cfg = search.config
    points = ", ".join(search.points + search.inert) or "any point"
    if score.problem:
        message = (f"{search.stage} of config {search.config_index + 1} ({cfg.short()}): no choice of {points} "
                   f"explains it; the closest ({best}): {score.problem}")
    else:
        message = (f"{search.stage} of config {search.config_index + 1} ({cfg.short()}): {score.unexplained} of "
                   f"{score.compared} elements are explained by no choice of {points}; "
                   f"largest {score.max_ulp} ulp (the closest: {best})")
    nan_made = [", ".join(f"{p}={c}" for p, c in zip(search.points, a)) for a, sc in search.scores.items()
                if sc.problem == NAN_OF_FINITE]
    if nan_made and not score.problem:
        message += (f"; refused, the reference making a NaN of the stage's finite inputs under them: "
                    f"{'; '.join(nan_made[:3])}{' ...' if len(nan_made) > 3 else ''}")
    return Finding(oracle=ORACLE, stage=search.stage, buffers=list(search.buffers), message=message, figures={
        "refused_nan_of_finite": nan_made,
        "config": search.config_index + 1, "elements_unexplained": score.unexplained, "elements": score.compared,
        "max_ulp": score.max_ulp, "points": list(search.points + search.inert), "closest": best})


def _allowed(search: StageSearch, domains: dict[str, set[str]]) -> list[tuple[str, ...]]:
    return [a for a in search.explaining() if all(c in domains[p] for p, c in zip(search.points, a))]


def _arc_consistent(constraints: list[StageSearch], domains: dict[str, set[str]]) -> list[StageSearch]:
    """Narrow `domains` until every constraint's allowed assignments cover them; the constraints
    left without any allowed assignment (a conflict between configs) are returned."""
    changed = True
    while changed:
        changed = False
        for search in constraints:
            allowed = _allowed(search, domains)
            if not allowed:
                return [s for s in constraints if not _allowed(s, domains)]
            for i, p in enumerate(search.points):
                seen = {a[i] for a in allowed}
                if not domains[p] <= seen:
                    domains[p] &= seen
                    changed = True
    return []


def _assign(constraints: list[StageSearch], domains: dict[str, set[str]], prefer: dict[str, str]) -> dict[str, str] | None:
    """One assignment satisfying every constraint, the preferred choice of each point first."""
    order = [p for p in POINT_NAMES if any(p in s.points for s in constraints)]
    allowed = [(s, set(s.explaining())) for s in constraints]
    chosen: dict[str, str] = {}

    def consistent() -> bool:
        for s, ok in allowed:
            if all(p in chosen for p in s.points) and tuple(chosen[p] for p in s.points) not in ok:
                return False
        return True

    def visit(i: int) -> bool:
        if i == len(order):
            return True
        p = order[i]
        options = sorted(domains[p], key=lambda c: (c != prefer.get(p), MENUS[p].index(c)))
        for c in options:
            chosen[p] = c
            if consistent() and visit(i + 1):
                return True
        del chosen[p]
        return False

    return dict(chosen) if visit(0) else None


def describes(name: str, configs: Sequence[MoEConfig]) -> bool:
    """Whether built-in profile `name` can describe every one of `configs` (MoEConfig's check of a
    profile against a config: a choice of one scheme's kernel only, SCHEME_ONLY)."""
    try:
        for config in configs:
            dataclasses.replace(config, numerics=name)
    except ValueError:
        return False
    return True


def choose_base(domains: dict[str, set[str]], acted: set[str], declared: str | None,
                configs: Sequence[MoEConfig] = ()) -> str:
    """The built-in profile agreeing with the most fitted points among those that describe every
    calibration config (`configs`); ties: the declared base, then PROFILES order.

    A base's choices stand at every point that did not act, so one that cannot describe a
    calibration config made a bogus residue of each: lmdeploy's FP8-block-only GEMM for a bf16-only
    kernel whose silu and reduce agreed with lmdeploy's (6 residues, exit 1; issue 49)."""
    def disagreements(name: str) -> int:
        return sum(PROFILES[name][p] not in domains[p] for p in acted)

    first = [declared] if declared in PROFILES else []
    eligible = [name for name in (*first, *PROFILE_NAMES) if describes(name, configs)]
    return min(eligible or [*first, *PROFILE_NAMES], key=disagreements)


def _describable(searches: list[StageSearch]) -> dict[str, set[str]]:
    """Every point's menu less the choices some calibration config cannot take (MoEConfig.validate):
    the profile must describe every config it was fitted on."""
    domains = {p: set(MENUS[p]) for p in POINT_NAMES}
    for s in searches:
        for p, choices in s.invalid.items():
            if p not in s.points:
                domains[p] -= set(choices)
    return domains


def solve(runs: list[ConfigRun], declared: str | None = None, base: str | None = None) -> Solution:
    """The profile the searches of `runs` support (module docstring). `declared`: the
    implementation's declared profile spec (its base breaks ties); `base`: a base to keep whatever
    the fit finds (--base)."""
    residues: list[Finding] = [r.failure for r in runs if r.failure is not None]
    searches = [s for r in runs for s in r.stages]
    refused: set[str] = set()
    constraints = []
    for s in searches:
        if s.explaining():
            constraints.append(s)
        else:
            residues.append(_residue(s))
            refused.update(s.points + s.inert)  # every point of the stage: none of them is known to be right
    domains = _describable(searches)
    conflicts = _arc_consistent(constraints, domains)
    if conflicts:
        for s in conflicts:
            points = ", ".join(s.points)
            residues.append(Finding(oracle=ORACLE, stage=s.stage, buffers=list(s.buffers), message=(
                f"{s.stage} of config {s.config_index + 1} ({s.config.short()}): the choices of {points} that explain it "
                f"contradict those that explain another config: no one profile explains every config"),
                figures={"config": s.config_index + 1, "points": list(s.points),
                         "explaining_here": [dict(zip(s.points, a)) for a in s.explaining()]}))
            refused.update(s.points)
        constraints = [s for s in constraints if s not in conflicts and not set(s.points) & refused]
        domains = _describable(searches)
        _arc_consistent(constraints, domains)  # what conflicts still is left to the final scoring below
    acted = {p for s in searches for p in s.points} - refused
    declared_base = parse_spec(declared).base if declared else None
    chosen_base = base or choose_base(domains, acted, declared_base, [r.config for r in runs])
    prefer = PROFILES[chosen_base]
    assignment = _assign(constraints, domains, prefer) or {}
    final = {p: assignment.get(p, prefer[p] if prefer[p] in domains[p] else min(domains[p], key=MENUS[p].index))
             for p in POINT_NAMES if p not in refused}
    verified = {}
    for s in searches:  # the whole profile on every stage: the points left out of a search at the base's choice
        if s.scorer is not None and not set(s.points) & refused:
            verified[id(s)] = s.scorer.evaluate(final)[1]
            if not verified[id(s)].explains:
                residues.append(_unverified(s, verified[id(s)]))
                refused.update(s.points + s.inert)
    evidence = []
    for p in POINT_NAMES:
        explaining = tuple(c for c in MENUS[p] if c in domains[p])
        if p in refused:
            evidence.append(PointEvidence(p, None, explaining, status="refused"))
            continue
        where = [s for s in searches if p in s.points or p in s.inert]
        ev = PointEvidence(p, final[p], explaining, configs=len({s.config_index for s in where}),
                           status="fitted" if p in acted else "base")
        for s in where:
            ev.compared += s.compared
            score = verified.get(id(s))
            ev.explained += s.compared - (score.unexplained if score is not None and score.problem is None else s.compared)
        evidence.append(ev)
    profile = None
    if not refused and not residues:
        profile = Profile(chosen_base, tuple((p, final[p]) for p in POINT_NAMES))
    return Solution(profile, chosen_base, evidence, residues)


def _unverified(search: StageSearch, score) -> Finding:
    return Finding(oracle=ORACLE, stage=search.stage, buffers=list(search.buffers), message=(
        f"{search.stage} of config {search.config_index + 1} ({search.config.short()}): the fitted choices, each "
        f"explaining its own stages, leave {score.unexplained} of {score.compared} elements unexplained together; "
        f"largest {score.max_ulp} ulp"), figures={"config": search.config_index + 1,
                                                  "elements_unexplained": score.unexplained, "elements": score.compared,
                                                  "max_ulp": score.max_ulp, "points": list(search.points)})
