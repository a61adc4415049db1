"""The zygote's life on the judge's side: started once per process that asks (and per set of
preloaded modules), reused by the processes forked from it, stopped when its starter exits.

Owns: the table of zygotes, how one starts (inside the OS boundary, boundary.py, a fresh
interpreter started by bwrap; without it, forked from this process while it holds no
reference: a fork costs milliseconds where a fresh interpreter costs the imports of torch and
Triton again, about 1.4 s here; else a fresh interpreter), whether one is still alive, its stop
(SIGTERM: it kills and reaps its children), and the CPU seconds candidates report at their close.
Must not import the reference (a forked zygote would hold it).
"""

from __future__ import annotations

import atexit
import os
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

from diffmoe.isolation import boundary


@dataclass
class _Zygote:
    proc: Any  # subprocess.Popen, or _ForkedZygote
    address: str
    authkey: bytes
    owner: int  # the pid that started it: only that process stops it
    bounded: bool = False  # started inside the OS boundary (boundary.py): its pids are its namespace's
    folder: str | None = None  # the candidates' folder (boundary.candidate_folder), removed at its stop


_ZYGOTES: dict[tuple, _Zygote] = {}
_CANDIDATE_CPU = [0.0]  # CPU seconds the candidates of this process's checks used (bench/ab_isolation.py)
# How long close() waits for a candidate to say how much CPU it used (it answers at once, unless
# it is stuck in the implementation: then it is killed without an answer).
_CLOSE_REPLY_SECONDS = 1.0


def candidate_cpu_seconds() -> float:
    """CPU seconds of every isolated check's candidate process so far, in this process's checks."""
    return _CANDIDATE_CPU[0]
_LOCK = threading.Lock()


def _search_path() -> str:
    """This process's sys.path for the zygote, so a factory pickled by reference (a test module's
    class, a module found from the current directory) imports there as it did here."""
    seen = [p for p in sys.path if p and os.path.isdir(p)]
    return os.pathsep.join(dict.fromkeys([*seen, os.getcwd()]))


def zygote(preload: tuple[str, ...] = ()) -> _Zygote:
    """The running zygote for `preload` (started by this process or the one it was forked from),
    or a new one."""
    key = (preload, os.environ.get("TRITON_INTERPRET", ""), boundary.available() is None)
    with _LOCK:
        found = _ZYGOTES.get(key)
        if found is not None and _alive(found):
            return found
        if found is not None:
            _remove_folder(found)
        authkey = secrets.token_bytes(32)
        folder = boundary.candidate_folder()
        if _may_fork():
            found = _ZYGOTES[key] = _fork_zygote(preload, authkey, folder)
            return found
        command, bounded = boundary.wrap(
            [sys.executable, "-c", "import sys; from diffmoe.isolation.sandbox import zygote_main; zygote_main(sys.argv[1:])",
             *preload], folder)
        env = dict(os.environ, PYTHONPATH=_search_path(), DIFFMOE_ZYGOTE_PARENT=str(os.getpid()), **bounded)
        proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, start_new_session=True)
        proc.stdin.write(authkey)
        proc.stdin.close()
        address = proc.stdout.readline().decode().strip()
        if not address:
            proc.wait()
            shutil.rmtree(folder, ignore_errors=True)
            raise RuntimeError(f"the candidate's zygote process ended at its start (exit code {proc.returncode})")
        _ZYGOTES[key] = found = _Zygote(proc, address, authkey, os.getpid(), bounded["DIFFMOE_BOUNDARY"] == "1",
                                        folder)
        return found


def _may_fork() -> bool:
    """Whether the zygote may be a fork of this process: where fork exists and nothing of the
    reference has been imported here yet (the CLI, before its first check builds the reference).
    Else a fresh interpreter (a test session, a Python program that imported the reference)."""
    if not hasattr(os, "fork") or sys.platform == "darwin" or boundary.available() is None:
        return False  # inside the OS boundary: a fresh interpreter, started by bwrap
    return not any(name == "reference" or name.startswith("reference.") for name in sys.modules)


class _ForkedZygote:
    """The few Popen methods the zygote table uses, for a zygote made by os.fork."""

    def __init__(self, pid: int) -> None:
        self.pid, self.returncode = pid, None

    def poll(self):
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                self.returncode = 0
            else:
                if pid:
                    self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def terminate(self) -> None:
        if self.poll() is None:
            os.kill(self.pid, signal.SIGTERM)

    def kill(self) -> None:
        if self.poll() is None:
            os.kill(self.pid, signal.SIGKILL)

    def wait(self, timeout: float | None = None):
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired("zygote", timeout)
            time.sleep(0.01)
        return self.returncode


def _fork_zygote(preload: tuple[str, ...], authkey: bytes, folder: str) -> _Zygote:
    """A zygote forked from this process (about as quick as a fork: torch and diffmoe are already
    imported here), which holds no reference (_may_fork) and installs the import guard first;
    `folder` is its candidates' own."""
    read_fd, write_fd = os.pipe()
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:
        os.close(read_fd)
        from diffmoe.isolation.sandbox import forked_zygote

        forked_zygote(authkey, list(preload), write_fd, parent, folder)  # never returns
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as announced:
        address = announced.readline().decode().strip()
    proc = _ForkedZygote(pid)
    if not address:
        proc.wait(5)
        shutil.rmtree(folder, ignore_errors=True)
        raise RuntimeError(f"the candidate's zygote process ended at its start (exit code {proc.returncode})")
    return _Zygote(proc, address, authkey, os.getpid(), folder=folder)


def zygote_pids() -> set[int]:
    """The zygotes this process started and that are still running (a test that counts a process's
    children leaves them out: they outlive a check on purpose, one per process)."""
    return {z.proc.pid for z in _ZYGOTES.values() if z.owner == os.getpid() and z.proc.poll() is None}


def _alive(z: _Zygote) -> bool:
    if z.owner == os.getpid():
        return z.proc.poll() is None
    try:  # started by the process this one was forked from: not a child of this one
        os.kill(z.proc.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


@atexit.register
def stop_zygotes() -> None:
    """Stop the zygotes this process started (not those of the process it was forked from)."""
    for z in list(_ZYGOTES.values()):
        if z.owner == os.getpid() and z.proc.poll() is None:
            z.proc.terminate()  # it kills and reaps its children first (sandbox._stop_children)
            try:
                z.proc.wait(5)
            except subprocess.TimeoutExpired:
                z.proc.kill()
                z.proc.wait()
        _remove_folder(z)


def _remove_folder(z: _Zygote) -> None:
    """The stopped zygote's folder, by the process that made it (tests/isolation/test_no_residue.py: a
    day of test runs had left 991 of them in /tmp)."""
    if z.folder is not None and z.owner == os.getpid():
        shutil.rmtree(z.folder, ignore_errors=True)
