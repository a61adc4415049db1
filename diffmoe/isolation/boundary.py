"""The OS boundary around the candidate's process (issue 43): who it runs as, what it sees.

Owns: whether the boundary can be set up here (`available`, probed once), the command that
starts the zygote inside it (`wrap`), the one-line notice when it cannot, and the audit hook
of the candidate's process (`watch_writes`): a write outside its own temporary folder, or a
network socket, is refused and kept, and the judge reports each as a `contract` finding naming
the path or the address.

Inside the boundary (bubblewrap, `apt-get install -y bubblewrap`): its own mount, network and
IPC namespaces; the whole file system read-only (the checkout, the venv, the peer cache); the
reference package, diffmoe/oracles/ and diffmoe/tolerance/ not present at all (an empty
read-only folder over each); one writable folder of its own
(its TMPDIR, also where the zygote's socket lives, so the judge reaches it); no network; and,
its own user and pid namespaces (uid 65534 inside, no capability outside; the judge's pid is not
in its view, so it can neither signal nor trace it).

Must not import the reference (the zygote imports this module).
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import tempfile

NOBODY = 65534
ENV = "DIFFMOE_BOUNDARY"  # set in the zygote: "1" inside the OS boundary, "0" without it
WRITABLE_ENV = "DIFFMOE_CANDIDATE_TMP"  # the candidate's own writable folder
# Folders the user grants the candidate besides its own (os.pathsep-separated; none by default):
# a kernel's scratch or cache folder, a test's folder where its candidate leaves its pid.
GRANT_ENV = "DIFFMOE_CANDIDATE_WRITABLE"
# diffmoe's folders of judging code, masked like the reference (import_guard.REFUSED_PACKAGES)
JUDGE_FOLDERS = ("oracles", "tolerance")


def granted() -> list[str]:
    return [os.path.realpath(p) for p in os.environ.get(GRANT_ENV, "").split(os.pathsep) if p and os.path.isdir(p)]
# How long the probe may take: bwrap starts in milliseconds; a machine that hangs it is refused.
_PROBE_SECONDS = 20


def _base(writable: str, hidden: list[str]) -> list[str]:
    args = ["bwrap", "--ro-bind", "/", "/", "--dev-bind", "/dev", "/dev", "--tmpfs", "/dev/shm", "--proc", "/proc",
            "--bind", writable, writable, "--unshare-net", "--unshare-ipc", "--unshare-uts", "--die-with-parent"]
    for path in hidden:
        args += ["--tmpfs", path, "--remount-ro", path]
    for path in granted():
        args += ["--bind", path, path]
    # A user namespace (uid 65534 inside, no capability outside it) and a pid namespace: the judge's
    # pid is not in its view, so it can neither signal nor trace it. Not setpriv's real uid 65534:
    # that cannot read what the judge's user keeps private (pytest's 0700 tmp_path, a kernel file
    # under /root), which an honest --impl names.
    return args + ["--unshare-user", "--uid", str(NOBODY), "--gid", str(NOBODY), "--unshare-pid", "--"]


def hidden_paths() -> list[str]:
    """The folders not present in the candidate's view: the reference package (found without
    importing it), and diffmoe's oracles and tolerance (the code that judges; issue 43)."""
    import importlib.util

    package = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
    found = [os.path.join(package, name) for name in JUDGE_FOLDERS]
    try:
        spec = importlib.util.find_spec("reference")
    except (ImportError, ValueError):
        spec = None
    found += list(spec.submodule_search_locations or []) if spec is not None else []
    return [os.path.realpath(p) for p in found if os.path.isdir(p)]


OFF_ENV = "DIFFMOE_NO_BOUNDARY"  # "1": isolation without the boundary (a benchmark's baseline, a debugger)


def available() -> str | None:
    """None when the boundary can be set up here, else why not (one line)."""
    if os.environ.get(OFF_ENV) == "1":
        return f"{OFF_ENV}=1 is set"
    return _probe()


@functools.lru_cache(maxsize=None)
def _probe() -> str | None:
    if not sys.platform.startswith("linux"):
        return f"namespaces are Linux's ({sys.platform})"
    if shutil.which("bwrap") is None:
        return "bwrap is not installed (apt-get install -y bubblewrap)"
    probe = tempfile.mkdtemp(prefix="diffmoe-probe-")
    try:
        done = subprocess.run([*_base(probe, []), "true"], capture_output=True, timeout=_PROBE_SECONDS)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bwrap did not start ({type(exc).__name__})"
    finally:
        shutil.rmtree(probe, ignore_errors=True)
    if done.returncode != 0:
        lines = done.stderr.decode(errors="replace").strip().splitlines()
        return f"bwrap cannot make namespaces here ({lines[-1] if lines else f'exit {done.returncode}'})"
    return None


def notice() -> str | None:
    """The one line a report starts with when the boundary is not set up, naming what is then
    not guaranteed; None inside it."""
    why = available()
    if why is None:
        return None
    return (f"isolation without the OS boundary ({why}): the candidate's process runs as this user, may write the "
            "checkout and the venv and open sockets (only what Python's audit hook sees is refused), and may read "
            "the reference's, the oracles' and the tolerance's sources")


# The longest path of the candidate's folder: the zygote's socket in it (SOCKET_NAME) must stay
# within the 107 bytes of a Unix socket's name (under pytest's tmp_path as TMPDIR, multiprocessing's
# own socket path inside the folder was 126 bytes and the zygote ended at its start).
_FOLDER_MAX_BYTES = 96
SOCKET_NAME = "zygote"


def candidate_folder() -> str:
    """A new folder for a zygote and its candidates (their TMPDIR, the zygote's socket): under
    the temporary folder, or under /tmp where that path is too long for a socket. The judge that
    made it removes it when the zygote stops (zygote.py); a judge killed with SIGKILL cannot, so
    the folders of dead judges are removed here first (_sweep)."""
    prefix = f"{_FOLDER_PREFIX}{_pid_namespace()}-{os.getpid()}-"
    _sweep(tempfile.gettempdir())
    folder = tempfile.mkdtemp(prefix=prefix)
    if len(os.fsencode(folder)) <= _FOLDER_MAX_BYTES or not os.path.isdir("/tmp"):
        return folder
    os.rmdir(folder)
    _sweep("/tmp")
    return tempfile.mkdtemp(prefix=prefix, dir="/tmp")


_FOLDER_PREFIX = "diffmoe-candidate-"


def _pid_namespace() -> int:
    """This process's pid namespace (its inode; 0 where /proc does not say): a folder's judge pid
    is asked about only in the namespace that pid belongs to (a /tmp shared between containers)."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


def _sweep(parent: str) -> None:
    """Remove the candidates' folders under `parent` whose judge, in this pid namespace, is gone
    (measured: a SIGKILLed `diffmoe check` left its folder and the zygote's socket; a full test
    suite, which kills judges on purpose, left two). A folder of another namespace, of a live pid
    or of a name this release does not write is left alone."""
    namespace = _pid_namespace()
    if not namespace:
        return
    mine = f"{_FOLDER_PREFIX}{namespace}-"
    try:
        names = [n for n in os.listdir(parent) if n.startswith(mine)]
    except OSError:
        return
    for name in names:
        pid = name[len(mine):].split("-", 1)[0]
        if not pid.isdigit() or pid_alive(int(pid)):
            continue
        shutil.rmtree(os.path.join(parent, name), ignore_errors=True)


def pid_alive(pid: int) -> bool:
    """Whether process `pid` exists in this pid namespace (one owned by another user counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def wrap(command: list[str], writable: str) -> tuple[list[str], dict[str, str]]:
    """`command` inside the boundary, with `writable` (candidate_folder) its one writable folder,
    and the environment entries it needs; `command` as it is (and the audit hook's folder only)
    without it."""
    env = {WRITABLE_ENV: writable, "TMPDIR": writable, "PYTHONDONTWRITEBYTECODE": "1"}
    if available() is not None:
        return command, {**env, ENV: "0"}
    from diffmoe.adapters.peer_wheels import CACHE_ENV, cache_dir

    # HOME moves to the writable folder, so the peer cache (read-only in the view) is named as the
    # judge resolves it: under the candidate's HOME a peer was "not in the peer cache"
    env.update({ENV: "1", "TRITON_CACHE_DIR": os.path.join(writable, "triton"), "HOME": writable,
                CACHE_ENV: str(cache_dir())})
    return [*_base(writable, hidden_paths()), *command], env


def host_pid(inner: int, ancestor: int) -> int | None:
    """The pid, in this process's view, of the process that is `inner` in the boundary's pid
    namespace and runs below `ancestor` (bwrap): a scan of /proc's NSpid lines."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as status:
                line = next((x for x in status if x.startswith("NSpid:")), "")
        except OSError:
            continue
        ids = line.split()[1:]
        if len(ids) > 1 and ids[-1] == str(inner) and _below(int(entry), ancestor):
            return int(entry)
    return None


def descends_from(pid: int, ancestor: int) -> bool:
    """Whether `pid` is a process below `ancestor` (the zygote, or the boundary that runs it): the
    candidate names its own pid, and the judge kills that group only when it is the zygote's."""
    return _below(pid, ancestor) if os.path.isdir("/proc") else True  # no /proc to ask: as before


def _below(pid: int, ancestor: int, depth: int = 4) -> bool:
    for _ in range(depth):
        try:
            with open(f"/proc/{pid}/stat", "rb") as stat:
                pid = int(stat.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return False
        if pid == ancestor:
            return True
    return False


# ---- inside the candidate's process ------------------------------------------------------
_EVENTS: list[tuple[str, str]] = []  # (what, path or address) refused, not yet reported
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
_PATH_EVENTS = {"os.remove", "os.rename", "os.mkdir", "os.rmdir", "os.symlink", "os.link", "os.truncate",
                "os.chmod", "os.chown", "os.utime", "shutil.rmtree", "shutil.move"}
_SOCKET_EVENTS = {"socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg"}
_DEVICES = ("/dev/null", "/dev/stdout", "/dev/stderr", "/dev/tty", "/dev/shm/", "/dev/nvidia", "/proc/self/")


def _writes(mode, flags) -> bool:
    if isinstance(mode, str):
        return any(c in mode for c in "wax+")
    return isinstance(flags, int) and flags & _WRITE_FLAGS != 0


_WATCHED: list[str] = []  # the folder watch_writes lets this process write


def scratch_env() -> dict[str, str]:
    """Where this process's temporary files and torch's compile cache go: inside the folder
    watch_writes allows (torch made /tmp/torchinductor_root when a check's child took a judge's
    environment without TMPDIR, a refused write and a `contract` finding on an honest kernel)."""
    if not _WATCHED:
        return {}
    return {"TMPDIR": _WATCHED[0], "TORCHINDUCTOR_CACHE_DIR": os.path.join(_WATCHED[0], "torchinductor")}


def watch_writes(writable: str) -> None:
    """Refuse and keep, in this process, every write outside `writable` and every network socket
    (an audit hook: once added it cannot be removed). The OS boundary makes them fail too; this
    is how the judge learns of them, as data."""
    own = tuple(p + os.sep for p in [os.path.realpath(writable), *granted()])
    _WATCHED[:] = [os.path.realpath(writable)]

    def outside(path) -> str | None:
        if isinstance(path, int) or path is None:
            return None
        text = os.fsdecode(path)
        full = os.path.realpath(text)
        if (full + os.sep).startswith(own) or full.startswith(_DEVICES) or text.startswith(_DEVICES):
            return None
        return full

    def hook(event: str, args: tuple) -> None:
        if event == "open":
            if len(args) >= 3 and _writes(args[1], args[2]):
                path = outside(args[0])
                if path is not None:
                    _refuse("write", path)
        elif event in _PATH_EVENTS:
            path = outside(args[0]) if args else None
            if path is not None:
                _refuse(event.split(".")[1], path)
        elif event in _SOCKET_EVENTS and len(args) >= 2:
            address = args[1] if event != "socket.sendmsg" else args[-1]
            if isinstance(address, (str, bytes)) and outside(address) is None:
                return  # a UNIX socket in its own folder
            _refuse("network", repr(address))

    sys.addaudithook(hook)


def _refuse(what: str, where: str) -> None:
    _EVENTS.append((what, where))
    raise PermissionError(f"the candidate's process may not {what} {where} (diffmoe isolation)")


def take_events() -> list[tuple[str, str]]:
    found = list(_EVENTS)
    del _EVENTS[:]
    return found
