"""Import paths that moved: user code written against an earlier layout keeps working for one
release, with a `DeprecationWarning` naming the new path.

Two kinds of old path:

* a module that moved (`MOVED`): the layout before the concept folders had one flat module per
  idea (`diffmoe.vocabulary`, `diffmoe.report`, ...), and the contract lived in
  `diffmoe.adapters.contract` before it became `diffmoe.contract`. `import diffmoe.vocabulary`
  (or `from diffmoe.vocabulary import Buffers`) warns and gives a module whose attributes are the
  new module's, the same objects; it is not the new module (no second name in `sys.modules` for
  one module object: a tool that follows imports sees one path, the new one).
* a name a public module stopped exporting (`internal_names`): `diffmoe.config`, `diffmoe.runner`,
  `diffmoe.strategies` and `diffmoe.pytest_plugin` were the real modules, so any of their names
  could be imported; each now exports a declared `__all__`, and any other name of the module it
  comes from is still found there, with a warning that names that module.

Names that no longer exist anywhere are not kept: `diffmoe.cli.KNOWN_ORACLES` (the oracle
registry: `diffmoe.oracles.registry`) and `diffmoe.fuzz_workers.default_workers` (`--workers`
defaults to 1 since the fuzz runs its searches as Ray tasks).

Owns the table of moved paths and the finder that serves them. Must not import a concept folder
at import time: `diffmoe/__init__.py` installs the finder before anything else is read.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
import warnings
from typing import Any, Callable

# Old module path -> where it lives now. The flat layout's modules (diffmoe 0.1.0, before the
# concept folders) and the paths moved since (issue 44's layers: the contract to the ground, the
# judge above the oracles, the museum a feature folder, progress beside the long runs). The flat
# `diffmoe.museum` is the museum's folder now, which exports the old module's names.
MOVED: dict[str, str] = {
    "diffmoe.adapters.contract": "diffmoe.contract",
    "diffmoe.adapters.museum": "diffmoe.museum.exhibits",
    "diffmoe.check.differential_run": "diffmoe.judge.differential_run",
    "diffmoe.check.runner": "diffmoe.judge.runner",
    "diffmoe.frontends.progress": "diffmoe.cluster.progress",
    "diffmoe.oracles.address_analysis": "diffmoe.interpreter.address_analysis",
    "diffmoe.oracles.guards": "diffmoe.check.guards",
    "diffmoe.call_environment": "diffmoe.check.call_environment",
    "diffmoe.campaign": "diffmoe.fuzz.campaign",
    "diffmoe.cli": "diffmoe.frontends.cli",
    "diffmoe.compare": "diffmoe.tolerance.compare",
    "diffmoe.compile_gate": "diffmoe.backend.compile_gate",
    "diffmoe.conformance": "diffmoe.backend.conformance",
    "diffmoe.doctor": "diffmoe.backend.doctor",
    "diffmoe.edge_cases": "diffmoe.problem.edge_cases",
    "diffmoe.execution": "diffmoe.check.execution",
    "diffmoe.fuzz_database": "diffmoe.fuzz.database",
    "diffmoe.fuzz_tiers": "diffmoe.fuzz.tiers",
    "diffmoe.fuzz_workers": "diffmoe.fuzz.workers",
    "diffmoe.fuzzing": "diffmoe.fuzz.driver",
    "diffmoe.gemm_interval": "diffmoe.tolerance.gemm_interval",
    "diffmoe.grid_order": "diffmoe.interpreter.grid_order",
    "diffmoe.hypothesis_profiles": "diffmoe.fuzz.profiles",
    "diffmoe.interpreter_fixes": "diffmoe.interpreter.fixes",
    "diffmoe.interpreter_speed": "diffmoe.interpreter.fast_path",
    "diffmoe.oracles.interpreter_races": "diffmoe.interpreter.address_recorder",
    "diffmoe.peer_wheels": "diffmoe.adapters.peer_wheels",
    "diffmoe.plan_tier": "diffmoe.fuzz.plan_tier",
    "diffmoe.plan_view": "diffmoe.frontends.plan_view",
    "diffmoe.recording": "diffmoe.check.recording",
    "diffmoe.report": "diffmoe.check.report",
    "diffmoe.tolerances": "diffmoe.tolerance.table",
    "diffmoe.triton_pin": "diffmoe.interpreter.triton_pin",
    "diffmoe.vocabulary": "diffmoe.problem.vocabulary",
    "diffmoe.watchers": "diffmoe.check.watchers",
    "diffmoe.worker": "diffmoe.check.worker",
}

WHEN = "the old path goes in the next release"


def moved_message(old: str, new: str) -> str:
    return f"{old} moved to {new}: import it from there ({WHEN})"


class _Forward(types.ModuleType):
    """The module an old path gives: every attribute read reaches the new module."""

    def __init__(self, old: str, new: types.ModuleType):
        super().__init__(old, f"Moved to {new.__name__} ({WHEN}).")
        self.__dict__["_moved_to"] = new

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["_moved_to"], name)

    def __dir__(self) -> list[str]:
        return dir(self.__dict__["_moved_to"])


class _MovedLoader(importlib.abc.Loader):
    def __init__(self, new: str):
        self.new = new

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        # stacklevel 2 names the importing line: the warnings module skips importlib's own frames.
        warnings.warn(moved_message(spec.name, self.new), DeprecationWarning, stacklevel=2)
        return _Forward(spec.name, importlib.import_module(self.new))

    def exec_module(self, module: types.ModuleType) -> None:
        pass


class MovedFinder(importlib.abc.MetaPathFinder):
    """Finds the old paths of `MOVED` (and only those) for the import system."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None):
        new = MOVED.get(fullname)
        if new is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, _MovedLoader(new))


def install() -> None:
    """Put the finder on `sys.meta_path` once (the old paths are no files, so it may go last)."""
    if not any(isinstance(f, MovedFinder) for f in sys.meta_path):
        sys.meta_path.append(MovedFinder())


def internal_names(public: str, home: str, lazy: tuple[str, ...] = ()) -> Callable[[str], Any]:
    """A public module's `__getattr__` (PEP 562): a name of `lazy` (public, read from `home` when
    first used) is returned as is; a name it does not export but `home` has is returned with a
    warning naming `home`; any other name is the usual AttributeError."""

    def __getattr__(name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(f"module {public!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(home), name, _MISSING)
        if value is _MISSING:
            raise AttributeError(f"module {public!r} has no attribute {name!r}")
        if name in lazy:
            return value
        warnings.warn(f"{public}.{name} is not public: import it from {home} ({WHEN})", DeprecationWarning,
                      stacklevel=2)
        return value

    return __getattr__


_MISSING = object()
