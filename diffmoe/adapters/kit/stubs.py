"""Stub modules made on demand: what a third-party file imports but the adapted path never calls.

A fused-MoE file imports far more than its Triton path uses (distributed helpers, other backends'
kernels, environment registries). `Stubs(prefixes, values)` answers every import of a module
under one of `prefixes` that the adapter did not load with a `StubModule`: any name read from it
is a `Placeholder`, which raises `NotImplementedError` naming the symbol the moment it is called
(so a stub that a run does reach is reported as exactly that, never as a wrong result), and any
submodule of it is another stub. `values` pins the names an import path does evaluate (an
`is_cuda()` read at import, a decorator): module name -> {name: value}.

Owns the stub modules, the placeholders and the import hook that makes them. Must not import an
implementation or know any package's names.
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib.abc
import importlib.machinery
import sys
import types
from typing import Any, Callable, ContextManager, Iterable, Iterator, Mapping


class Placeholder:
    """A name a stub module was asked for. Calling it, or calling anything read from it, raises
    NotImplementedError naming the symbol; reading an attribute gives the placeholder of that
    dotted name (a stubbed `envs.FLAG` is itself a placeholder)."""

    def __init__(self, symbol: str):
        self._symbol = symbol

    def __call__(self, *args, **kwargs):
        raise NotImplementedError(
            f"{self._symbol} is a stub: the adapted path imports it but was not expected to call it "
            "(give it a value in the adapter's Stubs(values=...) or a stand-in)")

    def __getattr__(self, name: str) -> Placeholder:
        if name.startswith("__"):
            raise AttributeError(name)
        return Placeholder(f"{self._symbol}.{name}")

    def __repr__(self) -> str:
        return f"<stub {self._symbol}>"


class StubModule(types.ModuleType):
    """A module every name of which is a Placeholder, but those given in `values`."""

    def __init__(self, name: str, values: Mapping[str, Any] | None = None):
        super().__init__(name, f"diffmoe stub of {name}")
        self.__path__ = []  # a package: its submodules are stubs too
        self.__dict__.update(values or {})

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        value = Placeholder(f"{self.__name__}.{name}")
        setattr(self, name, value)
        return value


class Stubs(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """The import hook: a module under one of `prefixes` that nothing else provides becomes a
    StubModule (with `values[name]` as its real names); `made` lists them, in import order."""

    def __init__(self, prefixes: Iterable[str], values: Mapping[str, Mapping[str, Any]] | None = None):
        self.prefixes = tuple(prefixes)
        self.values = {name: dict(v) for name, v in (values or {}).items()}
        self.made: list[str] = []

    def covers(self, fullname: str) -> bool:
        return any(fullname == p or fullname.startswith(p + ".") for p in self.prefixes)

    def module(self, name: str) -> StubModule:
        """The stub of `name` (its values included), made now."""
        return StubModule(name, self.values.get(name))

    def find_spec(self, fullname, path=None, target=None):
        if not self.covers(fullname):
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec):
        self.made.append(spec.name)
        return self.module(spec.name)

    def exec_module(self, module) -> None:
        module.__path__ = []

    def __enter__(self) -> Stubs:
        sys.meta_path.insert(0, self)
        return self

    def __exit__(self, *exc) -> None:
        sys.meta_path.remove(self)


def context_override(name: str) -> tuple[Callable[[], Any], Callable[[Any], ContextManager[None]]]:
    """(get, override) for a package's `get_config` / `override_config` pair as a stub value: `get()`
    is the value the innermost `with override(value):` block of this context forces, else None (vLLM's
    and SGLang's fused-MoE tile-config override hold one each; the adapters force tuned configs
    through it)."""
    forced: contextvars.ContextVar[Any] = contextvars.ContextVar(name, default=None)

    @contextlib.contextmanager
    def override(value: Any) -> Iterator[None]:
        token = forced.set(value)
        try:
            yield
        finally:
            forced.reset(token)

    return forced.get, override
