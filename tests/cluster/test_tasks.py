"""The task layer (diffmoe/cluster/tasks.py): tasks run in this process with one worker and as Ray tasks
on a real two-node cluster of this machine (tests/conftest.py's ray_cluster) with more; results come
back in completion order, a task whose process is killed is retried and named, a task that raises is
TaskFailed naming it, and Ctrl-C (or SIGTERM) cancels every task and keeps what finished.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

import pytest

from diffmoe.cluster.tasks import Task, TaskFailed, run_tasks
from diffmoe.frontends import cli
from ray_cluster import kill_when_named
from signal_dispositions import sigint_as
from task_standins import (interrupted_here, logged, planted_failure, reporting, reports_for, runtime_env, square,
                           until_stopped)

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="Ray clusters and /proc: Linux")


def _squares(values, **extra) -> list[Task]:
    return [Task(square, {"value": v, "name": f"t{v}", **extra}, name=f"t{v}") for v in values]


def test_in_process_every_task_runs_in_order_and_each_result_is_streamed():
    seen = []
    run = run_tasks(_squares([1, 2, 3]), workers=1, on_result=lambda i, v: seen.append((i, v)))
    assert seen == [(0, 1), (1, 4), (2, 9)] and run.results == {0: 1, 1: 4, 2: 9}
    assert not run.interrupted and run.notes == []


def test_in_process_a_raising_task_is_task_failed_naming_it_after_the_ones_before():
    seen = []
    tasks = _squares([2]) + [Task(planted_failure, {"name": "boom"}, name="boom")] + _squares([3])
    with pytest.raises(TaskFailed, match=r"task 2 of 3 \(boom\) failed: ValueError: planted failure in boom"):
        run_tasks(tasks, on_result=lambda i, v: seen.append(i))
    assert seen == [0]


def test_in_process_ctrl_c_stops_the_run_and_keeps_what_finished():
    tasks = _squares([2]) + [Task(interrupted_here)] + _squares([3])
    run = run_tasks(tasks)
    assert run.interrupted and run.results == {0: 4}  # the third never ran


def test_in_process_a_task_reports_on_a_board_of_its_own_and_outside_a_task_nothing_is_posted():
    from diffmoe.cluster.tasks import task_report

    assert task_report("outside") == {}
    run = run_tasks([Task(reporting, {"value": 3})])
    assert run.results == {0: {}}  # posted, and no stop was


def test_one_worker_on_a_cluster_runs_in_process_without_ray():
    assert run_tasks(_squares([4]), workers=1, cluster="local").results == {0: 16}
    assert "ray" not in sys.modules or not sys.modules["ray"].is_initialized()


@pytest.mark.parametrize("kwargs, error, says", [
    ({"workers": 0}, ValueError, r"workers must be in \[1, 256\], got 0"),
    ({"workers": 2.0}, TypeError, r"workers must be an int in \[1, 256\]"),
    ({"cluster": "remote"}, ValueError, r"--cluster remote: expected local, auto"),
    ({"cluster": 5}, TypeError, r"cluster must be a string"),
    ({"on_result": "print"}, TypeError, r"on_result must be a callable"),
    ({"on_poll": 3}, TypeError, r"on_poll must be a callable"),
    ({"stop_grace": -1}, ValueError, r"stop_grace must be a number of seconds in \[0, 600\]"),
    ({"stop_grace": True}, ValueError, r"stop_grace must be a number of seconds"),
])
def test_bad_arguments_are_named_before_any_task_runs(kwargs, error, says, tmp_path):
    log = tmp_path / "log.jsonl"
    with pytest.raises(error, match=says):
        run_tasks(_squares([1], log=str(log)), **kwargs)
    assert not log.exists()


def test_a_task_that_is_not_a_task_is_a_type_error():
    with pytest.raises(TypeError, match=r"tasks\[1\] must be a Task"):
        run_tasks([Task(square, {"value": 1}), (square, 1)])


@pytest.fixture
def on_cluster(ray_cluster, monkeypatch):
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")  # as the test cluster was started

    def run(tasks, **kwargs):
        return run_tasks(tasks, workers=kwargs.pop("workers", 2), cluster=ray_cluster.address,
                         runtime_env=runtime_env(), **kwargs)

    return run


def test_results_stream_back_in_completion_order_and_nothing_is_retried(on_cluster, tmp_path):
    release = tmp_path / "release"
    tasks = _squares([2, 3, 4])
    tasks[0] = Task(square, {"value": 2, "name": "held", "wait_for": str(release)}, name="held")
    seen = []

    def on_result(index, value):
        seen.append((index, value))
        if index == 1:
            release.touch()  # the first task ends only after the second one's result is here

    run = on_cluster(tasks, on_result=on_result)
    assert seen[0] == (1, 9) and sorted(seen) == [(0, 4), (1, 9), (2, 16)]
    assert run.results == {0: 4, 1: 9, 2: 16} and not run.interrupted and run.notes == []


def test_a_task_whose_process_is_killed_is_retried_and_named(on_cluster, tmp_path):
    log, release = tmp_path / "log.jsonl", tmp_path / "release"
    tasks = [Task(square, {"value": 5, "name": "victim", "log": str(log), "wait_for": str(release),
                           "first_attempt_waits": True}, name="victim")] + _squares([6])
    # the first attempt's worker process, mid-task
    killer, killed = kill_when_named(lambda: next((c["pid"] for c in logged(log) if c["name"] == "victim"), None))
    run = on_cluster(tasks)
    killer.join()
    assert killed and run.results == {0: 25, 1: 36} and not run.interrupted
    assert len(run.notes) == 1 and "task 1 of 2 (victim) was retried 1 time(s)" in run.notes[0]
    assert f"pid {killed[0]}" in run.notes[0]
    assert [c["pid"] for c in logged(log)][-1] != killed[0]  # the retry ran in another process


def test_a_raising_task_is_task_failed_naming_it_with_its_traceback(on_cluster):
    tasks = _squares([2]) + [Task(planted_failure, {"name": "boom"}, name="boom")]
    with pytest.raises(TaskFailed, match=r"task 2 of 2 \(boom\) failed: ValueError: planted failure in boom") as caught:
        on_cluster(tasks)
    assert "Traceback" in str(caught.value) and "task_standins.py" in str(caught.value)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as st:
            return st.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.parametrize("signum,disposition", [(signal.SIGINT, "terminal"), (signal.SIGTERM, "ignored")],
                         ids=["ctrl-c", "sigterm-with-sigint-ignored"])
def test_a_stop_cancels_every_task_and_keeps_what_finished(on_cluster, tmp_path, signum, disposition):
    log, never = tmp_path / "log.jsonl", tmp_path / "never"
    tasks = _squares([7]) + [Task(square, {"value": v, "name": f"held{v}", "log": str(log), "wait_for": str(never)},
                                  name=f"held{v}") for v in (8, 9)]

    def stop_once_both_are_held(index, value) -> None:
        def stop() -> None:
            deadline = time.monotonic() + 120
            while len(logged(log)) < 2 and time.monotonic() < deadline:
                time.sleep(0.05)
            os.kill(os.getpid(), signum)

        threading.Thread(target=stop).start()

    with sigint_as(disposition), cli._sigterm_interrupts():
        run = on_cluster(tasks, on_result=stop_once_both_are_held)
    assert run.interrupted and run.results == {0: 49}
    held = [c["pid"] for c in logged(log)]
    deadline = time.monotonic() + 30
    while any(_alive(pid) for pid in held) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(pid) for pid in held)  # cancelled: their processes were killed


def test_on_poll_reads_the_tasks_progress_and_a_stop_it_posts_reaches_them(on_cluster):
    seen: set = set()

    def poll(board) -> None:
        seen.update(payload[1] for payload in board.snapshot()["progress"].values())
        if seen == {"a", "b"}:
            board.stop("halt")

    run = on_cluster([Task(until_stopped, {"name": n}, name=n) for n in ("a", "b")], on_poll=poll)
    assert run.results == {0: "halt", 1: "halt"} and not run.interrupted


@pytest.mark.parametrize("grace", [30.0, 0.0], ids=["grace", "none"])
def test_a_stop_with_a_grace_lets_the_tasks_end_by_themselves(on_cluster, grace):
    """With stop_grace the user's stop is posted as `interrupt` and the tasks' own ends are kept;
    without, they are cancelled and nothing of theirs comes back."""
    def stop_once_both_report(board) -> None:
        if len(board.snapshot()["progress"]) == 2 and not stopped:
            stopped.append(True)
            os.kill(os.getpid(), signal.SIGINT)

    stopped: list = []
    with sigint_as("terminal"):
        run = on_cluster([Task(until_stopped, {"name": n}, name=n) for n in ("a", "b")], on_poll=stop_once_both_report,
                         stop_grace=grace)
    assert run.interrupted
    assert run.results == ({0: "interrupt", 1: "interrupt"} if grace else {})


def test_tasks_that_report_never_run_more_at_once_than_the_nodes_have_cpus(on_cluster):
    """Three busy tasks of 5 s reporting every 10 ms on the two one-CPU nodes: at most two run at a time.
    A report that waited for its answer (ray.get, ray.wait) gave the task's CPU back to the node and
    a third task started beside it (diffmoe/cluster/tasks.py, _Posted)."""
    run = on_cluster([Task(reports_for, {"seconds": 5.0}) for _ in range(3)], workers=3)
    spans = sorted(run.results.values())
    most = max(sum(start <= moment < end for start, end in spans) for moment, _ in spans)
    assert len(spans) == 3 and most == 2, spans


def test_a_commands_cluster_is_checked_before_its_run():
    from diffmoe.cluster.runtime import ClusterSpec
    from diffmoe.cluster.tasks import checked_cluster
    from redis_server import unused_port

    assert checked_cluster("auto", 1) is None  # in process: nothing to reach
    assert checked_cluster(None, 2) == ClusterSpec("local")
    port = unused_port()
    with pytest.raises(ValueError, match=rf"--cluster 127.0.0.1:{port}: nothing answers at 127.0.0.1:{port}"):
        checked_cluster(f"127.0.0.1:{port}", 2)
    with pytest.raises(ValueError, match=r"--workers must be in \[1, 256\], got 0"):
        checked_cluster(None, 0)
