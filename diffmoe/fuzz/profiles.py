"""The Hypothesis settings profiles of diffmoe, registered in this one place.

* ``ci``: reproducible and bounded. derandomize=True (the same examples on every run, so a
  red build is a real regression and not a new random draw), no example database, the
  failing example's blob printed for replay, no deadline (interpreter timings vary by
  machine). ``CI_MAX_EXAMPLES`` examples per property: 100. It was 20, then 40 once the
  differential property judged most examples with the fuzzer's cheap oracle set
  (tests/judge/test_differential_suite.py, diffmoe/fuzz/tiers.py), and 100 once the interpreter
  fast path (diffmoe/interpreter/fast_path.py) halved the suite: a clean-clone `.ci/run` took 944 s
  of pytest before it and 468 s after, at 40 (2026-12-04, this 2-core machine); the two
  differential properties took 14 s and 20 s of that at 40 examples. The explain phase is off: it reruns the failing
  example many times over, minutes on the interpreter.
* ``dev``: a quick look while editing, ``DEV_MAX_EXAMPLES`` examples, random, with the
  local database so a failure replays first on the next run.
* ``thorough``: a long soak, ``THOROUGH_MAX_EXAMPLES`` examples, explain phase on.

A shared example database: set ``DIFFMOE_HYPOTHESIS_DB`` to a directory and the ``dev`` and
``thorough`` profiles store and replay failing examples there, so pytest-xdist workers
(``pytest -n auto``), teammates or CI machines mounting the same directory share what any of
them found (Hypothesis's own DirectoryBasedExampleDatabase; safe for concurrent writers).
``ci`` never uses a database: its runs must not depend on what an earlier run found.

The pytest plugin registers these at import, so ``pytest --hypothesis-profile ci`` works,
and loads ``ci`` when the environment variable CI is true and no profile was chosen.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, Phase, settings
from hypothesis.database import DirectoryBasedExampleDatabase

SHARED_DATABASE_ENV = "DIFFMOE_HYPOTHESIS_DB"

CI_MAX_EXAMPLES = 100
DEV_MAX_EXAMPLES = 5
THOROUGH_MAX_EXAMPLES = 500

PROFILES = ("ci", "dev", "thorough")

# Interpreter runs are slow by nature; Hypothesis's "too slow" check would fire on every
# generated config, so it is not a signal here.
_QUIET_CHECKS = [HealthCheck.too_slow]
_NO_EXPLAIN = (Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink)


def shared_database_path(environ: dict[str, str] | None = None) -> str | None:
    """The directory DIFFMOE_HYPOTHESIS_DB names (`diffmoe fuzz` uses it too), or None."""
    return (os.environ if environ is None else environ).get(SHARED_DATABASE_ENV, "").strip() or None


def shared_database(environ: dict[str, str] | None = None) -> dict:
    """settings keyword for the shared example database named by DIFFMOE_HYPOTHESIS_DB, if any."""
    path = shared_database_path(environ)
    return {"database": DirectoryBasedExampleDatabase(path)} if path else {}


def register_profiles() -> None:
    """Register ci, dev and thorough (idempotent: registering again replaces them)."""
    settings.register_profile(
        "ci",
        max_examples=CI_MAX_EXAMPLES,
        derandomize=True,
        database=None,
        deadline=None,
        print_blob=True,
        phases=_NO_EXPLAIN,
        suppress_health_check=_QUIET_CHECKS,
    )
    settings.register_profile(
        "dev",
        max_examples=DEV_MAX_EXAMPLES,
        deadline=None,
        **shared_database(),
        phases=_NO_EXPLAIN,
        suppress_health_check=_QUIET_CHECKS,
    )
    settings.register_profile(
        "thorough",
        max_examples=THOROUGH_MAX_EXAMPLES,
        deadline=None,
        **shared_database(),
        print_blob=True,
        suppress_health_check=_QUIET_CHECKS,
    )


def load_profile(name: str) -> settings:
    """Register the profiles, make `name` the active one and return its settings."""
    if name not in PROFILES:
        raise ValueError(f"hypothesis profile must be one of {list(PROFILES)}, got {name!r}")
    register_profiles()
    settings.load_profile(name)
    return settings.get_profile(name)


def ci_requested(environ: dict[str, str] | None = None) -> bool:
    """True when CI is set to a true value ("true", "1", "yes"; any case)."""
    env = os.environ if environ is None else environ
    return env.get("CI", "").strip().lower() in ("true", "1", "yes")
