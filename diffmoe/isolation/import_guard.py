"""The import hook of the candidate's process: diffmoe's reference and judging code are refused.

Owns: the refused module names, the meta-path finder that refuses them, and the record of every
attempt (module name and the importer's file), which the candidate's process reports as a
`contract` finding naming the module. An implementation that imports `reference` to copy its
result, or the comparison to patch it, fails its import there and is named.

Refused: the reference package (`reference` and below), the tolerance package (the comparison
and its tables), the oracles (but `guards`, the guarded buffers the candidate's side allocates,
and `address_analysis`, which the interpreter's address recorder uses), the check's judging
modules (`diffmoe.check.execution`, `diffmoe.check.runner`, the `diffmoe.runner` face) and every
front end (they import the runner). Modules already imported before the guard is installed are
not affected: the candidate's process installs it before importing anything that could import
them (sandbox.py), and tests/test_isolation.py holds that none of them is in that process.
"""

from __future__ import annotations

import sys
import threading
from dataclasses import dataclass

REFUSED_PACKAGES = (
    "reference",
    "diffmoe.tolerance",
    "diffmoe.oracles",
    "diffmoe.check.execution",
    "diffmoe.check.runner",
    "diffmoe.runner",
    "diffmoe.frontends",
    "diffmoe.fuzz",
    "diffmoe.pytest_plugin",
)
ALLOWED = frozenset({
    "diffmoe.oracles",  # the package itself imports nothing (diffmoe/oracles/__init__.py)
    "diffmoe.oracles.guards",
    "diffmoe.oracles.address_analysis",
})


def refused(name: str) -> bool:
    """Whether the candidate's process refuses to import module `name`."""
    if name in ALLOWED:
        return False
    return any(name == p or name.startswith(p + ".") for p in REFUSED_PACKAGES)


@dataclass(frozen=True)
class Attempt:
    module: str
    importer: str  # the file whose code asked for it, or "?"


class RefusedImport(ImportError):
    pass


def _importer() -> str:
    """The first frame outside the import machinery and this module: who asked."""
    frame = sys._getframe(2)
    while frame is not None:
        filename = frame.f_code.co_filename
        if not filename.startswith("<frozen importlib") and filename != __file__:
            return f"{filename}:{frame.f_lineno}"
        frame = frame.f_back
    return "?"


class ImportGuard:
    """A meta-path finder placed first: refuses the names `refused` names, keeps the attempts."""

    def __init__(self) -> None:
        self.attempts: list[Attempt] = []
        self._lock = threading.Lock()

    def find_spec(self, name, path=None, target=None):
        if not refused(name):
            return None
        with self._lock:
            self.attempts.append(Attempt(name, _importer()))
        raise RefusedImport(
            f"{name} is diffmoe's reference or judging code, which the candidate's process refuses to import "
            "(diffmoe/isolation/import_guard.py)", name=name)

    def take(self) -> list[Attempt]:
        with self._lock:
            found, self.attempts = self.attempts, []
        return found


def install() -> ImportGuard:
    """Install the guard first on sys.meta_path (once); returns it."""
    for finder in sys.meta_path:
        if isinstance(finder, ImportGuard):
            return finder
    guard = ImportGuard()
    sys.meta_path.insert(0, guard)
    return guard
