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
  raised by on_result or on_poll (a progress printer cut short) is the same stop.
* Tasks that stop by themselves (the fuzz's searches, which keep what they found): with
  `stop_grace` S > 0 a stop is first posted on the board as `interrupt` (`task_report` returns it to
  the task), the results that come within S seconds are kept, and only then is the rest cancelled;
  a second stop cancels at once.
* A task reports while it runs: `task_report(payload)` posts its progress on the board and returns
  the stops posted so far (`interrupt`, and any the caller posts through `on_poll`'s board, such as
  the fuzz's `stop_generating`). `on_poll(view)` is called in this process after every wait on Ray
  (at most every _POLL_SECONDS): `view.snapshot()` reads the board, `view.stop(name)` posts a stop.
  In process the board is a plain object: task_report works the same and on_poll is not called.

Owns running tasks and streaming their results. Must not know what a task does.
"""

from __future__ import annotations

import os
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from diffmoe.cluster.board import Board, start_board
from diffmoe.cluster.interrupts import interrupts_noted
from diffmoe.cluster.runtime import MAX_TASK_RETRIES, ClusterSpec, check_cluster, connected, parse_cluster, task_options
from diffmoe.problem.config import check_int

MAX_WORKERS = 256
MAX_STOP_GRACE = 600.0  # a stop that waits longer is no stop
_POLL_SECONDS = 0.2  # how often a wait returns to hear a noted signal
_BOARD_SECONDS = 120.0  # a task's first call on the board: an actor on a live cluster answers in milliseconds
INTERRUPT = "interrupt"  # the stop posted on the board at the user's Ctrl-C or SIGTERM (stop_grace > 0)

ResultCallback = Callable[[int, Any], None]
PollCallback = Callable[["BoardView"], None]


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


class BoardView:
    """The run's board as `on_poll` sees it, in the process that started the run."""

    def __init__(self, ray, board) -> None:
        self._ray, self._board = ray, board

    def snapshot(self) -> dict:
        """{"starts": {index: [(pid, node)]}, "progress": {index: payload}, "stops": {name: True}}."""
        return self._ray.get(self._board.snapshot.remote())

    def stop(self, name: str) -> None:
        """Post the stop `name`: every task's next `task_report` returns it."""
        self._board.stop.remote(name)


# The board of the task running in this process, and its index: set by the layer around each task.
_CURRENT: list = [None]


def task_report(payload: Any) -> dict[str, bool]:
    """Inside a task of `run_tasks`: post `payload` as its progress and return the stops posted
    (module doc). Outside one: nothing is posted and no stop is returned."""
    current = _CURRENT[0]
    if current is None:
        return {}
    report, index = current
    return report(index, payload)


def run_tasks(tasks: Sequence[Task], *, workers: int = 1, cluster: str | ClusterSpec | None = None,
              device: str | None = None, on_result: ResultCallback | None = None,
              runtime_env: dict | None = None, on_poll: PollCallback | None = None,
              stop_grace: float = 0.0) -> TaskRun:
    """Run `tasks` (the module doc); a ValueError or TypeError naming the argument before any task runs.

    cluster: "local", "auto", "ray://HOST:PORT" or "HOST:PORT"; None is `local` when workers > 1.
    device: the checks' device (a task asks Ray for one GPU when it is CUDA).
    runtime_env: Ray's runtime environment for the tasks (what their code needs on the nodes).
    on_poll: called with a BoardView after every wait on Ray (progress read, stops posted).
    stop_grace: seconds a stopped run waits for tasks that end by themselves (0: cancel at once).
    """
    tasks = list(tasks)
    for i, task in enumerate(tasks):
        if not isinstance(task, Task) or not callable(task.function):
            raise TypeError(f"tasks[{i}] must be a Task with a callable function, got {task!r}")
    check_int("workers", workers, 1, MAX_WORKERS)
    for name, callback in (("on_result", on_result), ("on_poll", on_poll)):
        if callback is not None and not callable(callback):
            raise TypeError(f"{name} must be a callable or None, got {callback!r}")
    if isinstance(stop_grace, bool) or not isinstance(stop_grace, (int, float)) or not 0 <= stop_grace <= MAX_STOP_GRACE:
        raise ValueError(f"stop_grace must be a number of seconds in [0, {MAX_STOP_GRACE:g}], got {stop_grace!r}")
    spec = parse_cluster(cluster) if isinstance(cluster, str) else cluster
    if spec is not None and not isinstance(spec, ClusterSpec):
        raise TypeError(f"cluster must be a string or None, got {cluster!r}")
    if workers == 1 or not tasks:
        return _in_process(tasks, on_result)
    return _on_ray(tasks, spec or ClusterSpec("local"), workers, device, on_result, runtime_env, on_poll,
                   float(stop_grace))


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
    board = Board()
    for index, task in enumerate(tasks):
        try:
            try:
                value = _with_board(board.report, index, task.function, task.argument)
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


def _with_board(report: Callable[[int, Any], dict], index: int, function: Callable[[Any], Any], argument: Any) -> Any:
    """function(argument) with `task_report` posting to `report` as task `index`."""
    previous, _CURRENT[0] = _CURRENT[0], (report, index)
    try:
        return function(argument)
    finally:
        _CURRENT[0] = previous


class _Posted:  # pragma: no cover - runs in a Ray worker
    """`task_report` in a Ray task, never waiting: a task blocked in ray.get, or even in ray.wait with
    no timeout, gives its CPU back to the node, whose scheduler then starts another task in its place
    (measured 2026-12-05 on a one-CPU node: two tasks reporting every 10 ms through either ran at once
    as soon as the second's process was up; posting alone, they ran one after the other). So a report
    is posted and the stops are read from the answers already back, through each answer's future
    (filled by Ray's callback, read without asking Ray); stops are only ever added, so the newest
    answer holds every older one's, and a stop reaches the task a report or two later."""

    def __init__(self, board) -> None:
        self.board = board
        self.waiting: list = []  # futures of the answers not yet back
        self.stops: dict[str, bool] = {}

    def __call__(self, index: int, payload: Any) -> dict[str, bool]:
        self.waiting.append(self.board.report.remote(index, payload).future())
        still = []
        for answer in self.waiting:
            if answer.done():
                self.stops.update(answer.result())
            else:
                still.append(answer)
        self.waiting = still
        return dict(self.stops)


def _attempt(board, index: int, function: Callable[[Any], Any], argument: Any) -> tuple:  # pragma: no cover - a Ray worker
    """One task's attempt: ("value", the function's value) or ("error", what it raised, its traceback)."""
    import ray

    # on the board before the function runs (a process lost mid-task must be seen as an attempt): waited
    # for through its future, which keeps the task's CPU (ray.get would give it back: _Posted)
    board.started.remote(index, os.getpid(), ray.get_runtime_context().get_node_id()).future().result(timeout=_BOARD_SECONDS)
    try:
        return ("value", _with_board(_Posted(board), index, function, argument))
    except Exception as exc:  # noqa: BLE001 - everything goes back to the starting process
        return ("error", f"{type(exc).__name__}: {exc}", traceback.format_exc())


def _on_ray(tasks: list[Task], spec: ClusterSpec, workers: int, device: str | None, on_result: ResultCallback | None,
            runtime_env: dict | None, on_poll: PollCallback | None, stop_grace: float) -> TaskRun:
    run = TaskRun()
    with connected(spec, workers=min(workers, len(tasks)), runtime_env=runtime_env) as ray:
        board = start_board(ray)
        view = BoardView(ray, board)
        remote = ray.remote(max_retries=MAX_TASK_RETRIES, retry_exceptions=False, **task_options(device))(_attempt)
        waiting = list(range(len(tasks)))[::-1]  # popped from the end: submitted in order
        pending: dict = {}
        deadline: float | None = None  # after a stop with a grace: when the tasks still running are cancelled
        try:
            with interrupts_noted() as noted:
                heard = 0  # signals in `noted` acted on
                while pending or (waiting and deadline is None):
                    try:
                        while waiting and deadline is None and len(pending) < workers:  # at most `workers` at a time
                            index = waiting.pop()
                            pending[remote.remote(board, index, tasks[index].function, tasks[index].argument)] = index
                        if len(noted) > heard:
                            heard += 1
                            raise KeyboardInterrupt
                        if deadline is not None and time.perf_counter() > deadline:
                            break
                        ready, _ = ray.wait(list(pending), num_returns=1, timeout=_POLL_SECONDS)
                        for ref in ready:
                            index = pending.pop(ref)
                            value = _value(ray, ref, tasks, index)
                            run.results[index] = value
                            if on_result is not None:
                                on_result(index, value)
                        if on_poll is not None and pending:
                            on_poll(view)
                    except KeyboardInterrupt:
                        if run.interrupted or stop_grace <= 0:  # no grace, or the second stop: cancel now
                            run.interrupted = True
                            break
                        run.interrupted, deadline = True, time.perf_counter() + stop_grace
                        view.stop(INTERRUPT)  # the tasks end by themselves, keeping what they found
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
    except ray.exceptions.TaskCancelledError:  # this run cancels only after its last read: someone else did
        raise TaskFailed(f"{_name(tasks, index)} was cancelled outside this run") from None
    except ray.exceptions.RayError as exc:  # lost more often than MAX_TASK_RETRIES
        detail = " ".join(str(exc).split())[:300]
        raise TaskFailed(f"{_name(tasks, index)} failed after {MAX_TASK_RETRIES} retries ({type(exc).__name__}: "
                         f"{detail})") from None
    if result[0] == "error":
        raise TaskFailed(f"{_name(tasks, index)} failed: {result[1]}\n{result[2]}")
    return result[1]


def retry_notes(starts: dict[int, list[tuple[int, str]]], tasks: Sequence[Task]) -> list[str]:
    """One line per task started more than once (the board's `starts`): the processes and nodes lost."""
    notes = []
    for index in sorted(starts):
        attempts = starts[index]
        if len(attempts) > 1:
            lost = ", ".join(f"pid {pid} on node {node[:8]}" for pid, node in attempts[:-1])
            notes.append(f"{_name(tasks, index)} was retried {len(attempts) - 1} time(s) after its process or node was lost ({lost})")
    return notes
