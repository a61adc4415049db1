"""fuzz_in_workers / `diffmoe fuzz --workers N`: the split and the seeds, one worker in this process,
the arguments refused before any task starts, and the CLI's defaults.

The searches as Ray tasks (the first failure ending the others, the merge, a shared database, a stop,
a lost task) are tests/cluster/test_cluster_fuzz.py's, on the suite's two-node cluster.
"""

from __future__ import annotations

import os
import sys

import pytest

import diffmoe.fuzz.workers as fuzz_workers

from diffmoe.frontends import cli
from diffmoe.fuzz.driver import fuzz
from diffmoe.fuzz.workers import fuzz_in_workers, split_examples, worker_seed
from stand_in_runner import cli_runner, fake_runner  # noqa: F401 - the stand-in runner fixtures, shared


@pytest.mark.parametrize("examples, workers", [(1, 4), (7, 2), (8, 3), (100, 7), (3, 3)])
def test_the_split_covers_every_example_and_leaves_no_worker_empty(examples, workers):
    shares = split_examples(examples, workers)
    assert sum(shares) == examples and min(shares) >= 1 and len(shares) == min(examples, workers)
    assert max(shares) - min(shares) <= 1


def test_worker_zero_keeps_the_seed_and_the_others_differ():
    seeds = [worker_seed(12345, i) for i in range(8)]
    assert seeds[0] == 12345 and len(set(seeds)) == 8


def test_one_worker_is_the_serial_fuzz(fake_runner):
    fake_runner()
    serial = fuzz(max_examples=30, seed=5, planner="legacy")
    fake_runner()
    one = fuzz_in_workers(workers=1, max_examples=30, seed=5, planner="legacy")
    assert one.report.config == serial.report.config and one.examples == serial.examples


def test_bad_workers_value_is_a_clear_error():
    with pytest.raises(ValueError, match="workers"):
        fuzz_in_workers(workers=0, max_examples=3, seed=0)
    with pytest.raises(TypeError, match="database"):
        fuzz_in_workers(workers=2, max_examples=3, seed=None, database=object())


# ---- the CLI ---------------------------------------------------------------------------


def test_cli_workers_out_of_range_is_a_usage_error(cli_runner, capsys):
    assert cli.main(["fuzz", "--workers", "0"]) == 2
    assert cli.main(["fuzz", "--workers", "100000"]) == 2
    err = capsys.readouterr().err
    assert "--workers" in err and "Traceback" not in err


def test_cli_uses_the_shared_database_variable(cli_runner, capsys, monkeypatch, tmp_path):
    database = tmp_path / "shared"
    monkeypatch.setenv("DIFFMOE_HYPOTHESIS_DB", str(database))
    code = cli.main(["fuzz", "--planner", "legacy", "--max-examples", "200"])
    out, err = capsys.readouterr()
    assert code == 1 and f"example database {database}" in err and os.listdir(database)
    assert f"database {database}" in out  # the summary names where the failure is stored
    # an explicit seed wins over the variable: reproducible, nothing replayed
    assert cli.main(["fuzz", "--workers", "1", "--seed", "0", "--max-examples", "3"]) == 0




def test_cli_default_is_one_search_in_this_process_without_ray(cli_runner, capsys, monkeypatch):
    """No --workers: the search runs here (the stand-in in this process judges it) and no Ray
    runtime is started; the first failure is found and shrunk as ever."""
    def no_tasks(*args, **kwargs):  # pragma: no cover - fails the test if reached
        raise AssertionError("the default fuzz started tasks")

    monkeypatch.setattr(fuzz_workers, "run_tasks", no_tasks)
    assert cli.main(["fuzz", "--seed", "1", "--planner", "legacy", "--max-examples", "50"]) == 1
    assert cli_runner.calls and "found by worker" not in capsys.readouterr().out
    assert "ray" not in sys.modules or not sys.modules["ray"].is_initialized()


@pytest.mark.parametrize("value, says", [("{", "not JSON"), ("[1]", "expected a JSON object"),
                                         ('"env"', "expected a JSON object")])
def test_cli_bad_runtime_env_is_a_usage_error_in_one_line(cli_runner, capsys, value, says):
    assert cli.main(["fuzz", "--runtime-env", value, "--seed", "1", "--max-examples", "3"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--runtime-env" in err[0] and says in err[0] and cli_runner.calls == []


def test_a_file_implementation_travels_by_value(tmp_path, monkeypatch):
    """`--impl path/to/kernel.py:make` is known to this process under a name no Ray worker can import:
    its module is pickled by value, so a task rebuilds the factory from the file's own code."""
    ray_cloudpickle = pytest.importorskip("ray.cloudpickle")
    from diffmoe.adapters.loading import load_factory

    (tmp_path / "kernel_by_value.py").write_text("def make(config):\n    return ('made', config)\n")
    make = load_factory(f"{tmp_path / 'kernel_by_value.py'}:make")
    module = sys.modules[make.__module__]
    try:
        fuzz_workers._ship_implementation_files()
        payload = ray_cloudpickle.dumps(make)
        del sys.modules[make.__module__]  # as in a worker that never loaded the file
        assert ray_cloudpickle.loads(payload)(7) == ("made", 7)
    finally:
        sys.modules[make.__module__] = module
        ray_cloudpickle.unregister_pickle_by_value(module)
