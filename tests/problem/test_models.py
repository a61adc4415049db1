"""Real models' shapes (`--model NAME`, `--ep RANK/SIZE`, `diffmoe models`; diffmoe/problem/models.py,
diffmoe/frontends/model_flags.py, diffmoe/frontends/commands/models.py): each preset holds the numbers
docs/models.md cites, a check and a fuzz take them (a flag given wins), the expert-parallel map is
vLLM's linear placement with the shared experts on every rank and a replay line names it in two
numbers, the tuned-config sweep keeps the files a model loads, bad input is one line and exit 2, and
the shipped kernel passes a real model's shape on one expert-parallel rank.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from diffmoe.check.report import check_command
from diffmoe.frontends import cli
from diffmoe.frontends import model_flags
from diffmoe.frontends.commands import models as models_command
from diffmoe.fuzz.bounds import FieldBounds
from diffmoe.fuzz.campaign import MODEL_FIELDS, model_configs
from diffmoe.problem.config import MAX_PROBLEM_BYTES, MAX_TOKENS, MoEConfig
from diffmoe.problem.models import MODELS, ep_placement, expert_parallel_map, model, parse_ep

DOCS = Path(__file__).resolve().parents[2] / "docs" / "models.md"


def _config(*argv: str) -> MoEConfig:
    return cli.config_from_args(cli.build_parser().parse_args(["check", *argv]))


def _usage(capsys, *argv: str) -> str:
    code = cli.main(list(argv))
    err = capsys.readouterr().err
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    return err


# ---- the table ----------------------------------------------------------------------------------


def _doc_rows() -> dict[str, dict]:
    """docs/models.md's table: name -> the numbers it cites."""
    rows = {}
    for line in DOCS.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 9 or not cells[0].startswith("`"):
            continue
        name = cells[0].strip("`")
        rows[name] = dict(experts=int(cells[1]), topk=int(cells[2]), hidden=int(cells[3]), inter=int(cells[4]),
                          shared=int(cells[5]), scale=None if cells[6] == "-" else float(cells[6]),
                          clamp=None if cells[7] == "-" else float(cells[7]), quant=cells[8].strip("`"))
    return rows


def test_the_docs_table_cites_every_preset_with_its_numbers():
    rows = _doc_rows()
    assert set(rows) == set(MODELS)
    for name, shape in MODELS.items():
        assert rows[name] == dict(experts=shape.experts, topk=shape.topk, hidden=shape.hidden, inter=shape.inter,
                                  shared=shape.shared_experts, scale=shape.routed_scaling_factor,
                                  clamp=shape.swiglu_limit, quant=shape.quant), name
        assert shape.source.startswith("https://huggingface.co/") and shape.source in DOCS.read_text(), name


def test_the_issue_asks_for_these_models():
    """DeepSeek-V3/R1, Kimi K2, both Qwen3 MoEs, a 512-expert model, gpt-oss-120b, GLM-4.5, Mixtral-8x22B."""
    assert {"deepseek-v3", "deepseek-r1", "kimi-k2", "qwen3-30b-a3b", "qwen3-235b-a22b", "gpt-oss-120b", "glm-4.5",
            "mixtral-8x22b"} <= set(MODELS)
    assert any(m.experts == 512 for m in MODELS.values())


@pytest.mark.parametrize("name", sorted(MODELS))
def test_every_preset_is_a_valid_config_on_its_suggested_rank(name):
    shape = MODELS[name]
    fields = shape.fields()
    assert (fields["num_experts"], fields["topk"]) == (shape.experts + shape.shared_experts, shape.topk + shape.shared_experts)
    row = next(r for r in models_command.rows() if r["name"] == name)
    size = row["suggested_ep"] or row["smallest_ep"]
    if size is None:  # one expert is over the suggestion (Mixtral-8x22B): the allowed size
        size = row["smallest_ep"]
    em = None if size == 1 else expert_parallel_map(fields["num_experts"], shape.shared_experts, 0, size)
    config = MoEConfig(num_tokens=8, **fields, expert_map=em)
    assert config.estimated_bytes <= MAX_PROBLEM_BYTES


def test_a_name_is_read_as_written_or_refused_naming_every_preset():
    assert model(" DeepSeek-V3 ") is MODELS["deepseek-v3"]
    with pytest.raises(ValueError, match="--model must be one of deepseek-v3, .*got 'llama'"):
        model("llama", "--model")
    with pytest.raises(TypeError):
        model(3)


# ---- expert parallelism ----------------------------------------------------------------------------


@pytest.mark.parametrize("experts,shared,size", [(256, 1, 64), (256, 1, 7), (384, 1, 48), (8, 0, 3), (160, 1, 16), (5, 0, 5)])
def test_the_ranks_split_the_routed_experts_and_each_holds_the_shared_ones(experts, shared, size):
    total = experts + shared
    held = []
    for rank in range(size):
        m = expert_parallel_map(total, shared, rank, size)
        local = [g for g in range(total) if m[g] != -1]
        assert [m[g] for g in local] == list(range(len(local)))  # numbered 0..L-1 in global order
        routed = [g for g in local if g < experts]
        assert routed == list(range(routed[0], routed[-1] + 1))  # one contiguous slice
        assert local[len(routed):] == list(range(experts, total))  # every shared expert, on every rank
        assert len(routed) in (experts // size, experts // size + 1)
        held += routed
    assert held == list(range(experts))  # each routed expert on exactly one rank, in rank order


def test_placement_bad_input_names_the_flag():
    assert parse_ep("3/8") == (3, 8)
    for text in ("8/8", "-1/4", "1", "a/b", "1/0", ""):
        with pytest.raises(ValueError, match="--ep must be RANK/SIZE"):
            parse_ep(text)
    with pytest.raises(ValueError, match="ep size must be in"):
        expert_parallel_map(9, 1, 0, 9)  # 8 routed experts cannot fill 9 ranks


def test_a_long_map_is_named_by_its_placement_and_a_short_one_by_its_entries():
    long_map = expert_parallel_map(257, 1, 5, 64)
    rank, size = ep_placement(long_map, 1)  # the smallest size holding the same slice (4/63 here)
    assert size <= 64 and expert_parallel_map(257, 1, rank, size) == long_map
    assert ep_placement(long_map, 0) is None  # the shared expert would be routed: no placement of 257 makes it
    assert ep_placement((0, -1), 0) is None  # the fuzz's maps keep their entries, as replay lines showed them
    scrambled = list(long_map)
    a, b = [g for g, local in enumerate(long_map) if local != -1][:2]
    scrambled[a], scrambled[b] = scrambled[b], scrambled[a]  # the same experts, numbered out of order
    assert ep_placement(tuple(scrambled), 1) is None


def test_the_replay_line_of_a_model_check_rebuilds_it_with_ep():
    config = _config("--model", "deepseek-v3", "--ep", "3/32", "--tokens", "16")
    line = check_command(config)
    assert "--ep 3/32" in line and "--expert-map" not in line and len(line) < 400
    assert _config(*line.split()[2:]) == config
    assert "ep=3/32" in config.short()


# ---- check -------------------------------------------------------------------------------------


def test_a_check_takes_the_presets_fields_and_a_flag_given_wins():
    config = _config("--model", "kimi-k2", "--ep", "0/96")
    assert (config.num_experts, config.topk, config.hidden, config.inter) == (385, 9, 7168, 2048)
    assert (config.shared_experts, config.routed_scaling_factor, config.quant) == (1, 2.827, "fp8-block")
    assert (config.router, config.renormalize) == ("softmax-topk", True)
    assert config.num_local_experts == 5  # 384 / 96 routed, and the shared one
    small = _config("--model", "gpt-oss-120b", "--experts", "4", "--topk", "2", "--hidden", "128", "--inter", "128",
                    "--router", "random-k", "--act-scales", "token")
    assert (small.num_experts, small.topk, small.hidden, small.inter) == (4, 2, 128, 128)
    assert (small.swiglu_limit, small.quant, small.router, small.renormalize) == (7.0, "fp8-token", "random-k", False)


def test_the_token_counts_engines_run_are_accepted():
    for tokens in (1, 512, 8192, 65536, 262144, MAX_TOKENS):
        assert MoEConfig(num_tokens=tokens, num_experts=4, topk=2, hidden=16, inter=16).num_tokens == tokens
    with pytest.raises(ValueError, match="num_tokens must be"):
        MoEConfig(num_tokens=MAX_TOKENS + 1)


@pytest.mark.parametrize("argv,says", [
    (["check", "--model", "llama"], "--model must be one of deepseek-v3"),
    (["check", "--model", "deepseek-v3"], "42.2 GiB"),  # the whole layer: over the limit, and says what shrinks it
    (["check", "--model", "deepseek-v3", "--ep", "0/1000"], "ep size must be in [1, 256]"),
    (["check", "--ep", "0/2"], "--ep needs the experts known"),
    (["check", "--model", "qwen3-30b-a3b", "--ep", "0/4", "--expert-map=0,-1"], "--ep and --expert-map cannot be combined"),
    (["check", "--model", "qwen3-30b-a3b", "--config", "x.json"], "--config cannot be combined with config flags (--model)"),
    (["check", "--model", "qwen3-30b-a3b", "--ep", "two"], "--ep must be RANK/SIZE"),
    (["fuzz", "--model", "llama"], "--model must be one of"),
    (["fuzz", "--ep", "0/2"], "--ep needs E pinned"),
])
def test_bad_model_input_is_one_line_and_exit_2(argv, says, capsys):
    err = _usage(capsys, *argv)
    assert says in err, err
    if says == "42.2 GiB":
        assert "--ep RANK/SIZE" in err


def test_the_shipped_kernel_passes_a_real_models_shape_on_one_rank(capsys):
    """Qwen3-Next's 513 experts (512 routed, one shared), top-10 and the shared slot, H = 2048, I = 512: rank 0
    of 512 holds one routed expert and the shared one, so the check is cheap and every other expert is remote."""
    code = cli.main(["check", "--model", "qwen3-next-80b-a3b", "--ep", "0/512", "--tokens", "4", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0, report
    assert report["config"]["num_experts"] == 513 and report["config"]["topk"] == 11 and report["passed"]


# ---- fuzz --------------------------------------------------------------------------------------


def _bounds(*argv: str) -> FieldBounds:
    return cli.fuzz_bounds(cli.build_parser().parse_args(["fuzz", *argv]))


def test_a_fuzz_pins_the_presets_fields_and_its_rank():
    b = _bounds("--model", "deepseek-v3", "--ep", "0/64", "--tokens", "1..64")
    assert b.ranges["num_experts"] == (257, 257) and b.ranges["hidden"] == (7168, 7168) and b.ranges["num_tokens"] == (1, 64)
    assert b.values["routed_scaling_factor"] == (2.5,) and b.values["quant"] == ("fp8-block",)
    assert ep_placement(b.values["expert_map"][0], 1) == (0, 64)
    wins = _bounds("--model", "qwen3-30b-a3b", "--quant", "fp8-token,fp8-block", "--router", "random-k")
    assert wins.values["quant"] == ("fp8-token", "fp8-block") and "renormalize" not in wins.values


def test_a_fuzz_draws_a_models_shape_and_sizes_past_its_default_domain():
    from hypothesis import HealthCheck, given, settings

    from diffmoe.fuzz.strategies import moe_configs

    for b in (_bounds("--model", "deepseek-v3", "--ep", "0/64", "--tokens", "1..64"),
              _bounds("--experts", "72", "--hidden", "4096", "--inter", "128..1024")):
        drawn = []

        @settings(max_examples=15, database=None, derandomize=True, suppress_health_check=list(HealthCheck))
        @given(moe_configs(max_tokens=MAX_TOKENS, bounds=b))
        def draw(config):
            drawn.append(config)

        draw()
        assert drawn and all(b.holds(c) for c in drawn)
        assert len({c.num_tokens for c in drawn}) > 1  # T moves within its bound at a model's sizes


# ---- tuned-configs and the campaign ---------------------------------------------------------------


def test_tuned_configs_keep_the_files_a_model_loads(tmp_path, capsys):
    from diffmoe.tuned_configs import command
    from diffmoe.tuned_configs.files import config_files, for_model

    names = ["E=128,N=768,device_name=X.json", "E=128,N=96,device_name=X.json", "E=128,N=100,device_name=X.json",
             "E=64,N=768,device_name=X.json", "E=257,N=256,device_name=X,dtype=fp8_w8a8,block_shape=[128,128].json",
             "E=256,N=2048,device_name=X.json"]
    for name in names:
        (tmp_path / name).write_text("{}")
    files = config_files(tmp_path)
    qwen = MODELS["qwen3-30b-a3b"]
    assert sorted(f.name for f in for_model(files, qwen.experts, qwen.shared_experts, qwen.inter)) == sorted(names[:2])
    ds = MODELS["deepseek-v3"]
    assert sorted(f.name for f in for_model(files, ds.experts, ds.shared_experts, ds.inter)) == sorted(names[4:])
    code = command.main(["--impl", "vllm==0.33.0", "--model", "mixtral-8x22b", "--config-dir", str(tmp_path)])
    err = capsys.readouterr().err
    if "not in the peer cache" in err:
        pytest.skip("vllm==0.33.0 is not in the peer cache")
    assert code == 2 and "--model mixtral-8x22b: no tuned-config file of E in [8]" in err, err
    assert command.main(["--impl", "vllm==0.33.0", "--model", "llama"]) == 2
    assert "--model must be one of" in capsys.readouterr().err


def test_a_model_campaign_keeps_the_shape_and_draws_the_rest():
    shape = model_flags.check_fields(cli.build_parser().parse_args(["check", "--model", "glm-4.5", "--ep", "0/160"]), {}, {})
    configs = model_configs(12, 3, shape)
    assert configs == model_configs(12, 3, shape)  # the same list for the same arguments
    for c in configs:
        assert all(getattr(c, name) == shape.get(name) for name in MODEL_FIELDS), c.short()
    assert len({c.num_tokens for c in configs}) > 3 and len({c.seed for c in configs}) == 12


def test_the_models_command_lists_every_preset(capsys):
    assert cli.main(["models", "--json"]) == 0
    table = json.loads(capsys.readouterr().out)["models"]
    assert [r["name"] for r in table] == list(MODELS)
    ds = next(r for r in table if r["name"] == "deepseek-v3")
    assert ds["smallest_ep"] > 1 and ds["suggested_ep"] >= ds["smallest_ep"]
    assert cli.main(["models"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^qwen3-30b-a3b\s+128\s+0\s+8\s+2048\s+768\s+bf16", out, re.M), out
