"""`fit_profile(factory)`: the numerics profile an implementation computes, fitted on a calibration
set, and its evidence; the API behind `diffmoe numerics fit` (issue 27).

The candidate runs once per calibration config (diffmoe/numerics_fit/calibration.py); each stage's
reference is searched over the menus of the points acting there, on the candidate's own inputs of
that stage (search.py); the searches are joined into one profile, a base plus overrides, or
residues where no choice explains the candidate (solve.py). The result prints as the TOML
`--numerics-file` reads, each point's evidence in comments, or as JSON.

Owns the fit's orchestration and its report. Must not judge a check (a fitted profile is judged
by `diffmoe check --numerics-file`, like any other) or import an implementation.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from diffmoe.contract import default_device, factory_numerics
from diffmoe.findings import Finding
from diffmoe.check.worker import check_time_limit
from diffmoe.problem.config import MoEConfig
from diffmoe.problem.numerics import PROFILE_NAMES, PROFILES, Profile, parse_spec
from diffmoe.numerics_fit.calibration import calibration_configs
from diffmoe.numerics_fit.search import ConfigRun, search_config
from diffmoe.numerics_fit.solve import PointEvidence, solve

Progress = Callable[[int, int, str], None]
"""progress(configs done, configs in all, what is under way)."""


@dataclass
class FitReport:
    """The fit's outcome: the profile (None when anything is refused), its base, each point's
    evidence, the residues, the calibration set and the seconds it took."""

    implementation: str
    profile: Profile | None
    base: str
    evidence: list[PointEvidence]
    residues: list[Finding]
    configs: list[tuple[MoEConfig, str]]
    left_out: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def complete(self) -> bool:
        return self.profile is not None and not self.residues

    @property
    def exit_code(self) -> int:
        """0: fitted completely; 1: a residue (or the candidate failed on a config)."""
        return 0 if self.complete else 1

    def toml(self) -> str:
        """The profile as the TOML `--numerics-file` reads (ValueError when nothing was fitted)."""
        if self.profile is None:
            raise ValueError("no profile: the fit found residues no choice explains")
        lines = [f'base = "{self.base}"', "", "[points]"]
        lines += [f'{p} = "{c}"' for p, c in self.profile.overrides] or ["# none: the base profile's choice at every point"]
        return "\n".join(lines) + "\n"

    def evidence_lines(self) -> list[str]:
        rows = []
        for ev in self.evidence:
            if ev.status == "refused":
                what = "REFUSED (a residue: no choice explains it)"
            elif ev.status == "base":
                what = f"{ev.choice}: did not act on the calibration set, the base ({self.base}) profile's choice"
            else:
                others = [c for c in ev.explaining if c != ev.choice]
                also = f" (also explained by {', '.join(others)})" if others else ""
                what = f"{ev.choice}: {ev.explained}/{ev.compared} elements explained, {ev.configs} configs{also}"
            rows.append(f"{ev.point}: {what}")
        return rows

    def render(self) -> str:
        head = [f"# diffmoe numerics fit --impl {self.implementation}: {len(self.configs)} calibration configs, "
                f"{self.seconds:.0f} s"]
        head += [f"#   {i + 1}. {c.short()} ({feature})" for i, (c, feature) in enumerate(self.configs)]
        head += [f"#   left out: {why}" for why in self.left_out]
        evidence = ["# evidence, per point:"] + [f"#   {line}" for line in self.evidence_lines()]
        if self.complete:
            return "\n".join([*head, *evidence, "", self.toml().rstrip()]) + "\n"
        lines = [*head, *evidence, "", f"no profile: {len(self.residues)} residue{'s' if len(self.residues) != 1 else ''} "
                                       "that no choice explains (never absorbed into a profile):"]
        lines += [f"  {f.headline()}" for f in self.residues]
        return "\n".join(lines) + "\n"

    def to_dict(self) -> dict[str, Any]:
        return {
            "implementation": self.implementation, "complete": self.complete, "exit_code": self.exit_code,
            "profile": self.profile.spec if self.profile else None, "base": self.base,
            "overrides": dict(self.profile.overrides) if self.profile else None,
            "toml": self.toml() if self.profile else None,
            "evidence": [ev.to_dict() for ev in self.evidence],
            "residues": [f.to_dict() for f in self.residues],
            "configs": [{"config": c.to_dict(), "feature": feature} for c, feature in self.configs],
            "left_out": list(self.left_out), "seconds": round(self.seconds, 3),
        }


def fit_profile(implementation: Callable, *, quants: Sequence[str] | None = None, count: int | None = None,
                seed: int = 0, configs: Sequence[MoEConfig] | None = None, base: str | None = None,
                device: str | torch.device | None = None, implementation_name: str | None = None,
                progress: Progress | None = None, time_limit: float | None = None) -> FitReport:
    """Fit the numerics profile `implementation` (a factory) computes.

    quants, count, seed: the calibration set (calibration.calibration_configs: `count` configs over
        the schemes in `quants` the factory supports; default every scheme, four configs per
        supported scheme and fused flag); or `configs`, given configs instead (the bug zoo's).
    base: a built-in profile the printed TOML starts from, whatever fits best (default: the
        built-in profile agreeing with the most fitted points).
    time_limit: seconds a candidate run may go without progress (no phase, no launch) before it
        is stopped and its config is a residue (None: no limit; watchdog.py: main thread only).
    Raises ValueError (a bad argument, or a calibration set the factory refuses whole) and
    TypeError; a candidate that crashes is a residue, not an exception."""
    if not callable(implementation):
        raise TypeError(f"implementation must be a factory callable (config -> implementation), got {implementation!r}")
    if base is not None and base not in PROFILES:
        raise ValueError(f"base must be one of {list(PROFILE_NAMES)}, got {base!r}")
    declared = factory_numerics(implementation)
    left_out: list[str] = []
    if configs is None:
        drawn, left_out = calibration_configs(implementation, quants, count, seed)
    else:
        for c in configs:
            if not isinstance(c, MoEConfig):
                raise TypeError(f"configs must hold MoEConfig, got {type(c).__name__}")
            c.validate()
        drawn = [(c.replace(numerics=None), "given") for c in configs]
    if not drawn:
        raise ValueError("no calibration config: the implementation refuses every scheme asked for"
                         + (f" ({'; '.join(left_out)})" if left_out else ""))
    start_profile = parse_spec(base or declared or PROFILE_NAMES[0])
    limit = check_time_limit(time_limit)
    dev = torch.device(device) if device is not None else default_device()
    name = implementation_name or getattr(implementation, "__name__", "implementation")
    started = time.monotonic()
    runs: list[ConfigRun] = []
    for i, (config, feature) in enumerate(drawn):
        def stage_progress(stage: str, i: int = i, config: MoEConfig = config) -> None:
            if progress is not None:
                progress(i, len(drawn), f"{config.short()}: {stage}")

        stage_progress("the candidate's run")
        runs.append(search_config(i, config, feature, implementation, dev, name, start_profile, stage_progress, limit))
    if progress is not None:
        progress(len(drawn), len(drawn), "joining the stages")
    solution = solve(runs, declared=declared, base=base)
    return FitReport(name, solution.profile, solution.base, solution.evidence, solution.residues,
                     [(r.config, r.feature) for r in runs], left_out, time.monotonic() - started)
