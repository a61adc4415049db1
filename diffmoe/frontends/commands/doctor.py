"""`diffmoe doctor`: the Triton backend's primitives the optimized kernels rely on, each probed on the
active backend, with what the default implementation does about each (its conformance hooks).

Owns doctor's arguments and the handler; the probes and the report are diffmoe/backend/doctor.py's.
"""

from __future__ import annotations

import argparse

from diffmoe.contract import CONFORMANCE_HOOKS, factory_attribute
from diffmoe.frontends.flags import parse_device
from diffmoe.frontends.implementation import default_factory
from diffmoe.frontends.output import _print_json, implementation_output_to_stderr

NAME = "doctor"


def add_parser(sub) -> argparse.ArgumentParser:
    doctor = sub.add_parser(
        NAME, help="check the Triton backend's primitives the optimized kernels rely on",
        description="Run small conformance kernels on the active Triton backend (interpreter or CUDA) and report, "
                    "per primitive, whether it is right and which workaround the optimized path applies.")
    doctor.add_argument("--device", help="torch device (default: the implementation's)")
    doctor.add_argument("--json", action="store_true", help="print the report as one JSON object")
    doctor.set_defaults(handler=run)
    return doctor


def run(args: argparse.Namespace) -> int:
    device = parse_device(args.device)
    # The probes are the harness's; what the default implementation does about each primitive
    # comes through the contract (its factory's `conformance_hooks`). Loading the factory first
    # lets the implementation set up its backend (e.g. the interpreter when no GPU) before
    # diffmoe.backend.conformance imports triton.
    # The probes run under implementation_output_to_stderr: only the table (or JSON) is stdout.
    with implementation_output_to_stderr():
        hooks = factory_attribute(default_factory(), CONFORMANCE_HOOKS)
        from diffmoe.backend.doctor import run_doctor

        report = run_doctor(device, hooks() if hooks is not None else None)
    if args.json:
        _print_json(report.to_dict())
    else:
        print(report.render())
    return report.exit_code
