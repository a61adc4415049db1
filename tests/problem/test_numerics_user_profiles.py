"""User numerics profiles: a built-in profile plus +point=choice overrides (`--numerics`,
`MoEConfig.numerics`, a factory's `numerics`), or a TOML file (`--numerics-file`).

Each malformed spec is refused naming the field, the point and its menu; the config holds the
canonical spec, which a replay line carries whole; a user profile making a built-in profile's
choices judges exactly as it does; a tolerance row follows the choice, not the profile's name;
and a planted variant of the shipped kernel (codes made as x * (1 / scale)) is flagged under
diffmoe's numerics at quant_input and quiet under the profile that names that choice. The docs'
tables are the data's.
"""

from __future__ import annotations

import os
import shlex
from contextlib import contextmanager
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")  # before Triton is imported

import pytest  # noqa: E402
import torch  # noqa: E402

from optimized.moe import TritonFP8MoE  # noqa: E402 - first: it picks the interpreter without a GPU

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

import optimized.kernels.act_quant_kernel as act_quant_kernel  # noqa: E402
from diffmoe.contract import factory_numerics, judged_config  # noqa: E402
from diffmoe.check.report import check_command  # noqa: E402
from diffmoe.findings import Oracles
from diffmoe.judge.runner import run_differential  # noqa: E402
from diffmoe.frontends import cli  # noqa: E402
from diffmoe.problem.config import MoEConfig  # noqa: E402
from diffmoe.problem.inputs import make_problem  # noqa: E402
from diffmoe.problem.numerics import (  # noqa: E402
    MENUS, POINT_NAMES, PROFILE_NAMES, PROFILES, parse_spec, profile_from_toml, profiles_table,
)
from diffmoe.problem.vocabulary import Buffers, Stages  # noqa: E402
from diffmoe.tolerance.table import FORCED, rule_for  # noqa: E402
from optimized.kernels.numerics import E4M3_MAX, to_e4m3  # noqa: E402
from reference import reference_moe  # noqa: E402
from reference.moe import reference_stage  # noqa: E402
from reference.rounding import rounding  # noqa: E402
import reference.rounding.points as rounding_points  # noqa: E402
from reference.rounding.points import CHOICES, menu_table  # noqa: E402

NUMERICS_PAGE = Path(__file__).resolve().parents[2] / "docs" / "numerics.md"
SMALL = dict(num_tokens=4, num_experts=4, topk=3, hidden=128, inter=128, quant="bf16")


def spec_of(name: str, base: str = "diffmoe") -> str:
    """A spec written from `base` that makes every choice of built-in profile `name`."""
    return "+".join([base, *(f"{p}={c}" for p, c in PROFILES[name].items() if PROFILES[base][p] != c)])


# ---- the spec and its errors ------------------------------------------------------------------


@pytest.mark.parametrize("spec, message", [
    ("fast", r"numerics must be None or one of \['diffmoe', 'vllm', 'liger', 'lmdeploy', 'sglang', 'sglang_fallback'\], got 'fast'; a profile may be "
             r"followed by \+point=choice overrides"),
    ("vllm+quant_codes=reciprocal", r"numerics: unknown rounding point 'quant_codes'; points: \['amax', 'tensor_scale'"),
    ("vllm+token_codes=multiply", r"numerics: token_codes must be one of \['divide', 'reciprocal', 'reciprocal_amax'\], "
                                  r"got 'multiply'"),
    ("vllm+reduce", r"numerics: override 'reduce' must be point=choice"),
    ("vllm+reduce=fp32+reduce=bf16", r"numerics: reduce is given twice"),
    ("VLLM", r"one of \['diffmoe', 'vllm', 'liger', 'lmdeploy', 'sglang', 'sglang_fallback'\], got 'VLLM'"),
], ids=["base", "point", "choice", "no-equals", "twice", "case"])
def test_a_malformed_spec_is_refused_naming_the_field_and_the_menu(spec, message):
    with pytest.raises(ValueError, match=message):
        MoEConfig(numerics=spec)


def test_the_config_holds_the_canonical_spec_and_the_json_round_trip_keeps_it():
    c = MoEConfig(quant="fp8-token", numerics="vllm+reduce=fp32+token_codes=reciprocal+amax=drop_nan")
    assert c.numerics == "vllm+token_codes=reciprocal+reduce=fp32"  # POINTS order, no-op override dropped
    assert MoEConfig.from_json(c.to_json()) == c
    assert c.rounding_profile["reduce"] == "fp32" and c.rounding_profile["tensor_scale"] == "no_floor"
    for name in PROFILE_NAMES:  # the four names stay what they were
        block = MoEConfig(quant="fp8-block")
        assert block.replace(numerics=name).numerics == name == block.replace(numerics=spec_of(name, name)).numerics
    assert MoEConfig(numerics=spec_of("vllm")).numerics == spec_of("vllm")  # written from diffmoe: kept so


def test_the_choices_refuse_configs_they_cannot_describe():
    """The checks are on the choices, whatever profile makes them, with the words the built-in
    profiles' errors always had."""
    with pytest.raises(ValueError, match=r"numerics='diffmoe\+fp8_gemm=ratio_rescaled' needs quant='fp8-block' "
                                         r"\(fp8_gemm=ratio_rescaled: .*got quant='fp8-token'"):
        MoEConfig(quant="fp8-token", numerics="diffmoe+fp8_gemm=ratio_rescaled")
    assert MoEConfig(quant="fp8-block", numerics="diffmoe+fp8_gemm=ratio_rescaled")
    with pytest.raises(ValueError, match=r"swiglu_limit must be None with numerics='vllm\+swiglu_clamp=none': that "
                                         r"profile has no clamp \(swiglu_clamp=none"):
        MoEConfig(swiglu_limit=7.0, numerics="vllm+swiglu_clamp=none")
    assert MoEConfig(swiglu_limit=7.0, numerics="liger+swiglu_clamp=fp32").swiglu_limit == 7.0


def test_a_factory_declares_a_user_profile_the_same_way():
    def factory(config):
        raise AssertionError("not built")

    factory.numerics = "vllm+reduce=fp32+reduce=fp32"
    with pytest.raises(ValueError, match=r"the factory's numerics attribute: reduce is given twice"):
        factory_numerics(factory)
    factory.numerics = "vllm+silu=exp"
    with pytest.raises(ValueError, match=r"the factory's numerics attribute: silu must be one of \['divide', "
                                         r"'reciprocal', 'sigmoid', 'torch'\], got 'exp'"):
        judged_config(MoEConfig(**SMALL), factory)
    factory.numerics = "vllm+reduce=fp32+amax=drop_nan"
    assert judged_config(MoEConfig(**SMALL), factory).numerics == "vllm+reduce=fp32"


# ---- the TOML file -----------------------------------------------------------------------------


def test_a_toml_file_names_a_base_and_overrides():
    chosen = profile_from_toml('base = "vllm"\n[points]\nreduce = "fp32"\ntensor_codes = "divide"\n')
    assert chosen.spec == "vllm+tensor_codes=divide+reduce=fp32" == parse_spec(chosen.spec).spec
    assert profile_from_toml('base = "liger"\n').spec == "liger"


@pytest.mark.parametrize("text, message", [
    ('base = "vllm"\n[points]\nreduce = "fp16"\n', r"f\.toml: \[points\]: reduce must be one of \['fp32', "),
    ('base = "vllm"\n[points]\nquant = "x"\n', r"f\.toml: \[points\]: unknown rounding point 'quant'; points: \["),
    ('[points]\nreduce = "fp32"\n', r"f\.toml: base must be one of \['diffmoe', 'vllm', 'liger', 'lmdeploy', 'sglang', 'sglang_fallback'\], got None"),
    ('base = "vllm"\nextra = 1\n', r"f\.toml: unknown key\(s\) \['extra'\]"),
    ('base = "vllm"\npoints = "reduce=fp32"\n', r"f\.toml: points must be a table"),
    ('base = "vllm\n', r"f\.toml: not valid TOML"),
], ids=["choice", "point", "no-base", "key", "points-not-a-table", "syntax"])
def test_a_bad_toml_file_is_refused_naming_the_key(text, message):
    with pytest.raises(ValueError, match=message):
        profile_from_toml(text, "f.toml")


# ---- the command line -------------------------------------------------------------------------


@pytest.mark.parametrize("argv, says", [
    (["--numerics", "vllm+quant_codes=reciprocal"], "--numerics: unknown rounding point 'quant_codes'; points: ["),
    (["--numerics", "vllm+reduce=fp16"], "--numerics: reduce must be one of ['fp32', 'fp32_from_zero', 'bf16', "
                                         "'bf16_from_zero', 'bf16_k2_to_4', 'fp32_from_zero_past_k2'], got 'fp16'"),
    (["--numerics", "fast"], "--numerics must be one of ['diffmoe', 'vllm', 'liger', 'lmdeploy', 'sglang', 'sglang_fallback'], got 'fast'"),
    (["--numerics-file", "{bad}"], "[points]: silu must be one of ['divide', 'reciprocal', 'sigmoid', 'torch'], got 'exp'"),
    (["--numerics-file", "{missing}"], "cannot read numerics file"),
    (["--numerics", "vllm", "--numerics-file", "{bad}"], "not allowed with argument"),
], ids=["point", "choice", "base", "file-choice", "file-missing", "both"])
def test_the_cli_exits_2_with_one_line_naming_the_menu(argv, says, tmp_path, capsys):
    bad = tmp_path / "bad.toml"
    bad.write_text('base = "vllm"\n[points]\nsilu = "exp"\n')
    argv = [a.format(bad=bad, missing=tmp_path / "missing.toml") for a in argv]
    assert cli.main(["plan", *argv]) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip() and not line.startswith("usage:")]
    assert len(lines) == 1 and lines[0].startswith("diffmoe: error:") and says in lines[0], err


def _config_of(command: str) -> MoEConfig:
    argv = shlex.split(command.partition("#")[0])[2:]  # drop "diffmoe check"
    return cli.config_from_args(cli.build_parser().parse_args(["check", *argv]))


def test_a_replay_line_carries_the_whole_profile(tmp_path):
    """From the flag and from a file: the replay line names the canonical spec, and running it
    rebuilds the same config, hence the same profile."""
    path = tmp_path / "my_kernel.toml"
    path.write_text('base = "vllm"\n[points]\nreduce = "fp32"\ntoken_codes = "reciprocal"\n')
    from_file = cli.config_from_args(cli.build_parser().parse_args(["check", "--numerics-file", str(path)]))
    from_flag = cli.config_from_args(cli.build_parser().parse_args(["check", "--numerics", "vllm+reduce=fp32+token_codes=reciprocal"]))
    assert from_file == from_flag and from_file.numerics == "vllm+token_codes=reciprocal+reduce=fp32"
    line = check_command(from_file)
    assert "--numerics vllm+token_codes=reciprocal+reduce=fp32" in line
    assert _config_of(line) == from_file and _config_of(line).rounding_profile == from_file.rounding_profile
    with pytest.raises(cli.UsageError, match="--config cannot be combined with config flags \\(--numerics-file\\)"):
        cli.config_from_args(cli.build_parser().parse_args(["check", "--config", "c.json", "--numerics-file", str(path)]))


# ---- a user profile judges as the profile it equals -------------------------------------------


@pytest.mark.parametrize("name", ["vllm", "liger", "lmdeploy"])
def test_a_user_profile_making_a_builtin_profiles_choices_computes_its_bits(name):
    quant = "fp8-block" if name == "lmdeploy" else "fp8-token" if name == "vllm" else "bf16"
    config = MoEConfig(**{**SMALL, "quant": quant, "nan_rows": 1, "zero_rows": 1}, fused=quant == "fp8-block")
    builtin, user = config.replace(numerics=name), config.replace(numerics=spec_of(name))
    assert builtin.numerics != user.numerics and builtin.rounding_profile.same_choices(user.rounding_profile)
    a, b = reference_moe(make_problem(builtin)), reference_moe(make_problem(user))
    assert torch.equal(a.output.view(torch.int16), b.output.view(torch.int16))
    for buffer in a.intermediates:
        x, y = a.intermediates[buffer], b.intermediates[buffer]
        assert torch.equal(x.view(torch.uint8).flatten(), y.view(torch.uint8).flatten()), buffer


def test_a_user_profile_equal_to_vllm_judges_the_shipped_kernel_as_vllm_does():
    """The shipped kernel under vllm's profile is flagged at the K=3 reduce; under the same choices
    written from diffmoe's profile the findings are the same, figure for figure."""
    c = MoEConfig(**SMALL)
    oracles = [Oracles.DIFFERENTIAL, Oracles.TEACHER_FORCING]
    builtin = run_differential(c.replace(numerics="vllm"), oracles=oracles)
    user = run_differential(c.replace(numerics=spec_of("vllm")), oracles=oracles)
    assert builtin.findings and [f.stage for f in builtin.findings] == [Stages.REDUCE, Stages.REDUCE], builtin.render()
    assert user.findings == builtin.findings
    assert f"--numerics {spec_of('vllm')}" in user.replay_command()


def test_a_tolerance_row_follows_the_choice_not_the_name():
    """The derived activation row is Liger's because Liger reads the float32 product: any profile
    reading it gets the row; liger without that choice does not."""
    rows = {spec: rule_for("bf16", Buffers.ACTIVATION_OUTPUT, FORCED, numerics=spec)
            for spec in ("liger", "diffmoe+activation_input=fp32_product", "vllm+activation_input=fp32_product",
                         "liger+activation_input=stored_bf16", "diffmoe")}
    assert rows["liger"].mode == "derived" and rows["liger"] == rows["diffmoe+activation_input=fp32_product"]
    assert rows["vllm+activation_input=fp32_product"] == rows["liger"]
    assert rows["liger+activation_input=stored_bf16"] == rows["diffmoe"] != rows["liger"]


@pytest.mark.parametrize("spec", ["liger", "lmdeploy", "diffmoe+router_weight=reduce_bf16"])
def test_a_router_weight_on_the_input_is_applied_once_under_a_reduce_weighing_profile(spec):
    """router_weight='input' weighs the token before the GEMM; a profile weighing the down rows in its
    reduce then sums them unweighted (the per-profile modules weighed them a second time)."""
    config = MoEConfig(num_tokens=5, num_experts=4, topk=1, hidden=128, inter=128, quant="fp8-block",
                       router_weight="input", router="softmax-topk", numerics=spec)
    problem = make_problem(config)
    assert not torch.all(problem.topk_weights == 1.0)  # a weight below 1: weighing twice would show
    down = reference_moe(problem).intermediates[Buffers.DOWN_OUTPUT]
    out = reference_stage(Stages.REDUCE, {Buffers.DOWN_OUTPUT: down}, problem)[Buffers.OUTPUT]
    rows = down.view(5, 1, 128)
    assert torch.equal(out, rounding(spec).fn("reduce")(rows))
    weighed = rounding(spec).fn("reduce")(rounding(spec).fn("router_weight")(rows, problem.topk_weights))
    assert not torch.equal(out, weighed)


# ---- a planted variant: codes made by the reciprocal ------------------------------------------


@triton.jit
def _quantize_tile_by_reciprocal(v, scale, SOFTWARE_FP8: tl.constexpr):
    """The shipped _quantize_tile with x * (1 / scale) for x / scale: the reciprocal rounded first."""
    inverse = tl.math.div_rn(tl.zeros_like(scale) + 1.0, scale)
    q = v * inverse[:, None]
    q = tl.minimum(tl.maximum(q, -E4M3_MAX, propagate_nan=tl.PropagateNan.ALL), E4M3_MAX,
                   propagate_nan=tl.PropagateNan.ALL)
    codes = to_e4m3(q, SOFTWARE_FP8)
    if SOFTWARE_FP8:
        sign = ((q.to(tl.uint32, bitcast=True) >> 24) & 0x80).to(tl.uint8)
        bits = tl.where(q != q, sign | act_quant_kernel.E4M3_NAN_BITS, codes.to(tl.uint8, bitcast=True))
        codes = bits.to(tl.float8e4nv, bitcast=True)
    return codes


@contextmanager
def _reciprocal_codes():
    saved = act_quant_kernel._quantize_tile
    act_quant_kernel._quantize_tile = _quantize_tile_by_reciprocal  # the interpreter reads globals at call time
    try:
        yield
    finally:
        act_quant_kernel._quantize_tile = saved


class ReciprocalCodes(TritonFP8MoE):
    """The shipped kernel, its activation codes made as x * (1 / scale)."""

    def _run_stage(self, stage, bufs, problem, layout, ctx):
        with _reciprocal_codes():
            super()._run_stage(stage, bufs, problem, layout, ctx)


def make_reciprocal_codes(config: MoEConfig) -> TritonFP8MoE:
    return ReciprocalCodes(config)


RECIPROCAL = MoEConfig(num_tokens=32, num_experts=4, topk=2, hidden=512, inter=256, quant="fp8-token", seed=3)


def test_reciprocal_codes_are_flagged_under_diffmoe_and_quiet_under_the_profile_naming_them():
    oracles = [Oracles.DIFFERENTIAL, Oracles.TEACHER_FORCING]
    flagged = run_differential(RECIPROCAL, make_reciprocal_codes, oracles=oracles, schedules=["identity"])
    assert flagged.findings and flagged.findings[0].stage == Stages.QUANT_INPUT, flagged.render()
    assert {f.stage for f in flagged.findings if f.oracle == Oracles.TEACHER_FORCING} >= {Stages.QUANT_INPUT}
    mine = RECIPROCAL.replace(numerics="diffmoe+token_codes=reciprocal")
    quiet = run_differential(mine, make_reciprocal_codes, oracles=oracles, schedules=["identity"])
    assert quiet.passed, quiet.render()
    assert "--numerics diffmoe+token_codes=reciprocal" in quiet.replay_command()
    # and the shipped kernel itself is now the one flagged under that profile
    shipped = run_differential(mine, oracles=oracles, schedules=["identity"])
    assert shipped.findings and shipped.findings[0].stage == Stages.QUANT_INPUT, shipped.render()


# ---- the menus are functions -----------------------------------------------------------------

SOURCES = ("vLLM", "Liger", "lmdeploy", "SGLang", "DESIGN.md", "diffmoe")


def test_every_choice_is_one_function_citing_where_it_is_seen():
    assert set(CHOICES) == set(POINT_NAMES)
    for point, menu in MENUS.items():
        assert set(CHOICES[point]) == set(menu), point
        for choice, fn in CHOICES[point].items():
            assert callable(fn) and any(source in (fn.__doc__ or "") for source in SOURCES), f"{point}={choice}"


def test_the_registry_refuses_a_menu_without_its_function(monkeypatch):
    monkeypatch.delitem(CHOICES["reduce"], "bf16")
    with pytest.raises(AssertionError, match="reduce"):
        rounding_points._check_registry()
    monkeypatch.setitem(CHOICES["reduce"], "bf16", CHOICES["reduce"]["fp32"])
    monkeypatch.setitem(CHOICES["reduce"], "fp64", CHOICES["reduce"]["fp32"])
    with pytest.raises(AssertionError, match="fp64"):
        rounding_points._check_registry()


# ---- the docs' tables are the data's ----------------------------------------------------------


@pytest.mark.parametrize("table, header", [(profiles_table, "| point | `diffmoe` |"),
                                           (menu_table, "| point | what it decides |")], ids=["profiles", "menus"])
def test_the_documented_tables_are_the_data(table, header):
    text = NUMERICS_PAGE.read_text()
    start = text.index(header)
    end = text.find("\n\n", start)
    assert text[start:end if end >= 0 else len(text)].rstrip("\n") == table(), (
        f"regenerate docs/numerics.md's table from {table.__module__}.{table.__name__}()")
    assert all(f"`{p}`" in text for p in POINT_NAMES) and all(f"`{c}`" in text for m in MENUS.values() for c in m)
