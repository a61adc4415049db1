"""Parallel fuzzing: `fuzz()` in N worker processes sharing one example database.

The interpreter runs one program instance at a time on one core, so a fuzz uses one core of
the machine; `fuzz_in_workers(workers=N, ...)` runs N searches at once, each a plain
`diffmoe.fuzz.driver.fuzz` in its own process:

* Examples: max_examples is split between the workers (worker i draws max_examples // N, the
  first max_examples % N one more); no more workers start than there are examples.
* Seeds: with a seed S, worker 0 draws from S itself (so `--workers 1` and worker 0 of any
  run are the same search) and worker i > 0 from `worker_seed(S, i)`; without a seed each
  worker draws a fresh one. Each worker's stream is reproducible from its seed; which worker
  fails first depends on timing, so the outcome names the worker, its seed and its share,
  and `--workers 1 --seed SEED --max-examples SHARE` repeats that search exactly.
* Database: every worker opens the same directory (Hypothesis's DirectoryBasedExampleDatabase,
  atomic renames, safe for concurrent writers): a failure any worker meets is saved as it is
  met and every worker's replay pass starts from what is stored.
* The first failure ends the search, as in one process: when a worker reports its first
  failure (its progress turns to the shrink phase, or it ends with a report) a shared event
  tells the workers still generating to stop at their next example (an interrupt raised
  from inside the property, which `fuzz` turns into an outcome keeping what it found; no
  signal, whose interrupt could land inside Hypothesis's own setup); workers already
  shrinking finish their shrink.
* The failure reported: among the workers that found one, a completed shrink before an
  interrupted one, then the earliest first failure. Counts (examples, shrinking runs, full
  checks, escalations, siblings) are summed over the workers.
* Ctrl-C and SIGTERM (which the CLI turns into KeyboardInterrupt in this process) stop every
  worker: each gets one SIGTERM (a second stop signal is ignored, so the terminal's Ctrl-C,
  which reaches the whole process group, and the forwarded one do not cut its cleanup short;
  a worker stops on SIGINT only where SIGINT was not ignored when it started, so a job run
  with nohup or in the background keeps ignoring it, as the CLI does), is given
  STOP_GRACE_SECONDS to send its outcome, and is killed after that. The outcome is
  interrupted and carries the smallest failure any worker reported. A second Ctrl-C in this
  process stops waiting and kills them at once.
* Waived findings (diffmoe/fuzz/waivers.py): each worker searches past them, their counts summed.
  `keep_going` > 1 needs workers=1 (ValueError; CLI exit 2): a first failure stops the others.
* A worker that dies without an outcome, or whose search raises, is not a pass: this raises
  WorkerFailed (the CLI exits 3), after stopping the others.

Workers are forked on a CPU device (they inherit the loaded factory, any callable works) and
spawned otherwise (the factory must be picklable), as diffmoe.check.worker decides for one check;
a forked worker runs torch on one thread (diffmoe.check.worker explains why).

Owns splitting a fuzz over processes and merging the outcomes. Must not judge or shrink:
each worker's search is diffmoe.fuzz.driver's.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import queue
import signal
import sys
import time
import traceback
import warnings
from typing import Any

import torch

from diffmoe.cluster.interrupts import interrupts_noted as _interrupts_noted
from diffmoe.cluster.tasks import MAX_WORKERS
from diffmoe.problem.config import MAX_SEED, check_int
from diffmoe.fuzz.tiers import FULL_EVERY, worker_full_phase
from diffmoe.fuzz.driver import MAX_EXAMPLES_LIMIT, PHASE_SHRINK, FuzzOutcome, ProgressCallback, fuzz
from diffmoe.check.worker import signals_deferred, worker_start_method

STOP_GRACE_SECONDS = 20.0  # a stopped worker's time to send its outcome (it may be mid-check)
_POLL_SECONDS = 0.1
_SEED_STRIDE = 1_000_003  # worker seeds stay short enough to retype


def default_workers() -> int:
    """The cores this process may use (its CPU affinity where the platform tells it)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def worker_seed(seed: int, index: int) -> int:
    """Worker `index`'s seed in a run seeded with `seed` (worker 0 keeps the seed itself)."""
    return seed if index == 0 else (seed + index * _SEED_STRIDE) % (MAX_SEED + 1)


def split_examples(max_examples: int, workers: int) -> list[int]:
    """Examples per worker: as even as possible, none empty (fewer workers than examples)."""
    workers = min(workers, max_examples)
    return [max_examples // workers + (i < max_examples % workers) for i in range(workers)]


class WorkerFailed(RuntimeError):
    """A fuzz worker died without an outcome, or its search raised (not a finding: a harness error)."""


_stop_requested = [False]  # set in a worker by its first SIGINT/SIGTERM
_RETRY_SECONDS = 0.01


def _stop_once(signum, frame):  # pragma: no cover - runs in a worker, on a signal
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, signal.SIG_IGN)  # the forwarded SIGINT and the terminal's: one interrupt
    _stop_requested[0] = True
    raise KeyboardInterrupt


def _raise_again(signum, frame):  # pragma: no cover - runs in a worker, on SIGALRM
    raise KeyboardInterrupt


def _swallowed(info, previous=sys.unraisablehook) -> None:  # pragma: no cover - runs in a worker
    """A stop's KeyboardInterrupt that landed in a callback Python cannot raise from (one of
    Hypothesis's gc callbacks, seen in tests) is raised again 10 ms later, not printed."""
    if issubclass(info.exc_type, KeyboardInterrupt) and _stop_requested[0]:
        signal.signal(signal.SIGALRM, _raise_again)
        signal.setitimer(signal.ITIMER_REAL, _RETRY_SECONDS)
        return
    previous(info)


def _worker_main(index: int, messages, stop_generating, parent: int, payload: Any, forked: bool) -> None:
    """One worker: fuzz(**kwargs), its progress and its outcome sent on `messages`."""
    # SIGTERM is the parent's stop; SIGINT (a terminal's Ctrl-C, which reaches the whole process
    # group) only where it was not ignored when the fuzz started (inherited, through fork or exec).
    stops = [signal.SIGTERM] if signal.getsignal(signal.SIGINT) is signal.SIG_IGN else [signal.SIGINT, signal.SIGTERM]
    for s in stops:
        signal.signal(s, _stop_once)
    sys.unraisablehook = _swallowed
    if hasattr(signal, "pthread_sigmask"):  # blocked by the parent across the start
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})
    if forked:
        torch.set_num_threads(1)  # GNU OpenMP's pool does not survive fork (diffmoe/check/worker.py)
    kwargs: dict = {}
    try:
        kwargs = pickle.loads(payload) if isinstance(payload, bytes) else payload

        def progress(examples: int, phase: str, elapsed: float, label: str) -> None:
            # The handler's KeyboardInterrupt can land where Python swallows it (a gc callback of
            # Hypothesis's, measured): the flag stops the search at the next example instead.
            # A parent gone (killed) means nobody is listening: stop too.
            if _stop_requested[0] or os.getppid() != parent:
                raise KeyboardInterrupt
            # Another worker failed first: a search still generating ends here, at an example's
            # start (raised from inside the property, where fuzz() expects an interrupt); one
            # that is shrinking goes on. No signal: an interrupt landing inside Hypothesis's own
            # setup trips its internal assertions (seen in tests).
            if phase != PHASE_SHRINK and stop_generating.is_set():
                raise KeyboardInterrupt
            messages.put(("progress", index, examples, phase, label))

        outcome = fuzz(progress=progress, **kwargs)
        messages.put(("outcome", index, pickle.dumps(outcome)))
    except KeyboardInterrupt:  # stopped before fuzz() could catch it (starting up)
        messages.put(("outcome", index, pickle.dumps(FuzzOutcome(interrupted=True, seed=kwargs.get("seed")))))
    except BaseException as exc:  # noqa: BLE001 - everything goes back to the parent
        if isinstance(exc, Exception) and _stop_requested[0]:
            # The stop landed inside Hypothesis's engine, which then fails its own assertions;
            # fuzz() re-raises only when it had found nothing, so nothing is lost.
            messages.put(("outcome", index, pickle.dumps(FuzzOutcome(interrupted=True, seed=kwargs.get("seed")))))
        else:
            messages.put(("error", index, f"{type(exc).__name__}: {exc}", traceback.format_exc()))
    finally:
        messages.close()
        messages.join_thread()  # everything put is in the pipe before the process ends


class _Worker:
    def __init__(self, index: int, seed: int | None, share: int) -> None:
        self.index, self.seed, self.share = index, seed, share
        self.proc = None
        self.examples = 0
        self.phase = "generate"
        self.outcome: FuzzOutcome | None = None
        self.first_failure_at: float | None = None  # perf_counter in the parent, when first told
        self.stopped = False

    @property
    def done(self) -> bool:
        return self.outcome is not None

    def interrupt(self) -> None:
        """The user's stop (Ctrl-C, SIGTERM): one SIGTERM, whatever the worker is doing."""
        if not self.stopped and not self.done and self.proc is not None and self.proc.is_alive():
            self.stopped = True
            try:
                os.kill(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass


def fuzz_in_workers(*, workers: int, max_examples: int, seed: int | None,
                    progress: ProgressCallback | None = None, **fuzz_kwargs: Any) -> FuzzOutcome:
    """`fuzz(max_examples=..., seed=..., **fuzz_kwargs)` split over `workers` processes (module doc).

    workers == 1 (or max_examples == 1) runs `fuzz` in this process. fuzz_kwargs are fuzz()'s
    (database must then be None, a directory path or a redis:// URL, as every worker opens it itself).
    """
    check_int("workers", workers, 1, MAX_WORKERS)
    if workers > 1 and fuzz_kwargs.get("keep_going", 1) != 1:
        # the first failure stops every worker still generating (module doc): one search collects several
        raise ValueError(f"keep_going={fuzz_kwargs['keep_going']} needs workers=1: the first failure stops the other workers")
    check_int("max_examples", max_examples, 1, MAX_EXAMPLES_LIMIT)  # fuzz()'s own bound, checked before any worker starts
    if progress is not None and not callable(progress):
        raise TypeError(f"progress must be a callable or None, got {progress!r}")
    shares = split_examples(max_examples, workers)
    if len(shares) == 1:
        return fuzz(max_examples=max_examples, seed=seed, progress=progress, **fuzz_kwargs)
    database = fuzz_kwargs.get("database")
    if database is not None and not isinstance(database, (str, os.PathLike)):
        raise TypeError(f"database must be None, a directory path or a redis:// URL with workers > 1 (each worker opens it), got {database!r}")

    device = fuzz_kwargs.get("device")
    method = worker_start_method(torch.device(device) if device is not None else torch.device("cpu"))
    context = multiprocessing.get_context(method)
    messages = context.Queue()
    stop_generating = context.Event()  # set when a worker fails first (see _worker_main)
    pool = [_Worker(i, None if seed is None else worker_seed(seed, i), share) for i, share in enumerate(shares)]
    start = time.perf_counter()
    interrupted = False
    try:
        try:
            for w in pool:
                kwargs = dict(fuzz_kwargs, max_examples=w.share, seed=w.seed)
                if w.seed is None:  # a seeded worker's phase is its seed's; unseeded ones are spread (diffmoe/fuzz/tiers.py)
                    kwargs.setdefault("full_offset", worker_full_phase(w.index, len(pool), kwargs.get("full_every", FULL_EVERY)))
                payload = kwargs if method == "fork" else _picklable(kwargs)
                w.proc = context.Process(target=_worker_main, args=(w.index, messages, stop_generating, os.getpid(), payload, method == "fork"),
                                         name=f"diffmoe-fuzz-{w.index}")  # not a daemon: it starts check workers
                with signals_deferred(), warnings.catch_warnings():
                    warnings.filterwarnings("ignore", message=r".*multi-threaded.*fork", category=DeprecationWarning)
                    w.proc.start()
        except KeyboardInterrupt:  # while starting: the ones started are stopped and heard
            interrupted = True
            pool = [w for w in pool if w.proc is not None and w.proc.pid is not None]
        with _interrupts_noted() as noted:
            interrupted = _collect(pool, messages, stop_generating, progress, start, interrupted, noted)
    except BaseException:
        _kill(pool)
        raise
    finally:
        messages.close()
    _kill(pool)  # all have sent their outcome; reap them
    return _merge(pool, seed, interrupted, start)


def _picklable(kwargs: dict) -> bytes:
    try:
        return pickle.dumps(kwargs)
    except Exception as exc:  # noqa: BLE001 - pickling failures come in many types
        raise TypeError(f"fuzz workers under the spawn start method need picklable arguments (a module-level "
                        f"factory); {type(exc).__name__}: {exc}") from None


def _collect(pool: list[_Worker], messages, stop_generating, progress: ProgressCallback | None, start: float,
             interrupted: bool, noted: list[int] | None = None) -> bool:
    """Read messages until every worker has sent its outcome; True when interrupted (here or before).

    A KeyboardInterrupt anywhere in the loop (the printing progress callback included), or a
    signal `_interrupts_noted` wrote in `noted`, is the stop: the workers are asked to stop and
    heard, never killed mid-check first."""
    noted = [] if noted is None else noted
    heard = 0  # signals in `noted` acted on
    deadline: float | None = None  # after an interrupt: when the stragglers are killed
    if interrupted:
        deadline = _stop_all(pool)
    while not all(w.done for w in pool):
        try:
            if len(noted) > heard:
                heard += 1
                raise KeyboardInterrupt
            if deadline is not None and time.perf_counter() > deadline:
                break
            try:
                message = messages.get(timeout=_POLL_SECONDS)
            except queue.Empty:
                message = None
            if message is not None:
                _receive(pool, message, progress, start)
            if any(w.first_failure_at is not None for w in pool):
                stop_generating.set()  # the first failure ends the search; a shrink under way finishes
            for w in pool:
                if not w.done and w.proc is not None and not w.proc.is_alive() and _drained(messages, pool, progress, start, w):
                    _kill(pool)
                    raise WorkerFailed(f"fuzz worker {w.index + 1} of {len(pool)} died ({_exit(w.proc.exitcode)}) "
                                       f"before sending its outcome; its examples were not all judged")
        except KeyboardInterrupt:
            if interrupted:  # the second interrupt: stop waiting
                break
            interrupted, deadline = True, _stop_all(pool)
    return interrupted or len(noted) > heard


def _stop_all(pool: list[_Worker]) -> float:
    """Interrupt every worker; the time after which the ones still running are killed."""
    for w in pool:
        w.interrupt()
    return time.perf_counter() + STOP_GRACE_SECONDS


def _drained(messages, pool, progress, start, dead: _Worker) -> bool:
    """Read what a dead worker left in the queue; True when it still has no outcome."""
    while not dead.done:
        try:
            message = messages.get(timeout=_POLL_SECONDS)
        except queue.Empty:
            return True
        _receive(pool, message, progress, start)
    return False


def _receive(pool: list[_Worker], message: tuple, progress: ProgressCallback | None, start: float) -> None:
    kind, index = message[0], message[1]
    w = pool[index]
    if kind == "progress":
        _, _, w.examples, w.phase, label = message
        if w.phase == PHASE_SHRINK and w.first_failure_at is None:
            w.first_failure_at = time.perf_counter()
        if progress is not None:
            total = sum(p.examples for p in pool)
            phase = PHASE_SHRINK if any(p.phase == PHASE_SHRINK for p in pool) else w.phase
            progress(total, phase, time.perf_counter() - start, label)
    elif kind == "outcome":
        w.outcome = pickle.loads(message[2])
        w.examples = w.outcome.examples
        if w.outcome.report is not None and w.first_failure_at is None:
            w.first_failure_at = time.perf_counter()
    else:
        _kill(pool)
        raise WorkerFailed(f"fuzz worker {index + 1} of {len(pool)} failed: {message[2]}\n{message[3]}")


def _kill(pool: list[_Worker]) -> None:
    with signals_deferred():
        for w in pool:
            if w.proc is not None and w.proc.pid is not None:
                if w.proc.is_alive():
                    w.proc.kill()
                w.proc.join(5.0)


def _exit(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def _merge(pool: list[_Worker], seed: int | None, interrupted: bool, start: float) -> FuzzOutcome:
    end = time.perf_counter()
    outcomes = [(w, w.outcome) for w in pool if w.outcome is not None]
    merged = FuzzOutcome(seed=seed, seconds=end - start, interrupted=interrupted)
    for _, o in outcomes:
        for name in ("examples", "shrink_examples", "full_examples", "escalations", "sibling_runs", "waived_examples"):
            setattr(merged, name, getattr(merged, name) + getattr(o, name))
        merged.notes += [n for n in o.notes if n not in merged.notes]
    lost = [w for w in pool if w.outcome is None]
    if lost:  # killed after the grace period: only with an interrupt
        merged.notes.append(f"{len(lost)} worker(s) did not report within {STOP_GRACE_SECONDS:g} s of the stop and were killed")
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
