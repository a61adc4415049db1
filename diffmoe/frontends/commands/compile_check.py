"""`diffmoe compile-check`: every kernel specialization the implementation launches compiled ahead of
time for a GPU this machine need not have, with its progress on stderr (GateProgress, which
bench/compile_sweep.py shares).

Owns compile-check's arguments and the handler; the capture, the compiles and the report are
diffmoe/backend/compile_gate.py's.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import TextIO

from diffmoe.frontends.config_flags import CONFIG_FLAGS, MODEL_FLAGS, _add_config_options, config_from_args
from diffmoe.frontends.exits import EXIT_FINDINGS, EXIT_OK, UsageError
from diffmoe.frontends.flags import _add_impl_option, _csv, _positive_int
from diffmoe.frontends.implementation import default_factory, load_implementation, refuse_unsupported
from diffmoe.frontends.output import _print_json, implementation_output_to_stderr

NAME = "compile-check"


def add_parser(sub) -> argparse.ArgumentParser:
    cc = sub.add_parser(
        NAME, help="compile every kernel specialization for a GPU, no GPU needed",
        description="Run the implementation on CPU tensors with every Triton launch intercepted, then compile each "
                    "distinct specialization ahead of time for the target GPU(s) and report registers, spills, shared "
                    "memory and the matrix instruction. Without a config: the CI subset (every scheme x fused flag x "
                    "tile class, both order-table settings).")
    cc.add_argument("--arch", action="append", metavar="sm_90",
                    help="target, repeatable or comma-separated: sm_80, sm_89, sm_90 (default), sm_100")
    _add_impl_option(cc)
    cc.add_argument("--variant", metavar="V,...", help="the implementation's compile variants to build (default all it declares; "
                                                       "the optimized MoE: native, safe)")
    cc.add_argument("--tile-class", metavar="C,...", help="only configs of these CUDA tile classes: decode, mid, prefill")
    _add_config_options(cc)
    cc.add_argument("--sweep", action="store_true", help="the full sweep instead of the CI subset")
    cc.add_argument("--forbid-spills", metavar="V,...", help="variants whose register spills are failures (CI: native)")
    cc.add_argument("--jobs", type=_positive_int, metavar="N", help="compiler processes (default: the machine's cores)")
    cc.add_argument("--json", action="store_true", help="print the report as one JSON object")
    cc.set_defaults(handler=run)
    return cc


class GateProgress:
    """The compile gate's progress on stderr (diffmoe/cluster/progress.py), `compile-check` and
    `--sweep` (and bench/compile_sweep.py): first the capture, the configs run with every launch
    intercepted (on a terminal a bar of configs; otherwise a line at most every PLAIN_INTERVAL_S
    seconds, none for the last config, which the compile lines follow at once), then the compile,
    a bar of specializations, or one plain line each: "compile-check: 3/48 KERNEL sm_90 native: ok"."""

    def __init__(self, stream: TextIO, configs: int, *, label: str = "compile-check", live: bool | None = None,
                 clock=time.monotonic, json_lines: bool = False) -> None:
        self.stream, self.label, self.live, self.clock, self.json_lines = stream, label, live, clock, json_lines
        self.capture = self._progress(f"{label} capture", configs, "config", each=False)
        self.compile = None

    def _progress(self, label: str, total: int, unit: str, each: bool):
        from diffmoe.cluster.progress import Progress

        return Progress(self.stream, label, total=total, unit=unit, each=each, live=self.live, clock=self.clock,
                        json_lines=self.json_lines)

    def captured(self, done: int, total: int, found: int) -> None:
        """capture_progress of diffmoe.backend.compile_gate.run_gate."""
        detail = f"{found} specialization{'s' if found != 1 else ''} so far"
        if done < total:
            self.capture.update(done, detail=detail)
            return
        self.capture.close(done=done, detail=detail)
        if found:
            self.compile = self._progress(self.label, found, "specialization", each=True)

    def compiled(self, done: int, total: int, result) -> None:
        """progress of diffmoe.backend.compile_gate.run_gate."""
        if self.compile is None:
            self.capture.close()
            self.compile = self._progress(self.label, total, "specialization", each=True)
        what = f"{result.kernel} {result.arch} {result.variant}: {result.status}"
        self.compile.update(done, total=total, detail=what, line=f"{self.label}: {done}/{total} {what}")

    def close(self) -> None:
        self.capture.close()
        if self.compile is not None:
            self.compile.close()


def run(args: argparse.Namespace) -> int:
    # Real compiles need the kernels decorated as JITFunctions: no interpreter, before any import
    # of triton (nothing on the way here imported it).
    os.environ["TRITON_INTERPRET"] = "0"
    archs = [a for text in (args.arch or ["sm_90"]) for a in _csv(text) or []]
    from diffmoe.backend import compile_gate as gate

    for arch in archs:
        try:
            gate.parse_arch(arch)
        except ValueError as exc:
            raise UsageError(f"--arch: {exc}") from None
    given = [flag for flag in (*CONFIG_FLAGS, *MODEL_FLAGS) if getattr(args, flag, None) is not None]
    if args.sweep and (given or args.config is not None):
        raise UsageError("--sweep cannot be combined with a config (flags or --config)")
    one_config = given or args.config is not None
    if one_config:
        configs = [config_from_args(args)]
    else:
        configs = gate.sweep_configs() if args.sweep else gate.representative_configs()
    classes = _csv(args.tile_class)
    if classes is not None:
        unknown = [c for c in classes if c not in gate.TILE_CLASSES]
        if unknown or not classes:
            raise UsageError(f"--tile-class must be a comma-separated list from {list(gate.TILE_CLASSES)}, got {args.tile_class!r}")
        configs = [c for c in configs if gate.tile_class(c) in classes]
        if not configs:
            raise UsageError(f"no config of this run falls in tile class {', '.join(classes)}")
    # every argument is checked by now; the implementation loads (issue 48)
    factory, name = load_implementation(args.impl)
    if one_config:
        refuse_unsupported(factory, name, configs[0])
    if factory is None:
        factory = default_factory()
    progress = GateProgress(sys.stderr, len(configs), json_lines=args.json)
    try:
        with implementation_output_to_stderr():
            report = gate.run_gate(factory, configs, archs, variants=_csv(args.variant), jobs=args.jobs,
                                   forbid_spills=_csv(args.forbid_spills) or (), progress=progress.compiled,
                                   capture_progress=progress.captured)
    except gate.CompileGateError as exc:
        raise UsageError(str(exc)) from None
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    finally:
        progress.close()
    if args.json:
        _print_json(report.to_dict())
    else:
        print(report.render())
    return EXIT_OK if report.exit_code == 0 else EXIT_FINDINGS
