"""Run as a script, in a process of its own: OpenBLAS reads OPENBLAS_CORETYPE once, when numpy
loads it, so a BLAS configuration needs a fresh process (tests/oracles/test_batch_invariance.py starts
this one with OPENBLAS_CORETYPE=Haswell OPENBLAS_L2_SIZE=512, the configuration under which the
interpreter's whole-tile dots made a row's bits depend on its neighbours: issue 33).

Runs the batch-invariance oracle alone on the shipped kernels over the labelled edge cases of the
quant schemes named on the command line (each fused flag) and prints one JSON object: how many
checks ran and the findings (scheme, fused, label, message) of those that did not pass.
"""

from __future__ import annotations

import json
import os
import sys

os.environ["TRITON_INTERPRET"] = "1"

from diffmoe.findings import Oracles  # noqa: E402
from diffmoe.judge.runner import run_differential  # noqa: E402
from diffmoe.problem.edge_cases import edge_cases  # noqa: E402


def main(schemes: list[str]) -> dict:
    checks, findings = 0, []
    for quant in schemes:
        for fused in ((False,) if quant == "bf16" else (False, True)):
            for label, config in edge_cases(quant, fused=fused).items():
                report = run_differential(config, oracles=[Oracles.BATCH_INVARIANCE])
                checks += 1
                if not report.passed:
                    findings.append({"quant": quant, "fused": fused, "label": label,
                                     "message": report.render().splitlines()[0] if not report.findings
                                     else report.findings[0].message})
    return {"checks": checks, "findings": findings, "OPENBLAS_CORETYPE": os.environ.get("OPENBLAS_CORETYPE")}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1:])))
