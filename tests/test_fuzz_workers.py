"""fuzz_in_workers / `diffmoe fuzz --workers N`: the split, the merge, the first failure ending
the search, a shared database, interrupts, and a worker that dies.

A stand-in runner (tests/test_fuzzing.py's) replaces diffmoe.check.runner; the workers are forked,
so they inherit it, and these tests measure the process plumbing, not the kernels.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

import pytest

from diffmoe.frontends import cli
from diffmoe.fuzz.workers import WorkerFailed, fuzz_in_workers, split_examples, worker_seed
from diffmoe.fuzz.tiers import full_phase
from diffmoe.fuzz.driver import fuzz
from diffmoe.fuzz.strategies import MINIMAL_FUSED_CONFIG
from signal_dispositions import sigint_as
from test_fuzzing import cli_runner, fake_runner  # noqa: F401 - the stand-in runner fixtures, shared

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="forked workers and /proc: Linux")


_BEFORE: set[int] = set()  # children alive when the test began (_baseline)


@pytest.fixture(autouse=True)
def _baseline():
    """What a test may leave is judged against what it found: the suite's shared two-node Ray cluster
    (tests/conftest.py, session-wide) and a module's Redis server are children of this process too."""
    _BEFORE.clear()
    _BEFORE.update(_children(since_start=False))
    yield


def _children(since_start: bool = True) -> list[int]:
    """Live (non-zombie) child processes of this process started since the test began, but the
    isolation's zygote (an earlier isolated check's, kept for the process's later ones:
    diffmoe/isolation/client.py)."""
    from diffmoe.isolation.client import zygote_pids

    me, out, zygotes = os.getpid(), [], zygote_pids() | (_BEFORE if since_start else set())
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    fields = fh.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == me and fields[0] != "Z" and int(entry) not in zygotes:
                out.append(int(entry))
    return out


@pytest.mark.parametrize("examples, workers", [(1, 4), (7, 2), (8, 3), (100, 7), (3, 3)])
def test_the_split_covers_every_example_and_leaves_no_worker_empty(examples, workers):
    shares = split_examples(examples, workers)
    assert sum(shares) == examples and min(shares) >= 1 and len(shares) == min(examples, workers)
    assert max(shares) - min(shares) <= 1


def test_worker_zero_keeps_the_seed_and_the_others_differ():
    seeds = [worker_seed(12345, i) for i in range(8)]
    assert seeds[0] == 12345 and len(set(seeds)) == 8


def test_clean_search_runs_every_example_once_split(fake_runner):
    fake_runner(fails=lambda c: False)
    outcome = fuzz_in_workers(workers=2, max_examples=12, seed=3)
    assert outcome.passed and not outcome.interrupted
    assert outcome.generated_examples == 12 and outcome.seed == 3
    assert _children() == []


@pytest.mark.parametrize("seed", [0, None])
def test_the_full_set_judges_one_in_full_every_of_the_whole_split_search(fake_runner, seed):
    """Two workers of 10 examples: 3 full checks, as one worker of 20 has (each worker starting
    its count at its own first example made 4); seeded workers keep their seed's phase, so the
    worker's own `--workers 1 --seed` search judges the same examples fully."""
    fake_runner(fails=lambda c: False)
    split = fuzz_in_workers(workers=2, max_examples=20, seed=seed)
    assert split.passed and split.generated_examples == 20 and split.full_examples == 3
    if seed is not None:
        fake_runner(fails=lambda c: False)
        alone = fuzz(max_examples=10, seed=worker_seed(seed, 1))
        assert alone.full_examples == 1 and full_phase(worker_seed(seed, 1)) != full_phase(seed)


def test_one_worker_is_the_serial_fuzz(fake_runner):
    fake_runner()
    serial = fuzz(max_examples=30, seed=5, planner="legacy")
    fake_runner()
    one = fuzz_in_workers(workers=1, max_examples=30, seed=5, planner="legacy")
    assert one.report.config == serial.report.config and one.examples == serial.examples


def test_a_failure_is_shrunk_and_ends_the_others(fake_runner):
    fake_runner()  # legacy + fused fails: the minimal config is the documented one
    outcome = fuzz_in_workers(workers=2, max_examples=400, seed=1, planner="legacy")
    assert not outcome.passed and not outcome.interrupted
    assert outcome.report.config == MINIMAL_FUSED_CONFIG.replace(planner="legacy")
    assert outcome.shrink_examples > 0 and outcome.seconds_to_first_failure is not None
    assert outcome.generated_examples < 400  # the first failure stopped the search
    assert any(n.startswith("found by worker ") and "--workers 1 --seed " in n for n in outcome.notes)
    assert _children() == []


def test_the_worker_named_repeats_the_failure_alone(fake_runner):
    fake_runner(fails=lambda c: c.num_tokens >= 40)
    outcome = fuzz_in_workers(workers=3, max_examples=60, seed=11)
    note = next(n for n in outcome.notes if n.startswith("found by worker "))
    seed = int(note.split("(seed ")[1].split(",")[0])
    share = int(note.split(", ")[1].split(" examples")[0])
    fake_runner(fails=lambda c: c.num_tokens >= 40)
    alone = fuzz(max_examples=share, seed=seed)
    assert alone.report.config == outcome.report.config


def test_workers_share_the_database(fake_runner, tmp_path):
    database = tmp_path / "db"
    fake_runner()
    first = fuzz_in_workers(workers=2, max_examples=200, seed=None, planner="legacy", database=str(database))
    assert not first.passed and os.listdir(database)
    fake_runner()
    second = fuzz_in_workers(workers=2, max_examples=200, seed=None, planner="legacy", database=str(database))
    assert second.report.config == first.report.config
    assert second.generated_examples <= 2  # each worker's replay of the stored failure comes first


# 0.02 s an example: the 1,000 examples take each of the two workers 10 s or more, so the search is
# still running when the stop comes at 1.5 s, and ends by itself if it never comes.
SLOW_EXAMPLES = 1_000


@pytest.mark.parametrize("signum,disposition", [(signal.SIGINT, "terminal"), (signal.SIGTERM, "ignored")],
                         ids=["ctrl-c", "sigterm-with-sigint-ignored"])
def test_interrupt_stops_every_worker_and_keeps_what_was_found(fake_runner, signum, disposition):
    """Ctrl-C from a terminal, or SIGTERM to a job started with SIGINT ignored (the CLI turns
    SIGTERM into KeyboardInterrupt), stops the search and every worker: the parent stops them
    with SIGTERM, which they take whatever SIGINT they inherited. The disposition is the test's
    own, whatever pytest inherited (tests/signal_dispositions.py)."""
    def slow(config):
        time.sleep(0.02)
        return False

    fake_runner(fails=slow)
    timer = threading.Timer(1.5, lambda: os.kill(os.getpid(), signum))
    started = time.monotonic()
    with sigint_as(disposition), cli._sigterm_interrupts():
        timer.start()
        try:
            outcome = fuzz_in_workers(workers=2, max_examples=SLOW_EXAMPLES, seed=2)
        finally:
            timer.cancel()
    assert outcome.interrupted and outcome.passed
    assert 0 < outcome.generated_examples < SLOW_EXAMPLES
    assert time.monotonic() - started < 15
    assert _children() == []


def test_a_worker_that_dies_is_an_error_not_a_pass(fake_runner):
    parent = os.getpid()

    def dies(config):
        if os.getpid() != parent and config.num_tokens > 3:
            os._exit(7)
        return False

    fake_runner(fails=dies)
    with pytest.raises(WorkerFailed, match=r"died \(exit code 7\)"):
        fuzz_in_workers(workers=2, max_examples=200, seed=4)
    assert _children() == []


def test_bad_workers_value_is_a_clear_error():
    with pytest.raises(ValueError, match="workers"):
        fuzz_in_workers(workers=0, max_examples=3, seed=0)
    with pytest.raises(TypeError, match="database"):
        fuzz_in_workers(workers=2, max_examples=3, seed=None, database=object())


# ---- the CLI ---------------------------------------------------------------------------


def test_cli_workers_finds_and_shrinks(cli_runner, capsys):
    code = cli.main(["fuzz", "--workers", "2", "--seed", "1", "--planner", "legacy", "--max-examples", "200"])
    out, _ = capsys.readouterr()
    assert code == 1
    assert MINIMAL_FUSED_CONFIG.replace(planner="legacy").short() in out and "found by worker" in out


def test_cli_workers_out_of_range_is_a_usage_error(cli_runner, capsys):
    assert cli.main(["fuzz", "--workers", "0"]) == 2
    assert cli.main(["fuzz", "--workers", "100000"]) == 2
    err = capsys.readouterr().err
    assert "--workers" in err and "Traceback" not in err


def test_cli_uses_the_shared_database_variable(cli_runner, capsys, monkeypatch, tmp_path):
    database = tmp_path / "shared"
    monkeypatch.setenv("DIFFMOE_HYPOTHESIS_DB", str(database))
    code = cli.main(["fuzz", "--workers", "2", "--planner", "legacy", "--max-examples", "200"])
    out, err = capsys.readouterr()
    assert code == 1 and f"example database {database}" in err and os.listdir(database)
    assert f"database {database}" in out  # the summary names where the failure is stored
    # an explicit seed wins over the variable: reproducible, nothing replayed
    assert cli.main(["fuzz", "--workers", "1", "--seed", "0", "--max-examples", "3"]) == 0


def test_interrupts_are_noted_not_raised_while_the_workers_messages_are_read():
    """A signal while the parent reads a message must not cut it in half: the handlers that would
    raise only note it (fuzz_workers._interrupts_noted); an ignored SIGINT stays ignored; the
    handlers are back afterwards, and _collect hears a noted signal as the stop."""
    from diffmoe.fuzz import workers as fuzz_workers

    with sigint_as("terminal"):  # as a terminal's job has it (a background job starts with it ignored)
        before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
        with fuzz_workers._interrupts_noted() as noted:
            os.kill(os.getpid(), signal.SIGINT)  # would raise KeyboardInterrupt here without it
            for _ in range(100):
                if noted:
                    break
                time.sleep(0.01)
            assert noted == [signal.SIGINT]
        assert {s: signal.getsignal(s) for s in before} == before
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with fuzz_workers._interrupts_noted():
            assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)
    # a signal noted before the loop's end is an interrupt: no worker left to wait for, still True
    assert fuzz_workers._collect([], None, None, None, 0.0, False, [signal.SIGTERM]) is True
