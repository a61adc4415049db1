"""Throughput of one MoE call: the PyTorch reference against the optimized Triton path.

Providers (bench/conftest.py, `moe_providers`): "reference" (a fresh tensor per stage) and
"optimized" (the Triton path inside its two workspaces), the latter unfused and, for FP8
schemes, fused. The reference has no fused flag (it always
materialises the activation), so it is timed once per scheme.

Grids (the --moe-grid option; default by backend):
  small (interpreter): T in {1, 16, 64}, E=8, K=2, H=I=256. Interpreter cost is per program
      instance and op, so these times say nothing about kernel speed; they are recorded
      and labelled as interpreter figures.
  full (CUDA): T in {1, 16, 128, 1024, 4096} for two shapes, E=8 (K=2, H=4096, I=2048,
      Mixtral-like routing) and E=64 (K=8, H=4096, I=1024, fine-grained experts).

Every T of one (shape, scheme) shares one set of weights (benchkit.ProblemCache).
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from benchkit import grid_name
from diffmoe.problem.config import QUANT_SCHEMES, MoEConfig


@dataclass(frozen=True)
class Shape:
    num_experts: int
    topk: int
    hidden: int
    inter: int

    def label(self) -> str:
        return f"E={self.num_experts} K={self.topk} H={self.hidden} I={self.inter}"


GRIDS = {
    "small": ((Shape(8, 2, 256, 256),), (1, 16, 64)),
    "full": ((Shape(8, 2, 4096, 2048), Shape(64, 8, 4096, 1024)), (1, 16, 128, 1024, 4096)),
}


@dataclass(frozen=True)
class Case:
    shape: Shape
    quant: str
    provider: str
    fused: bool
    num_tokens: int
    max_tokens: int

    @property
    def id(self) -> str:
        variant = "reference" if self.provider == "reference" else f"optimized-{'fused' if self.fused else 'unfused'}"
        return f"E{self.shape.num_experts}-{self.quant}-{variant}-T{self.num_tokens}"

    def config(self) -> MoEConfig:
        s = self.shape
        return MoEConfig(num_tokens=self.num_tokens, num_experts=s.num_experts, topk=s.topk, hidden=s.hidden,
                         inter=s.inter, quant=self.quant, fused=self.fused, output="separate", seed=0)


def cases(grid: str) -> list[Case]:
    shapes, tokens = GRIDS[grid]
    out = []
    # Ordered by shape and scheme, so the problem cache draws each set of weights once.
    for shape in shapes:
        for quant in QUANT_SCHEMES:
            variants = [("reference", False), ("optimized", False)]
            if quant != "bf16":
                variants.append(("optimized", True))
            for t in tokens:
                for provider, fused in variants:
                    out.append(Case(shape, quant, provider, fused, t, max(tokens)))
    return out


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "case" in metafunc.fixturenames:
        chosen = cases(grid_name(metafunc.config.getoption("moe_grid")))
        metafunc.parametrize("case", chosen, ids=[c.id for c in chosen])


def test_moe_throughput(case: Case, measure, moe_providers, problem_cache, moe_device):
    config = case.config()
    problem = problem_cache.get(config, case.max_tokens)
    call = moe_providers[case.provider](config, problem, moe_device)
    result = measure(
        call,
        config=config,
        provider=case.provider,
        group=f"throughput {case.shape.label()} {case.quant}",
        problem=problem,
        extra={"fused": case.fused, "quant": case.quant, "shape": case.shape.label()},
    )
    # A benchmark of a call that returned garbage would be meaningless; the shape is the
    # cheapest sign that the call ran (correctness is the differential suite's job).
    assert tuple(result.output.shape) == (config.num_tokens, config.hidden)
