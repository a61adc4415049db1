"""One fuzz session's parameters, checked once: `FuzzRequest`.

Why: a search's parameters travelled as bags of names: `fuzz()`'s keywords, the kwargs dict the
worker split copied and edited per worker, and the CLI's call assembling both; a bad value was
found wherever it was first used, and a reader followed a name through three files to learn what
it could be. A FuzzRequest is built once (by `fuzz()` from its keywords, by `diffmoe fuzz` from its
flags, by `fuzz_in_workers` per worker with that worker's share and seed, `dataclasses.replace`),
checks every field that can be checked without running anything, and is what a search
(`diffmoe.fuzz.driver.run_request`), a Ray task and the CLI pass on. The meaning of each field is
`fuzz()`'s docstring.

Owns the fields, their defaults and their checks. Must not open a database or judge an example.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from hypothesis.database import ExampleDatabase

from diffmoe.contract import ImplementationFactory, Schedule
from diffmoe.fuzz.bounds import FieldBounds
from diffmoe.fuzz.strategies import DEFAULT_MAX_TOKENS, MAX_EXPERTS, moe_configs
from diffmoe.fuzz.tiers import FULL_EVERY, TIER_RUN, TierPolicy, full_phase
from diffmoe.fuzz.waivers import Waiver, Waivers
from diffmoe.problem.config import MAX_SEED, MAX_TOKENS, PLANNERS, check_int

MAX_EXAMPLES_LIMIT = 1_000_000
# --keep-going's bound: one failure per oracle@stage key; 15 oracles (crash and timeout
# included, waivers.waivable_oracles()) at 8 stages each is 120 keys, so 1000 never cuts a search short.
MAX_KEEP_GOING = 1000


@dataclass(frozen=True)
class FuzzRequest:
    """What one search is asked to do (the fields are `diffmoe.fuzz.driver.fuzz`'s keywords but
    `progress`). Construction checks each field (TypeError/ValueError naming it); `waive` is
    held as `Waivers`."""

    max_examples: int
    seed: int | None
    planner: str | None = "fixed"
    implementation: ImplementationFactory | None = None
    implementation_name: str | None = None
    max_tokens: int = DEFAULT_MAX_TOKENS
    max_experts: int = MAX_EXPERTS
    database: ExampleDatabase | str | os.PathLike | None = None
    oracles: Collection[str] | None = None
    schedules: Sequence[Schedule | str] | None = None
    device: str | None = None
    time_limit: float | None = None
    special_rows: bool = True
    features: bool = False
    tier: str = TIER_RUN
    full_every: int = FULL_EVERY
    full_offset: int | None = None
    shrink: bool = True
    bounds: FieldBounds | None = None
    waive: Waivers | Sequence[Waiver | str] = ()
    keep_going: int = 1
    isolation: str = "none"

    def __post_init__(self) -> None:
        check_int("max_examples", self.max_examples, 1, MAX_EXAMPLES_LIMIT)
        if self.seed is not None:
            check_int("seed", self.seed, 0, MAX_SEED)
        if self.planner is not None and self.planner not in PLANNERS:
            raise ValueError(f"planner must be None or one of {list(PLANNERS)}, got {self.planner!r}")
        check_int("max_tokens", self.max_tokens, 1, MAX_TOKENS)
        limit = self.time_limit
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, (int, float)) or not 0 < limit < float("inf")):
            raise ValueError(f"time_limit must be None or a number of seconds > 0, got {limit!r}")
        if self.database is not None and not isinstance(self.database, (ExampleDatabase, str, os.PathLike)):
            raise TypeError("database must be None, a directory path, a redis:// URL or a hypothesis ExampleDatabase, "
                            f"got {self.database!r}")
        if self.seed is not None and self.database is not None:
            raise ValueError("seed and database are exclusive: a seeded run is reproducible and replays no stored failure")
        for flag in ("special_rows", "features", "shrink"):
            if not isinstance(getattr(self, flag), bool):
                raise TypeError(f"{flag} must be a bool, got {getattr(self, flag)!r}")
        check_int("keep_going", self.keep_going, 1, MAX_KEEP_GOING)
        if not isinstance(self.waive, Waivers):
            object.__setattr__(self, "waive", Waivers(self.waive))
        self.policy()  # the tier, its full set's spacing and phase
        self.strategy()  # max_experts and the bounds

    def resolved_full_offset(self) -> int:
        """full_offset, or the seed's phase when None (`diffmoe.fuzz.tiers.full_phase`)."""
        if self.full_offset is not None:
            return self.full_offset
        return full_phase(self.seed, self.full_every) if isinstance(self.full_every, int) and self.full_every >= 1 else 0

    def policy(self) -> TierPolicy:
        """The tier policy of a search's first round."""
        return TierPolicy(self.tier, self.oracles, self.schedules, self.full_every, self.resolved_full_offset())

    def strategy(self):
        """The configs this search draws (`diffmoe.fuzz.strategies.moe_configs`)."""
        return moe_configs(planner=self.planner, max_tokens=self.max_tokens, max_experts=self.max_experts,
                           special_rows=self.special_rows, features=self.features, bounds=self.bounds)
