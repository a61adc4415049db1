"""The one table of oracles: what `--oracles` accepts, the order reports list them, the oracle
table of docs/oracles.md and the bug zoo's columns. Imports no torch until an oracle is loaded.

Adding an oracle: write its module under diffmoe/oracles/ (one `Oracle` subclass, base.py),
add its name to `diffmoe.findings.Oracles` and one row here; `tests/oracles/test_oracle_registry.py`
then holds the docs table to it.

Owns the table and its order. Must not hold an oracle's logic.
"""

from __future__ import annotations

import importlib
from collections.abc import Collection
from functools import cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from diffmoe.oracles.base import Oracle

# (name, "module:class"), in the order users see them: `--oracles`, reports, the docs table.
# The classes are imported on first use, so the names cost nothing (the CLI answers a bad
# `--oracles` before torch is imported).
REGISTRY: tuple[tuple[str, str], ...] = (
    ("differential", "diffmoe.oracles.differential:Differential"),
    ("teacher-forcing", "diffmoe.oracles.teacher_forcing:TeacherForcing"),
    ("metamorphic", "diffmoe.oracles.metamorphic:Metamorphic"),
    ("static-aliasing", "diffmoe.oracles.static_aliasing:StaticAliasing"),
    ("runtime-aliasing", "diffmoe.oracles.runtime_aliasing:RuntimeAliasing"),
    ("bounds", "diffmoe.oracles.bounds:Bounds"),
    ("overflow", "diffmoe.oracles.overflow:Overflow"),
    ("races", "diffmoe.oracles.races:Races"),
    ("store-extent", "diffmoe.oracles.store_extent:StoreExtent"),
    ("schedule", "diffmoe.oracles.schedule:ScheduleOracle"),
    ("poison", "diffmoe.oracles.poison:Poison"),
    ("call-sequence", "diffmoe.oracles.call_sequence:CallSequence"),
    ("red-zone", "diffmoe.oracles.red_zone:RedZone"),
    ("contract", "diffmoe.oracles.contract:Contract"),
    ("batch-invariance", "diffmoe.oracles.batch_invariance:BatchInvariance"),
)
ALL_ORACLES: tuple[str, ...] = tuple(name for name, _ in REGISTRY)  # as shipped; the functions read REGISTRY
DEFAULT_ORACLES: tuple[str, ...] = ALL_ORACLES  # a check's default: every oracle (none is opt-in since issue 48)


@cache
def _load(spec: str) -> Oracle:
    module, cls = spec.split(":")
    return getattr(importlib.import_module(module), cls)()


def oracle(name: str) -> Oracle:
    """The oracle object registered under `name` (a ValueError naming the known ones otherwise)."""
    for registered, spec in REGISTRY:
        if registered == name:
            found = _load(spec)
            if found.name != name:
                raise ValueError(f"registry row {name!r} loads an oracle named {found.name!r}")
            return found
    raise ValueError(f"oracles must be among {names()}, got unknown {[name]}")


# Outcomes that are not oracles (the harness reports them whatever the selection), as the
# docs table (docs/oracles.md) lists them: (name, what it means, what the finding holds).
OUTCOME_ROWS = (
    ("crash", "the implementation raised", "exception type, message and the stage in flight"),
)


def names() -> list[str]:
    return [name for name, _ in REGISTRY]


def resolve_oracles(oracles: Collection[str] | None) -> list[str]:
    """The selection in registry order (None: every oracle); a ValueError naming the unknown ones."""
    known = names()
    if oracles is None:
        return known
    unknown = sorted(set(oracles) - set(known))
    if unknown:
        raise ValueError(f"oracles must be among {known}, got unknown {unknown}")
    return [o for o in known if o in oracles]


# What judges a sampled check (issue 42, diffmoe/interpreter/program_sample.py), where each launch
# runs a chosen few of its programs: the differential on the elements those programs wrote, and
# teacher forcing on the elements each stage's chosen programs wrote from the reference's inputs, and
# every oracle that judges an access, a declaration or the plan (sound over any subset of programs).
# Not these: the oracles that compare whole runs or run other calls (metamorphic, schedule, poison,
# call-sequence, batch-invariance), whose unsampled elements would differ by design.
SAMPLED_ORACLES: tuple[str, ...] = ("differential", "teacher-forcing", "static-aliasing", "runtime-aliasing", "bounds",
                                    "overflow", "races", "store-extent", "red-zone", "contract")


def resolve_sampled_oracles(oracles: Collection[str] | None) -> list[str]:
    """A sampled check's selection: None is every oracle of SAMPLED_ORACLES; a ValueError naming any
    other selected oracle (it cannot judge a sampled run)."""
    chosen = resolve_oracles(oracles)
    if oracles is None:
        return [o for o in chosen if o in SAMPLED_ORACLES]
    refused = [o for o in chosen if o not in SAMPLED_ORACLES]
    if refused:
        raise ValueError(f"oracles {refused} cannot judge a sampled check (--sample-programs): each compares whole "
                         f"runs or makes other calls; a sampled check runs {list(SAMPLED_ORACLES)}")
    return chosen


def active_oracles(selected: Collection[str]) -> list[Oracle]:
    """The selected oracles in the order their findings come within one hook (by rank)."""
    return sorted((oracle(name) for name in resolve_oracles(selected)), key=lambda o: o.rank)


def docs_table() -> str:
    """The oracle table of docs/oracles.md, generated from the registry."""
    rows = ["| oracle | what it checks | how |", "|---|---|---|"]
    rows += [f"| `{o.name}` | {o.checks} | {o.how} |" for o in map(oracle, names())]
    rows += [f"| `{name}` | {checks} | {how} |" for name, checks, how in OUTCOME_ROWS]
    return "\n".join(rows)
