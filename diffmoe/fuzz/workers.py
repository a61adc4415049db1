"""`diffmoe fuzz --workers N [--cluster local|auto|ray://HOST:PORT]`: one fuzz split into N searches,
run as Ray tasks on the task layer (diffmoe/cluster/tasks.py), merged into one outcome (issue 31).

The interpreter runs one program instance at a time on one core, so one search uses one core;
`fuzz_in_workers(workers=N, ...)` runs N searches at once, each a plain `diffmoe.fuzz.driver.fuzz`:

* One worker (or one example) is that search in this process, with no Ray at all. More are Ray
  tasks on `cluster`: None (the default) is a local Ray runtime this call starts with N CPUs and
  stops at the end (10 to 17 s to start on a loaded 2-core machine, measured 2026-12-05: why the
  CLI's default is one worker); `auto`, `HOST:PORT` or `ray://HOST:PORT` join a running cluster,
  where each task asks for one GPU on CUDA.
* Examples: max_examples is split between the workers (worker i draws max_examples // N, the
  first max_examples % N one more); no more workers start than there are examples.
* Seeds: with a seed S, worker 0 draws from S itself (so `--workers 1` and worker 0 of any run
  are the same search) and worker i > 0 from `worker_seed(S, i)`; without a seed each worker
  draws a fresh one. A search draws the same examples in a task as in this process
  (diffmoe/fuzz/draws.py). Which worker fails first depends on timing, so the outcome names the
  worker, its seed and its share, and `--workers 1 --seed SEED --max-examples SHARE` repeats that
  search exactly. These are the splits and seeds of the process pool this module held before
  (a seeded run draws the examples it drew then).
* Database: every task opens the same one (a folder the nodes share, or `redis://HOST:PORT/N`,
  diffmoe/fuzz/database_spec.py): a failure any worker meets is saved as it is met and every
  worker's replay pass starts from what is stored.
* The first failure ends the search: each task reports its progress on the run's board at every
  example; this process reads it (`on_poll`) and, when a task turns to its shrink phase or ends
  with a report, posts `stop_generating`. Tasks still generating end at their next example (an
  interrupt raised from inside the property, which `fuzz` turns into an outcome keeping what it
  found); the one shrinking finishes its shrink.
* The failure reported: among the workers that found one, a completed shrink before an
  interrupted one, then the earliest first failure. Counts (examples, shrinking runs, full
  checks, escalations, siblings, waived examples) are summed over the workers.
* Ctrl-C and SIGTERM (which the CLI turns into KeyboardInterrupt) post `interrupt`: every task ends
  at its next example keeping what it found, and STOP_GRACE_SECONDS later the tasks still running
  are cancelled (their processes killed); a second Ctrl-C cancels at once. The outcome is
  interrupted and carries the smallest failure any task reported.
* Faults: a task whose process or node is lost is run again by Ray (MAX_TASK_RETRIES times) from
  its own seed, replaying the database first; the outcome's notes name every task retried. A task
  lost more often, or whose search raises, is WorkerFailed (the CLI's exit 3), never a pass. A
  hung check is ended by the check's own time limit (`time_limit`), as anywhere else.
* `keep_going` > 1 needs workers=1 (ValueError; CLI exit 2): a first failure stops the others.

Owns splitting a fuzz into searches and merging their outcomes. Must not judge or shrink: each
search is diffmoe.fuzz.driver's; running tasks is diffmoe/cluster/tasks.py's.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, replace
from typing import Any

from diffmoe.adapters.loading import file_modules
from diffmoe.cluster.runtime import ClusterSpec
from diffmoe.cluster.tasks import INTERRUPT, MAX_WORKERS, BoardView, Task, TaskFailed, run_tasks, task_report
from diffmoe.fuzz.driver import PHASE_SHRINK, FuzzOutcome, ProgressCallback, run_request
from diffmoe.fuzz.request import FuzzRequest
from diffmoe.fuzz.tiers import worker_full_phase
from diffmoe.problem.config import MAX_SEED, check_int

STOP_GRACE_SECONDS = 20.0  # a stopped task's time to send its outcome (it may be mid-check)
STOP_GENERATING = "stop_generating"  # the board's stop posted at the first failure
_SEED_STRIDE = 1_000_003  # worker seeds stay short enough to retype


def worker_seed(seed: int, index: int) -> int:
    """Worker `index`'s seed in a run seeded with `seed` (worker 0 keeps the seed itself)."""
    return seed if index == 0 else (seed + index * _SEED_STRIDE) % (MAX_SEED + 1)


def split_examples(max_examples: int, workers: int) -> list[int]:
    """Examples per worker: as even as possible, none empty (fewer workers than examples)."""
    workers = min(workers, max_examples)
    return [max_examples // workers + (i < max_examples % workers) for i in range(workers)]


class WorkerFailed(TaskFailed):
    """A fuzz task was lost too often, or its search raised (not a finding: a harness error)."""


@dataclass
class _Worker:
    index: int
    seed: int | None
    share: int
    examples: int = 0
    phase: str = "generate"
    outcome: FuzzOutcome | None = None
    first_failure_at: float | None = None  # perf_counter in this process, when first told


def search(request: FuzzRequest) -> FuzzOutcome:  # pragma: no cover - runs in a Ray task
    """One worker's search: run_request(request), reporting each example on the run's board and ending at
    the next example once `interrupt`, or (while generating) `stop_generating`, is posted."""

    def progress(examples: int, phase: str, elapsed: float, label: str) -> None:
        stops = task_report((examples, phase, label))
        if stops.get(INTERRUPT) or (phase != PHASE_SHRINK and stops.get(STOP_GENERATING)):
            raise KeyboardInterrupt  # from inside the property, where fuzz() expects an interrupt

    try:
        return run_request(request, progress)
    except KeyboardInterrupt:  # stopped before fuzz() could catch it (starting up), or Ray's SIGINT
        return FuzzOutcome(interrupted=True, seed=request.seed)


def fuzz_in_workers(*, workers: int, max_examples: int | None = None, seed: int | None = None,
                    cluster: str | ClusterSpec | None = None, progress: ProgressCallback | None = None,
                    runtime_env: dict | None = None, request: FuzzRequest | None = None,
                    **fuzz_kwargs: Any) -> FuzzOutcome:
    """`fuzz(max_examples=..., seed=..., **fuzz_kwargs)`, or the search `request` describes (then
    max_examples, seed and fuzz_kwargs are its own and are not passed), split over `workers`
    searches (module doc).

    cluster: None (a local Ray runtime when workers > 1), "local", "auto", "ray://HOST:PORT" or
    "HOST:PORT" (diffmoe/cluster/runtime.py); a ValueError starting "--cluster" when it cannot be
    started or reached, before any example runs. runtime_env: Ray's runtime environment for the
    tasks (what an implementation outside this package needs on the nodes). fuzz_kwargs are fuzz()'s;
    with workers > 1 database must be None, a folder or a redis:// URL (each task opens it itself).
    """
    check_int("workers", workers, 1, MAX_WORKERS)
    if request is None:
        request = FuzzRequest(max_examples=max_examples, seed=seed, **fuzz_kwargs)  # checked before any task starts
    elif max_examples is not None or seed is not None or fuzz_kwargs:
        raise TypeError("fuzz_in_workers: pass a request or its fields (max_examples, seed, ...), not both")
    if workers > 1 and request.keep_going != 1:
        # the first failure stops every worker still generating (module doc): one search collects several
        raise ValueError(f"keep_going={request.keep_going} needs workers=1: the first failure stops the other workers")
    if progress is not None and not callable(progress):
        raise TypeError(f"progress must be a callable or None, got {progress!r}")
    seed = request.seed
    shares = split_examples(request.max_examples, workers)
    if len(shares) == 1:  # one worker runs in this process: no runtime to start
        return run_request(request, progress)
    database = request.database
    if database is not None and not isinstance(database, (str, os.PathLike)):
        raise TypeError(f"database must be None, a directory path or a redis:// URL with workers > 1 (each task opens it), got {database!r}")
    if database is not None:
        request = replace(request, database=os.fspath(database))

    pool = [_Worker(i, None if seed is None else worker_seed(seed, i), share) for i, share in enumerate(shares)]
    tasks = []
    for w in pool:
        share = replace(request, max_examples=w.share, seed=w.seed)
        if w.seed is None and request.full_offset is None:
            # a seeded worker's phase is its seed's; unseeded ones are spread (diffmoe/fuzz/tiers.py)
            share = replace(share, full_offset=worker_full_phase(w.index, len(pool), request.full_every))
        tasks.append(Task(search, share, name=f"fuzz worker {w.index + 1}"))
    _ship_implementation_files()
    start = time.perf_counter()
    watch = _Watch(pool, progress, start)
    try:
        run = run_tasks(tasks, workers=len(pool), cluster=cluster, device=request.device,
                        on_result=watch.result, on_poll=watch.poll, stop_grace=STOP_GRACE_SECONDS,
                        runtime_env=runtime_env)
    except TaskFailed as exc:
        raise WorkerFailed(str(exc)) from exc.__cause__
    merged = merge(pool, seed, run.interrupted, start)
    merged.notes += [f"{note}; its search ran again from its seed, replaying the database first" for note in run.notes]
    return merged


def _ship_implementation_files() -> None:
    """An implementation loaded from a file (`--impl path/to/kernel.py:make`) lives in this process
    under a name no node can import: its module travels with the tasks by value (Ray's cloudpickle),
    so a node needs only what the file itself imports."""
    try:
        from ray import cloudpickle
    except ImportError:  # run_tasks says Ray is missing, in one line
        return
    for module in file_modules():
        cloudpickle.register_pickle_by_value(module)


class _Watch:
    """What this process does as the tasks report: progress streamed, the first failure's stop posted."""

    def __init__(self, pool: list[_Worker], progress: ProgressCallback | None, start: float) -> None:
        self.pool, self.progress, self.start = pool, progress, start
        self.posted = False
        self.last_total = -1

    def result(self, index: int, outcome: FuzzOutcome) -> None:
        w = self.pool[index]
        w.outcome, w.examples = outcome, outcome.examples
        if outcome.report is not None and w.first_failure_at is None:
            w.first_failure_at = time.perf_counter()

    def poll(self, board: BoardView) -> None:
        snapshot = board.snapshot()
        for index, (examples, phase, _label) in snapshot["progress"].items():
            w = self.pool[index]
            if w.outcome is None:
                w.examples, w.phase = examples, phase
                if phase == PHASE_SHRINK and w.first_failure_at is None:
                    w.first_failure_at = time.perf_counter()
        if not self.posted and any(w.first_failure_at is not None for w in self.pool):
            board.stop(STOP_GENERATING)  # the first failure ends the search; a shrink under way finishes
            self.posted = True
        total = sum(w.examples for w in self.pool)
        if self.progress is not None and total != self.last_total and snapshot["progress"]:
            self.last_total = total
            phase = PHASE_SHRINK if any(w.phase == PHASE_SHRINK for w in self.pool) else "generate"
            label = list(snapshot["progress"].values())[-1][2]
            self.progress(total, phase, time.perf_counter() - self.start, label)


def merge(pool: list[_Worker], seed: int | None, interrupted: bool, start: float) -> FuzzOutcome:
    """The workers' outcomes as one (module doc: the failure reported, the counts summed)."""
    end = time.perf_counter()
    outcomes = [(w, w.outcome) for w in pool if w.outcome is not None]
    merged = FuzzOutcome(seed=seed, seconds=end - start, interrupted=interrupted)
    for _, o in outcomes:
        for name in ("examples", "shrink_examples", "full_examples", "escalations", "sibling_runs", "waived_examples"):
            setattr(merged, name, getattr(merged, name) + getattr(o, name))
        merged.notes += [n for n in o.notes if n not in merged.notes]
    lost = [w for w in pool if w.outcome is None]
    if lost:  # cancelled after the grace period: only with an interrupt
        merged.notes.append(f"{len(lost)} worker(s) did not report within {STOP_GRACE_SECONDS:g} s of the stop and were cancelled")
    found = [(w, o) for w, o in outcomes if o.report is not None]
    if found:
        w, o = min(found, key=lambda wo: (wo[1].interrupted, wo[0].first_failure_at or float("inf"), wo[0].index))
        merged.report = o.report
        merged.failures, merged.failure_keys = list(o.failures), list(o.failure_keys)
        first = min(x.first_failure_at for x, _ in found if x.first_failure_at is not None)
        merged.seconds_to_first_failure = first - start
        merged.seconds_shrinking = end - first
        again = f"; --workers 1 --seed {w.seed} --max-examples {w.share} repeats its search" if w.seed is not None else ""
        merged.notes.append(f"found by worker {w.index + 1} of {len(pool)}" + (f" (seed {w.seed}, {w.share} examples{again})"
                                                                               if w.seed is not None else ""))
        if o.interrupted and not interrupted:
            merged.notes.append("its shrink was interrupted")
    return merged
