"""The MoE-model features (MoEConfig's swiglu_limit, dropped_slots, shared_experts) end to end:
their config fields, their problems, the reference against an independent dense computation,
the shipped implementation quiet under the differential, the peers' refusals, and checks that
fail when a side ignores a feature."""

from __future__ import annotations

import os
import sys

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

import reference.moe as ref_moe  # noqa: E402
from dense_moe import dense_moe_float64  # noqa: E402
from diffmoe.frontends import cli  # noqa: E402
from diffmoe.problem.config import MAX_SWIGLU_LIMIT, SHARED_EXPERT_WEIGHT, MoEConfig  # noqa: E402
from diffmoe.problem.edge_cases import edge_cases  # noqa: E402
from diffmoe.fuzz.driver import fuzz  # noqa: E402
from diffmoe.problem.inputs import make_problem  # noqa: E402
from diffmoe.check.report import check_command  # noqa: E402
from diffmoe.findings import Oracles
from diffmoe.judge.runner import run_differential  # noqa: E402
from reference import reference_moe  # noqa: E402

FEATURE_LABELS = ("swiglu-limit", "swiglu-limit-below-almost-every-value", "dropped-slots",
                  "dropped-slots-with-expert-map", "all-slots-dropped", "shared-experts")
SMALL = MoEConfig(num_tokens=6, num_experts=4, topk=2, hidden=128, inter=128, quant="fp8-token", seed=5)


# ---- config --------------------------------------------------------------------------------


@pytest.mark.parametrize("fields,error,message", [
    (dict(swiglu_limit=float("nan")), ValueError, r"swiglu_limit must be finite and in \(0, 65536\]"),
    (dict(swiglu_limit=float("inf")), ValueError, "swiglu_limit"),
    (dict(swiglu_limit=0.0), ValueError, "swiglu_limit"),
    (dict(swiglu_limit=-1.0), ValueError, "swiglu_limit"),
    (dict(swiglu_limit=MAX_SWIGLU_LIMIT * 2), ValueError, "swiglu_limit"),
    (dict(swiglu_limit="7"), TypeError, "swiglu_limit"),
    (dict(swiglu_limit=True), TypeError, "swiglu_limit"),
    (dict(dropped_slots=-1), ValueError, "dropped_slots"),
    (dict(num_tokens=3, topk=2, dropped_slots=7), ValueError, r"dropped_slots must be in \[0, num_tokens \* topk = 6\]"),
    (dict(dropped_slots=1.0), TypeError, "dropped_slots"),
    (dict(topk=2, shared_experts=2), ValueError, r"shared_experts must be in \[0, min\(8, topk - 1\) = 1\]"),
    (dict(num_experts=16, topk=12, shared_experts=9), ValueError, "shared_experts"),
    (dict(shared_experts=-1), ValueError, "shared_experts"),
    (dict(shared_experts=False), TypeError, "shared_experts"),
])
def test_invalid_feature_fields_are_named_with_their_range(fields, error, message):
    with pytest.raises(error, match=message):
        MoEConfig(**fields)


def test_features_round_trip_and_show_in_the_replay_line_only_when_set():
    cfg = SMALL.replace(swiglu_limit=7, dropped_slots=3, shared_experts=1)
    assert cfg.swiglu_limit == 7.0 and isinstance(cfg.swiglu_limit, float)
    assert MoEConfig.from_json(cfg.to_json()) == cfg
    line = check_command(cfg)
    assert line.endswith("--swiglu-limit 7.0 --dropped-slots 3 --shared-experts 1")
    assert cli.config_from_args(cli.build_parser().parse_args(line.split()[1:])) == cfg
    plain = check_command(SMALL)
    assert not any(flag in plain for flag in ("--swiglu-limit", "--dropped-slots", "--shared-experts"))
    # a config file written before the fields existed loads as the same config
    old = {k: v for k, v in SMALL.to_dict().items() if k not in ("swiglu_limit", "dropped_slots", "shared_experts")}
    assert MoEConfig.from_dict(old) == SMALL


# ---- problems ------------------------------------------------------------------------------


def test_dropped_slots_change_only_the_ids_they_drop():
    plain, dropped = make_problem(SMALL), make_problem(SMALL.replace(dropped_slots=5))
    drop = dropped.topk_ids == -1
    assert int(drop.sum()) == 5
    assert torch.equal(dropped.topk_ids[~drop], plain.topk_ids[~drop])
    assert torch.equal(dropped.topk_weights, plain.topk_weights)  # a dropped slot keeps its router weight
    assert torch.equal(dropped.hidden_states, plain.hidden_states) and torch.equal(dropped.w1, plain.w1)
    assert torch.equal(make_problem(SMALL.replace(dropped_slots=5)).topk_ids, dropped.topk_ids)  # deterministic


def test_shared_experts_fill_the_last_slots():
    cfg = SMALL.replace(num_experts=6, topk=4, shared_experts=2, router="softmax-topk")
    p = make_problem(cfg)
    assert p.topk_ids[:, 2:].tolist() == [[4, 5]] * cfg.num_tokens
    assert torch.all(p.topk_weights[:, 2:] == SHARED_EXPERT_WEIGHT)
    assert int(p.topk_ids[:, :2].max()) < 4 and torch.all(p.topk_weights[:, :2] < 1)


def _has_a_feature(c: MoEConfig) -> bool:
    return c.swiglu_limit is not None or c.dropped_slots > 0 or c.shared_experts > 0


@pytest.mark.parametrize("asked", [False, True])
def test_the_fuzzer_draws_the_features_only_when_asked(monkeypatch, asked):
    from stand_in_runner import make_fake_runner

    fake = make_fake_runner(fails=lambda c: False)
    monkeypatch.setitem(sys.modules, "diffmoe.judge.runner", fake)
    args = cli.build_parser().parse_args(["fuzz", *(["--model-features"] if asked else [])])
    assert args.model_features is asked
    assert fuzz(max_examples=30, seed=0, features=args.model_features).passed
    assert any(map(_has_a_feature, fake.calls)) is asked


# ---- the reference -------------------------------------------------------------------------


def test_all_slots_dropped_give_exact_zeros_even_for_non_finite_tokens():
    cfg = SMALL.replace(dropped_slots=SMALL.routed_rows, nan_rows=1, inf_rows=1, quant="fp8-block")
    out = reference_moe(make_problem(cfg)).output
    assert torch.equal(out.view(torch.int16), torch.zeros_like(out).view(torch.int16))  # +0 everywhere


def test_a_limit_above_every_value_is_the_plain_activation_and_a_tight_one_is_not():
    cfg = edge_cases("fp8-token")["swiglu-limit"]
    unclamped = reference_moe(make_problem(cfg.replace(swiglu_limit=None))).output
    assert torch.equal(reference_moe(make_problem(cfg.replace(swiglu_limit=MAX_SWIGLU_LIMIT))).output, unclamped)
    assert not torch.equal(reference_moe(make_problem(cfg)).output, unclamped)


def _dense_error(problem) -> float:
    ref = reference_moe(problem).output.double()
    dense = dense_moe_float64(problem, quantized_input=problem.config.swiglu_limit is not None)
    return ((ref - dense).norm() / dense.norm().clamp_min(1e-30)).item()


@pytest.mark.parametrize("label,broken", [
    ("swiglu-limit", "clamp ignored"),
    ("dropped-slots-with-expert-map", "dropped slot looked up as expert_map[-1]"),
])
def test_the_dense_comparison_catches_a_reference_that_ignores_a_feature(monkeypatch, label, broken):
    problem = make_problem(edge_cases("fp8-token")[label])
    assert _dense_error(problem) <= 2**-3  # tests/reference/test_reference.py's bound: quiet on the real reference
    if broken == "clamp ignored":
        plain = ref_moe.silu_and_mul
        monkeypatch.setattr(ref_moe, "silu_and_mul", lambda gate_up, limit=None, r=None: plain(gate_up, None, r))
    else:
        monkeypatch.setattr(ref_moe, "local_expert_ids", lambda p: p.expert_map.long()[p.topk_ids.long().flatten()])
    assert _dense_error(problem) > 2**-3, broken


# ---- the shipped implementation ------------------------------------------------------------


@pytest.mark.parametrize("label", FEATURE_LABELS)
@pytest.mark.parametrize("quant,fused", [("fp8-token", True), ("fp8-tensor", False), ("bf16", False)])
def test_the_shipped_implementation_is_quiet_on_the_features(quant, fused, label):
    cfg = edge_cases(quant, fused=fused)[label]
    report = run_differential(cfg, oracles=[Oracles.DIFFERENTIAL, Oracles.TEACHER_FORCING], schedules=["identity"])
    assert report.passed, report


@pytest.mark.parametrize("fused", [False, True])
def test_the_differential_catches_a_clamp_ignored_on_either_side(monkeypatch, fused):
    cfg = edge_cases("fp8-token", fused=fused)["swiglu-limit"]
    plain = ref_moe.silu_and_mul
    with monkeypatch.context() as mp:  # the reference ignores the limit, the kernel applies it
        mp.setattr(ref_moe, "silu_and_mul", lambda gate_up, limit=None, r=None: plain(gate_up, None, r))
        assert not run_differential(cfg, oracles=[Oracles.DIFFERENTIAL], schedules=["identity"]).passed
    import optimized.moe as opt_moe

    row_stage = opt_moe.run_row_stage
    with monkeypatch.context() as mp:  # the kernel ignores the limit
        mp.setattr(opt_moe, "run_row_stage", lambda *a, swiglu_limit=None, **k: row_stage(*a, **k))
        assert not run_differential(cfg, oracles=[Oracles.DIFFERENTIAL], schedules=["identity"]).passed


# ---- the peers -----------------------------------------------------------------------------


# (peer, a config it runs, the fields it refuses): vLLM wires the clamp (its apply takes
# the layer's swiglu_limit) and meets -1 slots only under an expert map; lmdeploy and Liger wire neither
PEER_REFUSALS = [
    ("vllm", SMALL, ("dropped_slots",)),
    ("lmdeploy", SMALL.replace(quant="fp8-block"), ("swiglu_limit", "dropped_slots")),
    ("liger", SMALL.replace(quant="bf16"), ("swiglu_limit", "dropped_slots")),
]


@pytest.mark.parametrize("peer,base,refused", PEER_REFUSALS, ids=[p[0] for p in PEER_REFUSALS])
def test_the_peers_refuse_what_they_do_not_wire_and_take_shared_experts(peer, base, refused):
    from diffmoe.adapters.loading import load_factory

    make = load_factory(peer)
    assert make.supports(base) is None
    for fields, name in ((dict(swiglu_limit=7.0), "swiglu_limit"), (dict(dropped_slots=1), "dropped_slots")):
        reason = make.supports(base.replace(**fields))
        if name in refused:
            assert reason is not None and reason.startswith(f"{name} must be"), reason
        else:
            assert reason is None, reason
    assert make.supports(base.replace(topk=3, shared_experts=1)) is None  # just more experts