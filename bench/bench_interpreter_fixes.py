"""What fixing the interpreter at the interpreter saves: one optimized MoE call with
diffmoe.interpreter.fixes installed (the plain kernels: every software switch off, the native
casts and dots correct) against triton 3.9's own interpreter with the software paths the probes
would select there (every switch on, the fixes suspended). Both give the same bits
(tests/interpreter/test_interpreter_fixes.py, tests/backend/test_conformance.py); this is interpreter time only.

`test_the_cheap_probes`: one run of the probes behind the workaround switches
(optimized/backend.py's probe_defects, once per process and backend) after a first run paid the
interpreter's set-up; tests/backend/test_conformance.py held it under 1 s until issue 48 moved the figure here.

    python -m pytest bench/bench_interpreter_fixes.py --benchmark-only --benchmark-timer time.process_time
"""

from __future__ import annotations

from contextlib import nullcontext

import pytest
import torch

from benchkit import BACKEND_CUDA
from diffmoe.interpreter import fixes as interpreter_fixes
from diffmoe.problem.config import QUANT_SCHEMES, MoEConfig
from diffmoe.problem.inputs import make_problem
from optimized import make_implementation
from optimized.backend import INTERPRETER_TRAITS, probe_defects

CONFIG = MoEConfig(num_tokens=16, num_experts=8, topk=2, hidden=128, inter=128, quant="fp8-token", fused=True, seed=0)
MODES = ("fixed-interpreter", "software-paths")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("quant", QUANT_SCHEMES)
def test_one_call(measure, moe_backend, quant, mode):
    if moe_backend == BACKEND_CUDA:
        pytest.skip("interpreter only")
    config = CONFIG.replace(quant=quant, fused=quant != "bf16")
    problem = make_problem(config)
    impl = make_implementation(config)
    if mode == "software-paths":
        impl.traits = INTERPRETER_TRAITS
    workspaces = impl.allocate_workspaces()
    out = torch.empty(config.num_tokens, config.hidden, dtype=torch.bfloat16)
    scope = interpreter_fixes.suspended() if mode == "software-paths" else nullcontext()
    with scope:
        measure(lambda: impl.run(problem, workspaces, output=out), config=config, provider=mode,
                group=f"interpreter-fixes-{quant}", problem=problem)


def test_the_cheap_probes(benchmark, moe_device):
    benchmark.group = "probes"
    probe_defects(moe_device)  # the interpreter's (or Triton's) first-call costs
    results = benchmark.pedantic(probe_defects, args=(moe_device,), rounds=5, iterations=1)
    assert results, "the probes ran"
