"""What one check of a peer's kernel costs against one check of the shipped implementation.

Issue 11's bound: a peer check at T=8 E=4 K=2 H=I=128 costs at most 3x the shipped
implementation's check of the same config. Each benchmark is one `diffmoe check` in process:
`run_differential(config, factory)` with every oracle and the default schedules (a peer's
`supports` skips what it has no path for, the metamorphic sibling: that is its check, as the
CLI runs it). The configs are the ones each peer runs: vLLM 0.33 fp8-token unfused and
fp8-block fused, lmdeploy 0.18 fp8-block unfused, Liger 0.8.5 bf16 unfused, SGLang 0.5.23
fp8-token unfused (its fp8-block refuses H = I = 128); the shipped
implementation runs each of them too. The peers' files come from the peer cache (`diffmoe peers
fetch vllm`, `... lmdeploy`, `... liger`, `... sglang`);
without them the module fails with the fetch command, as tests/peers/test_peers_*.py do.

Timed with `--benchmark-timer time.process_time`, as the oracle-overhead suite, the figures are
CPU seconds of this process. A peer's benchmark records `x_shipped`, its time over the shipped
implementation's on the same config from the same session, and bench/report_tables.py prints
the table with the bound:

    python -m pytest bench/bench_peer_cost.py --benchmark-only --benchmark-timer time.process_time --benchmark-json PEER.json
    python bench/report_tables.py PEER.json

Owns the peer-cost benchmark. Must not judge the peers: a finding is recorded, not asserted
(tests/peers/test_peers_*.py hold what each check must say).
"""

from __future__ import annotations

import pytest
from benchkit import PEER_COST_BOUND

from diffmoe.adapters import peer_wheels
from diffmoe.problem.config import MoEConfig
from diffmoe.contract import DEFAULT_IMPLEMENTATION_NAME
from diffmoe.findings import Oracles
from diffmoe.judge.runner import load_factory, run_differential

SHAPE = dict(num_tokens=8, num_experts=4, topk=2, hidden=128, inter=128, seed=0)
# (peer, quant, fused): each peer's runnable configs at SHAPE (peers/vllm/core.py, peers/lmdeploy/core.py,
# peers/liger/core.py, peers/sglang/core.py)
PEER_CASES = (("vllm", "fp8-token", False), ("vllm", "fp8-block", True), ("lmdeploy", "fp8-block", False),
              ("liger", "bf16", False), ("sglang", "fp8-token", False))
SHIPPED = DEFAULT_IMPLEMENTATION_NAME


def config_of(quant: str, fused: bool) -> MoEConfig:
    return MoEConfig(**SHAPE, quant=quant, fused=fused)


def _cases():
    # the shipped implementation first on each config: a peer's ratio needs its time
    seen = set()
    for peer, quant, fused in PEER_CASES:
        if (quant, fused) not in seen:
            seen.add((quant, fused))
            yield pytest.param(SHIPPED, quant, fused, id=f"{SHIPPED}-{quant}-{'fused' if fused else 'unfused'}")
        yield pytest.param(peer, quant, fused, id=f"{peer}-{quant}-{'fused' if fused else 'unfused'}")


# median seconds of the shipped implementation's check per (quant, fused), this session
_shipped_seconds: dict[tuple[str, bool], float] = {}


@pytest.mark.parametrize("impl, quant, fused", list(_cases()))
def test_peer_check_cost(impl: str, quant: str, fused: bool, measure, benchmark, moe_device):
    config = config_of(quant, fused)
    if impl != SHIPPED:
        peer_wheels.fetch(impl)  # cached once; else downloaded, or one line naming the fetch command
    factory = None if impl == SHIPPED else load_factory(impl)
    reports = []

    def check():
        reports.append(run_differential(config, factory, device=moe_device, implementation_name=impl))

    measure(check, config=config, provider=impl, group="peer cost")  # one untimed check first (warm-up)
    last = reports[-1]
    crashes = [f for f in last.findings if f.oracle == Oracles.CRASH]
    if crashes:
        pytest.fail(f"{impl} crashes on the benchmark config, its timing would be meaningless:\n{last.render()}")
    info = benchmark.extra_info
    info.update({"impl": impl, "oracles": list(last.oracles), "skipped": sorted(last.skipped),
                 "findings": len(last.findings)})
    stats = getattr(benchmark, "stats", None)  # None under --benchmark-disable
    if stats is None:
        return
    seconds = stats.stats.median
    if impl == SHIPPED:
        _shipped_seconds[(quant, fused)] = seconds
    elif (quant, fused) in _shipped_seconds:
        info["x_shipped"] = round(seconds / _shipped_seconds[(quant, fused)], 3)
        info["bound"] = PEER_COST_BOUND
