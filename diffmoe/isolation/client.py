"""The judge's side of isolation: one candidate child per check, `RemoteCandidate` and `RemoteFactory`.

Owns (the zygote's start and stop are zygote.py's): how a factory travels (pickled by reference, or as its
MODULE:FACTORY spec); and `RemoteCandidate`, which Check uses in place of
diffmoe.check.candidate.Candidate: every method sends one request and waits for its answer,
relaying the candidate's progress (so a time limit still sees launches), raising `Crash` with
the candidate's finding, and turning refused imports into `contract` findings.
"""

from __future__ import annotations

import os
import pickle
import signal
from multiprocessing import reduction
from multiprocessing.connection import Client
from typing import Any

import torch

from diffmoe.check.candidate import Crash, Executed
from diffmoe.check.report import Finding, Oracles
from diffmoe.isolation.messages import dumps, recv, send
from diffmoe.isolation.zygote import (  # noqa: F401 - candidate_cpu_seconds, stop_zygotes, zygote_pids: this module's API too
    _CANDIDATE_CPU, _CLOSE_REPLY_SECONDS, candidate_cpu_seconds, stop_zygotes, zygote, zygote_pids,
)

ISOLATIONS = ("process", "none")
"""`process`: the candidate runs in its own process (this module); `none`: in the judge's."""


def check_isolation(isolation: object) -> str:
    if isolation not in ISOLATIONS:
        raise ValueError(f"isolation must be one of {', '.join(map(repr, ISOLATIONS))}, got {isolation!r}")
    return isolation  # type: ignore[return-value]


def _preload(spec: str) -> tuple[str, ...]:
    from diffmoe.adapters.contract import IMPLEMENTATION_ALIASES, WHEEL_FUNCTIONS

    module = IMPLEMENTATION_ALIASES.get(spec, spec).split(":")[0]
    module = WHEEL_FUNCTIONS.get(module, module).split(":")[0]  # a peer wheel's function: its adapter's module
    return () if module.endswith(".py") else (module,)


def factory_reference(factory: Any, spec: str | None) -> tuple[tuple[str, Any], tuple[str, ...]]:
    """How the factory travels, and the modules the zygote may preload: a RemoteFactory by its
    spec; else pickled by reference (a module-level class or function), else its MODULE:FACTORY
    spec; a TypeError naming both when neither works (a closure or a lambda cannot be isolated:
    run it with isolation='none')."""
    if isinstance(factory, RemoteFactory):
        return ("spec", factory.spec), _preload(factory.spec)
    try:
        return ("pickle", pickle.dumps(factory)), (getattr(factory, "__module__", None) or "",)
    except Exception as exc:  # noqa: BLE001 - pickling fails in many types
        if spec is not None:
            return ("spec", spec), _preload(spec)
        raise TypeError(
            f"isolation='process' sends the factory to the candidate's process by reference; {factory!r} does not "
            f"pickle ({type(exc).__name__}: {exc}): make it a module-level class or function, give its MODULE:FACTORY "
            "spec, or run with isolation='none'") from None


def _send_stderr(conn) -> None:
    """The judge's stderr as it is now (fd 2: the CLI's, or a test's capture), for the child's
    stdout and stderr: what the implementation prints reaches the judge's stderr, never its stdout
    (a JSON report stays one document), and never a file the zygote inherited when it started."""
    reduction.send_handle(conn, 2, 0)


def refused_import_finding(module: str, importer: str) -> Finding:
    return Finding(
        oracle=Oracles.CONTRACT,
        message=f"the implementation imported {module} ({importer}), diffmoe's reference; the candidate's process "
                "refuses it (isolation: the candidate holds neither the reference nor its results)",
        figures={"module": module, "importer": importer},
    )


class RemoteCandidate:
    """A Candidate in its own process (diffmoe.check.candidate.Candidate's methods, by request)."""

    def __init__(self, factory, device: torch.device, problem, progress, *, factory_ref, preload=()) -> None:
        self._progress = progress
        self._gone = False  # the candidate's process ended: nothing more can be asked of it
        self.pending: list[Finding] = []
        self._refused: set[str] = set()
        self.phase = "starting the candidate's process"
        z = zygote(tuple(m for m in preload if m))
        self.conn = Client(z.address, family="AF_UNIX", authkey=z.authkey)
        send(self.conn, ("open", factory_ref, str(device), dumps(problem), torch.get_num_threads(), os.getpid(),
                         dict(os.environ)))
        _send_stderr(self.conn)
        self.pid = None
        try:
            reply = self._receive()
        except Crash as crash:  # the child ended while opening: every later call is that finding
            self._crash = crash
            return
        if reply[0] == "failed":
            _, finding, attempts = reply
            self._note_attempts(attempts)
            # a refused import is why it failed to load: that contract finding, not the ImportError
            self._crash = Crash(self.pending.pop(0) if self.pending else finding)
        else:
            _, self.pid, attempts = reply
            self._note_attempts(attempts)
            self._crash = None

    # ---- the protocol --------------------------------------------------------------------
    def _receive(self):
        while True:
            try:
                message = recv(self.conn)
            except (EOFError, OSError):
                self._gone = True
                raise Crash(Finding(
                    oracle=Oracles.CRASH,
                    message=f"the candidate's process ended during {self.phase} (its connection closed)",
                    figures={"phase": self.phase, "candidate_pid": getattr(self, "pid", None)},
                )) from None
            if message[0] != "progress":
                return message
            _, phase, stage = message
            if phase is not None:
                self.phase = phase
            if self._progress is not None:
                self._progress(phase, stage)

    def _note_attempts(self, attempts) -> None:
        for module, importer in attempts:
            if module not in self._refused:
                self._refused.add(module)
                self.pending.append(refused_import_finding(module, importer))

    def _request(self, op: str, *args):
        if self._crash is not None:  # the factory never loaded: every call is that finding
            raise self._crash
        if self._gone:
            raise Crash(Finding(oracle=Oracles.CRASH, message=f"the candidate's process had ended before {op}",
                                figures={"phase": self.phase}))
        send(self.conn, (op, *args))
        reply = self._receive()
        kind = reply[0]
        self._note_attempts(reply[-1])
        if kind == "result":
            return reply[1]
        if kind == "crash":
            _, finding, pending, _ = reply
            self.pending += pending
            raise Crash(finding)
        raise RuntimeError(f"the candidate's process failed serving {op}: {reply[1]}\n{reply[2]}")

    def take_pending(self) -> list[Finding]:
        found, self.pending = self.pending, []
        return found

    def take_refused(self) -> list:
        if self._crash is not None or self._gone:
            return []  # what a process that ended had refused ended with it
        return self._request("take_refused")

    def close(self) -> None:
        try:
            send(self.conn, ("close",))
            if not self._gone and self._crash is None and self.conn.poll(_CLOSE_REPLY_SECONDS):
                reply = recv(self.conn)
                if reply[0] == "closed":
                    _CANDIDATE_CPU[0] += reply[1]
        except (OSError, EOFError):
            pass
        self.conn.close()
        if self.pid:
            try:  # whatever it left running (a thread writing late, a process it started) ends with the check
                os.killpg(self.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    # ---- Candidate's methods ---------------------------------------------------------------
    def build(self, config):
        return self._request("build", config)

    def workspace_shapes(self, impl, max_tokens: int):
        return self._request("workspace_shapes", impl, max_tokens)

    def workspace_plan(self, impl, num_tokens: int):
        return self._request("workspace_plan", impl, num_tokens)

    def has_run_stage(self, impl) -> bool:
        return self._request("has_run_stage", impl)

    def allocate(self, shapes, what: str):
        return self._request("allocate", tuple(shapes), what)

    def new_output(self, num_tokens: int, hidden: int, pattern: int | None = None):
        return self._request("new_output", num_tokens, hidden, pattern)

    def execute(self, impl, guarded, output, schedule, poison, problem=None, what=None, attribute_input_writes=False,
                poison_workspaces=None, address_oracles=(), schedule_selected=False) -> Executed:
        executed = self._request("execute", impl, guarded, output, schedule, poison,
                                 None if problem is None else dumps(problem), what, attribute_input_writes,
                                 poison_workspaces, list(address_oracles), schedule_selected)
        executed.findings = self.take_pending() + executed.findings
        return executed

    def run_stage(self, impl, stage: str, inputs, what: str):
        outputs, found = self._request("run_stage", impl, stage, inputs, what)
        if not isinstance(outputs, dict):  # Unsendable: the type is what the contract finding names
            outputs = _TypeNamed(outputs.type_name)
        return outputs, self.take_pending() + found


class _TypeNamed:
    """Stands for a non-dict that run_stage returned, so the judge's message names its type."""

    def __init__(self, name: str) -> None:
        self.__class__ = type(name, (_TypeNamed,), {})


class RemoteFactory:
    """A factory named by its MODULE:FACTORY spec whose module is imported only in the candidate's
    process: what the judge reads of a factory (its numerics profile, batch-invariance claim,
    peer wheel, `supports`, `plan_workspaces`) is asked of a child of the zygote, so the implementation's
    module never runs in the judge's process (whose comparison its import-time code could
    otherwise patch). Calling it is refused: instances are built in the candidate's process.
    A module that fails to load there declares nothing here; the check then reports the failure
    (a refused import as a `contract` finding). Pickles as its spec."""

    def __init__(self, spec: str) -> None:
        self.spec = spec
        self.__module__, _, self.__qualname__ = spec.partition(":")
        self._conn: tuple[int, Any] | None = None  # (pid, connection): one per process
        reply = self._ask("describe")
        declared = reply if isinstance(reply, dict) else {}
        self.numerics = declared.get("numerics")
        self.batch_invariant = declared.get("batch_invariant")
        self.peer_wheel = declared.get("peer_wheel")
        if declared.get("supports"):
            self.supports = self._supports
        if declared.get("plan_workspaces"):
            self.plan_workspaces = self._plan

    def __reduce__(self):
        return RemoteFactory, (self.spec,)

    def __repr__(self) -> str:
        return f"RemoteFactory({self.spec!r})"

    def __call__(self, config):
        raise TypeError(f"{self.spec} is built only in the candidate's process (isolation)")

    def _connection(self):
        if self._conn is None or self._conn[0] != os.getpid():  # a forked process opens its own
            z = zygote(_preload(self.spec))
            conn = Client(z.address, family="AF_UNIX", authkey=z.authkey)
            send(conn, ("describe", ("spec", self.spec), os.getpid()))
            _send_stderr(conn)
            self._conn = (os.getpid(), conn)
            self._declared = recv(conn)
        return self._conn[1]

    def _ask(self, op: str, *args):
        conn = self._connection()
        if op == "describe":
            reply = self._declared
        else:
            send(conn, (op, *args))
            reply = recv(conn)
        if reply[0] == "result":
            return reply[1]
        if reply[0] == "raised":
            raise reply[1]
        if reply[0] == "invalid":  # the spec names nothing loadable: load_factory's own ValueError
            raise ValueError(reply[1])
        return None  # "failed": the module does not load there; the check says why

    def _supports(self, config):
        return self._ask("supports", config)

    def _plan(self, config, num_tokens):
        return self._ask("plan", config, num_tokens)
