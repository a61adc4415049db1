"""diffmoe: reference-vs-optimized differential testing for fused Mixture-of-Experts kernels.

The verbs, importable from here: `MoEConfig` (one check's config), `make_problem` (its inputs),
`load_factory` (an implementation named "MODULE:FACTORY"), `run_differential` (one check through
every oracle), which returns a `Report` of `Finding`s; the plug-in contract's types
(`MoEImplementation`, `WorkspacePlan`, `RunResult`, ...) and the pipeline's names (`Buffers`,
`Stages`). The check's verbs are read on first use (PEP 562), so `import diffmoe` stays cheap.

The public modules: this one, `diffmoe.contract` (what an implementation provides: the plug-in
contract and the vocabulary it speaks), `diffmoe.config`, `diffmoe.runner`, `diffmoe.strategies`
and `diffmoe.pytest_plugin`; each declares `__all__`. Everything else lives in a concept folder,
and paths that moved keep working for one release with a DeprecationWarning (diffmoe.moved):

    problem/      the problem's language: config, vocabulary, inputs, edge cases
    check/        one check: runner, execution, worker, watchers, recording, report
    oracles/      one module per oracle, behind one interface, listed in one registry
    tolerance/    how close is close enough: compare, the tolerance table, GEMM intervals
    interpreter/  Triton interpreter hooks: fixes, fast path, grid order, address recorder, pin
    backend/      can the backend be trusted: conformance probes, doctor, compile gate
    fuzz/         strategies, the fuzz driver, tiers, database, workers, plan tier, campaign
    adapters/     the adapter kit, families, loading, peer wheels, the museum
    frontends/    the command line and the pytest plugin

Owns the public re-exports only.
"""

from typing import TYPE_CHECKING

from diffmoe import moved

moved.install()

from diffmoe.contract import LaunchInfo, MoEImplementation, Placement, RunResult, Schedule, WorkspacePlan  # noqa: E402
from diffmoe.problem.config import MoEConfig  # noqa: E402
from diffmoe.problem.inputs import Problem, make_problem  # noqa: E402
from diffmoe.problem.vocabulary import Buffers, Stages  # noqa: E402

if TYPE_CHECKING:  # what the lazy names below are, for readers and static tools
    from diffmoe.check.recording import ChainedRecorder
    from diffmoe.check.report import Report
    from diffmoe.findings import Finding
    from diffmoe.judge.runner import load_factory, run_differential

# Read on first use: the check's modules import the oracles, isolation and the worker, which a
# config or a contract type alone does not need.
_LAZY = {
    "ChainedRecorder": "diffmoe.check.recording",
    "Finding": "diffmoe.findings",
    "Report": "diffmoe.check.report",
    "load_factory": "diffmoe.judge.runner",
    "run_differential": "diffmoe.judge.runner",
}

__all__ = [
    "Buffers",
    "ChainedRecorder",
    "Finding",
    "LaunchInfo",
    "MoEConfig",
    "MoEImplementation",
    "Placement",
    "Problem",
    "Report",
    "RunResult",
    "Schedule",
    "Stages",
    "WorkspacePlan",
    "load_factory",
    "make_problem",
    "run_differential",
]


def __getattr__(name: str):
    home = _LAZY.get(name)
    if home is None:
        raise AttributeError(f"module 'diffmoe' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
