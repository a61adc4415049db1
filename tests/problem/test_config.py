"""MoEConfig: every invalid field is named in its error; JSON round trips exactly."""

import pytest

from diffmoe.problem.config import MoEConfig

INVALID = [
    ("num_tokens", dict(num_tokens=0), ValueError),
    ("num_tokens", dict(num_tokens=-3), ValueError),
    ("num_tokens", dict(num_tokens=2.5), TypeError),
    ("num_tokens", dict(num_tokens=True), TypeError),
    ("num_tokens", dict(num_tokens=10**9), ValueError),
    ("num_experts", dict(num_experts=0), ValueError),
    ("topk", dict(num_experts=2, topk=3), ValueError),
    ("topk", dict(topk=0), ValueError),
    ("hidden", dict(hidden=0), ValueError),
    ("inter", dict(inter="128"), TypeError),
    ("hidden", dict(quant="fp8-block", hidden=200), ValueError),
    ("inter", dict(quant="fp8-block", inter=64), ValueError),
    ("quant", dict(quant="int4"), ValueError),
    ("fused", dict(quant="bf16", fused=True), ValueError),
    ("fused", dict(fused=1), TypeError),
    ("activation", dict(activation="gelu"), ValueError),
    ("router_weight", dict(router_weight="middle"), ValueError),
    ("topk", dict(router_weight="input", topk=2), ValueError),
    ("planner", dict(planner="greedy"), ValueError),
    ("output", dict(output="heap"), ValueError),
    ("skew", dict(skew="zipf"), ValueError),
    ("seed", dict(seed=-1), ValueError),
    ("expert_map", dict(num_experts=4, expert_map=(0, 1)), ValueError),
    ("expert_map", dict(num_experts=3, expert_map=(0, 0, 1)), ValueError),
    ("expert_map", dict(num_experts=3, expert_map=(0, 2, -1)), ValueError),
    ("expert_map", dict(num_experts=3, expert_map=(0, -2, 1)), ValueError),
    ("expert_map", dict(num_experts=2, expert_map=(-1, -1)), ValueError),
    ("expert_map", dict(num_experts=2, expert_map=("a", 0)), TypeError),
    ("num_tokens * topk", dict(num_tokens=2**20, num_experts=32, topk=32, hidden=16, inter=16), ValueError),
    # the opt-in inputs and the schedule count
    ("call_tokens", dict(num_tokens=4, call_tokens=5), ValueError),
    ("call_tokens", dict(call_tokens=-1), ValueError),
    ("call_tokens", dict(call_tokens=2.0), TypeError),
    ("router", dict(router="top-p"), ValueError),
    ("renormalize", dict(renormalize=True), ValueError),  # random-k weights are already normalised
    ("renormalize", dict(router="softmax-topk", renormalize="yes"), TypeError),
    ("expert_scale_spread", dict(expert_scale_spread=5), ValueError),
    ("expert_scale_spread", dict(expert_scale_spread=-1), ValueError),
    ("nan_rows", dict(num_tokens=2, nan_rows=3), ValueError),
    ("zero_rows", dict(zero_rows=1.5), TypeError),
    ("inf_rows", dict(num_tokens=4, call_tokens=1, inf_rows=2), ValueError),
    ("zero_rows + nan_rows + inf_rows", dict(num_tokens=2, zero_rows=1, nan_rows=1, inf_rows=1), ValueError),
    ("tie_heavy", dict(tie_heavy=1), TypeError),
    ("random_orders", dict(random_orders=17), ValueError),
    ("random_orders", dict(random_orders=-1), ValueError),
    ("random_orders", dict(random_orders=None), TypeError),
    # the reference's numerics profile
    ("numerics", dict(numerics="fast"), ValueError),
    ("numerics", dict(numerics=""), ValueError),
    ("numerics", dict(numerics=1), TypeError),
]


@pytest.mark.parametrize("field,changes,error", INVALID, ids=[f"{f}:{c}" for f, c, _ in INVALID])
def test_invalid_config_names_the_field(field, changes, error):
    with pytest.raises(error) as info:
        MoEConfig(**changes)
    assert field in str(info.value)


def test_valid_configs_construct():
    MoEConfig()
    MoEConfig(quant="fp8-block", hidden=256, inter=128, fused=True)
    MoEConfig(num_experts=3, expert_map=[1, -1, 0])  # a list is accepted and stored as a tuple


@pytest.mark.parametrize(
    "config",
    [
        MoEConfig(),
        MoEConfig(num_tokens=1, num_experts=1, topk=1, quant="bf16", output="workspace"),
        MoEConfig(quant="fp8-block", fused=True, planner="legacy", seed=2**40),
        MoEConfig(num_experts=3, topk=1, expert_map=(1, -1, 0), router_weight="input", skew="one-expert"),
        MoEConfig(num_tokens=9, call_tokens=4, router="softmax-topk", renormalize=True, expert_scale_spread=3,
                  zero_rows=1, nan_rows=1, inf_rows=1, tie_heavy=True, random_orders=5),
        MoEConfig(numerics="vllm"),
        MoEConfig(quant="bf16", numerics="diffmoe"),
    ],
)
def test_json_round_trip_is_exact(config):
    text = config.to_json()
    back = MoEConfig.from_json(text)
    assert back == config
    assert back.to_json() == text


@pytest.mark.parametrize(
    "text,needle",
    [
        ("{", "not valid JSON"),
        ("[1, 2]", "JSON object"),
        ('{"num_tokens": 4, "bogus": 1}', "bogus"),
        ('{"expert_map": "0,1"}', "expert_map"),
        ('{"num_tokens": "8"}', "num_tokens"),
    ],
)
def test_bad_json_is_a_clear_error(text, needle):
    with pytest.raises((TypeError, ValueError)) as info:
        MoEConfig.from_json(text)
    assert needle in str(info.value)


def test_numerics_names_its_profiles_and_none_is_diffmoes():
    with pytest.raises(ValueError, match=r"numerics must be None or one of \['diffmoe', 'vllm', 'liger', 'lmdeploy', 'sglang', 'sglang_fallback'\], got 'fast'"):
        MoEConfig(numerics="fast")
    assert MoEConfig().numerics is None and MoEConfig().numerics_profile == "diffmoe"
    assert MoEConfig(numerics="vllm").numerics_profile == "vllm"
    assert MoEConfig.from_json('{"numerics": null}') == MoEConfig()  # a file without the field reads the same


def test_the_replay_line_and_summary_name_numerics_only_when_set():
    from diffmoe.check.report import check_command

    plain = MoEConfig()
    assert "numerics" not in check_command(plain, "optimized") and "numerics" not in plain.short()
    for profile in ("diffmoe", "vllm"):
        c = MoEConfig(numerics=profile, zero_rows=1, nan_rows=1)  # the command line's padding and NaN tokens: not named
        # the spread and the outliers are named whatever their value (config.ALWAYS_NAMED, issue 42)
        assert check_command(c, "optimized").endswith(f"--seed 0 --expert-scale-spread 2 --outlier-channels 4 --numerics {profile}")
        assert f"numerics={profile}" in c.short()
