"""diffmoe: reference-vs-optimized differential testing for fused Mixture-of-Experts kernels.

The harness imports no Triton. Entry points: `MoEConfig`, `make_problem`, the plug-in
contract in `diffmoe.contract`, and `run_differential` (diffmoe.runner).

The package's face: this module, `__main__`, and the public paths `diffmoe.contract`,
`diffmoe.config`, `diffmoe.runner`, `diffmoe.strategies` and `diffmoe.pytest_plugin`, each the
same module object as the one it names in a concept folder. Everything else lives in one:

    problem/      the problem's language: config, vocabulary, inputs, edge cases
    check/        one check: runner, execution, worker, watchers, recording, report
    oracles/      one module per oracle, behind one interface, listed in one registry
    tolerance/    how close is close enough: compare, the tolerance table, GEMM intervals
    interpreter/  Triton interpreter hooks: fixes, fast path, grid order, address recorder, pin
    backend/      can the backend be trusted: conformance probes, doctor, compile gate
    fuzz/         strategies, the fuzz driver, tiers, database, workers, plan tier, campaign
    adapters/     the plug-in contract, peer wheels, the museum
    frontends/    the command line and the pytest plugin

Owns the public re-exports only.
"""

from diffmoe.problem.config import MoEConfig
from diffmoe.adapters.contract import LaunchInfo, MoEImplementation, Placement, RunResult, Schedule, WorkspacePlan
from diffmoe.problem.inputs import Problem, make_problem
from diffmoe.problem.vocabulary import Buffers, Stages

__all__ = [
    "Buffers",
    "LaunchInfo",
    "MoEConfig",
    "MoEImplementation",
    "Placement",
    "Problem",
    "RunResult",
    "Schedule",
    "Stages",
    "WorkspacePlan",
    "make_problem",
]
