"""Independent tasks, run in this process or as Ray tasks: the execution layer of long runs (issue 31).

A task is a function, its one argument and a name for messages (`Task`). On Ray both the function
and the argument travel to another process: a module-level function and plain data.
`run_tasks(tasks, workers=N, cluster=...)`:

* workers 1: the tasks run here, one after another, in their order; Ray is not imported.
* workers > 1: Ray tasks on `cluster` (diffmoe/cluster/runtime.py; none given: `local`, a Ray
  runtime started here with N CPUs and stopped at the end), at most N at a time, each asking for one
  GPU on CUDA (`device`), one CPU otherwise.
* Results stream back: `on_result(index, value)` is called in this process as each task finishes,
  in completion order (the caller's progress, its resume file); `TaskRun.results` holds every
  finished task's value by its index in `tasks`.
* A task whose process or node is lost is run again by Ray, up to MAX_TASK_RETRIES times; every
  attempt is written on the run's board (diffmoe/cluster/board.py) and `TaskRun.notes` names each
  task retried and the processes lost. A task lost more often, or whose function raises, is
  TaskFailed naming the task (the CLI's exit 3), raised after every unfinished task is cancelled;
  the results that came before it were already given to on_result.
* Ctrl-C and SIGTERM stop every task at once and keep what finished: on Ray the signal is noted
  between two waits (diffmoe/cluster/interrupts.py) and every unfinished task is cancelled, its
  process killed (a task here is one check: a rerun judges it again whole); in process, a
  KeyboardInterrupt out of a task ends the run. `TaskRun.interrupted` says so. A KeyboardInterrupt
  raised by on_result (a progress printer cut short) is the same stop.

Owns running tasks and streaming their results. Must not know what a task does.
"""

from __future__ import annotations

import os
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from diffmoe.cluster.board import start_board
from diffmoe.cluster.interrupts import interrupts_noted
from diffmoe.cluster.runtime import MAX_TASK_RETRIES, ClusterSpec, check_cluster, connected, parse_cluster, task_options
from diffmoe.problem.config import check_int

MAX_WORKERS = 256
_POLL_SECONDS = 0.2  # how often a wait returns to hear a noted signal

ResultCallback = Callable[[int, Any], None]


@dataclass(frozen=True)
class Task:
    function: Callable[[Any], Any]
    argument: Any = None
    name: str = ""


@dataclass
class TaskRun:
    results: dict[int, Any] = field(default_factory=dict)  # index in the task list -> the function's value
    interrupted: bool = False
    notes: list[str] = field(default_factory=list)  # the tasks retried after a lost process or node


class TaskFailed(RuntimeError):
    """A task's function raised, or its process or node was lost more than MAX_TASK_RETRIES times:
    a harness failure, never a verdict."""


def run_tasks(tasks: Sequence[Task], *, workers: int = 1, cluster: str | ClusterSpec | None = None,
              device: str | None = None, on_result: ResultCallback | None = None,
              runtime_env: dict | None = None) -> TaskRun:
    """Run `tasks` (the module doc); a ValueError or TypeError naming the argument before any task runs.

    cluster: "local", "auto", "ray://HOST:PORT" or "HOST:PORT"; None is `local` when workers > 1.
    device: the checks' device (a task asks Ray for one GPU when it is CUDA).
    runtime_env: Ray's runtime environment for the tasks (what their code needs on the nodes).
    """
    tasks = list(tasks)
    for i, task in enumerate(tasks):
        if not isinstance(task, Task) or not callable(task.function):
            raise TypeError(f"tasks[{i}] must be a Task with a callable function, got {task!r}")
    check_int("workers", workers, 1, MAX_WORKERS)
    if on_result is not None and not callable(on_result):
        raise TypeError(f"on_result must be a callable or None, got {on_result!r}")
    spec = parse_cluster(cluster) if isinstance(cluster, str) else cluster
    if spec is not None and not isinstance(spec, ClusterSpec):
        raise TypeError(f"cluster must be a string or None, got {cluster!r}")
    if workers == 1 or not tasks:
        return _in_process(tasks, on_result)
    return _on_ray(tasks, spec or ClusterSpec("local"), workers, device, on_result, runtime_env)


def checked_cluster(cluster: str | ClusterSpec | None, workers: int) -> ClusterSpec | None:
    """The cluster `run_tasks(workers=workers, cluster=cluster)` will use, checked now (Ray importable, an
    address answering: runtime.check_cluster), or None where it runs in process; a ValueError or TypeError
    in one line naming --workers or --cluster. Commands call it before their progress starts."""
    check_int("--workers", workers, 1, MAX_WORKERS)
    spec = parse_cluster(cluster) if isinstance(cluster, str) else cluster
    if spec is not None and not isinstance(spec, ClusterSpec):
        raise TypeError(f"cluster must be a string or None, got {cluster!r}")
    if workers == 1:
        return None
    spec = spec or ClusterSpec("local")
    check_cluster(spec)
    return spec


def _name(tasks: Sequence[Task], index: int) -> str:
    return f"task {index + 1} of {len(tasks)}" + (f" ({tasks[index].name})" if tasks[index].name else "")


def _in_process(tasks: list[Task], on_result: ResultCallback | None) -> TaskRun:
    run = TaskRun()
    for index, task in enumerate(tasks):
        try:
            try:
                value = task.function(task.argument)
            except KeyboardInterrupt:
                raise
            except Exception as exc:  # noqa: BLE001 - named as the task's failure, the cause chained
                raise TaskFailed(f"{_name(tasks, index)} failed: {type(exc).__name__}: {exc}") from exc
            run.results[index] = value
            if on_result is not None:
                on_result(index, value)
        except KeyboardInterrupt:
            run.interrupted = True
            break
    return run


def _attempt(board, index: int, function: Callable[[Any], Any], argument: Any) -> tuple:  # pragma: no cover - a Ray worker
    """One task's attempt: ("value", the function's value) or ("error", what it raised, its traceback)."""
    import ray

    ray.get(board.started.remote(index, os.getpid(), ray.get_runtime_context().get_node_id()))
    try:
        return ("value", function(argument))
    except Exception as exc:  # noqa: BLE001 - everything goes back to the starting process
        return ("error", f"{type(exc).__name__}: {exc}", traceback.format_exc())


def _on_ray(tasks: list[Task], spec: ClusterSpec, workers: int, device: str | None, on_result: ResultCallback | None,
            runtime_env: dict | None) -> TaskRun:
    run = TaskRun()
    with connected(spec, workers=min(workers, len(tasks)), runtime_env=runtime_env) as ray:
        board = start_board(ray)
        remote = ray.remote(max_retries=MAX_TASK_RETRIES, retry_exceptions=False, **task_options(device))(_attempt)
        waiting = list(range(len(tasks)))[::-1]  # popped from the end: submitted in order
        pending: dict = {}
        try:
            with interrupts_noted() as noted:
                while waiting or pending:
                    while waiting and len(pending) < workers:  # at most `workers` at a time, on any cluster
                        index = waiting.pop()
                        pending[remote.remote(board, index, tasks[index].function, tasks[index].argument)] = index
                    if noted:
                        raise KeyboardInterrupt
                    ready, _ = ray.wait(list(pending), num_returns=1, timeout=_POLL_SECONDS)
                    for ref in ready:
                        index = pending.pop(ref)
                        value = _value(ray, ref, tasks, index)
                        run.results[index] = value
                        if on_result is not None:
                            on_result(index, value)
        except KeyboardInterrupt:
            run.interrupted = True
        finally:
            for ref in pending:  # interrupted or failed: nothing unfinished goes on running
                ray.cancel(ref, force=True)
        try:
            run.notes = retry_notes(ray.get(board.snapshot.remote(), timeout=10)["starts"], tasks)
        except Exception:  # noqa: BLE001 - the notes are a courtesy; the results stand
            pass
    return run


def _value(ray, ref, tasks: list[Task], index: int) -> Any:
    try:
        result = ray.get(ref)
    except ray.exceptions.RayError as exc:  # lost more often than MAX_TASK_RETRIES
        detail = " ".join(str(exc).split())[:300]
        raise TaskFailed(f"{_name(tasks, index)} failed after {MAX_TASK_RETRIES} retries ({type(exc).__name__}: "
                         f"{detail})") from None
    if result[0] == "error":
        raise TaskFailed(f"{_name(tasks, index)} failed: {result[1]}\n{result[2]}")
    return result[1]


def retry_notes(starts: dict[int, list[tuple[int, str]]], tasks: Sequence[Task] | int) -> list[str]:
    """One line per task started more than once (the board's `starts`): the processes and nodes lost."""
    named = (lambda i: f"task {i + 1} of {tasks}") if isinstance(tasks, int) else (lambda i: _name(tasks, i))
    notes = []
    for index in sorted(starts):
        attempts = starts[index]
        if len(attempts) > 1:
            lost = ", ".join(f"pid {pid} on node {node[:8]}" for pid, node in attempts[:-1])
            notes.append(f"{named(index)} was retried {len(attempts) - 1} time(s) after its process or node was lost ({lost})")
    return notes
