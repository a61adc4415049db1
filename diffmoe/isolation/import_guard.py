"""The import hook of the candidate's process: diffmoe's reference, oracles and tolerance are refused.

Owns: the refused module names, the meta-path finder that refuses them, and the record of every
attempt (module name and the importer's file), which the candidate's process reports as a
`contract` finding naming the module. An implementation that imports `reference` to copy its
result, or the oracles or the tolerance to read or patch what it is judged by, fails that import
there, and is named.

Refused: the reference package (`reference` and below), the one place expected values are
computed; the oracles (`diffmoe.oracles`) and the tolerance (`diffmoe.tolerance`), the code that
judges (issue 43: inside the OS boundary their folders are not in the candidate's view at all,
boundary.py). A test module that defines a factory beside its tests imports the public faces
(`diffmoe.runner`, `diffmoe.judge.runner`, `diffmoe.frontends.cli`, `diffmoe.pytest_plugin`):
those read the judge's names when first used (PEP 562), so importing them here needs none of the
refused packages (tests/house/test_architecture.py holds the candidate's modules to it).
"""

from __future__ import annotations

import sys
import threading
from dataclasses import dataclass

REFUSED_PACKAGES = ("reference", "diffmoe.oracles", "diffmoe.tolerance")


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
            f"{name} is diffmoe's reference or judging code, which the candidate's process refuses to import "
            "(diffmoe/isolation/import_guard.py)", name=name)

    def take(self) -> list[Attempt]:
        with self._lock:
            found, self.attempts = self.attempts, []
        return found


def forget_refused() -> None:
    """Drop the refused modules a forked process inherited (a zygote forked from a judge that
    imported its oracles): a later import of them then goes through the guard."""
    for name in [n for n in sys.modules if refused(n)]:
        parent, _, child = name.rpartition(".")
        del sys.modules[name]
        if parent in sys.modules and getattr(sys.modules[parent], child, None) is not None:
            try:
                delattr(sys.modules[parent], child)
            except AttributeError:
                pass


def install() -> ImportGuard:
    """Install the guard first on sys.meta_path (once); returns it."""
    for finder in sys.meta_path:
        if isinstance(finder, ImportGuard):
            return finder
    guard = ImportGuard()
    sys.meta_path.insert(0, guard)
    return guard
