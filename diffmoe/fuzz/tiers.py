"""Which oracles judge each fuzz example: a cheap set by default, every oracle when it matters.

With every oracle a check runs the implementation about seven times (three program orders, a
second poison pattern, a teacher-forced run per stage, the metamorphic sibling, a smaller call
first). The execution tier ("run", the fuzzer's default) judges most generated examples with
`CHEAP_ORACLES` under one random program order (`random:{seed+1}`, the first random order of
the full set, so a full check of the same config sees everything the cheap one saw): one run
of the implementation, watched by the race recorder, and one call of one token, batch
invariance's (a full check judges it from call-sequence's small call, at no cost). It is in
the cheap set because the bug it is for shows rarely (tests/support/bug_zoo.py's tile-from-batch-size:
one bf16 ulp among thousands of elements, in a few examples in a hundred): judged on full
examples only, or on every other cheap one, the default fuzz of seed 0 met it in none of 60
examples; on every example, at the third (issue 48). That call costs a cheap check about a
quarter more (docs/oracles.md has the figures). That set sees every bug class whose mutant
the bug zoo holds but five: the schedule oracle's (a second order), poison's (a second pattern), teacher forcing's (per-stage runs),
call-sequence's (a smaller call first) and the metamorphic oracle's (the sibling). Those are
seen by the full set, which judges

  * every FULL_EVERY-th generated example, so a bug only they see is still found, on average
    FULL_EVERY times later than a full-tier fuzz would find it. The count starts at the search's
    phase, `full_phase(seed)` = seed % FULL_EVERY (the 1st, 9th, ... example for seed 0 or an
    unseeded search; the 6th, 14th, ... for seed 5), so a seeded search judges the same examples
    fully in any process and the workers of a split search (diffmoe/fuzz/workers.py: seeds S,
    S + 1000003, ..., phases 3 apart, distinct for up to 8 workers) do not all judge their first
    example fully: the whole search keeps the rate of one in FULL_EVERY (20 examples on two
    workers had 4 full checks, one per worker more than 3, and a full check costs several cheap
    ones). Unseeded workers get phases i * FULL_EVERY // N;
  * every example once one has failed (Hypothesis's shrinking and its final replay), so the
    shrinker keeps only examples the whole set still fails and the report is complete;
  * the failing example itself, judged again at once (escalation): its report is the full set's;
  * every example replayed from a database, which may have been stored by a full check.

The "full" tier judges every example with every oracle (the fuzzer's behaviour before tiers).
Oracles named by the caller (`--oracles`) judge every example as named: no tiers.

Owns the choice of oracles and schedules per example. Must not judge or drive Hypothesis.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from diffmoe.problem.config import MoEConfig
from diffmoe.findings import Oracles

TIER_RUN = "run"
TIER_FULL = "full"
EXECUTION_TIERS = (TIER_RUN, TIER_FULL)

# One run, judged from its output, its memory record and the plan (see the module doc).
# The bounds guard (and the overflow watch with it) runs under every call whatever the selection,
# so their oracles cost nothing here.
CHEAP_ORACLES = (
    Oracles.STATIC_ALIASING, Oracles.CONTRACT, Oracles.DIFFERENTIAL, Oracles.RUNTIME_ALIASING,
    Oracles.BOUNDS, Oracles.OVERFLOW, Oracles.RACES, Oracles.STORE_EXTENT, Oracles.RED_ZONE, Oracles.BATCH_INVARIANCE,
)
# 1 in 8: the five full-only bug classes are still met within the first few dozen examples,
# while the cheap set carries seven examples in eight (bench/bench_fuzz.py times both tiers).
FULL_EVERY = 8


def full_phase(seed: int | None, full_every: int = FULL_EVERY) -> int:
    """How many generated examples come before a search's first full one (module doc)."""
    return 0 if seed is None else seed % full_every


def worker_full_phase(index: int, workers: int, full_every: int = FULL_EVERY) -> int:
    """The phase of unseeded worker `index` of `workers`: spread evenly (module doc)."""
    return index * full_every // workers


def cheap_schedule(config: MoEConfig) -> str:
    """The one program order of a cheap check: the full set's first random order."""
    return f"random:{config.seed + 1}"


@dataclass(frozen=True)
class Judging:
    """What one example is judged with: None means run_differential's defaults (every oracle,
    every default schedule); `full` says whether that is the whole set."""

    oracles: tuple[str, ...] | None
    schedules: tuple[str, ...] | None
    full: bool


class TierPolicy:
    """Per example, the oracles and schedules of its tier (module doc)."""

    def __init__(self, tier: str, oracles: Collection[str] | None, schedules: Sequence | None,
                 full_every: int = FULL_EVERY, full_offset: int = 0) -> None:
        if tier not in EXECUTION_TIERS:
            raise ValueError(f"tier must be one of {list(EXECUTION_TIERS)}, got {tier!r}")
        if isinstance(full_every, bool) or not isinstance(full_every, int) or full_every < 1:
            raise ValueError(f"full_every must be an int >= 1, got {full_every!r}")
        if isinstance(full_offset, bool) or not isinstance(full_offset, int) or not 0 <= full_offset < full_every:
            raise ValueError(f"full_offset must be an int in [0, full_every - 1] = [0, {full_every - 1}], got {full_offset!r}")
        self.tier = tier
        self.full_every = full_every
        self.full_offset = full_offset  # the full set judges generated example full_offset + 1, then every full_every-th
        self.named = None if oracles is None else tuple(oracles)
        self.schedules = None if schedules is None else tuple(schedules)
        # the caller chose the oracles or the orders: no cheap set
        self.tiered = tier == TIER_RUN and self.named is None and self.schedules is None
        self.generated = 0  # examples judged in the generate phase so far

    def full_judging(self) -> Judging:
        return Judging(self.named, self.schedules, self.named is None)

    def judging(self, config: MoEConfig, *, failed_before: bool, replaying: bool) -> Judging:
        """The judging of the next example (counts generated examples)."""
        if not failed_before and not replaying:
            self.generated += 1
        if not self.tiered or failed_before or replaying or (self.generated - 1 - self.full_offset) % self.full_every == 0:
            return self.full_judging()
        return Judging(CHEAP_ORACLES, (cheap_schedule(config),), False)
