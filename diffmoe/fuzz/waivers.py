"""Known findings a fuzz searches past: waivers by `oracle@stage`, and the key that tells failures apart.

A finding's key is `ORACLE@STAGE` (`differential@down_gemm`), or `ORACLE` for a finding that
names no stage (a crash, a timeout, a contract finding about the call). The same key
deduplicates the failures `diffmoe fuzz --keep-going N` collects: two failures are distinct
when one holds a key the other's report did not add.

A waiver is `ORACLE@STAGE` (that oracle at that stage), `ORACLE@*` or a bare `ORACLE` (that
oracle at any stage, a stageless finding included). `--waive` gives one; `--waive-file F`
gives one per line, `#` starting a comment, blank lines ignored: a baseline of the findings a
team already knows about. An example whose every finding is waived is not a failure: the
search goes on, and the outcome counts such examples (`FuzzOutcome.waived_examples`).

Owns parsing waivers and keying findings. Must not judge or drive the search.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from diffmoe.findings import Finding, Oracles

ANY_STAGE = "*"
COMMENT = "#"
# A waiver file is a short list of known findings; past this it is not one (read cap, as the config file's).
MAX_WAIVER_FILE_CHARS = 2**20


def waivable_oracles() -> tuple[str, ...]:
    """Every oracle's name (diffmoe/oracles/registry.py), and crash and timeout: outcomes, not
    oracles one can select, but findings name them all the same. Read when used: a module that
    defines a factory may import this one, and loads in the candidate's process, where
    diffmoe.oracles is refused (issue 43)."""
    from diffmoe.oracles import registry

    return (*registry.ALL_ORACLES, Oracles.CRASH, Oracles.TIMEOUT)


def __getattr__(name: str):  # PEP 562: WAIVABLE_ORACLES, the name this module offered before
    if name == "WAIVABLE_ORACLES":
        return waivable_oracles()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def finding_key(finding: Finding) -> str:
    """`oracle@stage`, or the oracle alone when the finding names no stage."""
    return f"{finding.oracle}@{finding.stage}" if finding.stage else finding.oracle


def report_keys(findings: Iterable[Finding]) -> tuple[str, ...]:
    """The distinct keys of `findings`, in first-seen order."""
    return tuple(dict.fromkeys(finding_key(f) for f in findings))


@dataclass(frozen=True)
class Waiver:
    oracle: str
    stage: str = ANY_STAGE

    def matches(self, finding: Finding) -> bool:
        return finding.oracle == self.oracle and (self.stage == ANY_STAGE or finding.stage == self.stage)

    def __str__(self) -> str:
        return self.oracle if self.stage == ANY_STAGE else f"{self.oracle}@{self.stage}"


def parse_waiver(text: str, where: str = "--waive") -> Waiver:
    """`ORACLE[@STAGE]` as a Waiver; ValueError naming `where`, the known oracles and the form."""
    if not isinstance(text, str):
        raise TypeError(f"{where} must be a string ORACLE@STAGE, got {type(text).__name__}")
    oracle, sep, stage = text.strip().partition("@")
    known = waivable_oracles()
    if oracle not in known:
        raise ValueError(f"{where} must be ORACLE@STAGE or ORACLE with ORACLE one of {list(known)}, "
                         f"got {text.strip()[:60]!r}")
    if sep and (not stage or any(c.isspace() for c in stage)):
        raise ValueError(f"{where}: the stage after '@' must be a stage name (as findings show it) or '*', got {text.strip()[:60]!r}")
    return Waiver(oracle, stage if sep else ANY_STAGE)


def parse_waiver_text(text: str, name: str) -> list[Waiver]:
    """A waiver file's waivers: one per line, `#` comments and blank lines skipped; errors name the line."""
    waivers = []
    for number, line in enumerate(text.splitlines(), 1):
        entry = line.split(COMMENT, 1)[0].strip()
        if entry:
            waivers.append(parse_waiver(entry, f"{name} line {number}"))
    return waivers


class Waivers:
    """A set of waivers: which findings they cover, and whether a report holds any other."""

    def __init__(self, waivers: Iterable[Waiver | str] = ()) -> None:
        self.items: tuple[Waiver, ...] = tuple(dict.fromkeys(w if isinstance(w, Waiver) else parse_waiver(w, "waive")
                                                             for w in waivers))

    def __bool__(self) -> bool:
        return bool(self.items)

    def covers(self, finding: Finding) -> bool:
        return any(w.matches(finding) for w in self.items)

    def unwaived(self, findings: Sequence[Finding]) -> list[Finding]:
        return [f for f in findings if not self.covers(f)]

    def __str__(self) -> str:
        return ", ".join(str(w) for w in self.items)
