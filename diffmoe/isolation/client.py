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
from diffmoe.contract import resolve_factory
from diffmoe.findings import Finding, Oracles
from diffmoe.isolation import boundary
from diffmoe.isolation.messages import (
    AddressVerdicts, Handle, MessageError, RemoteOutput, RemoteWorkspaces, Unsendable, dumps, recv, send, series_answer,
    triples_of_str,
)
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
    from diffmoe.contract import IMPLEMENTATION_ALIASES, WHEEL_FUNCTIONS

    module = IMPLEMENTATION_ALIASES.get(spec, spec).split(":")[0]
    module = WHEEL_FUNCTIONS.get(module, module).split(":")[0]  # a peer wheel's function: its adapter's module
    return () if module.endswith(".py") else (module,)


def factory_reference(factory: Any, spec: str | None) -> tuple[tuple[str, Any], tuple[str, ...]]:
    """How the factory travels, and the modules the zygote may preload: a RemoteFactory by its spec; else
    pickled by reference (a module-level class or function), else its MODULE:FACTORY spec; a TypeError naming
    both when neither works (a closure or a lambda cannot be isolated: run it with isolation='none')."""
    if isinstance(factory, RemoteFactory):
        return ("spec", factory.spec), _preload(factory.spec)
    try:
        return ("pickle", pickle.dumps(factory)), (resolve_factory(factory).module or "",)
    except Exception as exc:  # noqa: BLE001 - pickling fails in many types
        if spec is not None:
            return ("spec", spec), _preload(spec)
        raise TypeError(
            f"isolation='process' sends the factory to the candidate's process by reference; {factory!r} does not "
            f"pickle ({type(exc).__name__}: {exc}): make it a module-level class or function, give its MODULE:FACTORY "
            "spec, or run with isolation='none'") from None


def judge_environment() -> dict[str, str]:
    """This process's environment for the candidate's child to take (sandbox._take_environment),
    with the peer cache named as this process resolves it now: inside the boundary HOME is the
    candidate's own folder, and the zygote's environment is that of the command that started it
    (a later command in the same process may name another cache)."""
    from diffmoe.adapters.peer_wheels import CACHE_ENV, cache_dir

    return {**os.environ, CACHE_ENV: str(cache_dir())}


def _send_stderr(conn) -> None:
    """The judge's stderr as it is now (fd 2: the CLI's, or a test's capture), for the child's
    stdout and stderr: what the implementation prints reaches the judge's stderr, never its stdout
    (a JSON report stays one document), and never a file the zygote inherited when it started."""
    reduction.send_handle(conn, 2, 0)


def refused_import_finding(module: str, importer: str) -> Finding:
    what = "diffmoe's reference" if module.split(".")[0] == "reference" else "diffmoe's judging code"
    return Finding(
        oracle=Oracles.CONTRACT,
        message=f"the implementation imported {module} ({importer}), {what}; the candidate's process refuses it "
                "(isolation: the candidate holds neither the reference, its results, nor the code that judges it)",
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
        self._zygote_pid = z.proc.pid
        self.conn = Client(z.address, family="AF_UNIX", authkey=z.authkey)
        send(self.conn, ("open", factory_ref, str(device), dumps(problem), torch.get_num_threads(), os.getpid(),
                         judge_environment()))
        _send_stderr(self.conn)
        self.pid = None
        try:
            reply = self._receive()
        except Crash as crash:  # the child ended while opening: every later call is that finding
            self._crash = crash
            return
        if not (reply[0] == "failed" and len(reply) == 3 and isinstance(reply[1], Finding)
                or reply[0] == "ready" and len(reply) == 3 and type(reply[1]) is int):
            self._gone = True
            self._crash = Crash(not_data(self.phase, MessageError(f"a {reply[0]!r} reply to the opening")))
        elif reply[0] == "failed":
            _, finding, attempts = reply
            self._note_attempts(attempts)
            # a refused import is why it failed to load: that contract finding, not the ImportError
            self._crash = Crash(self.pending.pop(0) if self.pending else finding)
        else:
            _, self.pid, attempts = reply
            if z.bounded:  # its pid in the boundary's pid namespace: the same process in this view
                self.pid = boundary.host_pid(self.pid, z.proc.pid)
            self._note_attempts(attempts)
            self._crash = None

    # ---- the protocol --------------------------------------------------------------------
    def _receive(self):
        while True:
            try:
                message = recv(self.conn)
                if not isinstance(message, tuple) or not message or not isinstance(message[0], str):
                    raise MessageError(f"a message that is not a tuple naming its kind ({type(message).__name__})")
            except MessageError as exc:  # its bytes are never used: the stream is not trusted after
                self._gone = True
                raise Crash(not_data(self.phase, exc)) from None
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
        if not triples_of_str(attempts):
            self._gone = True
            raise Crash(not_data(self.phase, MessageError("the refused attempts are not (what, subject, detail) strings")))
        for what, subject, detail in attempts:
            if (what, subject) not in self._refused:
                self._refused.add((what, subject))
                self.pending.append(refused_import_finding(subject, detail) if what == "import"
                                    else refused_access_finding(what, subject))

    def _request(self, op: str, *args):
        if self._crash is not None:  # the factory never loaded: every call is that finding
            raise self._crash
        if self._gone:
            raise Crash(Finding(oracle=Oracles.CRASH, message=f"the candidate's process had ended before {op}",
                                figures={"phase": self.phase}))
        send(self.conn, (op, *args))
        reply = self._receive()
        kind = reply[0]
        shape = _REPLIES.get(kind)
        if shape is None or len(reply) != len(shape) or not all(isinstance(v, t) for v, t in zip(reply, shape)):
            self._gone = True
            raise Crash(not_data(op, MessageError(f"a {kind!r} reply of {len(reply)} parts")))
        self._note_attempts(reply[-1])
        if kind == "result":
            expected = _RESULTS.get(op, object)
            if not isinstance(reply[1], expected):
                self._gone = True
                raise Crash(not_data(op, MessageError(f"{op} answered a {type(reply[1]).__name__}")))
            return reply[1]
        if kind == "crash":
            _, finding, pending, _ = reply
            if not isinstance(finding, Finding) or not all(isinstance(f, Finding) for f in pending):
                self._gone = True
                raise Crash(not_data(op, MessageError("a crash that is not findings")))
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
                if reply[0] == "closed" and type(reply[1]) in (int, float):
                    _CANDIDATE_CPU[0] += reply[1]
        except (OSError, EOFError, MessageError, TypeError, IndexError):
            pass
        self.conn.close()
        if self.pid and boundary.descends_from(self.pid, self._zygote_pid):
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
                poison_workspaces=None, address_oracles=(), schedule_selected=False, sample=None) -> Executed:
        executed = self._request("execute", impl, guarded, output, schedule, poison,
                                 None if problem is None else dumps(problem), what, attribute_input_writes,
                                 poison_workspaces, list(address_oracles), schedule_selected, sample)
        executed.findings = self.take_pending() + executed.findings
        return executed

    def series(self, config, problems, calls, schedule, whats, pattern):
        answer = self._request("series", config, dict(problems), list(calls), schedule, list(whats), pattern)
        if not series_answer(answer, len(calls)):
            self._gone = True
            raise Crash(not_data("series", MessageError("series answered other than (tensors by name, refused accesses) "
                                                        "per call and findings")))
        return answer

    def late_findings(self) -> list[Finding]:
        """Candidate.late_findings, asked before the process is closed; none once it has ended."""
        if self._crash is not None or self._gone:
            return []
        found = self._request("late_findings")
        if not all(isinstance(f, Finding) for f in found):
            self._gone = True
            raise Crash(not_data("late_findings", MessageError("late_findings answered other than findings")))
        return found

    def run_stage(self, impl, stage: str, inputs, what: str, sample=None):
        answer = self._request("run_stage", impl, stage, inputs, what, sample)
        if len(answer) != 2 or not isinstance(answer[0], (dict, Unsendable)) or not isinstance(answer[1], list):
            self._gone = True
            raise Crash(not_data("run_stage", MessageError("run_stage answered other than (outputs, findings)")))
        outputs, found = answer
        if not isinstance(outputs, dict):  # Unsendable: the type is what the contract finding names
            outputs = _TypeNamed(outputs.type_name)
        return outputs, self.take_pending() + found


# The replies the candidate's process may send (kind -> the types of its parts) and what each
# op's result must be: anything else is a `contract` finding, and the connection is not read again.
_REPLIES = {"result": (str, object, list), "crash": (str, Finding, list, list), "error": (str, str, str, list)}
_RESULTS = {"build": Handle, "has_run_stage": bool, "allocate": RemoteWorkspaces, "new_output": RemoteOutput,
            "execute": Executed, "run_stage": tuple, "take_refused": list, "series": tuple, "late_findings": list}


def refused_access_finding(what: str, subject: str) -> Finding:
    """A write outside the candidate's own folder, or a network socket, that its process refused."""
    kind = "open a network socket to" if what == "network" else f"{what}"
    return Finding(
        oracle=Oracles.CONTRACT,
        message=f"the implementation tried to {kind} {subject}; the candidate's process may write only its own "
                "temporary folder and has no network (isolation)",
        figures={"access": what, "path" if what != "network" else "address": subject},
    )


def not_data(phase: str, exc: Exception) -> Finding:
    """The `contract` finding for a message from the candidate's process that is not data of the
    wire format (diffmoe/isolation/codec.py): it is never used."""
    return Finding(
        oracle=Oracles.CONTRACT,
        message=f"the candidate's process sent, during {phase}, a message that is not data the judge reads ({exc}); "
                "it was not used (isolation: messages are data, never code)",
        figures={"phase": phase, "why": str(exc)},
    )


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
            send(conn, ("describe", ("spec", self.spec), os.getpid(), judge_environment()))
            _send_stderr(conn)
            self._conn = (os.getpid(), conn)
            self._declared = _read_reply(conn)
        return self._conn[1]

    def _ask(self, op: str, *args):
        conn = self._connection()
        if op == "describe":
            reply = self._declared
        else:
            send(conn, (op, *args))
            reply = _read_reply(conn)
        if reply[0] == "result":
            return reply[1]
        if reply[0] == "raised":  # the factory's own error: its type's name and message, as text
            raise _raised(reply[1], reply[2])
        if reply[0] == "invalid":  # the spec names nothing loadable: load_factory's own ValueError
            raise ValueError(reply[1])
        return None  # "failed": the module does not load there; the check says why

    def _supports(self, config):
        return self._ask("supports", config)

    def _plan(self, config, num_tokens):
        return self._ask("plan", config, num_tokens)


# The factory's errors that keep their type in the judge (builtins, by name); any other travels
# as a RuntimeError naming it: no class of the candidate's is ever looked up or built here.
_BUILTIN_ERRORS = {e.__name__: e for e in (ValueError, TypeError, KeyError, IndexError, AttributeError,
                                            NotImplementedError, RuntimeError, AssertionError, ImportError)}


def _raised(name: object, message: object) -> Exception:
    error = _BUILTIN_ERRORS.get(name) if isinstance(name, str) else None
    if name == "PeerError":  # diffmoe's own one-line error (a peer not cached): the CLI words it, exit 2
        from diffmoe.adapters.peer_wheels import PeerError as error
    return error(str(message)) if error is not None else RuntimeError(f"{str(name)[:80]}: {message}")


def _read_reply(conn) -> tuple:
    """A describe connection's reply; one that is not data of the wire format is a `failed` (the
    check then loads the implementation itself and reports what it finds)."""
    try:
        reply = recv(conn)
    except MessageError:
        return ("failed",)
    ok = isinstance(reply, tuple) and len(reply) >= 2 and reply[0] in ("result", "raised", "invalid", "failed")
    if ok and reply[0] == "raised" and (len(reply) < 3 or not all(isinstance(x, str) for x in reply[1:3])):
        ok = False
    return reply if ok else ("failed",)
