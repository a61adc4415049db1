"""pytest plugin (entry point `diffmoe`): Hypothesis profiles and fixtures for testing an MoE
implementation with diffmoe.

Profiles: `ci`, `dev` and `thorough` (diffmoe.fuzz.profiles) are registered when the
plugin loads, so `pytest --hypothesis-profile ci` works; with the environment variable CI
set to true and no profile chosen, `ci` is loaded.

Fixtures, for suites that plug in their own implementation:

* `moe_problem_factory`: `make(config, device="cpu") -> Problem`, every input of a config.
* `moe_reference`: `run(problem) -> RunResult`, the pure-PyTorch reference with every
  intermediate.
* `guarded_workspaces`: `make(nbytes=(ws1, ws2), device="cpu", **options) ->
  GuardedWorkspaces`, poisonable workspaces between guard bytes.
* `assert_report_passes`: `check(report)` fails the test with the rendered report and its
  replay command when the report has findings. The report names the implementation under
  test and the replay command carries it: `run_differential(config, my_factory)` calls a
  factory defined at module level `module:factory` (a test module's own name when pytest
  imports it by file name: replay with its folder on PYTHONPATH), and says so when no command
  can load it (a lambda, a closure).

The fixtures are session-scoped (they hold no state: each returns a function), so they work
inside `@given` tests, where Hypothesis refuses function-scoped fixtures (FailedHealthCheck).

Must not judge: the fixtures hand configs to run_differential.
"""

from __future__ import annotations

from typing import Callable

import pytest

from diffmoe.fuzz.profiles import ci_requested, load_profile, register_profiles

# At import, not in pytest_configure: Hypothesis's own plugin loads the profile named by
# --hypothesis-profile in its pytest_configure, which may run before ours.
register_profiles()


def pytest_configure(config: pytest.Config) -> None:
    chosen = config.getoption("--hypothesis-profile", default=None)
    if chosen is None and ci_requested():
        load_profile("ci")


@pytest.fixture(scope="session")
def moe_problem_factory() -> Callable:
    """config -> Problem (deterministic from config.seed)."""
    from diffmoe.problem.inputs import make_problem

    def make(config, device="cpu"):
        return make_problem(config, device)

    return make


@pytest.fixture(scope="session")
def moe_reference() -> Callable:
    """problem -> RunResult of the reference MoE (output and every intermediate)."""
    from reference import reference_moe

    return reference_moe


@pytest.fixture(scope="session")
def guarded_workspaces() -> Callable:
    """Factory of GuardedWorkspaces: make((ws1_bytes, ws2_bytes), device="cpu", **options)."""
    from diffmoe.check.guards import GuardedWorkspaces

    def make(nbytes, device="cpu", **options):
        return GuardedWorkspaces(tuple(nbytes), device, **options)

    return make


def report_failure_message(report) -> str:
    """The rendered report, ending with the replay command."""
    text = report.render()
    replay = report.replay_command()
    if replay not in text:
        text += f"\n  replay: {replay}"
    return text


@pytest.fixture(scope="session")
def assert_report_passes() -> Callable:
    """check(report): fail the test with the report and its replay line if it has findings."""

    def check(report) -> None:
        __tracebackhide__ = True  # the report says everything; the helper's frame says nothing
        if not report.passed:
            pytest.fail(report_failure_message(report), pytrace=False)

    return check
