"""Public path of the pytest plugin (entry point `diffmoe`): its hooks, fixtures and
`report_failure_message`.

The plugin lives in diffmoe/frontends/pytest_plugin.py (its docstring lists the profiles and
fixtures); pytest registers this module, which holds the same hook and fixture objects. Any
other name of that module is still found here, with a DeprecationWarning naming it (diffmoe.moved).

Owns the public names (`__all__`) only. Must not hold code of its own.
"""

from diffmoe.frontends.pytest_plugin import (
    assert_report_passes,
    guarded_workspaces,
    moe_problem_factory,
    moe_reference,
    pytest_configure,
    report_failure_message,
)
from diffmoe.moved import internal_names

__all__ = [
    "assert_report_passes",
    "guarded_workspaces",
    "moe_problem_factory",
    "moe_reference",
    "pytest_configure",
    "report_failure_message",
]

__getattr__ = internal_names(__name__, "diffmoe.frontends.pytest_plugin")
