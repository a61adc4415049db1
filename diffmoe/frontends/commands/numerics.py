"""`diffmoe numerics fit`: the numerics profile an implementation computes, fitted from its own runs on a
calibration set, with its progress on stderr (FitProgress).

Owns the arguments of `numerics` and `numerics fit` and the handler; the fit itself is
diffmoe/numerics_fit/'s.
"""

from __future__ import annotations

import argparse
import sys
from typing import TextIO

from diffmoe.problem.config import QUANT_SCHEMES
from diffmoe.problem.numerics import PROFILE_NAMES
from diffmoe.frontends.exits import UsageError, _sigterm_interrupts
from diffmoe.frontends.flags import (
    _add_impl_option, _csv, _non_negative_int, _positive_int, _time_limit, parse_device, time_limit_kwargs,
)
from diffmoe.frontends.implementation import _runner, default_factory, load_implementation
from diffmoe.frontends.output import _print_json, implementation_output_to_stderr

NAME = "numerics"


def add_parser(sub) -> argparse.ArgumentParser:
    numerics = sub.add_parser(
        NAME, help="fit the numerics profile an implementation computes (diffmoe numerics fit)",
        description="diffmoe numerics fit: the rounding-point choices that reproduce an implementation's stages bit for bit")
    numerics_sub = numerics.add_subparsers(dest="numerics_command", metavar="{fit}")
    fit = numerics_sub.add_parser(
        "fit", help="fit a profile (base + overrides, the TOML --numerics-file reads) on a calibration set",
        description="Run the implementation once per calibration config and, stage by stage on its own inputs, find the "
                    "menu choice of every rounding point that reproduces its outputs bit for bit (GEMMs: within their "
                    "derived interval) over every config. Prints the profile as TOML with its evidence; a stage no "
                    "choice explains is a residue, shown as a finding (exit 1), never absorbed.")
    _add_impl_option(fit)
    fit.add_argument("--quant", metavar="Q,...", help=f"calibrate on these schemes only (default: every one the implementation supports: {', '.join(QUANT_SCHEMES)})")
    fit.add_argument("--configs", type=_positive_int, metavar="N", help="calibration configs (default: one per feature, four, per supported scheme and fused flag)")
    fit.add_argument("--seed", type=_non_negative_int, default=0, metavar="S", help="seed of the first calibration config (default 0; the next ones S+1, ...)")
    fit.add_argument("--base", choices=PROFILE_NAMES, help="the built-in profile the TOML starts from (default: the one agreeing with the most fitted points among those describing every calibration config)")
    fit.add_argument("--device", help="torch device (default: the implementation's)")
    fit.add_argument("--time-limit", type=_time_limit, metavar="S",
                     help="stop a candidate run that makes no progress (no launch) for S seconds: that config is a residue (0: no limit; default 120 on the interpreter, none on CUDA)")
    fit.add_argument("--json", action="store_true", help="print the fit as one JSON object")
    fit.set_defaults(handler=run)
    numerics.set_defaults(handler=run, numerics_command=None)
    return numerics


class FitProgress:
    """`numerics fit` progress on stderr (diffmoe/cluster/progress.py): a bar of calibration configs
    on a terminal, otherwise a plain line per config and stage ("numerics fit: 2/14 CONFIG: STAGE")."""

    def __init__(self, stream: TextIO, live: bool | None = None, json_lines: bool = False) -> None:
        self.stream, self.live, self.bar, self.json_lines = stream, live, None, json_lines

    def __call__(self, done: int, total: int, what: str) -> None:
        if self.bar is None:
            from diffmoe.cluster.progress import Progress

            self.bar = Progress(self.stream, "numerics fit", total=total, unit="config", each=True, live=self.live,
                                json_lines=self.json_lines)
        self.bar.update(done, detail=what, line=f"numerics fit: {done}/{total} {what}")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def run(args: argparse.Namespace) -> int:
    if args.numerics_command != "fit":
        raise UsageError("a numerics command is required: fit (see diffmoe numerics --help)")
    quants = _csv(args.quant)
    if quants is not None:
        unknown = [q for q in quants if q not in QUANT_SCHEMES]
        if unknown or not quants:
            raise UsageError(f"--quant must be a comma-separated list from {list(QUANT_SCHEMES)}, got {args.quant!r}")
    device = parse_device(args.device)  # every argument checked before the implementation loads (issue 48)
    factory, name = load_implementation(args.impl)
    if factory is None:
        factory = default_factory()
    from diffmoe.numerics_fit import fit_profile

    progress = FitProgress(sys.stderr, json_lines=args.json)
    try:
        with _sigterm_interrupts(), implementation_output_to_stderr():
            report = fit_profile(factory, quants=quants, count=args.configs, seed=args.seed, base=args.base,
                                 device=device, implementation_name=name, progress=progress,
                                 **time_limit_kwargs(_runner(), args.time_limit, device))
    except ValueError as exc:  # a calibration set the implementation refuses whole
        raise UsageError(f"numerics fit: {exc}") from None
    finally:
        progress.close()
    if args.json:
        _print_json(report.to_dict())
    else:
        print(report.render(), end="")
    return report.exit_code
