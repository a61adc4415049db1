"""The false-alarm campaign: many configs from a realistic serving profile, run with every
oracle against a correct implementation, where any finding is a false alarm.

A differential tester is only trusted if it never cries wolf on correct code. Hypothesis
(diffmoe.fuzz.strategies) looks for bugs and shrinks toward the smallest config; this campaign
instead samples what engines really run, at the sizes where tolerances that do not compose
would break: many tokens, wide H and I, many experts, every scheme, both fused settings and
output placements, calls below the workspace maximum, per-expert weight scales, NaN/Inf/zero
rows, softmax-top-k router weights.

Profile (`draw_config`, each field independent unless said; `rng` is a seeded
`random.Random`, so a campaign seed gives the same configs everywhere):

* quant: uniform over QUANT_SCHEMES; fused: a coin for FP8 (bf16 has no fused path).
* T: log-uniform integer in 1..PROFILE_MAX_TOKENS (512).
* E: log-uniform integer in 1..PROFILE_MAX_EXPERTS (64); K: uniform in 1..min(E, 8).
* H, I: 128 * a log-uniform integer in 1..8 (128..1024); for schemes other than fp8-block a
  quarter of the draws are ragged instead, a multiple of 16 in 16..1024.
* output: separate/workspace; router_weight "input" on a third of the K = 1 draws.
* expert_map: a fifth of the draws with E >= 2 hold a random half of the experts locally.
* skew: uniform 70 %, one-expert 10 %, empty-experts 20 %.
* call_tokens: two fifths of the draws with T >= 2 call with 1..T-1 tokens.
* router: softmax-topk 60 % (half of them renormalised), random-k 40 %.
* expert_scale_spread: uniform 0..MAX_EXPERT_SCALE_SPREAD octaves.
* special rows, at the fuzz's shares: half the draws hold 1..2 all-zero (padding) tokens, an
  eighth one NaN token, an eighth one Inf token (cut to the call's T); tie_heavy on a tenth.
* seed: uniform 0..2**31-1; planner: fixed (the campaign judges correct code).
* drawn last (issue 27 item 5): per-tensor weights (`weight_scales="tensor"`) on half the
  fp8-token draws, so every pair of config.SCALE_PAIRS runs; a routed_scaling_factor on a fifth
  of the draws, one of ROUTED_SCALING_FACTORS (DeepSeek-V3's 2.5, DeepSeek-V2's 16.0, 0.5).
* drawn after them (issue 42): outlier_channels uniform in 0..MAX_OUTLIER_CHANNELS.

The interpreter's cost of a config grows with its GEMM programs (row blocks times tiles
times K-steps), so a draw whose `cost_units` exceed the cap is drawn again, and the corners
(`corner_configs`: each axis at its profile maximum, the others small, for every scheme)
are run beside the sampled configs so the extremes are covered whatever the cap.

Each config is one check, so a campaign is a list of independent tasks (`CampaignCheck` through
`check_config`, diffmoe/cluster/tasks.py): bench/false_alarm_campaign.py runs them in its process with
one worker and as Ray tasks with more (`--workers N --cluster ...`), a task loading its `--impl` itself.

Owns the profile, the cost model and the corners.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from diffmoe.problem.config import MAX_EXPERT_SCALE_SPREAD, MAX_OUTLIER_CHANNELS, QUANT_BLOCK, QUANT_SCHEMES, MoEConfig, check_int

# The routed scaling factors the profile draws: DeepSeek-V3's, DeepSeek-V2's, and one below 1.
ROUTED_SCALING_FACTORS = (2.5, 16.0, 0.5)

PROFILE_MAX_TOKENS = 512
PROFILE_MAX_EXPERTS = 64
PROFILE_MAX_TOPK = 8  # serving engines route to at most 8 experts (DeepSeek-V3, Qwen3: 8)
PROFILE_MAX_WIDTH = 1024  # H and I
# Default cap on cost_units, and what a unit costs. Measured on the interpreter, every oracle,
# a busy 2-core machine (2026-12-03): a check takes about 0.4 s per unit (T=1 E=14 K=2 H=256
# I=128: 12 units, 3.5 s; T=77 E=2 K=1 H=128 I=528 fp8-tensor: 74 units, 27 s; T=1 E=10 K=8
# H=256 I=768 fp8-block: 171 units, 72 s), so a capped config takes at most about a minute.
DEFAULT_COST_CAP = 120

# The interpreter's tiles (optimized/tiles.py): rows per GEMM block, columns per program, K step,
# rows per row-kernel program, columns per row-kernel step.
_BLOCK_M, _BLOCK_N, _BLOCK_K, _ROWS, _COLS = 32, 256, QUANT_BLOCK, 32, 256


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def cost_units(config: MoEConfig) -> int:
    """Program-steps of one run of the call on the interpreter, whose cost is per program and
    per loop step, not per element: for both GEMMs the row blocks (cdiv(TK, BLOCK_M) plus a
    partial block per expert hit, at most min(L, TK)) times the column tiles times the K-steps;
    for the row kernels (input quant, activation and its quant, reduce) programs times column
    steps, twice where per-tensor scales need an amax pass."""
    t = config.call_num_tokens
    tk = t * config.topk
    h, i = config.hidden, config.inter
    blocks = _cdiv(tk, _BLOCK_M) + min(config.num_local_experts, tk)
    gemms = blocks * (_cdiv(2 * i, _BLOCK_N) * _cdiv(h, _BLOCK_K) + _cdiv(h, _BLOCK_N) * _cdiv(i, _BLOCK_K))
    passes = 2 if config.quant == "fp8-tensor" else 1
    activation = _cdiv(tk, _ROWS) * _cdiv(i, _COLS) * (passes if config.is_fp8 else 1) * (1 if config.fused else 2)
    token_rows = _cdiv(t, _ROWS) * _cdiv(h, _COLS)
    return gemms + activation + token_rows * (1 + (passes if config.is_fp8 else 0))


def _log_uniform_int(rng: random.Random, lo: int, hi: int) -> int:
    return min(hi, int(math.exp(rng.uniform(math.log(lo), math.log(hi + 1)))))


def _width(rng: random.Random, quant: str) -> int:
    if quant != "fp8-block" and rng.random() < 0.25:
        return 16 * rng.randint(1, PROFILE_MAX_WIDTH // 16)
    return QUANT_BLOCK * _log_uniform_int(rng, 1, PROFILE_MAX_WIDTH // QUANT_BLOCK)


def draw_config(rng: random.Random) -> MoEConfig:
    """One config of the profile (see the module docstring), cost not yet capped."""
    quant = rng.choice(QUANT_SCHEMES)
    t = _log_uniform_int(rng, 1, PROFILE_MAX_TOKENS)
    e = _log_uniform_int(rng, 1, PROFILE_MAX_EXPERTS)
    k = rng.randint(1, min(e, PROFILE_MAX_TOPK))
    fields: dict = dict(
        num_tokens=t, num_experts=e, topk=k, hidden=_width(rng, quant), inter=_width(rng, quant), quant=quant,
        fused=quant != "bf16" and rng.random() < 0.5, output=rng.choice(("separate", "workspace")),
        seed=rng.randrange(2**31), planner="fixed",
    )
    if k == 1 and rng.random() < 1 / 3:
        fields["router_weight"] = "input"
    if e >= 2 and rng.random() < 0.2:
        local = sorted(rng.sample(range(e), max(1, e // 2)))
        fields["expert_map"] = tuple(local.index(g) if g in local else -1 for g in range(e))
    r = rng.random()
    fields["skew"] = "uniform" if r < 0.7 else "one-expert" if r < 0.8 else "empty-experts"
    if t >= 2 and rng.random() < 0.4:
        fields["call_tokens"] = rng.randint(1, t - 1)
    if rng.random() < 0.6:
        fields["router"] = "softmax-topk"
        fields["renormalize"] = rng.random() < 0.5
    fields["expert_scale_spread"] = rng.randint(0, MAX_EXPERT_SCALE_SPREAD)
    call_t = fields.get("call_tokens", t)
    # the fuzz's shares (diffmoe.fuzz.strategies): padding in half the calls, a non-finite token rarer
    zero = min(call_t, rng.randint(1, 2)) if rng.random() < 0.5 else 0
    nan = min(call_t - zero, 1) if rng.random() < 0.125 else 0
    inf = min(call_t - zero - nan, 1) if rng.random() < 0.125 else 0
    fields.update(zero_rows=zero, nan_rows=nan, inf_rows=inf)
    fields["tie_heavy"] = rng.random() < 0.1
    if quant == "fp8-token" and rng.random() < 0.5:
        fields["weight_scales"] = "tensor"
    if rng.random() < 0.2:
        fields["routed_scaling_factor"] = rng.choice(ROUTED_SCALING_FACTORS)
    fields["outlier_channels"] = rng.randint(0, MAX_OUTLIER_CHANNELS)
    return MoEConfig(**fields)


def sampled_configs(count: int, seed: int = 0, cost_cap: int = DEFAULT_COST_CAP) -> list[MoEConfig]:
    """`count` configs of the profile, each within `cost_cap` cost units (over-cap draws are
    drawn again), the same list for the same arguments."""
    check_int("count", count, 0, 100_000)
    check_int("seed", seed, 0, 2**63 - 1)
    check_int("cost_cap", cost_cap, 1, 10**9)
    rng = random.Random(seed)
    configs: list[MoEConfig] = []
    while len(configs) < count:
        config = draw_config(rng)
        if cost_units(config) <= cost_cap:
            configs.append(config)
    return configs


# The fields a model's shape (diffmoe.problem.models; `--model NAME [--ep R/N]`) sets in a model campaign.
MODEL_FIELDS = ("num_experts", "topk", "hidden", "inter", "quant", "shared_experts", "routed_scaling_factor",
                "swiglu_limit", "expert_map")


def model_configs(count: int, seed: int, shape: dict) -> list[MoEConfig]:
    """`count` configs of the profile at one model's shape (`shape`: MODEL_FIELDS' values, as
    diffmoe.frontends.model_flags.check_fields builds them): each draw of the profile keeps its T, call,
    inputs, special rows and seed, takes the shape's fields, and drops what the shape rules out (the
    fused path for bf16, per-tensor weights for another scheme, router weights on the input for K > 1);
    no cost cap (the shape is the point). The same list for the same arguments; ValueError (the
    config's own) when the shape is one no config may have, a problem over MAX_PROBLEM_BYTES included."""
    check_int("count", count, 0, 100_000)
    check_int("seed", seed, 0, 2**63 - 1)
    rng = random.Random(seed)
    configs = []
    for _ in range(count):
        fields = draw_config(rng).to_dict()
        fields.update({name: shape.get(name) for name in MODEL_FIELDS})
        if fields["expert_map"] is not None:
            fields["expert_map"] = list(fields["expert_map"])  # as a config file holds it
        if fields["quant"] == "bf16":
            fields["fused"] = False
        if fields.get("weight_scales") is not None and fields["quant"] != "fp8-token":
            fields["weight_scales"] = None
        if fields["topk"] > 1:
            fields["router_weight"] = "down"
        if fields.get("dropped_slots", 0) > fields["num_tokens"] * fields["topk"]:
            fields["dropped_slots"] = 0
        configs.append(MoEConfig.from_dict(fields))
    return configs


def corner_configs() -> list[MoEConfig]:
    """Each axis of the profile at its maximum with the others small, for every scheme (fused
    for FP8): T=512; E=64 (K=8 so most experts are busy); K=8; H=1024; I=1024."""
    small = dict(num_tokens=8, num_experts=4, topk=2, hidden=128, inter=128, seed=0)
    axes = {
        "T": dict(num_tokens=PROFILE_MAX_TOKENS),
        "E": dict(num_experts=PROFILE_MAX_EXPERTS, topk=PROFILE_MAX_TOPK, num_tokens=16),
        "K": dict(num_experts=PROFILE_MAX_TOPK, topk=PROFILE_MAX_TOPK),
        "H": dict(hidden=PROFILE_MAX_WIDTH),
        "I": dict(inter=PROFILE_MAX_WIDTH),
    }
    return [
        MoEConfig(**{**small, **axis, "quant": quant, "fused": quant != "bf16"})
        for axis in axes.values() for quant in QUANT_SCHEMES
    ]


@dataclass
class CampaignResult:
    config: MoEConfig
    seconds: float
    findings: list[str] = field(default_factory=list)  # one line per finding: oracle, stage, message
    replay: str = ""

    @property
    def passed(self) -> bool:
        return not self.findings


def run_campaign(configs: list[MoEConfig], *, check: Callable | None = None,
                 on_result: Callable[[int, CampaignResult], None] | None = None) -> Iterator[CampaignResult]:
    """Every config through `check` (default: run_differential with every oracle and the
    default schedules, the shipped implementation), one result each, in order."""
    if check is None:
        from diffmoe.judge.runner import run_differential  # the runner imports torch; the profile above does not
        check = run_differential
    for index, config in enumerate(configs):
        start = time.perf_counter()
        report = check(config)
        result = CampaignResult(
            config=config, seconds=time.perf_counter() - start,
            findings=[f"{f.oracle} {f.stage or '-'}: {f.message}" for f in report.findings],
            replay=report.replay_command() if report.findings else "",
        )
        if on_result is not None:
            on_result(index, result)
        yield result


@dataclass(frozen=True)
class CampaignCheck:
    """One campaign config as a task: plain data, so it travels to a Ray worker."""

    config: MoEConfig
    impl: str | None = None  # an --impl spec the task loads; None: the shipped implementation


_factories: dict[str, Callable] = {}  # by --impl spec: loaded once per process


def check_config(item: CampaignCheck) -> CampaignResult:
    """A task (diffmoe/cluster/tasks.py): `item.config` judged by every oracle against `item.impl`."""
    if item.impl is None:
        return next(run_campaign([item.config]))
    from diffmoe.judge.runner import load_factory, run_differential

    factory = _factories.get(item.impl)
    if factory is None:
        factory = _factories[item.impl] = load_factory(item.impl)
    return next(run_campaign([item.config], check=lambda c: run_differential(c, factory, implementation_name=item.impl)))
