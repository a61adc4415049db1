"""The argument types and options several commands share: counts, seconds, --time-limit, --oracles,
--device, --impl / --fn / --family, --isolation, small files and writable paths.

Owns turning those arguments into values or a UsageError (one line, exit 2) before anything runs.
A config's own flags are diffmoe/frontends/config_flags.py's; a command's own flags are its module's
(diffmoe/frontends/commands/).
"""

from __future__ import annotations

import argparse
import os

from diffmoe.adapters.families import FAMILIES as FAMILY_NAMES
from diffmoe.frontends.exits import UsageError

# --time-limit's upper bound, the same as diffmoe.judge.runner.MAX_TIME_LIMIT (not imported: the
# runner pulls in torch, and argument errors must answer at once).
MAX_TIME_LIMIT_S = 7 * 24 * 3600


def _oracle_registry():
    """The one table of oracles (diffmoe/oracles/registry.py; its names cost no torch import), read
    when a command line is parsed: a module beside a factory that imports this one loads in the
    candidate's process, where diffmoe.oracles is refused (issue 43). crash and timeout are
    outcomes, not checks one can select."""
    from diffmoe.oracles import registry

    return registry


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def _positive_int(text: str) -> int:
    value = _non_negative_int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _time_limit(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not 0 <= value <= MAX_TIME_LIMIT_S:  # NaN fails this too
        raise argparse.ArgumentTypeError(f"must be in [0, {MAX_TIME_LIMIT_S}] seconds (0 turns the limit off), got {text}")
    return value


def time_limit_kwargs(runner, requested: float | None, device: str | None) -> dict[str, float]:
    """run_differential's time_limit argument: {} for no limit. Without --time-limit, the
    runner's documented default for the device (a stand-in runner without one: no limit)."""
    if requested is None:
        default = getattr(runner, "default_time_limit", None)
        limit = default(device) if default is not None else None
    else:
        limit = requested or None  # 0 turns the limit off
    return {} if limit is None else {"time_limit": limit}


def _float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None


def _csv(text: str | None) -> list[str] | None:
    return None if text is None else [part.strip() for part in text.split(",") if part.strip()]


def parse_oracles(text: str | None) -> list[str] | None:
    if text is None:
        return None
    names = [n.strip() for n in text.split(",") if n.strip()]
    known = _oracle_registry().names()
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        raise UsageError(f"--oracles must be a comma-separated list from {known}, got {text!r}")
    return names


def parse_device(text: str | None) -> str | None:
    """--device: a torch device this torch can use, else a UsageError (one line, exit 2), never a
    traceback from the first tensor put there (e.g. cuda on a CPU-only build of torch)."""
    if text is None:
        return None
    import torch

    try:
        device = torch.device(text)
    except (RuntimeError, ValueError):
        raise UsageError(f"--device must be a torch device such as cpu or cuda:0, got {text!r}") from None
    if device.type == "cpu":
        return text
    backend = getattr(torch, device.type, None)
    available = getattr(backend, "is_available", None)
    try:
        usable = bool(available()) if callable(available) else False
        count = backend.device_count() if usable and hasattr(backend, "device_count") else None
    except Exception:  # noqa: BLE001 - a backend that cannot even answer is not usable
        usable, count = False, None
    if not usable:
        build = f"torch {torch.__version__}"
        raise UsageError(f"--device {text}: {device.type} is not available with this torch ({build}); use --device cpu")
    if device.index is not None and count is not None and device.index >= count:
        raise UsageError(f"--device {text}: this machine has {count} {device.type} device{'s' if count != 1 else ''}")
    return text


def _add_impl_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--impl", metavar="MODULE:FACTORY", help="implementation factory to test (default: the optimized Triton MoE; "
                                                          "vllm: vLLM 0.33.0's kernel from its wheel, see diffmoe peers; "
                                                          "vllm==0.28.0, vllm==0.30.0: those releases; lmdeploy, liger, "
                                                          "sglang (0.5.23), sglang==0.5.20)")
    p.add_argument("--fn", metavar="MODULE:FUNCTION", help="a fused_experts function to test as it is, called with its "
                                                          "family's signature (--family); the same as --impl MODULE:FUNCTION@FAMILY; "
                                                          "NAME==V:FUNCTION or NAME==V:MODULE:FUNCTION is the function inside "
                                                          "that pinned peer wheel (sglang==0.5.23:fused_experts)")
    p.add_argument("--family", choices=FAMILY_NAMES, help="the signature --fn is called with: vllm's or sglang's fused_experts")


def fold_fn(args: argparse.Namespace) -> None:
    """--fn MODULE:FUNCTION --family F is --impl MODULE:FUNCTION@F (what replay lines carry)."""
    fn, family = getattr(args, "fn", None), getattr(args, "family", None)
    if fn is None and family is None:
        return
    if fn is None or family is None:
        raise UsageError("--fn and --family go together: --fn MODULE:FUNCTION --family vllm|sglang")
    if getattr(args, "impl", None) is not None:
        raise UsageError("--fn replaces --impl: give one of them")
    args.impl = f"{fn}@{family}"


# --isolation's default for check and fuzz (docs/robustness.md, "Isolation"); a module constant
# so a test driving the CLI through a stand-in runner can set it, as DEFAULT_FUZZ_WORKERS
# (diffmoe/frontends/commands/fuzz.py).
DEFAULT_ISOLATION = "process"


def _isolation_kwargs(args: argparse.Namespace) -> dict:
    """run_differential's / fuzz's isolation argument: given only when the candidate is isolated
    (their default is in process), so a stand-in runner need not know the argument."""
    return {"isolation": args.isolation} if args.isolation != "none" else {}


def _add_isolation_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--isolation", choices=("process", "none"), default=DEFAULT_ISOLATION,
                   help="process (default): the implementation runs in a process that holds neither the reference nor "
                        "the judge, and its module is never imported here; none: in this process (for a debugger)")


def _read_small_text(path: str, what: str, limit: int) -> str:
    """A small UTF-8 file's text, at most one character past `limit` (enough to tell a too-large
    file without reading it), or a UsageError naming `what` and the path."""
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read(limit + 1)
    except OSError as exc:
        raise UsageError(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise UsageError(f"{what} {path} is not UTF-8 text") from None


def _check_writable(path: str, flag: str = "--save-failure") -> None:
    """A usage error unless `path` can be written (a file is created and removed to find out)."""
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise UsageError(f"{flag} {path}: folder {folder} does not exist")
    if os.path.isdir(path):
        raise UsageError(f"{flag} {path}: is a folder")
    existed = os.path.exists(path)
    try:
        with open(path, "a", encoding="utf-8"):
            pass
        if not existed:
            os.remove(path)
    except OSError as exc:
        raise UsageError(f"{flag} {path}: cannot write: {exc.strerror or exc}") from None
