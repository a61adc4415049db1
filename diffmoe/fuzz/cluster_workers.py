"""`diffmoe fuzz --workers N --cluster local|auto|ray://HOST:PORT`: the execution tier's searches as
Ray tasks (issue 31), on a local Ray runtime or across a cluster's nodes.

The searches are diffmoe/fuzz/workers.py's, run as Ray tasks instead of forked processes, with
what that pool guarantees kept:

* The split and the seeds are the pool's (`split_examples`, `worker_seed`): task i searches
  exactly what worker i of `fuzz_in_workers` searches, so the same seed draws the same examples,
  and the failure found names the task, its seed and its share, repeatable with `--workers 1`.
  One worker (or one example) runs in this process, with no Ray at all.
* The first failure ends the search: this process reads every task's progress on the run's board
  (diffmoe/cluster/board.py) and, at the first failure, posts `stop_generating`; tasks still
  generating end at their next example, the one shrinking finishes. The failure reported is
  chosen and the counts summed as the pool does (`_merge`).
* Ctrl-C and SIGTERM (noted between Ray calls, never raised inside one, as the pool does) post
  `interrupt`: every task ends at its next example keeping what it found; after STOP_GRACE_SECONDS
  the tasks still running are cancelled (their processes killed). The outcome is interrupted and
  carries the smallest failure any task reported.
* A task whose process or node is lost is run again by Ray (up to MAX_TASK_RETRIES times) from
  its own seed; every failure met before the loss is in the example database, which the new
  attempt replays first, and a seeded search draws the same examples again. The board counts
  each task's attempts and the outcome's notes name every task retried. A task lost more often
  than that, or whose search raises, is WorkerFailed (the CLI's exit 3), never a pass.
* A hung check is ended by the check's own time limit (`time_limit`), as anywhere else.

The example database must be one every node reaches: on several machines, `redis://HOST:PORT/N`
(diffmoe/fuzz/database_spec.py); a folder only where the nodes share it.

Owns running the fuzz searches as Ray tasks and merging them. Must not judge or shrink: each
task's search is diffmoe.fuzz.driver's; connecting to Ray is diffmoe/cluster/runtime.py's.
"""

from __future__ import annotations

import os
import pickle
import time
import traceback
from typing import Any

from diffmoe.cluster.board import start_board
from diffmoe.cluster.interrupts import interrupts_noted
from diffmoe.cluster.runtime import MAX_TASK_RETRIES, ClusterSpec, connected, parse_cluster, task_options
from diffmoe.cluster.tasks import MAX_WORKERS, retry_notes
from diffmoe.fuzz.driver import MAX_EXAMPLES_LIMIT, PHASE_SHRINK, FuzzOutcome, ProgressCallback, fuzz
from diffmoe.fuzz.tiers import FULL_EVERY, worker_full_phase
from diffmoe.fuzz.workers import STOP_GRACE_SECONDS, WorkerFailed, _merge, _Worker, split_examples, worker_seed
from diffmoe.problem.config import check_int

_POLL_SECONDS = 0.2  # how often the board is read: progress lines are not needed faster


def _search(board, index: int, kwargs: dict) -> tuple:  # pragma: no cover - runs in a Ray worker
    """One task: fuzz(**kwargs), stopping when the board says so; ("outcome", bytes) or ("error", ...)."""
    import ray

    ray.get(board.started.remote(index, os.getpid(), ray.get_runtime_context().get_node_id()))

    def progress(examples: int, phase: str, elapsed: float, label: str) -> None:
        stops = ray.get(board.report.remote(index, (examples, phase, label)))
        if stops["interrupt"] or (phase != PHASE_SHRINK and stops["stop_generating"]):
            raise KeyboardInterrupt  # from inside the property, where fuzz() expects an interrupt

    try:
        return ("outcome", pickle.dumps(fuzz(progress=progress, **kwargs)))
    except KeyboardInterrupt:  # stopped before fuzz() could catch it
        return ("outcome", pickle.dumps(FuzzOutcome(interrupted=True, seed=kwargs.get("seed"))))
    except Exception as exc:  # noqa: BLE001 - everything goes back to the starting process
        return ("error", f"{type(exc).__name__}: {exc}", traceback.format_exc())


def fuzz_on_cluster(*, cluster: str | ClusterSpec, workers: int, max_examples: int, seed: int | None,
                    progress: ProgressCallback | None = None, runtime_env: dict | None = None,
                    **fuzz_kwargs: Any) -> FuzzOutcome:
    """`fuzz_in_workers` with the workers as Ray tasks on `cluster` (the module doc).

    cluster: "local", "auto", "ray://HOST:PORT" or "HOST:PORT" (diffmoe/cluster/runtime.py).
    runtime_env: Ray's runtime environment for the tasks (what an implementation needs on the
    nodes). fuzz_kwargs are fuzz()'s; database must be None, a folder or a redis:// URL.
    """
    spec = parse_cluster(cluster) if not isinstance(cluster, ClusterSpec) else cluster
    check_int("workers", workers, 1, MAX_WORKERS)
    if workers > 1 and fuzz_kwargs.get("keep_going", 1) != 1:
        raise ValueError(f"keep_going={fuzz_kwargs['keep_going']} needs workers=1: the first failure stops the other workers")
    check_int("max_examples", max_examples, 1, MAX_EXAMPLES_LIMIT)
    if progress is not None and not callable(progress):
        raise TypeError(f"progress must be a callable or None, got {progress!r}")
    shares = split_examples(max_examples, workers)
    if len(shares) == 1:  # one worker runs in this process: no runtime to start
        return fuzz(max_examples=max_examples, seed=seed, progress=progress, **fuzz_kwargs)
    database = fuzz_kwargs.get("database")
    if database is not None and not isinstance(database, (str, os.PathLike)):
        raise TypeError(f"database must be None, a directory path or a redis:// URL on a cluster (each task opens it), got {database!r}")
    if database is not None:
        fuzz_kwargs["database"] = os.fspath(database)

    pool = [_Worker(i, None if seed is None else worker_seed(seed, i), share) for i, share in enumerate(shares)]
    with connected(spec, workers=len(pool), runtime_env=runtime_env) as ray:
        board = start_board(ray)
        task = ray.remote(max_retries=MAX_TASK_RETRIES, retry_exceptions=False,
                          **task_options(fuzz_kwargs.get("device")))(_search)
        start = time.perf_counter()
        refs = {}
        for w in pool:
            kwargs = dict(fuzz_kwargs, max_examples=w.share, seed=w.seed)
            if w.seed is None:  # as the pool spreads unseeded workers' full phases (diffmoe/fuzz/tiers.py)
                kwargs.setdefault("full_offset", worker_full_phase(w.index, len(pool), kwargs.get("full_every", FULL_EVERY)))
            refs[task.remote(board, w.index, kwargs)] = w
        with interrupts_noted() as noted:
            interrupted, starts = _collect(ray, board, refs, pool, progress, start, noted)
    merged = _merge(pool, seed, interrupted, start)
    merged.notes += _retry_notes(starts, len(pool))
    return merged


def _collect(ray, board, refs: dict, pool: list[_Worker], progress: ProgressCallback | None, start: float,
             noted: list[int]) -> tuple[bool, dict]:
    """Wait for every task, streaming progress and posting the stops; (interrupted, attempts per task)."""
    pending = dict(refs)
    interrupted, heard, deadline = False, 0, None
    starts: dict = {}
    last_total = -1
    while pending:
        try:
            if len(noted) > heard:
                heard += 1
                raise KeyboardInterrupt
            if deadline is not None and time.perf_counter() > deadline:
                break
            ready, _ = ray.wait(list(pending), num_returns=len(pending), timeout=_POLL_SECONDS)
            for ref in ready:
                _receive(ray, pending.pop(ref), ref, pool, pending, interrupted)
            snapshot = ray.get(board.snapshot.remote())
            starts = snapshot["starts"]
            for index, (examples, phase, _label) in snapshot["progress"].items():
                w = pool[index]
                if not w.done:
                    w.examples, w.phase = examples, phase
                    if phase == PHASE_SHRINK and w.first_failure_at is None:
                        w.first_failure_at = time.perf_counter()
            if any(w.first_failure_at is not None for w in pool) and not snapshot["stops"]["stop_generating"]:
                board.stop.remote("stop_generating")  # the first failure ends the search; a shrink under way finishes
            total = sum(w.examples for w in pool)
            if progress is not None and total != last_total and snapshot["progress"]:
                last_total = total
                phase = PHASE_SHRINK if any(w.phase == PHASE_SHRINK for w in pool) else "generate"
                labels = [p[2] for p in snapshot["progress"].values()]
                progress(total, phase, time.perf_counter() - start, labels[-1])
        except KeyboardInterrupt:
            if interrupted:  # the second interrupt: stop waiting
                break
            interrupted, deadline = True, time.perf_counter() + STOP_GRACE_SECONDS
            board.stop.remote("interrupt")
    for ref in pending:  # past the grace period: ended, their processes killed
        ray.cancel(ref, force=True)
    if pending:
        try:
            starts = ray.get(board.snapshot.remote(), timeout=5)["starts"]
        except Exception:  # noqa: BLE001 - the notes are a courtesy here; the outcome stands
            pass
    return interrupted or len(noted) > heard, starts


def _receive(ray, w: _Worker, ref, pool: list[_Worker], pending: dict, interrupted: bool) -> None:
    try:
        result = ray.get(ref)
    except ray.exceptions.RayError as exc:  # lost more often than MAX_TASK_RETRIES, or cancelled
        if interrupted and isinstance(exc, ray.exceptions.TaskCancelledError):
            return
        for other in pending:
            ray.cancel(other, force=True)
        detail = " ".join(str(exc).split())[:300]
        raise WorkerFailed(f"fuzz task {w.index + 1} of {len(pool)} failed after {MAX_TASK_RETRIES} retries "
                           f"({type(exc).__name__}: {detail}); its examples were not all judged") from None
    if result[0] == "error":
        for other in pending:
            ray.cancel(other, force=True)
        raise WorkerFailed(f"fuzz task {w.index + 1} of {len(pool)} failed: {result[1]}\n{result[2]}")
    w.outcome = pickle.loads(result[1])
    w.examples = w.outcome.examples
    if w.outcome.report is not None and w.first_failure_at is None:
        w.first_failure_at = time.perf_counter()


def _retry_notes(starts: dict, tasks: int) -> list[str]:
    return [f"{note}; its search ran again from its seed, replaying the database first" for note in retry_notes(starts, tasks)]
