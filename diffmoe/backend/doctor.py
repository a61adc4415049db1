"""`diffmoe doctor`: the conformance probes' full sweep on one backend, judged against the
workaround switches of the implementation behind the hooks, with the state of the interpreter
fixes, as one report (diffmoe.backend.conformance.DoctorReport: a table, or one JSON object).

Apart from diffmoe/backend/conformance.py because it reads diffmoe.interpreter.fixes, which itself runs
conformance probes to decide its probe-gated fixes: the probes below, the fixes above them, the
doctor above both, and no import circle (tests/house/test_architecture.py draws the graph).

Owns running the sweep and printing it. Must not import an implementation: it gets one's hooks
through the contract.
"""

from __future__ import annotations

import json
import platform
import time

import torch

from diffmoe.backend import conformance
from diffmoe.backend.conformance import ConformanceHooks, DoctorReport
from diffmoe.interpreter.triton_pin import triton_release


def run_doctor(device: torch.device | None = None, hooks: ConformanceHooks | None = None) -> DoctorReport:
    """The full sweep on `device` (default: CUDA when present, else the interpreter on cpu),
    judged against the switches the implementation behind `hooks` would use there (None: the
    backend alone, no workaround)."""
    device = conformance.normalize_device(torch.device(device) if device is not None else conformance.default_device())
    start = time.perf_counter()
    name = conformance.backend_name(device)
    # a refusal is said loudly in the verdict, and judged as the switches it would have run with
    traits, refusal = hooks.switches(device) if hooks is not None else ({}, None)
    traits = dict(traits)
    rows = tuple(conformance._row(conformance.run_probe(k, device, True, hooks), traits, hooks)
                 for k in conformance.PRIMITIVE_KEYS)
    versions = {"triton": triton_release()[0], "torch": torch.__version__, "python": platform.python_version()}
    fixes = None
    if name == "interpreter":
        from diffmoe.interpreter import fixes as interpreter_fixes

        state = interpreter_fixes.status()
        fixes = f"{'installed' if state.installed else 'not installed'}: {state.reason}"
    return DoctorReport(name, str(device), versions, traits, rows, time.perf_counter() - start, refusal, fixes)


def doctor_main(as_json: bool, device: torch.device | str | None = None, hooks: ConformanceHooks | None = None) -> int:
    """`diffmoe doctor [--json]`: prints the table (or one JSON object) and returns the exit code.
    `hooks`: the implementation judged with the backend (diffmoe/frontends/commands/doctor.py passes
    the default implementation's, from its factory's `conformance_hooks`)."""
    report = run_doctor(torch.device(device) if device is not None else None, hooks)
    if as_json:
        print(json.dumps(report.to_dict(), sort_keys=False))
    else:
        print(report.render())
    return report.exit_code
