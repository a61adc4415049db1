"""Every mutant of the bug zoo is caught by the oracles it is meant to be caught by, and a
finding names the buffer, stage or workspace it breaks; the unmodified implementation passes
the very same config, so each finding is the mutant's doing.

Reports are cached per module (one interpreter run per mutant and one per control config):
each run takes seconds, and the assertions are cheap views of the same report.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bug_zoo import MUTANTS, Mutant, finding_names, names_expected
from diffmoe.check.report import Report
from diffmoe.findings import Oracles
from diffmoe.judge.runner import ALL_ORACLES, run_differential
from diffmoe.frontends import cli

# Mutants feed corrupted values (NaN poison, clobbered rows) into the kernels; numpy's
# overflow warnings from the interpreter are expected there, not a finding.
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")

_mutant_reports: dict[str, Report] = {}
_control_reports: dict[tuple, Report] = {}


def mutant_report(mutant: Mutant) -> Report:
    if mutant.name not in _mutant_reports:
        mutant.fetch_peer()
        _mutant_reports[mutant.name] = run_differential(mutant.config, mutant.factory, implementation_name=mutant.impl)
    return _mutant_reports[mutant.name]


def control_report(mutant: Mutant) -> Report:
    """The implementation the mutant was broken from (the shipped one, or a peer's adapter) on its config."""
    key = (mutant.control_factory, mutant.control_config)
    if key not in _control_reports:
        mutant.fetch_peer()
        _control_reports[key] = run_differential(mutant.control_config, mutant.control_factory)
    return _control_reports[key]


NAMES = sorted(MUTANTS)


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_mutant_is_caught_by_its_oracles(name):
    mutant = MUTANTS[name]
    report = mutant_report(mutant)
    assert not report.passed, f"{name} went unnoticed:\n{report.render()}"
    missing = mutant.expected_oracles - set(report.oracles_with_findings())
    assert not missing, f"{name}: {sorted(missing)} reported nothing:\n{report.render()}"


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_finding_names_the_broken_buffer_or_stage(name):
    mutant = MUTANTS[name]
    report = mutant_report(mutant)
    named = sorted({n for f in report.findings if f.oracle in mutant.expected_oracles for n in finding_names(f)})
    assert names_expected(mutant, report), f"{name}: no finding names {mutant.expected_name!r}; they name {named}"


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_unmodified_implementation_passes_the_same_config(name):
    mutant = MUTANTS[name]
    report = control_report(mutant)
    assert report.passed, f"control run for {name} is not clean:\n{report.render()}"


def test_the_control_differs_from_the_mutant_only_by_the_bug():
    # The legacy planner is the one mutant that is a config, not a subclass: its control is the
    # same config with the fixed planner, and nothing else may change.
    for mutant in MUTANTS.values():
        if mutant.baseline_config is None:
            continue
        diff = {k for k, v in mutant.config.to_dict().items() if mutant.baseline_config.to_dict()[k] != v}
        assert diff == {"planner"}, f"{mutant.name}: control differs in {sorted(diff)}"


# Oracles whose lonely bug needs a production shape: a wrap at a unit test's size can only be
# planted (a multiplier standing in for a 2^31-element tensor), and a planted one lands outside the
# tensor or on a wrong value, so bounds or the differential see it too; the oracle's own tests say
# what it alone names (the line, the operands, the exact and wrapped values).
NEEDS_A_REAL_SHAPE = {Oracles.OVERFLOW: "tests/oracles/test_overflow.py"}


def test_every_oracle_is_shown_catching_a_bug():
    expected = set().union(*(m.expected_oracles for m in MUTANTS.values())) | set(NEEDS_A_REAL_SHAPE)
    assert expected == set(ALL_ORACLES), f"no mutant is expected to be caught by {sorted(set(ALL_ORACLES) - expected)}"


def test_registry_is_consistent():
    for key, mutant in MUTANTS.items():
        assert key == mutant.name
        assert mutant.expected_oracles and mutant.expected_oracles <= set(ALL_ORACLES), mutant.name
        assert mutant.what_it_breaks and "\n" not in mutant.what_it_breaks, mutant.name
        impl = mutant.impl
        if impl != "optimized":  # the replay command must load the same factory
            import importlib

            module, attr = impl.split(":")
            assert getattr(importlib.import_module(module), attr) is mutant.factory, mutant.name


@pytest.mark.slow
def test_every_oracle_has_a_mutant_that_it_alone_catches():
    # Each oracle earns its place: some bug is seen by it and by no other oracle.
    alone = {o: [] for o in ALL_ORACLES}
    for name in NAMES:
        seen = set(mutant_report(MUTANTS[name]).oracles_with_findings())
        if len(seen) == 1:
            alone.setdefault(seen.pop(), []).append(name)
    lonely = sorted(o for o in ALL_ORACLES if not alone[o] and o not in NEEDS_A_REAL_SHAPE)
    assert not lonely, f"no mutant is caught by these oracles alone: {lonely}"
    assert all(Path(__file__).resolve().parents[2].joinpath(t).is_file() for t in NEEDS_A_REAL_SHAPE.values())


INPUT_CLASS_MUTANTS = sorted(n for n, m in MUTANTS.items() if m.unseen_without is not None)


@pytest.mark.slow
@pytest.mark.parametrize("name", INPUT_CLASS_MUTANTS)
def test_input_class_mutant_is_unseen_without_its_input(name):
    # The opt-in input is what makes the bug visible: without it the same mutant passes, so a
    # campaign that never draws the input would never see the bug.
    mutant = MUTANTS[name]
    report = run_differential(mutant.unseen_without, mutant.factory, implementation_name=mutant.impl)
    assert report.passed, f"{name} is already caught without its input class:\n{report.render()}"


@pytest.mark.slow
@pytest.mark.parametrize("impl,exit_code", [
    ("bug_zoo:make_scale_floor_dropped", 1),  # the padding token's (issue 34)
    ("bug_zoo:make_nan_squashed_on_input", 1),  # the NaN token's (issue 48 item 5)
    ("bug_zoo:make_reduce_skips_non_finite_sums", 1),
    (None, 0),  # the shipped implementation: quiet on the same rows
])
def test_a_default_check_finds_the_special_row_mutants(capsys, impl, exit_code):
    # `diffmoe check` with no flag holds one padding token and one NaN token (config.flag_zero_rows,
    # flag_nan_rows): a kernel that squashes a NaN or leaves a NaN row unwritten fails it, as one
    # that drops the scale floor does, with nothing about the bug told to the command.
    argv = ["check", "--isolation", "none"] + (["--impl", impl] if impl else [])
    assert cli.main(argv) == exit_code, capsys.readouterr().out
