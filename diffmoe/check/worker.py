"""Worker-process isolation for one check: time limits, signals, a worker that dies.

Owns: validating and defaulting the time limit, starting the worker (fork on a CPU device
where the platform has it, spawn otherwise), streaming its progress and findings back,
stopping it with everything it started when the limit passes without progress, and turning a
worker's death into a `crash` finding. It knows nothing of oracles or implementations: it runs
a job (`job.run(progress)`, `job.report(findings, seconds)`, `job.device`) and moves Reports, and
what a job learned in the worker (`job.learned()`) back to the parent (`job.learn(...)`), where the
next forked worker inherits it.
"""

from __future__ import annotations

import ctypes
import math
import multiprocessing
import os
import pickle
import signal
import time
import traceback
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from diffmoe.contract import default_device, interpreter_enabled
from diffmoe.check.report import Report
from diffmoe.findings import Finding, Oracles

# The CLI's limit per check when --time-limit is not given, on the Triton interpreter, where a
# kernel that waits for another program instance spins forever (programs run one at a time).
# The largest configs the fuzzing strategies draw take well under a minute there; 120 s
# leaves room for a slow machine. On CUDA the default is no limit: compiled checks are quick,
# and a CUDA check's worker must be spawned (a forked child cannot use CUDA), which re-imports
# torch and Triton: seconds per check.
DEFAULT_INTERPRETER_TIME_LIMIT = 120.0
MAX_TIME_LIMIT = 7 * 24 * 3600.0  # a week; beyond it a limit is a typo, and poll() overflows
WORKER_START_METHODS = ("fork", "spawn")
# None: fork where the platform has it and the device is not CUDA, otherwise spawn.
WORKER_START_METHOD: str | None = None
# After a report or a kill, how long to wait for the worker to be gone before SIGKILL again.
_WORKER_JOIN_SECONDS = 5.0


def default_time_limit(device: str | torch.device | None = None) -> float | None:
    """The documented per-check limit for `device`: DEFAULT_INTERPRETER_TIME_LIMIT seconds on
    the Triton interpreter, None (no limit) on CUDA."""
    dev = torch.device(device) if device is not None else default_device()
    if dev.type == "cuda" and not interpreter_enabled():
        return None
    return DEFAULT_INTERPRETER_TIME_LIMIT


def check_time_limit(time_limit: object) -> float | None:
    """None, or a finite number of seconds in (0, MAX_TIME_LIMIT]; TypeError/ValueError otherwise."""
    if time_limit is None:
        return None
    if isinstance(time_limit, bool) or not isinstance(time_limit, (int, float)):
        raise TypeError(f"time_limit must be None or a number of seconds in (0, {MAX_TIME_LIMIT:g}], got {time_limit!r}")
    if not math.isfinite(time_limit) or not 0 < time_limit <= MAX_TIME_LIMIT:
        raise ValueError(f"time_limit must be None or a number of seconds in (0, {MAX_TIME_LIMIT:g}], got {time_limit!r}")
    return float(time_limit)


class WorkerError(RuntimeError):
    """run_differential itself failed inside the worker (not the implementation: that is a
    finding); carries the worker's traceback text."""


def worker_start_method(device: torch.device) -> str:
    """WORKER_START_METHOD if set, else fork on a CPU device where available, else spawn."""
    if WORKER_START_METHOD is not None:
        if WORKER_START_METHOD not in WORKER_START_METHODS:
            raise ValueError(f"WORKER_START_METHOD must be None or one of {list(WORKER_START_METHODS)}, got {WORKER_START_METHOD!r}")
        return WORKER_START_METHOD
    if device.type == "cuda" or "fork" not in multiprocessing.get_all_start_methods():
        return "spawn"
    return "fork"


# SIGALRM too: a handler that raises on it (a caller's own alarm; the fuzz's process pool had one
# before its searches became Ray tasks) raised inside fork would orphan the check's worker.
_DEFERRED_SIGNALS = {signal.SIGINT, signal.SIGTERM, signal.SIGALRM}


@contextmanager
def signals_deferred() -> Iterator[None]:
    """Hold SIGINT and SIGTERM while a worker is forked or stopped; they arrive when the block
    ends. A Python handler (the CLI turns SIGTERM into KeyboardInterrupt) that ran inside
    fork's at-fork hooks would have its exception printed and dropped, so the interrupt would
    be lost; one that ran halfway through stopping the worker could leave it running."""
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, _DEFERRED_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _die_with_parent() -> None:
    """Linux: SIGKILL this worker when the process that started it dies, however it dies (a
    parent killed with SIGKILL cannot stop it, and a worker in its own process group is not
    reached by the signals sent to the parent's). Elsewhere: nothing (the parent's stop stands)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _worker_main(conn, job, env: dict[str, str], forked: bool) -> None:
    """The worker: run the job, stream progress and findings, send the Report as JSON."""
    # Before anything imports Triton: under spawn the job (its factory) is still pickled bytes.
    os.environ.update(env)
    if forked:
        # GNU OpenMP's thread pool does not survive fork: the child's first parallel torch op
        # waits forever for threads that do not exist. One thread never enters the pool.
        # The reference and the implementation both run in this process, so they still see
        # the same numerics as each other.
        torch.set_num_threads(1)
    try:
        os.setpgid(0, 0)  # its own process group: the parent kills the group, a terminal's Ctrl-C reaches the parent only
    except OSError:
        pass
    _die_with_parent()
    for signum in _DEFERRED_SIGNALS:
        signal.signal(signum, signal.SIG_DFL)  # not the CLI's handlers, inherited by fork
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _DEFERRED_SIGNALS)  # blocked by the parent across the start
    sent = [0]

    def progress(phase: str, stage: str | None, findings: list[Finding]) -> None:
        fresh = findings[sent[0]:]
        sent[0] = len(findings)
        conn.send(("progress", phase, stage, [f.to_dict() for f in fresh]))

    try:
        if isinstance(job, bytes):
            job = pickle.loads(job)
        report = job.run(progress)
        learned = getattr(job, "learned", None)
        if learned is not None:  # what the parent's later checks may reuse (runner._Job.learned)
            try:
                conn.send(("learned", learned()))
            except Exception:  # noqa: BLE001 - a key that does not pickle: nothing is learned, the report still goes
                pass
        conn.send(("report", report.to_json()))
    except BaseException as exc:  # noqa: BLE001 - everything goes back to the parent
        conn.send(("error", f"{type(exc).__name__}: {exc}", traceback.format_exc()))
    finally:
        conn.close()


def _stop_worker(proc) -> None:
    """Kill the worker's process group and the worker, and reap it: nothing outlives the check."""
    if proc.pid is None:
        return  # never started
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # exists only once the worker made its own group
    except (OSError, AttributeError):
        pass
    if proc.is_alive():
        proc.kill()
    proc.join(_WORKER_JOIN_SECONDS)


def _exit_description(exitcode: int | None) -> str:
    if exitcode is None:
        return "still running"
    if exitcode < 0:
        try:
            return f"killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exit code {exitcode}"


def run_in_worker(job, limit: float) -> Report:
    """job.run(progress) in a worker process, stopped after `limit` seconds without progress;
    the Report, or job.report(findings so far + a timeout or crash finding)."""
    method = worker_start_method(job.device)
    context = multiprocessing.get_context(method)
    if method == "fork":
        payload: object = job  # inherited, not pickled: any factory works, closures included
    else:
        try:
            payload = pickle.dumps(job)
        except Exception as exc:  # noqa: BLE001 - pickling failures come in many types
            raise TypeError(
                f"time_limit under the spawn start method needs a picklable job (a module-level factory); "
                f"{type(exc).__name__}: {exc}"
            ) from None
    env = {k: v for k, v in os.environ.items() if k == "TRITON_INTERPRET"}
    receiver, sender = context.Pipe(duplex=False)
    proc = context.Process(target=_worker_main, args=(sender, payload, env, method == "fork"), name="diffmoe-check",
                           daemon=True)
    start = time.perf_counter()
    findings: list[Finding] = []
    phase, stage = "starting the worker process", None
    try:
        with signals_deferred(), warnings.catch_warnings():
            # Python >= 3.12 warns about forking a process with threads (torch's OpenMP pool
            # counts); the one hazard it means is handled in _worker_main (one thread).
            warnings.filterwarnings("ignore", message=r".*multi-threaded.*fork", category=DeprecationWarning)
            proc.start()
            sender.close()  # the worker holds the only sending end: EOF means it is gone
        # The limit bounds silence, not the check: every phase and every launch the worker starts
        # is a progress message that restarts the clock, so a slow check that keeps launching is
        # never a timeout (a 2-core machine under load made large checks look like hangs); a launch
        # or a phase that goes quiet for `limit` seconds is one.
        last_progress = start
        while True:
            remaining = last_progress + limit - time.perf_counter()
            if remaining <= 0 or not receiver.poll(remaining):
                findings.append(Finding(
                    oracle=Oracles.TIMEOUT, stage=stage,
                    message=f"no progress within the time limit of {limit:g} s; the worker was stopped during {phase}"
                            + (f", in a launch of stage {stage}" if stage else "")
                            + f" ({time.perf_counter() - start:.1f} s into the check)",
                    figures={"time_limit_s": limit, "phase": phase, "worker_pid": proc.pid, "start_method": method,
                             "seconds_since_progress": round(time.perf_counter() - last_progress, 3)},
                ))
                break
            last_progress = time.perf_counter()
            try:
                message = receiver.recv()
            except EOFError:
                proc.join(_WORKER_JOIN_SECONDS)
                findings.append(Finding(
                    oracle=Oracles.CRASH, stage=stage,
                    message=f"the worker process died ({_exit_description(proc.exitcode)}) before sending its report, during {phase}"
                            + (f", in a launch of stage {stage}" if stage else ""),
                    figures={"exitcode": proc.exitcode, "phase": phase, "worker_pid": proc.pid},
                ))
                break
            kind = message[0]
            if kind == "progress":
                _, phase, stage, fresh = message
                findings += [Finding.from_dict(f) for f in fresh]
            elif kind == "learned":
                job.learn(message[1])
            elif kind == "report":
                report = Report.from_json(message[1])
                report.seconds = time.perf_counter() - start
                return report
            else:
                raise WorkerError(f"run_differential failed in the worker: {message[1]}\n{message[2]}")
    finally:
        with signals_deferred():
            _stop_worker(proc)
            sender.close()
            receiver.close()
    return job.report(findings, time.perf_counter() - start)
