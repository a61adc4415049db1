"""Default inputs that tell experts apart (issue 42 item 4): every config's local experts have their
own weight range (expert_scale_spread, on by default) and a few outlier input channels
(outlier_channels, on by default), unless turned off with 0; the same seed gives the same inputs;
replay lines and config files keep meaning the problem they meant; and a kernel that scales every
expert by expert 0's per-tensor weight scale is caught by a default check and a default fuzz."""

from __future__ import annotations

import json
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from diffmoe.check.report import check_command  # noqa: E402
from diffmoe.frontends import cli  # noqa: E402
from diffmoe.problem.config import (  # noqa: E402
    DEFAULT_EXPERT_SCALE_SPREAD, DEFAULT_OUTLIER_CHANNELS, MAX_OUTLIER_CHANNELS, OUTLIER_OCTAVES, MoEConfig,
)
from diffmoe.problem.inputs import make_problem  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")

OFF = dict(expert_scale_spread=0, outlier_channels=0)
# the config: a decode batch, four experts, per-tensor weights beside per-token activations
SMALL_FLAGS = ["--tokens", "8", "--experts", "4", "--topk", "2", "--hidden", "128", "--inter", "128",
               "--weight-scales", "tensor", "--act-scales", "token"]
MUTANT = "bug_zoo:make_expert_zero_weight_scale"


def _tensors(config: MoEConfig) -> dict[str, torch.Tensor]:
    p = make_problem(config)
    return {"hidden_states": p.hidden_states, "topk_ids": p.topk_ids, "topk_weights": p.topk_weights,
            **p.inputs(), "w1_master": p.w1_master, "w2_master": p.w2_master}


# ---- the defaults ------------------------------------------------------------------------------


def test_a_default_config_spreads_its_experts_and_has_outlier_channels():
    c = MoEConfig()
    assert (c.expert_scale_spread, c.outlier_channels) == (DEFAULT_EXPERT_SCALE_SPREAD, DEFAULT_OUTLIER_CHANNELS)
    assert DEFAULT_EXPERT_SCALE_SPREAD > 0 and DEFAULT_OUTLIER_CHANNELS > 0


@pytest.mark.parametrize("seed", range(10))
def test_default_inputs_give_every_expert_its_own_per_tensor_weight_scale(seed):
    # the observation: with both off, at H, I >= 256 every expert's amax is the 4-std clamp
    base = dict(num_experts=4, hidden=256, inter=256, quant="fp8-tensor", seed=seed)
    off = make_problem(MoEConfig(**base, **OFF))
    assert torch.equal(off.w1_scale, off.w1_scale[:1].expand(4)) and torch.equal(off.w2_scale, off.w2_scale[:1].expand(4))
    on = make_problem(MoEConfig(**base))
    for scale in (on.w1_scale, on.w2_scale):
        ratios = scale[1:] / scale[0]  # what using expert 0's scale multiplies each other expert by
        assert bool(((ratios - 1).abs() > 0.01).all()), (seed, scale)


def test_outlier_channels_are_a_few_input_columns_of_each_expert_scaled_2x_to_8x():
    c = MoEConfig(num_experts=3, hidden=128, inter=96, quant="bf16", expert_scale_spread=0, outlier_channels=5)
    plain, outl = make_problem(c.replace(outlier_channels=0)), make_problem(c)
    lo, hi = 2.0 ** OUTLIER_OCTAVES[0], 2.0 ** OUTLIER_OCTAVES[1]
    for name in ("w1_master", "w2_master"):
        a, b = getattr(plain, name).float(), getattr(outl, name).float()  # [L, N, C]
        for e in range(c.num_experts):
            moved = (a[e] != b[e]).any(dim=0)  # [C]: the columns that changed
            assert int(moved.sum()) == 5, (name, e)
            ratio = b[e][:, moved].abs().sum(dim=0) / a[e][:, moved].abs().sum(dim=0)  # bf16 rounding: within 1 %
            assert bool(((ratio > lo * 0.99) & (ratio < hi * 1.01)).all()), (name, e, ratio)
        # each expert its own columns (3 experts drawing the same 5 of 96+ columns: never at this seed)
        cols = [tuple((a[e] != b[e]).any(dim=0).nonzero().flatten().tolist()) for e in range(c.num_experts)]
        assert len(set(cols)) == c.num_experts, (name, cols)
    # more outliers than columns: every column is one (cut to the width, not refused)
    wide = MoEConfig(num_experts=1, topk=1, hidden=16, inter=16, quant="bf16", expert_scale_spread=0,
                     outlier_channels=MAX_OUTLIER_CHANNELS)
    assert bool((make_problem(wide).w1_master != make_problem(wide.replace(outlier_channels=0)).w1_master).any(dim=1).all())


def test_the_outliers_change_the_weights_only():
    c = MoEConfig(num_tokens=6, hidden=128, inter=128, zero_rows=1, nan_rows=1, router="softmax-topk", seed=5)
    a, b = _tensors(c), _tensors(c.replace(outlier_channels=0))
    for name in ("hidden_states", "topk_ids", "topk_weights"):
        assert torch.equal(a[name], b[name]) or (name == "hidden_states" and torch.equal(a[name].nan_to_num(), b[name].nan_to_num()))
    assert not torch.equal(a["w1_master"], b["w1_master"]) and not torch.equal(a["w2_master"], b["w2_master"])


# ---- determinism -----------------------------------------------------------------------------


@pytest.mark.parametrize("quant", ["fp8-tensor", "fp8-token", "fp8-block", "bf16"])
def test_same_seed_same_inputs(quant):
    c = MoEConfig(num_tokens=5, num_experts=5, topk=2, hidden=256, inter=128, quant=quant, seed=123)
    first, second = _tensors(c), _tensors(MoEConfig.from_json(c.to_json()))
    assert first.keys() == second.keys()
    for name in first:
        assert first[name].dtype == second[name].dtype and torch.equal(first[name].view(torch.uint8),
                                                                        second[name].view(torch.uint8)), name
    other = _tensors(c.replace(seed=124))
    assert not torch.equal(first["w1_master"], other["w1_master"])


# ---- validation, JSON and replay lines ---------------------------------------------------------


@pytest.mark.parametrize("value,exc", [(-1, ValueError), (MAX_OUTLIER_CHANNELS + 1, ValueError), (True, TypeError),
                                       ("2", TypeError), (2.0, TypeError)])
def test_a_bad_outlier_count_is_refused_naming_the_field_and_its_range(value, exc):
    with pytest.raises(exc, match=rf"outlier_channels must be .*\[0, {MAX_OUTLIER_CHANNELS}\]"):
        MoEConfig(outlier_channels=value)


def test_the_flag_out_of_range_exits_2_with_one_line(capsys):
    code = cli.main(["check", "--outlier-channels", str(MAX_OUTLIER_CHANNELS + 1)])
    err = capsys.readouterr().err
    assert code == 2 and "outlier_channels" in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_a_stored_config_without_outlier_channels_means_none():
    # every stored reproducer names every field it had, expert_scale_spread included; none names outliers
    stored = MoEConfig(num_tokens=3, **OFF).to_dict()
    assert "outlier_channels" not in stored and stored["expert_scale_spread"] == 0  # serialises as before: checksums unchanged
    assert MoEConfig.from_dict(stored) == MoEConfig(num_tokens=3, **OFF)
    assert MoEConfig.from_dict({**stored, "expert_scale_spread": 3}).outlier_channels == 0
    # a config with the defaults names both, so it reads back with them
    assert MoEConfig.from_json(MoEConfig(num_tokens=3).to_json()) == MoEConfig(num_tokens=3)
    assert json.loads(MoEConfig(num_tokens=3).to_json())["outlier_channels"] == DEFAULT_OUTLIER_CHANNELS
    # a hand-written file naming neither: the defaults, as for every other field it leaves out
    assert MoEConfig.from_json('{"num_tokens": 3}') == MoEConfig(num_tokens=3)


@pytest.mark.parametrize("fields", [{}, OFF, dict(expert_scale_spread=4, outlier_channels=1),
                                    dict(expert_scale_spread=0, outlier_channels=MAX_OUTLIER_CHANNELS)])
def test_a_replay_line_names_both_fields_and_rebuilds_exactly_those_inputs(fields):
    config = MoEConfig(num_tokens=4, num_experts=3, topk=2, hidden=128, inter=128, seed=7, **fields)
    command = check_command(config)
    assert f"--expert-scale-spread {config.expert_scale_spread}" in command
    assert f"--outlier-channels {config.outlier_channels}" in command
    args = cli.build_parser().parse_args(command.split()[1:])
    replayed = cli.config_from_args(args)
    assert replayed == config
    a, b = _tensors(config), _tensors(replayed)
    assert all(torch.equal(a[n].view(torch.uint8), b[n].view(torch.uint8)) for n in a)


# ---- the planted defect: every expert dequantised with expert 0's per-tensor weight scale ---------


def _check(capsys, *argv) -> int:
    code = cli.main(["check", "--oracles", "differential", *argv])
    capsys.readouterr()
    return code


@pytest.mark.slow
def test_a_default_check_catches_the_expert_zero_scale_kernel_at_seeds_0_to_9(capsys):
    caught = [s for s in range(10) if _check(capsys, "--impl", MUTANT, *SMALL_FLAGS, "--seed", str(s)) == 1]
    assert caught == list(range(10))
    # the inputs are what catch it: with both off (the defaults before issue 42) it passes seed 0
    assert _check(capsys, "--impl", MUTANT, *SMALL_FLAGS, "--seed", "0", "--expert-scale-spread", "0",
                  "--outlier-channels", "0") == 0


@pytest.mark.slow
def test_the_shipped_kernel_passes_the_same_default_checks(capsys):
    assert [s for s in range(10) if _check(capsys, *SMALL_FLAGS, "--seed", str(s)) != 0] == []


@pytest.mark.slow
def test_a_default_fuzz_catches_the_expert_zero_scale_kernel(capsys):
    code = cli.main(["fuzz", "--seed", "0", "--impl", MUTANT, "--no-shrink", "--json"])
    data = json.loads(capsys.readouterr().out)
    assert code == 1, data
    found = MoEConfig.from_dict(data["config"])
    assert found.weight_granularity == "tensor" and found.num_local_experts >= 2, found
