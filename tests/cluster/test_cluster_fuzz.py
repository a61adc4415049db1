"""`diffmoe fuzz --workers N [--cluster ...]`: the searches as Ray tasks on a real two-node Ray cluster
of this machine (tests/support/ray_cluster.py) and on a local runtime the command starts itself (issue 31).

The same seed draws the same examples as each worker's search alone (and as the process pool that
ran them before), the first failure ends the other searches and is shrunk and named with its
repeatable search, the full checks are spread over the whole split search, a shared database is
replayed first, Ctrl-C stops every task keeping what was found, and a task whose process is killed
mid-run is retried, the run completing and saying so.
The stand-in runner (tests/support/ray_standins.py) judges inside the tasks; one slow test runs the real
kernels through the CLI.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid

import pytest

from diffmoe.cluster.runtime import ClusterSpec, parse_cluster, task_options
from diffmoe.frontends import cli
from diffmoe.fuzz.driver import fuzz
from diffmoe.fuzz.strategies import MINIMAL_FUSED_CONFIG
from diffmoe.fuzz.tiers import full_phase
from diffmoe.fuzz.workers import fuzz_in_workers, split_examples, worker_seed
from ray_cluster import kill_when_named, processes_left
from ray_standins import on_cluster, runtime_env  # noqa: F401 - on_cluster: the two-node cluster's fuzz, shared
from redis_server import RedisServer, unused_port
from signal_dispositions import sigint_as
from stand_in_runner import cli_runner, fake_runner  # noqa: F401 - the stand-in runner fixtures, shared
from hang_bounds import LONG_SUBPROCESS_S, LONG_TEST_S

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="Ray clusters and /proc: Linux")

LEGACY_MINIMAL = MINIMAL_FUSED_CONFIG.replace(planner="legacy")


def _logged(path) -> list[dict]:
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


@pytest.mark.parametrize("spec, parsed", [
    ("local", ClusterSpec("local")), ("auto", ClusterSpec("auto")),
    ("ray://head.internal:10001", ClusterSpec("address", "ray://head.internal:10001")),
    ("10.0.0.5:6379", ClusterSpec("address", "10.0.0.5:6379")),
])
def test_cluster_specs_parse(spec, parsed):
    assert parse_cluster(spec) == parsed


@pytest.mark.parametrize("spec, named", [("", "local, auto, ray://HOST:PORT"), ("remote", "local, auto"),
                                         ("ray://", "ray://HOST:PORT"), ("ray://host", "ray://HOST:PORT"),
                                         ("host:99999", r"port must be an integer in \[1, 65535\]"),
                                         ("http://host:1", "local, auto")])
def test_bad_cluster_specs_name_the_allowed_forms(spec, named):
    with pytest.raises(ValueError, match=named):
        parse_cluster(spec)


def test_a_task_asks_for_one_gpu_on_cuda_only():
    assert task_options("cuda:0") == {"num_gpus": 1, "num_cpus": 1}
    assert task_options("cpu") == task_options(None) == {"num_cpus": 1}


@pytest.mark.parametrize("spec", ["remote", "ray://host", "unreachable"])  # ids stay the same in every xdist worker
def test_cli_bad_or_unreachable_cluster_is_exit_2_in_one_line(cli_runner, capsys, spec):
    spec = f"127.0.0.1:{unused_port()}" if spec == "unreachable" else spec
    code = cli.main(["fuzz", "--workers", "2", "--cluster", spec, "--seed", "1", "--planner", "legacy", "--max-examples", "20"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len([line for line in err if "--cluster" in line]) == 1
    assert not any("Traceback" in line for line in err) and cli_runner.calls == []


def test_cli_one_worker_runs_in_process_without_ray(cli_runner, capsys):
    code = cli.main(["fuzz", "--workers", "1", "--cluster", "local", "--seed", "1", "--planner", "legacy", "--max-examples", "50"])
    assert code == 1 and LEGACY_MINIMAL.short() in capsys.readouterr().out
    assert cli_runner.calls  # judged here, by this process's stand-in
    assert "ray" not in sys.modules or not sys.modules["ray"].is_initialized()


def test_two_nodes_find_and_shrink_the_legacy_alias(on_cluster, tmp_path):
    log = tmp_path / "calls.jsonl"
    outcome = on_cluster({"STANDIN_LOG": str(log)}, workers=2, max_examples=200, seed=1, planner="legacy")
    assert outcome.report.config == LEGACY_MINIMAL and not outcome.interrupted
    note = next(n for n in outcome.notes if n.startswith("found by worker "))
    assert "--workers 1 --seed" in note  # the task's own search, repeatable alone
    assert _logged(log)  # judged in the tasks' processes (which ones depends on timing: a task that
    # finds the failure at once may end before Ray has started a worker on the second node)


def test_the_same_seed_draws_the_same_examples_as_each_search_alone(on_cluster, fake_runner, tmp_path):
    log = tmp_path / "calls.jsonl"
    outcome = on_cluster({"STANDIN_LOG": str(log), "STANDIN_FAILS": "never"}, workers=2, max_examples=12, seed=7)
    assert outcome.passed and outcome.generated_examples == 12
    on_ray = sorted(json.dumps(c["config"], sort_keys=True) for c in _logged(log))
    here = []
    for index, share in enumerate(split_examples(12, 2)):  # worker i's search, alone in this process
        fake = fake_runner(fails=lambda c: False)
        fuzz(max_examples=share, seed=worker_seed(7, index))
        here += [json.dumps(c.to_dict(), sort_keys=True) for c in fake.calls]
    assert on_ray == sorted(here)


def test_the_first_failure_ends_the_other_searches(on_cluster, tmp_path):
    """The search that did not fail stops generating soon after the other's first failure: fewer of
    its examples are judged than its share. Seed 110's worker 2 first draws a T >= 87 at its 147th
    judged example and worker 1 none in its 200 (found by running both searches alone; it was seed 7
    until the strategies drew the outlier channels, issue 42): without the stop, worker 1 would judge
    all 200. The two raced: beside a second full suite worker 1 once judged all 200 before worker 2
    reached its 147th. The gate (tests/support/ray_standins.py) holds each search after its 160th judged
    example until the other has failed, then gives it half a second an example for the stop to arrive."""
    log = tmp_path / "calls.jsonl"
    outcome = on_cluster({"STANDIN_LOG": str(log), "STANDIN_SLEEP": "0.02", "STANDIN_FAILS": "tokens>=87",
                          "STANDIN_GATE": str(tmp_path / "failed"), "STANDIN_GATE_AFTER": "160"},
                         workers=2, max_examples=400, seed=110)
    assert not outcome.passed and not outcome.interrupted and outcome.shrink_examples > 0
    # shrunk to T = 96, not 87: the strategies' draw of their cap (max_tokens, 96) is a simpler
    # example to Hypothesis than a T of 87..95, so it shrinks to the cap and stops there
    assert 87 <= outcome.report.config.num_tokens <= 96 and "found by worker 2 of 2" in " ".join(outcome.notes)
    by_pid: dict = {}
    for call in _logged(log):
        by_pid.setdefault(call["pid"], []).append(call["config"]["num_tokens"] >= 87)
    clean = [len(judged) for judged in by_pid.values() if not any(judged)]
    assert len(clean) == 1 and clean[0] < 200, clean


def test_the_worker_named_repeats_the_failure_alone(on_cluster, fake_runner):
    outcome = on_cluster({"STANDIN_FAILS": "tokens>=40"}, workers=3, max_examples=60, seed=11)
    note = next(n for n in outcome.notes if n.startswith("found by worker "))
    seed = int(note.split("(seed ")[1].split(",")[0])
    share = int(note.split(", ")[1].split(" examples")[0])
    fake_runner(fails=lambda c: c.num_tokens >= 40)
    alone = fuzz(max_examples=share, seed=seed)
    assert alone.report.config == outcome.report.config


@pytest.mark.parametrize("seed", [0, None])
def test_the_full_set_judges_one_in_full_every_of_the_whole_split_search(on_cluster, fake_runner, seed):
    """Two workers of 10 examples: 3 full checks, as one worker of 20 has (each worker starting
    its count at its own first example made 4); seeded workers keep their seed's phase, so the
    worker's own `--workers 1 --seed` search judges the same examples fully."""
    split = on_cluster({"STANDIN_FAILS": "never"}, workers=2, max_examples=20, seed=seed)
    assert split.passed and split.generated_examples == 20 and split.full_examples == 3
    if seed is not None:
        fake_runner(fails=lambda c: False)
        alone = fuzz(max_examples=10, seed=worker_seed(seed, 1))
        assert alone.full_examples == 1 and full_phase(worker_seed(seed, 1)) != full_phase(seed)


def test_tasks_share_a_database_folder(on_cluster, tmp_path):
    database = tmp_path / "db"  # both nodes of this machine see it
    first = on_cluster(workers=2, max_examples=200, seed=None, planner="legacy", database=str(database))
    assert first.report.config == LEGACY_MINIMAL and os.listdir(database)
    second = on_cluster(workers=2, max_examples=200, seed=None, planner="legacy", database=database)
    assert second.report.config == LEGACY_MINIMAL
    assert second.generated_examples <= 2  # each task's replay of the stored failure comes first


def test_cli_workers_on_the_cluster_find_and_shrink_with_a_runtime_env(ray_cluster, cli_runner, capsys, monkeypatch, tmp_path):
    """--workers 2 on a running cluster, the stand-in installed in its tasks through --runtime-env:
    the tasks judge (their log), not this process's stand-in."""
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    log = tmp_path / "calls.jsonl"
    code = cli.main(["fuzz", "--workers", "2", "--cluster", ray_cluster.address, "--seed", "1", "--planner", "legacy",
                     "--max-examples", "200", "--runtime-env", json.dumps(runtime_env(STANDIN_LOG=str(log)))])
    out = capsys.readouterr().out
    assert code == 1 and LEGACY_MINIMAL.short() in out and "found by worker" in out
    assert _logged(log) and cli_runner.calls == []


def test_tasks_on_two_nodes_share_a_redis_database(on_cluster):
    server = RedisServer()
    try:
        first = on_cluster(workers=2, max_examples=200, seed=None, planner="legacy", database=server.url())
        assert first.report.config == LEGACY_MINIMAL
        second = on_cluster(workers=2, max_examples=200, seed=None, planner="legacy", database=server.url())
        assert second.report.config == LEGACY_MINIMAL
        assert second.generated_examples <= 2  # each task's replay of the stored failure comes first
    finally:
        server.stop()


def test_a_clean_search_says_nothing_was_retried(on_cluster):
    outcome = on_cluster({"STANDIN_FAILS": "never"}, workers=2, max_examples=10, seed=3)
    assert outcome.passed and outcome.generated_examples == 10
    assert not any("retried" in n for n in outcome.notes)


@pytest.mark.parametrize("signum,disposition", [(signal.SIGINT, "terminal"), (signal.SIGTERM, "ignored")],
                         ids=["ctrl-c", "sigterm-with-sigint-ignored"])
def test_a_stop_ends_every_task_and_keeps_what_was_found(on_cluster, tmp_path, signum, disposition):
    log = tmp_path / "calls.jsonl"
    # 0.05 s an example: 1,000 examples would take each task 25 s, and the shrink of the first
    # failure (T >= 40) some 50 runs; the stop comes 0.3 s after that failure was judged, mid-shrink
    found = lambda: any(c["config"]["num_tokens"] >= 40 for c in _logged(log))  # noqa: E731
    stopper = threading.Thread(target=_signal_when, args=(found, signum))
    # SIGINT as a terminal's job has it (xdist's workers and background jobs start with it ignored);
    # SIGTERM as the CLI turns it into an interrupt
    with sigint_as(disposition), cli._sigterm_interrupts():
        stopper.start()
        outcome = on_cluster({"STANDIN_LOG": str(log), "STANDIN_SLEEP": "0.05", "STANDIN_FAILS": "tokens>=40"},
                             workers=2, max_examples=1_000, seed=11)
        stopper.join()
    assert outcome.interrupted  # stopped, not run to the end (pytest-timeout bounds a hang; no speed is claimed)
    assert outcome.report is not None and outcome.report.config.num_tokens >= 40  # what was found is kept


def _signal_when(ready, signum: int, limit: float = 120.0) -> None:
    deadline = time.monotonic() + limit
    while not ready() and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(0.3)
    os.kill(os.getpid(), signum)


def test_a_task_killed_mid_run_is_retried_and_the_run_completes(on_cluster, tmp_path):
    log = tmp_path / "calls.jsonl"
    # the first task's worker process, mid-search (after 4 examples were judged)
    killer, killed = kill_when_named(lambda: (lambda calls: calls[0]["pid"] if len(calls) >= 4 else None)(_logged(log)))
    outcome = on_cluster({"STANDIN_LOG": str(log), "STANDIN_SLEEP": "0.1", "STANDIN_FAILS": "never"},
                         workers=2, max_examples=40, seed=5)
    killer.join()
    assert killed, "no task was killed"
    assert outcome.passed and not outcome.interrupted and outcome.generated_examples == 40
    retried = [n for n in outcome.notes if "retried 1 time(s)" in n]
    assert len(retried) == 1 and f"pid {killed[0]}" in retried[0]
    pids = {c["pid"] for c in _logged(log)}
    assert killed[0] in pids and len(pids) >= 3  # the killed task ran again in a new process


@pytest.mark.slow
@pytest.mark.timeout(LONG_TEST_S)
def test_cli_local_cluster_finds_the_legacy_planner_with_the_real_kernels_and_leaves_no_process(tmp_path):
    mark = f"DIFFMOE_TEST_MARK={uuid.uuid4().hex}"
    env = dict(os.environ, **dict([mark.split("=", 1)]))
    done = subprocess.run(
        [sys.executable, "-m", "diffmoe", "fuzz", "--workers", "2", "--cluster", "local", "--seed", "1",
         "--planner", "legacy", "--max-examples", "10", "--max-tokens", "8", "--max-experts", "4",
         "--oracles", "static-aliasing", "--isolation", "none", "--plan-examples", "0"],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=LONG_SUBPROCESS_S)
    assert done.returncode == 1, done.stderr[-2000:]
    assert LEGACY_MINIMAL.short() in done.stdout and "found by worker" in done.stdout
    assert processes_left(mark) == []  # the local runtime stopped with the command


def test_a_run_leaves_the_process_signal_handlers_as_it_found_them(ray_cluster, monkeypatch):
    """ray.init puts its own SIGTERM handler (sys.exit(15)) in the driver and ray.shutdown leaves it:
    in a full suite a later SIGTERM ended an unrelated check as SystemExit(15). connected() restores."""
    from diffmoe.cluster.runtime import connected

    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")  # as the test cluster was started

    def mine(signum, frame):  # pragma: no cover - never delivered
        pass

    previous = signal.signal(signal.SIGTERM, mine)
    try:
        with connected(parse_cluster(ray_cluster.address), workers=1):
            during = signal.getsignal(signal.SIGTERM)
        assert during is not mine  # Ray's own, while connected
        assert signal.getsignal(signal.SIGTERM) is mine
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_a_cluster_that_does_not_come_up_is_started_again_with_new_ports():
    """Two suites side by side may take each other's freshly chosen ports (tests/support/ray_cluster.py
    START_ATTEMPTS): a failed start is tried again, and only a cluster that never comes up fails."""
    from ray_cluster import ClusterStartFailed, start_cluster

    tries = []

    def start():
        tries.append(len(tries))
        if len(tries) < 3:
            raise ClusterStartFailed(f"the Ray cluster at 127.0.0.1:{6000 + len(tries)} did not bring up 1 node(s)")
        return "the cluster"

    assert start_cluster(attempts=3, start=start) == "the cluster" and len(tries) == 3
    tries.clear()
    with pytest.raises(pytest.fail.Exception, match=r"no Ray cluster came up in 2 starts: .*:6001.*; .*:6002"):
        start_cluster(attempts=2, start=start)
