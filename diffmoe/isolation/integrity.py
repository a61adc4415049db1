"""The judge's own files, as they were when its first isolated check began (issue 43).

Owns: `prepare` (the judge imports the reference and its tolerance before any candidate's code
is loaded anywhere, and hashes its source files: diffmoe's and the reference's) and
`changed_findings` (a `contract` finding per file whose bytes differ after a check). Inside the
OS boundary the candidate cannot write them; without it, this is how a rewrite that was put
back before the check ended is still seen when the check's sources differ at its end.
"""

from __future__ import annotations

import hashlib
import importlib
import os
from pathlib import Path

_HASHES: dict[str, str] = {}
# What the judge imports before a candidate runs: the expected values and how close is close.
JUDGE_MODULES = ("reference", "diffmoe.tolerance", "diffmoe.oracles.registry", "diffmoe.check.execution")


def _sources() -> list[Path]:
    roots = []
    for name in ("diffmoe", "reference"):
        module = importlib.import_module(name)
        roots += [Path(p) for p in getattr(module, "__path__", [])]
    return sorted(p for root in roots for p in root.rglob("*.py"))


def _digest(path: Path) -> str:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError as exc:
        return f"unreadable: {exc.strerror}"


def prepare() -> None:
    """Import the judge's modules and hash its sources, once per process (a forked worker keeps
    its parent's hashes: they were taken before any candidate ran)."""
    if _HASHES:
        return
    for name in JUDGE_MODULES:
        importlib.import_module(name)
    _HASHES.update({str(p): _digest(p) for p in _sources()})


def changed_findings() -> list:
    """A `contract` finding per judge source file changed, added or removed since `prepare`."""
    if not _HASHES:
        return []
    from diffmoe.findings import Finding, Oracles

    now = {str(p): _digest(p) for p in _sources()}
    changed = sorted(p for p in set(now) | set(_HASHES) if now.get(p) != _HASHES.get(p))
    return [Finding(oracle=Oracles.CONTRACT,
                    message=f"the judge's source file {os.path.relpath(p)} changed during the check (isolation: the "
                            "candidate must not write the checkout)",
                    figures={"path": p}) for p in changed]
