"""The import hook of the candidate's process: diffmoe's reference is refused.

Owns: the refused module names, the meta-path finder that refuses them, and the record of every
attempt (module name and the importer's file), which the candidate's process reports as a
`contract` finding naming the module. An implementation that imports `reference` to copy its
result fails that import there, and is named.

Refused: the reference package (`reference` and below), the one place expected values are
computed. The judge's modules (the comparison, the oracles, the runner) may be imported there:
a test module that defines a factory beside its tests imports them, and refusing it would be a
false alarm on a correct kernel (every such module in tests/ was one). They judge nothing there:
every verdict is made in the judge's process, on the bytes the candidate returned, so patching
them in the candidate's process changes nothing (tests/test_exploits.py's PatchesTheComparison).
None of them imports the reference at import time (diffmoe/check/execution.py imports it where
it runs), and tests/test_isolation.py holds that the candidate's process holds no reference.
"""

from __future__ import annotations

import sys
import threading
from dataclasses import dataclass

REFUSED_PACKAGES = ("reference",)


def refused(name: str) -> bool:
    """Whether the candidate's process refuses to import module `name`."""
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
            f"{name} is diffmoe's reference, which the candidate's process refuses to import "
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
