"""The Report: the findings of one check (diffmoe.findings) as the CLI, pytest and JSON show them.

A Report is passed when it holds no finding; it renders them, and says how to replay the check.

Owns the report type, its rendering and replay commands. Must not run anything.
"""

from __future__ import annotations

from collections.abc import Sequence

import json
import re
import shlex
from dataclasses import dataclass, field
from typing import Any

from diffmoe.problem.config import ALWAYS_NAMED, OPT_IN_FIELDS, MoEConfig
from diffmoe.problem.models import ep_placement
from diffmoe.contract import DEFAULT_IMPLEMENTATION_NAME, IMPLEMENTATION_ALIASES, WHEEL_FUNCTIONS
from diffmoe.findings import ByteRange, Finding, Oracles  # noqa: F401 - a report holds findings; old imports read them here


# What `--impl` (diffmoe.judge.runner.load_factory) can load: MODULE:FACTORY, one colon, a top-level
# attribute of an importable module. Anything else (a lambda, a closure, a label) is a name only.
_FACTORY_SPEC = re.compile(r"[^\s:<>()]+:[^\s:<>().]+")
# A fused_experts function inside a pinned peer wheel, NAME==V:[MODULE:]FUNCTION@FAMILY (contract.WHEEL_FUNCTIONS):
# loadable too, its MODULE dotted and a second colon allowed
_WHEEL_FUNCTION_SPEC = re.compile(r"([^\s:]+):(?:[\w.]+:)?\w+@\w+")
# The stand-in a replay command carries for an implementation no command can load.
UNREPLAYABLE_IMPL = "MODULE:FACTORY"


def is_factory_spec(implementation: str) -> bool:
    """Whether a report's implementation name is one `--impl` can load: a MODULE:FACTORY spec (the
    runner names a factory so only when `import_module(MODULE).FACTORY is factory`) or an alias
    of one (contract.IMPLEMENTATION_ALIASES: `--impl vllm`), or a function inside a pinned peer wheel
    (`sglang==0.5.23:fused_experts@sglang`, contract.WHEEL_FUNCTIONS)."""
    if not isinstance(implementation, str):
        return False
    wheel = _WHEEL_FUNCTION_SPEC.fullmatch(implementation)
    return (implementation in IMPLEMENTATION_ALIASES or _FACTORY_SPEC.fullmatch(implementation) is not None
            or (wheel is not None and wheel.group(1) in WHEEL_FUNCTIONS))


# the special rows whose command-line default depends on the config (MoEConfig.with_flag_rows)
_ROW_FLAGS = ("zero_rows", "nan_rows")


def check_command(config: MoEConfig, implementation: str = DEFAULT_IMPLEMENTATION_NAME,
                  sample: dict[str, Any] | None = None) -> str:
    """The `diffmoe check` command line that rebuilds exactly this config and implementation.

    The default implementation (DEFAULT_IMPLEMENTATION_NAME, or no name) needs no `--impl`; a
    MODULE:FACTORY spec is passed as `--impl SPEC`. Any other name (a factory no module exports:
    a lambda, a closure) cannot be loaded by a command: the line then carries
    `--impl MODULE:FACTORY` and a shell comment saying so, so that pasting it fails with a
    usage error instead of silently replaying the default implementation. `sample` (a sampled
    check's Report.sample) adds the flags that choose the same programs."""
    c = config
    parts = [
        "diffmoe check",
        f"--tokens {c.num_tokens} --experts {c.num_experts} --topk {c.topk}",
        f"--hidden {c.hidden} --inter {c.inter} --quant {c.quant}",
        "--fused" if c.fused else "--unfused",
        f"--planner {c.planner} --output {c.output} --router-weight {c.router_weight} --skew {c.skew}",
    ]
    placement = ep_placement(c.expert_map, c.shared_experts)
    if placement is not None:  # a model's expert-parallel rank: two numbers instead of E map entries
        parts.append(f"--ep {placement[0]}/{placement[1]}")
    elif c.expert_map is not None:
        parts.append("--expert-map=" + ",".join(str(v) for v in c.expert_map))
    parts.append(f"--seed {c.seed}")
    # the opt-in inputs, only where set; the zero and NaN rows wherever they differ from the padding
    # and NaN tokens the command line gives by default (MoEConfig.with_flag_rows): the fewest flags
    # that rebuild exactly this config (naming both always does)
    named = next(rows for rows in ((), ("nan_rows",), ("zero_rows",), _ROW_FLAGS) if c.with_flag_rows(rows) == c)
    shown = {name: value for name, value in c.opt_in_fields() if name not in _ROW_FLAGS}
    # the fields whose default changed, whatever their value (config.ALWAYS_NAMED, issue 42)
    shown.update((name, getattr(c, name)) for name in ALWAYS_NAMED)
    shown.update((name, getattr(c, name)) for name in named)
    for name in OPT_IN_FIELDS:  # declaration order
        if name in shown:
            flag = "--" + name.replace("_", "-")
            parts.append(flag if shown[name] is True else f"{flag} {shown[name]}")
    if sample is not None:
        parts.append(f"--sample-programs {sample['seeded']} --sample-seed {sample['seed']}")
    if implementation and implementation != DEFAULT_IMPLEMENTATION_NAME:
        if is_factory_spec(implementation):
            parts.append(f"--impl {shlex.quote(implementation)}")
        else:
            label = " ".join(str(implementation).split())
            parts.append(
                f"--impl {UNREPLAYABLE_IMPL}  # implementation {label} is not importable as {UNREPLAYABLE_IMPL}: "
                "define its factory at module level and name it here, or pass it to run_differential"
            )
    return " ".join(parts)


@dataclass
class Report:
    config: MoEConfig
    implementation: str
    oracles: list[str]
    schedules: list[str]
    findings: list[Finding] = field(default_factory=list)
    seconds: float = 0.0
    # None: the inputs were generated from the config, and the replay command rebuilds them.
    # Otherwise a note saying where they came from (run_differential's `problem=`).
    inputs: str | None = None
    # selected oracles that could not run on this check (name -> why), e.g. teacher forcing for an
    # implementation without run_stage; a selection is only fully judged when this is empty
    skipped: dict[str, str] = field(default_factory=dict)
    # isolated without the OS boundary: the one line saying so and what is then not guaranteed
    isolation: str | None = None
    # what is not a finding but a reader should know: a 32-bit pointer offset near 2^31 (the overflow
    # oracle's headroom, diffmoe/oracles/overflow.py); they never change the verdict or the exit code
    warnings: list[str] = field(default_factory=list)
    # the first program order's launches, as the judge recorded them (launch_rows): what `check
    # --launches` lists; empty where the check never ran the candidate
    launches: list[dict[str, Any]] = field(default_factory=list)
    # a sampled check (issue 42, diffmoe/interpreter/program_sample.py): the sample ("seed", "seeded"),
    # what ran ("ran": one line) and per judged buffer [elements judged, elements] ("judged"); None: every program ran
    sample: dict[str, Any] | None = None

    @property
    def passed(self) -> bool:
        return not self.findings

    def oracles_with_findings(self) -> list[str]:
        return sorted({f.oracle for f in self.findings})

    def first_divergent_stage(self) -> str | None:
        for f in self.findings:
            if f.stage:
                return f.stage
        return None

    def replay_command(self) -> str:
        """A copy-pasteable command that replays this config with this implementation
        (`--impl SPEC` unless it is the default; see check_command for one no command loads)."""
        return check_command(self.config, self.implementation, self.sample)

    def to_dict(self) -> dict[str, Any]:
        d = {
            "passed": self.passed,
            "config": self.config.to_dict(),
            "implementation": self.implementation,
            "oracles": list(self.oracles),
            "schedules": list(self.schedules),
            "findings": [f.to_dict() for f in self.findings],
            "seconds": round(self.seconds, 4),
            "replay": self.replay_command(),
        }
        if self.inputs is not None:
            d["inputs"] = self.inputs
        if self.skipped:
            d["skipped"] = dict(self.skipped)
        if self.isolation is not None:
            d["isolation"] = self.isolation
        if self.warnings:
            d["warnings"] = list(self.warnings)
        if self.launches:
            d["launches"] = [dict(row) for row in self.launches]
        if self.sample is not None:
            d["sample"] = dict(self.sample)
        return d

    def to_json(self, indent: int | None = None) -> str:
        return json.dumps(self.to_dict(), indent=indent, sort_keys=False, default=str)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Report:
        return cls(
            config=MoEConfig.from_dict(d["config"]),
            implementation=d.get("implementation", ""),
            oracles=list(d.get("oracles", [])),
            schedules=list(d.get("schedules", [])),
            findings=[Finding.from_dict(f) for f in d.get("findings", [])],
            seconds=float(d.get("seconds", 0.0)),
            inputs=d.get("inputs"),
            skipped=dict(d.get("skipped") or {}),
            isolation=d.get("isolation"),
            warnings=[str(w) for w in d.get("warnings") or []],
            launches=[dict(row) for row in d.get("launches") or []],
            sample=dict(d["sample"]) if d.get("sample") else None,
        )

    @classmethod
    def from_json(cls, text: str) -> Report:
        """The inverse of to_json (figures come back as JSON values: tuples as lists)."""
        return cls.from_dict(json.loads(text))

    def render(self, max_findings: int = 20) -> str:
        """The readable text block: verdict, config, then one paragraph per finding."""
        verdict = "PASS" if self.passed else f"FAIL ({len(self.findings)} finding{'s' if len(self.findings) != 1 else ''})"
        lines = [
            f"diffmoe {verdict}  {self.implementation or 'implementation'}  ({self.seconds:.2f} s)",
            f"  config:    {self.config.short()}",
            f"  oracles:   {', '.join(self.oracles)}",
            f"  schedules: {', '.join(self.schedules)}",
        ]
        if self.isolation is not None:
            lines.insert(0, f"note: {self.isolation}")
        if self.inputs is not None:
            lines.append(f"  inputs:    {self.inputs}")
        if self.sample is not None:
            lines.append(f"  sampled:   {sample_line(self.sample)}")
        for name, why in self.skipped.items():
            lines.append(f"  skipped:   {name}: {why}")
        for warning in self.warnings:
            lines.append(f"  warning:   {warning}")
        for n, f in enumerate(self.findings[:max_findings], 1):
            lines.append(f"  [{n}] {f.headline()}")
            if f.byte_ranges:
                lines.append(f"      bytes: {', '.join(str(b) for b in f.byte_ranges)}")
            for key, value in f.figures.items():
                lines.append(f"      {key}: {value}")
        if len(self.findings) > max_findings:
            lines.append(f"  ... {len(self.findings) - max_findings} more findings (use --json for all)")
        if not self.passed:
            lines.append(f"  replay: {self.replay_command()}")
        return "\n".join(lines)

    def render_launches(self) -> str:
        """Every launch of the first program order's run: its stage, what it read and wrote, and why it
        has that stage (`check --launches`; issue 49: users wrote their own script to trust an adapter)."""
        if not self.launches:
            return "  launches: none reported by the first program order's run"
        lines = [f"  launches ({len(self.launches)}, the first program order's run):"]
        for row in self.launches:
            count = row.get("programs")
            programs = "" if count is None else f", {count} program{'' if count == 1 else 's'}"
            kind = "Triton" if row.get("triton") else "host"
            lines.append(f"    [{row['index']}] {row['stage']}: {row['kernel']} ({kind}, grid {tuple(row['grid'])}{programs})")
            lines.append(f"        reads {', '.join(row['reads']) or 'nothing named'}; writes {', '.join(row['writes']) or 'nothing named'}")
            lines.append(f"        placed: {row['placed']}")
        return "\n".join(lines)


def sample_line(sample: dict[str, Any]) -> str:
    """A sampled check in one line: what ran and, per buffer, how many of its elements were judged."""
    def counts(key: str) -> str:
        return ", ".join(f"{name} {n:,} of {total:,}" for name, (n, total) in sample.get(key, {}).items()) or "no element"

    if "ran" not in sample:  # stopped before its first run ended
        return f"seed {sample.get('seed')}, {sample.get('seeded')} seeded programs a launch; no run finished"
    forced = f"; teacher-forced: {counts('forced')}" if "forced" in sample else ""
    return f"{sample['ran']}; judged: {counts('judged')}{forced}"


# A launch's texts come from the candidate: one printable line each, cut to this length, before a terminal shows them.
MAX_LAUNCH_TEXT = 200


def _line(text: str) -> str:
    text = " ".join("".join(c if c.isprintable() else repr(c)[1:-1] for c in str(text)).split())
    return text if len(text) <= MAX_LAUNCH_TEXT else text[: MAX_LAUNCH_TEXT - 3] + "..."


def launch_rows(launches: Sequence[Any]) -> list[dict[str, Any]]:
    """A run's recorded launches (diffmoe.check.recording.RecordedLaunch) as the report's data, each
    text the candidate sent made one printable line."""
    return [{
        "index": launch.index, "stage": _line(launch.stage), "kernel": _line(launch.kernel), "grid": list(launch.grid),
        "triton": launch.triton, "programs": launch.programs,
        "reads": [_line(r.name) for r in launch.reads], "writes": [_line(w.name) for w in launch.writes],
        "placed": _line(launch.why) or "reported at this stage by the implementation",
    } for launch in launches]
