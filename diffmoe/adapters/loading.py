"""Loading an implementation's factory from a spec: `MODULE:FACTORY`, `path/to/file.py:FACTORY`,
a peer's name (contract.IMPLEMENTATION_ALIASES), or a fused_experts family function
`FUNCTION_SPEC@FAMILY` (diffmoe.adapters.families), where FUNCTION_SPEC is `MODULE:FUNCTION` or a
function inside a pinned peer wheel, `NAME==V:FUNCTION` / `NAME==V:MODULE:FUNCTION`
(contract.WHEEL_FUNCTIONS: `sglang==0.5.23:fused_experts@sglang`).

Owns: importing the spec's module (a file under a name unique to its path; a module name from
the current directory too) and every failure of it as one clear ValueError. Used by the CLI,
the runner and, isolated, the candidate's process, so it must not import the reference or the
judge (diffmoe/isolation/).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys

from diffmoe.adapters import families
from diffmoe.contract import DEFAULT_IMPLEMENTATION, IMPLEMENTATION_ALIASES, WHEEL_FUNCTIONS, ImplementationFactory
from diffmoe.problem.config import quoted


FILE_MODULE_PREFIX = "diffmoe_impl_"  # the name of a module loaded from a file path, before the path


def file_modules() -> list:
    """The implementation modules this process loaded from a file path (`path/to/kernel.py:make`):
    known only here, under a name no other process can import (Ray's tasks get them by value)."""
    return [m for name, m in list(sys.modules.items()) if name.startswith(FILE_MODULE_PREFIX)]


def _import_impl_module(name: str):
    """The module of an --impl spec: a file path ending in .py, loaded under a name unique to its
    absolute path (once per process), or a module name, resolved from the current directory too
    (appended to sys.path, after everything installed) so that `--impl mymodule:make` works from
    the folder that holds mymodule.py without PYTHONPATH=."""
    if name.endswith(".py"):
        path = os.path.abspath(name)
        if not os.path.isfile(path):
            raise ImportError(f"no file {name!r} (from {os.getcwd()})")
        unique = FILE_MODULE_PREFIX + "".join(c if c.isalnum() else "_" for c in path)
        if unique in sys.modules:
            return sys.modules[unique]
        spec = importlib.util.spec_from_file_location(unique, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[unique] = module  # dataclasses, pickling and a fork-started worker look it up there
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[unique]
            raise
        return module
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.append(cwd)
    return importlib.import_module(name)


def wheel_function_spec(spec: object) -> tuple[str, str] | None:
    """(peer, path) of a function inside a pinned peer wheel, `NAME==V:PATH` with NAME==V one of
    contract.WHEEL_FUNCTIONS (PATH is `FUNCTION` or `MODULE:FUNCTION` inside the package), else None."""
    if not isinstance(spec, str):
        return None
    peer, sep, path = spec.partition(":")
    return (peer, path) if sep and peer in WHEEL_FUNCTIONS else None


def load_wheel_function(peer: str, path: str):
    """The function at `path` inside `peer`'s cached wheel, loaded by the peer's adapter with its stubs and
    stand-ins (the wheel itself is read at the first call: a missing one is the CLI's one line first)."""
    function = load_factory(WHEEL_FUNCTIONS[peer])(path)
    if not callable(function):
        raise ValueError(f"{WHEEL_FUNCTIONS[peer]} gave no function for {peer}:{path}")
    return function


def load_factory(spec: str) -> ImplementationFactory:
    """'MODULE:FACTORY' or 'path/to/file.py:FACTORY' -> the factory callable; a clear ValueError
    when it cannot be found. A module name is also looked up in the current directory.
    'MODULE:FUNCTION@FAMILY' is a fused_experts family function (diffmoe.adapters.families), and so is
    'NAME==V:[MODULE:]FUNCTION@FAMILY', the function inside a pinned peer wheel (wheel_function_spec).

    Whatever importing the module raises (an ImportError, a SyntaxError, any exception of its
    top-level code, even SystemExit; not KeyboardInterrupt) is that ValueError, naming the
    module and the error: the CLI's usage error (exit 2), not a traceback or a silent exit."""
    if isinstance(spec, str) and spec in IMPLEMENTATION_ALIASES:
        spec = IMPLEMENTATION_ALIASES[spec]
    if isinstance(spec, str) and families.SEPARATOR in spec:  # MODULE:FUNCTION@FAMILY: a fused_experts function
        function_spec, _, family = spec.rpartition(families.SEPARATOR)
        if family not in families.FAMILIES:
            raise ValueError(f"--family must be one of {list(families.FAMILIES)}, got {family!r} (in {spec!r})")
        wheel = wheel_function_spec(function_spec)
        function = load_wheel_function(*wheel) if wheel else load_factory(function_spec)
        return families.function_factory(function, family, spec)
    if wheel_function_spec(spec) is not None:
        raise ValueError(f"--impl {spec!r} is a function inside a peer wheel: name its signature, "
                         f"--fn {spec} --family {'|'.join(families.FAMILIES)} (or --impl {spec}@FAMILY)")
    if not isinstance(spec, str) or spec.count(":") != 1:
        raise ValueError(f"--impl must be MODULE:FACTORY, path/to/file.py:FACTORY or a peer's name "
                         f"({', '.join(IMPLEMENTATION_ALIASES)}) (e.g. {DEFAULT_IMPLEMENTATION}), got {spec!r}")
    module_name, attr = spec.split(":")
    try:
        module = _import_impl_module(module_name)
    except ImportError as exc:
        raise ValueError(f"--impl module {module_name!r} cannot be imported: {exc}") from None
    except KeyboardInterrupt:
        raise
    except SystemExit as exc:
        raise ValueError(f"--impl module {module_name!r} called sys.exit({quoted(exc.code)}) while being imported") from None
    except BaseException as exc:  # noqa: BLE001 - a broken module is the caller's to fix, with its error named
        # (a SyntaxError's text already names the file and line)
        raise ValueError(f"--impl module {module_name!r} cannot be imported: {type(exc).__name__}: {exc}") from None
    try:
        factory = getattr(module, attr, None)
    except Exception as exc:  # noqa: BLE001 - a module __getattr__ that raises
        raise ValueError(f"--impl {spec!r}: looking up {attr!r} raised {type(exc).__name__}: {exc}") from None
    if not callable(factory):
        raise ValueError(f"--impl {spec!r}: module {module_name!r} has no callable {attr!r}")
    return factory
