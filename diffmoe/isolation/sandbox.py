"""The candidate's process: a clean zygote that forks one child per check, and the child's service.

Owns: the zygote (`zygote_main`, started by client.py in a fresh interpreter), which installs the import guard
before anything else, imports torch, the candidate's side of a check and the modules it is
asked to preload (the implementation's), warms the interpreter's rewrites, then accepts one
connection per check and forks a child for it; and the child, which loads the factory, receives
the problem as bytes and serves diffmoe.check.candidate.Candidate's methods, one request at a
time, instances and workspaces kept here and named to the judge by handles.

Why a zygote: a fresh interpreter per check costs the imports of torch and Triton again (about
1.4 s measured on this 2-core machine, `python -c "import torch"`); a fork of a process that
already holds them, and never held the reference or the judge, costs a few milliseconds.

Must not import the reference, before the guard or after (import_guard.py).

Longer than 400 lines because the zygote and the child it forks are one process's two lives:
the child inherits the zygote's guard, warm-up and signal state, and the zygote's stop reaps
what the children left; split, each half would re-derive the other's state.

Messages are data (codec.py, `send`/`recv`), never pickles nor shared memory: what the candidate
returns is a copy, which it cannot change after it returned, and which runs no code in the judge;
what the implementation hands back that is not data is a `contract` finding made here.
"""

from __future__ import annotations

import ctypes
import gc
import importlib
import os
import pickle
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
from multiprocessing import reduction
from typing import Any

from diffmoe.isolation import boundary, import_guard
from diffmoe.isolation.codec import encode
from diffmoe.isolation.messages import AddressVerdicts, Handle, RemoteOutput, RemoteWorkspaces, Unsendable, loads, recv, send

_GUARD = import_guard.ImportGuard()  # installed by zygote_main, first

# How often a child checks that its judge is still alive: a judge killed by its time limit
# (diffmoe/check/worker.py kills the worker's process group, which a zygote's child is not in)
# must not leave a spinning kernel behind for longer than this.
JUDGE_POLL_SECONDS = 0.25
_PR_SET_PDEATHSIG = 1  # linux/prctl.h
PARENT_ENV = "DIFFMOE_ZYGOTE_PARENT"  # the pid of the process that started a spawned zygote


def _die_with_parent(parent: int) -> None:
    """SIGTERM when the process that started the zygote (`parent`) dies, however it dies: the
    zygote then stops its children (`_stop_children`) rather than leave them to an init that may
    not reap. A parent already gone before the request took effect: the zygote ends at once (seen:
    a zygote whose CLI was interrupted during its start outlived it by hours)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):
        pass
    if os.environ.get(boundary.ENV) == "1":  # inside, bwrap is its parent, and dies with the judge
        _watch_parent(os.getppid())
    elif os.getppid() != parent:
        os._exit(0)


def _watch_parent(ppid: int) -> None:
    """Stop when the zygote's parent (bwrap) is gone: its death signal does not reach a process
    whose uid setpriv changed (seen: a zygote outlived its judge)."""
    def watch() -> None:
        while os.getppid() == ppid:
            time.sleep(JUDGE_POLL_SECONDS)
        _stop_children()

    threading.Thread(target=watch, name="diffmoe-parent-watch", daemon=True).start()


_CHILDREN: set[int] = set()
# How long the zygote, told to stop, waits for its killed children to be reaped.
_REAP_SECONDS = 2.0


def _stop_children(signum=None, frame=None) -> None:
    """Kill every child's process group, wait (bounded) until they are reaped, exit."""
    for pid in list(_CHILDREN):
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    deadline = time.monotonic() + _REAP_SECONDS
    while _CHILDREN and time.monotonic() < deadline:
        for pid in list(_CHILDREN):
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                _CHILDREN.discard(pid)
        time.sleep(0.01)
    folder = os.environ.get(boundary.WRITABLE_ENV)
    if folder:  # its judge removes it too, unless the judge was killed (inside the boundary the
        shutil.rmtree(folder, ignore_errors=True)  # folder itself is a mount point: its contents go)
    os._exit(0)


def _judge_gone(conn) -> bool:
    """Inside the boundary the judge's pid is not in view: its end of the connection closed."""
    import socket

    with socket.socket(fileno=os.dup(conn.fileno())) as peer:
        try:
            return peer.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
        except (BlockingIOError, InterruptedError):
            return False
        except OSError:
            return True


def _watch_judge(pid: int, conn=None) -> None:
    """End this child, and everything it started (its process group), when the judge that opened
    it is gone (a thread: the main one may be inside a kernel that never returns)."""
    bounded = os.environ.get(boundary.ENV) == "1"

    def watch() -> None:
        while True:
            time.sleep(JUDGE_POLL_SECONDS)
            try:
                if bounded and _judge_gone(conn):
                    raise ProcessLookupError
                if not bounded:
                    os.kill(pid, 0)
            except ProcessLookupError:
                try:
                    os.killpg(0, signal.SIGKILL)
                finally:
                    os._exit(0)
            except PermissionError:
                pass

    threading.Thread(target=watch, name="diffmoe-judge-watch", daemon=True).start()


class _Service:
    """One check's candidate: the factory, the problem, the objects its handles name."""

    def __init__(self, conn, candidate) -> None:
        self.conn = conn
        self.candidate = candidate
        self.objects: dict[int, Any] = {}

    def keep(self, obj: Any) -> int:
        self.objects[len(self.objects) + 1] = obj
        return len(self.objects)

    def get(self, handle):
        return None if handle is None else self.objects[handle.id]

    # each op: the arguments as the judge sent them -> the value sent back
    def op_build(self, config):
        return Handle(self.keep(self.candidate.build(config)))

    def op_workspace_shapes(self, impl, max_tokens):
        return self.candidate.workspace_shapes(self.get(impl), max_tokens)

    def op_workspace_plan(self, impl, num_tokens):
        return self.candidate.workspace_plan(self.get(impl), num_tokens)

    def op_has_run_stage(self, impl):
        return self.candidate.has_run_stage(self.get(impl))

    def op_allocate(self, shapes, what):
        guarded = self.candidate.allocate(shapes, what)
        return RemoteWorkspaces(self.keep(guarded), guarded.region_names())

    def op_new_output(self, num_tokens, hidden, pattern):
        from diffmoe.check.candidate import TensorIdentity

        out = self.candidate.new_output(num_tokens, hidden, pattern)
        return RemoteOutput(self.keep(out), TensorIdentity.of(out.tensor))

    def op_execute(self, impl, guarded, output, schedule, poison, problem, what, attribute, poison_workspaces,
                   address_oracles, schedule_selected, sample=None):
        from diffmoe.check.candidate import TensorIdentity

        executed = self.candidate.execute(self.get(impl), self.get(guarded), self.get(output), schedule, poison,
                                          problem, what, attribute, poison_workspaces, address_oracles, schedule_selected,
                                          sample)
        run = executed.run
        if run.returned is not None:
            run.returned = TensorIdentity.of(run.returned)
        if run.addresses is not None:
            run.addresses = AddressVerdicts(run.addresses.findings(), run.addresses.store_extent_findings())
        return executed

    def op_series(self, config, problems, calls, schedule, whats, pattern):
        return self.candidate.series(config, problems, calls, schedule, whats, pattern)

    def op_late_findings(self):
        return self.candidate.late_findings()

    def op_take_refused(self):
        return self.candidate.take_refused()

    def op_run_stage(self, impl, stage, inputs, what, sample=None):
        import torch

        outputs, found = self.candidate.run_stage(self.get(impl), stage, inputs, what, sample)
        if isinstance(outputs, dict):
            outputs = {k: v.detach().clone() if isinstance(v, torch.Tensor) else v for k, v in outputs.items()}
        else:
            outputs = Unsendable(type(outputs).__name__)
        return outputs, found


def _attempts() -> list:
    """What the candidate's process refused since the last reply: imports of the reference, and
    writes and sockets (boundary.watch_writes), as (what, subject, detail) strings."""
    return ([("import", a.module, a.importer) for a in _GUARD.take()]
            + [(what, where, "") for what, where in boundary.take_events()])


# The environment entries of the boundary (its folder, Triton's cache in it), kept over the judge's
# environment that each check's child takes
_OWN_ENV = (boundary.ENV, boundary.WRITABLE_ENV, "TMPDIR", "TRITON_CACHE_DIR", "HOME", "PYTHONDONTWRITEBYTECODE")


def _take_environment(environ: dict) -> None:
    """The judge's environment now, not the zygote's at its start: what the implementation reads
    (a variable a test or a user set since, the peer cache a command names) is what it would read in
    the judge's process. The boundary's own entries stay (`_OWN_ENV`)."""
    if not isinstance(environ, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in environ.items()):
        raise TypeError("the judge's environment must be a dict of str to str")
    own = {k: os.environ[k] for k in _OWN_ENV if k in os.environ and os.environ.get(boundary.ENV) == "1"}
    os.environ.clear()
    os.environ.update(environ)
    os.environ.update(own)
    os.environ.update(boundary.scratch_env())
    tempfile.tempdir = None  # gettempdir() reads TMPDIR again


def serve(conn) -> None:
    """One check: open (factory, device, problem), then requests until close or EOF."""
    import torch

    from diffmoe.adapters.loading import load_factory
    from diffmoe.check.candidate import Candidate, Crash, crash_finding

    message = recv(conn)
    _print_to(reduction.recv_handle(conn))
    if message[0] == "describe":
        describe(conn, *message[1:])
        return
    _, factory_ref, device, problem_bytes, threads, judge_pid, environ = message
    _watch_judge(judge_pid, conn)
    _take_environment(environ)
    torch.set_num_threads(threads)
    try:
        kind, value = factory_ref
        factory = load_factory(value) if kind == "spec" else pickle.loads(value)
        problem = loads(problem_bytes)
    except BaseException as exc:  # noqa: BLE001 - the implementation's module failing to load is its finding
        if isinstance(exc, KeyboardInterrupt):
            raise
        send(conn, ("failed", crash_finding(exc, None, "loading the implementation in the candidate's process"),
                    _attempts()))
        return

    def progress(phase, stage) -> None:
        send(conn, ("progress", phase, stage))

    service = _Service(conn, Candidate(factory, torch.device(device), problem, progress))
    send(conn, ("ready", os.getpid(), _attempts()))
    while True:
        try:
            request = recv(conn)
        except EOFError:
            return
        op, args = request[0], request[1:]
        if op == "close":  # its CPU seconds: what isolation costs is counted in both processes
            send(conn, ("closed", time.process_time()))
            return
        if op == "execute" and args[5] is not None:
            args = (*args[:5], loads(args[5]), *args[6:])
        try:
            value = getattr(service, "op_" + op)(*args)
        except Crash as crash:
            send(conn, ("crash", crash.finding, service.candidate.take_pending(), _attempts()))
            continue
        except BaseException as exc:  # noqa: BLE001 - a harness failure goes back as text
            if isinstance(exc, KeyboardInterrupt):
                raise
            send(conn, ("error", f"{type(exc).__name__}: {exc}", traceback.format_exc(), _attempts()))
            continue
        try:
            data = encode(("result", value, _attempts()))
        except TypeError as exc:  # the implementation handed back an object, not data
            send(conn, ("crash", not_data_finding(op, exc), service.candidate.take_pending(), _attempts()))
            continue
        conn.send_bytes(data)


def not_data_finding(what: str, exc: BaseException):
    """The `contract` finding for an answer that is not data of the wire format (codec.py)."""
    from diffmoe.findings import Finding, Oracles

    return Finding(oracle=Oracles.CONTRACT,
                   message=f"the implementation's answer to {what} is not data the judge reads: {exc} (only numbers, "
                           "strings, tensors and diffmoe's own records cross to the judge: isolation)",
                   figures={"phase": what, "why": str(exc)})


def describe(conn, factory_ref, judge_pid: int, environ: dict) -> None:
    """A factory's declarations for a judge that does not load its module (client.RemoteFactory):
    its attributes once, then `supports` and `plan` per request, under the judge's environment (a
    plan read the peer cache of the zygote's start: a fuzz whose command named an empty cache found
    the wheel a test before it had used, and judged a plan the user's cache could not build)."""
    from diffmoe import contract
    from diffmoe.adapters.loading import load_factory
    from diffmoe.check.candidate import crash_finding

    _watch_judge(judge_pid, conn)
    _take_environment(environ)
    try:
        factory = load_factory(factory_ref[1]) if factory_ref[0] == "spec" else pickle.loads(factory_ref[1])
    except ValueError as exc:
        attempts = _attempts()
        if not attempts:  # nothing refused: the spec names nothing loadable (a usage error in the judge)
            send(conn, ("invalid", str(exc), attempts))
            return
        send(conn, ("failed", crash_finding(exc, None, "loading the implementation in the candidate's process"), attempts))
        return
    try:
        declared = contract.declared_attributes(factory)
    except BaseException as exc:  # noqa: BLE001 - reported by the check that then cannot load it either
        if isinstance(exc, KeyboardInterrupt):
            raise
        send(conn, ("failed", crash_finding(exc, None, "loading the implementation in the candidate's process"),
                    _attempts()))
        return
    try:
        conn.send_bytes(encode(("result", declared, _attempts())))
    except TypeError as exc:
        send(conn, ("failed", not_data_finding("the factory's attributes", exc), _attempts()))
        return
    while True:
        try:
            request = recv(conn)
        except EOFError:
            return
        try:
            if request[0] == "supports":
                value = contract.unsupported(factory, request[1])
            elif request[0] == "plan":
                value = contract.factory_plan(factory, request[1], request[2])
            else:
                return
        except BaseException as exc:  # noqa: BLE001 - raised again in the judge, as the factory's own error
            if isinstance(exc, KeyboardInterrupt):
                raise
            send(conn, ("raised", type(exc).__name__, str(exc), _attempts()))
            continue
        try:
            data = encode(("result", value, _attempts()))
        except TypeError as exc:
            data = encode(("raised", "TypeError", f"{request[0]} returned what is not data: {exc}", _attempts()))
        conn.send_bytes(data)


def _print_to(fd: int) -> None:
    """This child's stdout and stderr become the judge's stderr (client._send_stderr)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


# The config of the zygote's warm-up call: small, fp8 (the quantisation kernels and both GEMMs).
_WARM_CONFIG = dict(num_tokens=4, num_experts=2, topk=2, hidden=128, inter=128, quant="fp8-token", fused=False)


def _warm_interpreter() -> None:
    """One call of diffmoe's own shipped kernels on a small problem, under the interpreter only:
    the interpreter's per-process memos (numpy dtypes, block types, shapes: diffmoe.interpreter.
    fast_path) and the kernels' rewrites are filled once here, not in every child (a child that
    starts cold paid about 0.4 s of CPU more per check: bench/ab_isolation.py). The candidate's own
    code never runs here: whatever it keeps between calls starts empty in every child."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        return
    try:
        import torch

        from diffmoe.contract import DEFAULT_IMPLEMENTATION, Schedule
        from diffmoe.adapters.loading import load_factory
        from diffmoe.check.candidate import Candidate
        from diffmoe.check.guards import POISON_PATTERNS
        from diffmoe.problem.config import MoEConfig
        from diffmoe.problem.inputs import make_problem

        config = MoEConfig(**_WARM_CONFIG)
        cpu = torch.device("cpu")  # TRITON_INTERPRET=1: the kernels run on the CPU
        candidate = Candidate(load_factory(DEFAULT_IMPLEMENTATION), cpu, make_problem(config, cpu))
        impl = candidate.build(config)
        guarded = candidate.allocate(candidate.workspace_shapes(impl, config.num_tokens), "warm-up")
        output = candidate.new_output(config.num_tokens, config.hidden)
        # as a check's first run (the address recorder) and a later order's (the program order)
        candidate.execute(impl, guarded, output, Schedule(), POISON_PATTERNS[0], address_oracles=("races",))
        candidate.execute(impl, guarded, output, Schedule.parse("reversed"), POISON_PATTERNS[1])
    except Exception:  # noqa: BLE001 - a warm-up that fails only leaves the children cold
        pass


def zygote_main(preload: list[str]) -> None:
    """A zygote in a fresh interpreter: the authentication key from stdin, the address to stdout."""
    sys.meta_path.insert(0, _GUARD)  # before anything below imports more of diffmoe
    parent = int(os.environ.get(PARENT_ENV, os.getppid()))
    authkey = sys.stdin.buffer.read(32)
    _zygote(authkey, preload, lambda address: (sys.stdout.write(address + "\n"), sys.stdout.flush()), parent)


def forked_zygote(authkey: bytes, preload: list[str], announce_fd: int, parent: int, folder: str) -> None:
    """A zygote forked from a judge that holds no reference yet (client.zygote says when): the
    address to `announce_fd`, `folder` its candidates' own (their TMPDIR, its socket). Never returns."""
    code = 1
    try:
        os.environ.update({boundary.WRITABLE_ENV: folder, "TMPDIR": folder})
        tempfile.tempdir = None
        sys.meta_path.insert(0, _GUARD)
        import_guard.forget_refused()  # the judge's oracles and tolerance, imported before the fork
        os.setsid()  # its own session, as the spawned zygote's: a terminal's signals are the judge's
        if hasattr(signal, "pthread_sigmask"):
            signal.pthread_sigmask(signal.SIG_SETMASK, set())
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGALRM):
            signal.signal(signum, signal.SIG_DFL)  # not the judge's handlers, inherited by fork

        def announce(address: str) -> None:
            os.write(announce_fd, (address + "\n").encode())
            os.close(announce_fd)

        _zygote(authkey, preload, announce, parent)
        code = 0
    finally:
        os._exit(code)


def _zygote(authkey: bytes, preload: list[str], announce, parent: int) -> None:
    """Listen, preload, warm, announce the address, fork a child per check until stopped."""
    from multiprocessing import AuthenticationError
    from multiprocessing.connection import Listener

    _die_with_parent(parent)
    folder = os.environ.get(boundary.WRITABLE_ENV)
    # its socket in its candidates' folder, which its judge removes when it stops (multiprocessing's
    # default, a pymp-* folder of its own, outlived every zygote: one ends by os._exit)
    address = os.path.join(folder, boundary.SOCKET_NAME) if folder else None
    listener = Listener(address, family="AF_UNIX", authkey=authkey)
    # announced before the imports and the warm-up: the judge builds its problem and reference
    # meanwhile, and its first connection waits in the listener's backlog until they are done
    announce(listener.address)
    sys.dont_write_bytecode = True  # no .pyc beside the sources: every write outside its folder is refused
    boundary.watch_writes(os.environ.get(boundary.WRITABLE_ENV) or os.path.dirname(listener.address))
    os.dup2(2, 1)  # not into a pipe nobody reads, nor the judge's stdout (each child prints to its judge's stderr)
    import torch  # noqa: F401 - what every child needs, imported once here

    import diffmoe.check.candidate  # noqa: F401
    for name in preload:
        try:
            importlib.import_module(name)
        except BaseException:  # noqa: BLE001 - the child imports it again and reports what fails
            pass
    _GUARD.take()  # the zygote's attempts are nobody's finding: each child makes its own
    # (the writes and sockets of a preloaded module's import stay: every child reports them, since
    # no child imports it again)
    torch.set_num_threads(1)  # no OpenMP team before the forks (a child sets its judge's count)
    _warm_interpreter()
    if "triton" in sys.modules:
        from diffmoe.interpreter import fast_path

        fast_path.warm_rewrites()  # every child starts from the rewritten kernels
    # Everything imported and warmed so far stays out of the collector's reach in the children: a
    # collection there would write to every object's header, copying each page of the zygote's
    # heap it shares (copy-on-write), paid by every check
    gc.collect()
    gc.freeze()
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped by the kernel
    signal.signal(signal.SIGTERM, _stop_children)
    while True:
        try:
            conn = listener.accept()
        except (ConnectionError, EOFError, AuthenticationError):
            # a judge that left before the handshake ended (one stopped by a signal as it connected:
            # this traceback reached a stopped fuzz's stderr and the zygote died, 2026-12-08): no candidate
            continue
        pid = os.fork()
        if pid == 0:
            listener.close()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.setpgid(0, 0)  # its own group: stopping a candidate stops what it started, never the zygote
            code = 0
            try:
                serve(conn)
            except BaseException:  # noqa: BLE001
                code = 1
            finally:
                os._exit(code)
        conn.close()
        _CHILDREN.add(pid)
        for done in [p for p in _CHILDREN if not boundary.pid_alive(p)]:
            _CHILDREN.discard(done)

