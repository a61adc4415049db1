"""Public path of one check: `run_differential`, the factory loader, and the report it returns.

The check's orchestration lives in diffmoe/judge/runner.py; this module exports the part users
call (`__all__`). Any other name of that module is still found here, with a
DeprecationWarning naming diffmoe.judge.runner (diffmoe.moved).

Owns the public names (`__all__`) only. Must not hold code of its own.
"""

from diffmoe.check.report import Report
from diffmoe.findings import Finding
from diffmoe.judge.runner import (
    DEFAULT_INTERPRETER_TIME_LIMIT,
    MAX_TIME_LIMIT,
    WorkerError,
    default_schedules,
    load_factory,
    run_differential,
)
from diffmoe.moved import internal_names

__all__ = [
    "ALL_ORACLES",
    "DEFAULT_INTERPRETER_TIME_LIMIT",
    "MAX_TIME_LIMIT",
    "Finding",
    "Report",
    "WorkerError",
    "default_schedules",
    "load_factory",
    "run_differential",
]

# ALL_ORACLES is read when first used: it imports the oracles, which a module that only defines a
# factory beside its tests must not need (in the candidate's process they are not there, issue 43).
__getattr__ = internal_names(__name__, "diffmoe.judge.runner", lazy=("ALL_ORACLES",))
