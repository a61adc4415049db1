"""Every supported vLLM release behind one adapter core (peers/vllm/core.py RELEASES): each loads
its own wheel's files, names itself, passes a check, and runs the expert-parallel path the way
its TritonExperts.apply takes it; the release table is held to what the wheel's apply calls.
The wheels are fetched once each (about 315 MB; ~1.3 MB kept: diffmoe/adapters/peer_wheels.py).
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before Triton is imported

import dataclasses

import pytest
import torch

from diffmoe.adapters import peer_wheels
from diffmoe.problem.config import MoEConfig
from diffmoe.contract import IMPLEMENTATION_ALIASES
from diffmoe.oracles.registry import DEFAULT_ORACLES
from diffmoe.findings import Oracles
from diffmoe.judge.runner import load_factory, run_differential

SPECS = ("vllm==0.28.0", "vllm==0.30.0", "vllm==0.33.0")
CHECK_ORACLES = [o for o in DEFAULT_ORACLES if o != Oracles.METAMORPHIC]  # vLLM has no fused/unfused sibling
SMALL = dict(num_tokens=4, num_experts=4, topk=2, hidden=128, inter=128)


@pytest.fixture(scope="module", autouse=True)
def vllm_wheels():
    return [peer_wheels.fetch(spec) for spec in SPECS]


def test_each_release_has_a_pin_an_alias_and_its_own_cache():
    roots = set()
    for spec in SPECS:
        pin = peer_wheels.PEERS[spec]
        assert pin.requirement == spec and len(pin.sha256) == 64 and pin.files == peer_wheels.PEERS["vllm"].files
        make = load_factory(spec)
        assert IMPLEMENTATION_ALIASES[spec] == f"{make.__module__}:{make.__qualname__}" and make.release.impl == spec
        roots.add(peer_wheels.peer_root(make.release.peer))
    assert len(roots) == 3 and peer_wheels.PEERS["vllm"] is peer_wheels.PEERS["vllm==0.33.0"]


@pytest.mark.parametrize("spec", SPECS[:2])
@pytest.mark.parametrize("quant", ["bf16", "fp8-block"])
def test_an_older_release_passes_every_oracle(spec, quant):
    c = MoEConfig(**SMALL, quant=quant, fused=quant == "fp8-block")
    report = run_differential(c, load_factory(spec), oracles=CHECK_ORACLES)
    assert report.passed, report.render()
    assert load_factory(spec).plan_workspaces(c, 4).planner == f"vllm-{spec.split('==')[1]}"  # its own layout


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("quant", ["bf16", "fp8-token"])
def test_the_expert_parallel_path_runs_and_passes(spec, quant):
    """expert_map is passed to apply as vLLM's EP argument: 0.28/0.30 align every slot and write
    zeros for remote blocks; 0.33 (bf16) drops remote slots at the alignment and reduces them
    away; both are correct, and the oracles judge no row of a remote slot."""
    c = MoEConfig(**SMALL, quant=quant, expert_map=(0, -1, 1, -1))
    report = run_differential(c, load_factory(spec), oracles=CHECK_ORACLES)
    assert report.passed, report.render()


def test_a_release_row_that_disagrees_with_the_wheel_stops_the_run(monkeypatch):
    """RELEASES is read from each wheel's apply and checked at every call: 0.28.0 said to use the
    pad-aware moe_sum is refused when its apply calls the two-argument one."""
    from peers.vllm import RELEASES, core as vllm_core

    wrong = dataclasses.replace(RELEASES["0.28.0"], pad_aware_moe_sum=True)
    c = MoEConfig(**SMALL, quant="bf16", expert_map=(0, 1, -1, -1))
    impl = vllm_core.VllmTritonMoE(c, release=wrong)
    from diffmoe.problem.inputs import make_problem

    problem = make_problem(c)
    n1, n2 = impl.workspace_shapes()
    ws = (torch.zeros(n1, dtype=torch.uint8), torch.zeros(n2, dtype=torch.uint8))
    with pytest.raises(RuntimeError, match="pad_aware_moe_sum"):
        impl.run(problem, ws)
    vllm_core.VllmTritonMoE(c, release=RELEASES["0.28.0"]).run(problem, ws)  # the true row runs


# ---- the SwiGLU clamp, as each release's apply takes it (exhibit 2's vLLM side) -----------------


@dataclasses.dataclass(frozen=True)
class ClampedConfig(MoEConfig):
    """MoEConfig with the clamp limit the adapter reads (peers/vllm/core.py swiglu_limit) until
    MoEConfig has its own swiglu_limit field."""

    swiglu_limit: float | None = None


def _output(spec: str, config) -> torch.Tensor:
    from diffmoe.problem.inputs import make_problem

    problem = make_problem(config)
    impl = load_factory(spec)(config)
    n1, n2 = impl.workspace_shapes()
    return impl.run(problem, (torch.zeros(n1, dtype=torch.uint8), torch.zeros(n2, dtype=torch.uint8))).output


def test_the_clamp_limit_reaches_apply_and_each_release_takes_it_as_its_wheel_does():
    """0.28.0 fuses silu with the FP8-block quant whatever the limit (the fused kernel has no
    clamp: vLLM PR #57984's bug); 0.33.0 falls back to the unfused path, where vLLM's
    swiglu_limit_func clamps; the adapter refuses a fused config there, naming the field."""
    base = dict(num_tokens=1, num_experts=2, topk=1, hidden=128, inter=128, quant="fp8-block", seed=3)
    limit = 0.01  # far below the gate/up values of the generated problem
    free, clamped = ClampedConfig(**base, fused=True), ClampedConfig(**base, fused=True, swiglu_limit=limit)
    assert torch.equal(_output("vllm==0.28.0", clamped), _output("vllm==0.28.0", free))  # the limit is dropped
    with pytest.raises(ValueError, match="^fused must be false"):
        load_factory("vllm==0.33.0")(clamped)
    unfused = ClampedConfig(**base, fused=False, swiglu_limit=limit)
    got, free_out = _output("vllm==0.33.0", unfused).float(), _output("vllm==0.33.0", free).float()
    # clamped: |silu(gate) * up| <= silu(limit) * limit per element, so the output shrinks by orders
    # of magnitude (a dropped clamp would leave it the size of the free one)
    assert got.abs().max() < 0.01 * free_out.abs().max()
