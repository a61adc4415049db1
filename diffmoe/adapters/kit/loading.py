"""A third-party package's modules executed by path: from a pinned wheel, an installed
distribution or a folder, without running the package's `__init__` (which, for a serving engine,
imports the world) and without installing anything.

`load_modules(source, files, stubs=..., before=...)` executes each (module name, path inside the
source) of `files` in order, each seeing the ones before it, inside `stubs` (stubs.py: the
modules they import but the adapted path never calls). Every package a file's name lies in is
`before`'s module of that name (a stand-in module), else its stub when the stubs cover it, else
an empty module. The result, `LoadedModules`, maps
names to modules; `installed()` makes the package's names resolve to them while a run imports
some at call time, and puts `sys.modules` back afterwards.

Owns where a package's files come from and how they are executed. Must not import an
implementation or know any package's names.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import linecache
import sys
import types
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Mapping

from .stubs import Stubs


@dataclass(frozen=True)
class PackageSource:
    """Where a package's files are read from: `kind` 'folder' (the files at their paths below
    `where`), 'wheel' (members of the wheel file `where`) or 'distribution' (an installed one)."""

    kind: str
    where: str

    @classmethod
    def folder(cls, path) -> PackageSource:
        if not Path(path).is_dir():
            raise ValueError(f"folder must be an existing directory, got {str(path)!r}")
        return cls("folder", str(path))

    @classmethod
    def wheel(cls, path) -> PackageSource:
        if not zipfile.is_zipfile(path):
            raise ValueError(f"wheel must be a wheel (zip) file, got {str(path)!r}")
        return cls("wheel", str(path))

    @classmethod
    def distribution(cls, name: str) -> PackageSource:
        try:
            root = importlib.metadata.distribution(name).locate_file("")
        except importlib.metadata.PackageNotFoundError:
            raise ValueError(f"distribution must be an installed distribution, {name!r} is not installed") from None
        return cls("folder", str(root))

    def read(self, rel: str) -> tuple[str, str]:
        """The source text of the file `rel` and the file name its code objects carry."""
        if self.kind == "wheel":
            with zipfile.ZipFile(self.where) as zf:
                try:
                    return zf.read(rel).decode(), f"{self.where}/{rel}"
                except KeyError:
                    raise FileNotFoundError(f"{self.where} has no {rel}") from None
        path = Path(self.where) / rel
        return path.read_text(), str(path)


class LoadedModules(dict):
    """Module name -> module, as load_modules left them; `stubs` the hook they were loaded under."""

    stubs: Stubs | None = None

    @contextlib.contextmanager
    def installed(self):
        """`sys.modules` resolves each name here to its module (and, under the stubs' prefixes,
        any other name to a stub) while inside; every name is put back on the way out."""
        saved = {name: sys.modules.get(name) for name in self}
        present = set(sys.modules)
        sys.modules.update(self)
        hook = self.stubs if self.stubs is not None else contextlib.nullcontext()
        try:
            with hook:
                yield self
        finally:
            for name in set(sys.modules) - present - set(saved):
                if name in self or (self.stubs is not None and self.stubs.covers(name)):
                    del sys.modules[name]  # loaded or stubbed inside: not left behind for other code
            for name, module in saved.items():
                if module is None:
                    sys.modules.pop(name, None)
                else:
                    sys.modules[name] = module


def load_modules(source: PackageSource, files: Iterable[tuple[str, str]], *, stubs: Stubs | None = None,
                 before: Mapping[str, types.ModuleType] | None = None,
                 loaded_hook: Callable[[str, types.ModuleType], None] | None = None) -> LoadedModules:
    """Execute each (name, path in `source`) of `files` in order, see the module docstring;
    `loaded_hook(name, module)`, if given, right after each (before the next one imports it)."""
    files = list(files)
    loaded = LoadedModules(before or {})
    loaded.stubs = stubs
    for name, _ in files:
        parts = name.split(".")
        for i in range(1, len(parts)):
            package = ".".join(parts[:i])
            if package not in loaded and stubs is not None and stubs.covers(package):
                loaded[package] = stubs.module(package)  # its other names are stubs too (values given)
            elif package not in loaded:
                module = types.ModuleType(package)
                module.__path__ = []
                loaded[package] = module
    with loaded.installed():
        # the stub modules a file imports stay in `loaded`: a call-time import finds the same one
        for name, rel in files:
            text, filename = source.read(rel)
            # triton.jit reads a kernel's source through linecache: a wheel member has no file
            linecache.cache[filename] = (len(text), None, text.splitlines(True), filename)
            module = types.ModuleType(name)
            module.__file__ = filename
            module.__package__ = name.rpartition(".")[0]
            loaded[name] = sys.modules[name] = module
            exec(compile(text, filename, "exec"), module.__dict__)
            parent, _, attr = name.rpartition(".")
            if parent in loaded:
                setattr(loaded[parent], attr, module)
            if loaded_hook is not None:
                loaded_hook(name, module)
        for name, module in list(sys.modules.items()):
            if isinstance(module, types.ModuleType) and stubs is not None and stubs.covers(name) and name not in loaded:
                loaded[name] = module
    return loaded
