"""Numerics profiles as data: the reference's rounding points, each point's menu of choices, the
built-in profiles, and the spec a user writes to name a profile of their own.

A rounding point is a place where two correct MoE kernels may round differently (the amax's NaN
policy, the scale's floor, how codes are made, silu's precision, the reduce's order...). Each
point has a small menu of choices seen in real kernels; reference/rounding/ holds one function per
choice, citing where it is seen. A profile is a mapping point -> choice, nothing else:

    PROFILES["vllm"]["reduce"] == "bf16_k2_to_4"

A profile spec (`MoEConfig.numerics`, `--numerics`, a factory's `numerics` attribute) is a
built-in profile's name, optionally followed by overrides: `vllm+tensor_codes=divide+reduce=fp32`.
Its canonical form (`Profile.spec`) keeps the base and the overrides that change something, in
POINTS order, so equal specs are equal strings and a replay line rebuilds the profile. A TOML file
(`--numerics-file`) says the same: `base = "vllm"` and a `[points]` table of overrides.

Some choices describe a kernel that exists for one quant scheme only, or has no SwiGLU clamp:
`SCHEME_ONLY` and `NO_CLAMP` name them, and MoEConfig.validate refuses a config they cannot
describe.

The points and menus live here, not in reference/, because the config validates a spec and the
harness keys tolerance rows on choices: the problem's language must not import the reference
(reference/ imports it). reference/rounding/points.py checks at import that its functions are
exactly these menus.

Owns the point and choice names, the built-in profiles and the spec language. Must not import
torch, Triton, reference/ or anything outside diffmoe/problem/.
"""

from __future__ import annotations

import functools
import re
import sys
from dataclasses import dataclass
from typing import Any

QUANT_SCHEMES = ("bf16", "fp8-tensor", "fp8-token", "fp8-block")  # the same tuple as config.QUANT_SCHEMES
_FP8 = QUANT_SCHEMES[1:]


@dataclass(frozen=True)
class Point:
    """One rounding point: its name, the question it answers, the stage(s) where it acts, the quant
    schemes under which it can change anything, and its menu."""

    name: str
    question: str
    stages: str
    schemes: tuple[str, ...]
    menu: tuple[str, ...]


_SCALES = ("min_scale", "min_amax", "no_floor", "min_amax_product", "min_amax_product_1e10")
_CODES = ("divide", "reciprocal", "reciprocal_amax")
_NAN_CODES = ("nan", "pos_max", "neg_max")


def _unit_points(unit: str, scheme: str) -> tuple[Point, ...]:
    stages = f"quant_input, quant_down_input ({scheme})"
    return (
        Point(f"{unit}_scale", f"the {unit} scale from its amax, and its floor", stages, (scheme,), _SCALES),
        Point(f"{unit}_codes", f"how the {unit}'s codes are made from x and the scale", stages, (scheme,), _CODES),
        Point(f"{unit}_nan_code", f"the +-448 clamp before the e4m3 cast: what a NaN becomes ({unit})", stages,
              (scheme,), _NAN_CODES),
    )


POINTS: tuple[Point, ...] = (
    Point("amax", "max |x| of a scaling unit: what a NaN does to it (an Inf stays Inf)", "every FP8 quantisation",
          _FP8, ("propagate_nan", "drop_nan")),
    *_unit_points("tensor", "fp8-tensor"),
    *_unit_points("token", "fp8-token"),
    *_unit_points("group", "fp8-block"),
    Point("fused_act_quant", "what the fused activation + quant computes", "act_quant (fused)", _FP8,
          ("chain", "fp32_block")),
    Point("activation_input", "which gate/up values the activation reads", "activation, act_quant", QUANT_SCHEMES,
          ("stored_bf16", "fp32_product")),
    Point("swiglu_clamp", "where the SwiGLU limit clamps gate and up (swiglu_limit)", "activation, act_quant",
          QUANT_SCHEMES, ("fp32", "bf16", "none")),
    Point("silu", "silu's float32 formula", "activation, act_quant", QUANT_SCHEMES,
          ("divide", "reciprocal", "sigmoid", "torch")),
    Point("silu_rounding", "where silu(gate) * up rounds to bf16", "activation, act_quant", QUANT_SCHEMES,
          ("once", "silu_to_bf16")),
    Point("fp8_gemm", "when the FP8 GEMMs apply the scales", "gate_up_gemm, down_gemm", _FP8,
          ("dequantize_first", "scales_after_dot", "ratio_rescaled")),
    Point("router_weight", "where the router weight multiplies (router_weight='down'), and in what precision",
          "down_gemm or reduce", QUANT_SCHEMES, ("down_gemm", "reduce_fp32", "reduce_bf16")),
    Point("input_weight", "the router weight on the input (router_weight='input', K = 1)", "quant_input, gate_up_gemm",
          QUANT_SCHEMES, ("fp32", "bf16")),
    Point("reduce", "the sum over k: precision, start and order", "reduce", QUANT_SCHEMES,
          ("fp32", "fp32_from_zero", "bf16", "bf16_from_zero", "bf16_k2_to_4", "fp32_from_zero_past_k2")),
)
POINT_NAMES: tuple[str, ...] = tuple(p.name for p in POINTS)
MENUS: dict[str, tuple[str, ...]] = {p.name: p.menu for p in POINTS}
POINT = {p.name: p for p in POINTS}

# diffmoe's own numerics (DESIGN.md's, reference/moe.py's docstring)
_DIFFMOE = {
    "amax": "propagate_nan",
    "tensor_scale": "min_scale", "tensor_codes": "divide", "tensor_nan_code": "nan",
    "token_scale": "min_scale", "token_codes": "divide", "token_nan_code": "nan",
    "group_scale": "min_amax", "group_codes": "divide", "group_nan_code": "nan",
    "fused_act_quant": "chain",
    "activation_input": "stored_bf16", "swiglu_clamp": "fp32", "silu": "divide", "silu_rounding": "once",
    "fp8_gemm": "dequantize_first",
    "router_weight": "down_gemm", "input_weight": "fp32",
    "reduce": "fp32",
}
# The four built-in profiles, as data. Each is complete (every point named); the comment on a line
# is the source the reference/rounding/ function of that choice cites.
PROFILES: dict[str, dict[str, str]] = {
    "diffmoe": dict(_DIFFMOE),
    "vllm": {  # vLLM 0.33.0
        **_DIFFMOE,
        "amax": "drop_nan",  # fmaxf chains from 0 in every quant kernel
        "tensor_scale": "no_floor", "tensor_codes": "reciprocal", "tensor_nan_code": "pos_max",  # scaled_fp8_quant
        "token_nan_code": "pos_max",  # dynamic_per_token_scaled_fp8_quant
        "group_nan_code": "neg_max",  # per_token_group_quant
        "fused_act_quant": "fp32_block",  # silu_and_mul_per_block_quant
        "swiglu_clamp": "bf16", "silu": "torch", "silu_rounding": "silu_to_bf16",  # silu_and_mul, swiglu_limit_func
        "fp8_gemm": "scales_after_dot",  # fused_moe_kernel
        "input_weight": "bf16",  # prepare_finalize/no_dp_ep.py
        "reduce": "bf16_k2_to_4",  # moe_sum
    },
    "liger": {  # Liger-Kernel 0.8.5
        **_DIFFMOE,
        "activation_input": "fp32_product", "silu": "sigmoid",  # _fused_up_proj_swiglu_kernel
        "swiglu_clamp": "none",
        "router_weight": "reduce_fp32", "reduce": "fp32_from_zero",  # _token_gather_weighted_sum_kernel
    },
    "lmdeploy": {  # lmdeploy 0.18.0, blocked FP8
        **_DIFFMOE,
        "amax": "drop_nan", "group_scale": "min_amax_product", "group_codes": "reciprocal_amax",
        "group_nan_code": "neg_max",  # _quant_fp8_kernel
        "swiglu_clamp": "none", "silu_rounding": "silu_to_bf16",  # _silu_and_mul_kernel
        "fp8_gemm": "ratio_rescaled",  # fused_moe_blocked_fp8_kernel
        "router_weight": "reduce_bf16", "reduce": "bf16",  # _moe_reduce_kernel
    },
    "sglang": {  # SGLang 0.5.23 / 0.5.20, the CUDA branch of fused_experts (peers/sglang/core.py)
        **_DIFFMOE,
        "amax": "drop_nan",  # fmaxf chains from 0 in every quant kernel
        "tensor_scale": "no_floor", "tensor_codes": "reciprocal", "tensor_nan_code": "pos_max",  # per_tensor_quant_fp8.cuh
        "token_scale": "no_floor", "token_codes": "reciprocal", "token_nan_code": "pos_max",  # per_token_quant_fp8.cuh
        "group_scale": "min_amax_product_1e10", "group_codes": "reciprocal_amax",
        "group_nan_code": "pos_max",  # per_token_group_quant.cuh
        "swiglu_clamp": "none",  # the adapter refuses swiglu_limit (DeepSeek V4's path)
        "fp8_gemm": "scales_after_dot",  # fused_moe_kernel
        "reduce": "fp32_from_zero_past_k2",  # torch.add at K = 2, torch.sum / moe_sum_reduce (float32, from +0) above
    },
    "sglang_fallback": {  # the same, the non-CUDA branch: torch's silu, SGLang's Triton group quant
        **_DIFFMOE,
        "group_scale": "min_amax", "group_codes": "reciprocal", "group_nan_code": "nan",  # _per_token_group_quant_8bit
        "amax": "propagate_nan",  # tl.max(tl.abs(y)) keeps a NaN
        "swiglu_clamp": "none", "silu": "torch", "silu_rounding": "silu_to_bf16",  # F.silu(gate) * up in bf16
        "fp8_gemm": "scales_after_dot",
        "reduce": "fp32_from_zero",  # moe_sum_reduce_triton: tl.zeros, then += each row
    },
}
PROFILE_NAMES: tuple[str, ...] = tuple(PROFILES)
DEFAULT_PROFILE = PROFILE_NAMES[0]

# Choices that describe one quant scheme's kernel only: (point, choice) -> (scheme, why).
SCHEME_ONLY: dict[tuple[str, str], tuple[str, str]] = {
    ("fp8_gemm", "ratio_rescaled"): ("fp8-block", "a ratio-rescaled sum over 128-wide K blocks, lmdeploy's blocked-FP8 "
                                                  "accumulation: the profile describes no other scheme"),
}
# The choice of a kernel without a SwiGLU clamp: a config with swiglu_limit cannot be judged under it.
NO_CLAMP = ("swiglu_clamp", "none")

SEPARATOR = "+"
_NAME = re.compile(r"[a-z0-9_]+")
EXAMPLE = "vllm+tensor_codes=divide+reduce=fp32"
# A numerics file is a few lines; anything past this is not one.
MAX_NUMERICS_FILE_CHARS = 2**16
_QUOTED = 60


def _quoted(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= _QUOTED else text[: _QUOTED - 3] + "..."


@dataclass(frozen=True)
class Profile:
    """A resolved profile: the base it was written from and its choice at every point."""

    base: str
    choices: tuple[tuple[str, str], ...]  # (point, choice), POINTS order, every point

    @functools.cached_property
    def _mapping(self) -> dict[str, str]:
        return dict(self.choices)

    def __getitem__(self, point: str) -> str:
        return self._mapping[point]

    def as_dict(self) -> dict[str, str]:
        return dict(self._mapping)

    @property
    def overrides(self) -> tuple[tuple[str, str], ...]:
        """(point, choice) where this profile differs from its base, POINTS order."""
        base = PROFILES[self.base]
        return tuple((p, c) for p, c in self.choices if base[p] != c)

    @property
    def spec(self) -> str:
        """The canonical spec: the base, then `+point=choice` for each override."""
        return SEPARATOR.join([self.base, *(f"{p}={c}" for p, c in self.overrides)])

    def uses(self, point: str, choice: str) -> bool:
        return self[point] == choice

    def same_choices(self, other: Profile) -> bool:
        return self.choices == other.choices


def _profile(base: str, overrides: dict[str, str]) -> Profile:
    merged = {**PROFILES[base], **overrides}
    return Profile(base, tuple((p, merged[p]) for p in POINT_NAMES))


def _choice_error(field: str, point: str, choice: Any) -> ValueError:
    return ValueError(f"{field}: {point} must be one of {list(MENUS[point])}, got {_quoted(choice)}")


def _point_error(field: str, point: Any) -> ValueError:
    return ValueError(f"{field}: unknown rounding point {_quoted(point)}; points: {list(POINT_NAMES)}")


def parse_spec(spec: Any, field: str = "numerics", none_ok: bool = False) -> Profile:
    """The profile a spec names; ValueError (TypeError for a non-string) naming `field`, and the
    point and its menu for a bad override. `none_ok` words the message for a field that may also
    be None (MoEConfig.numerics)."""
    either = "None or " if none_ok else ""
    if not isinstance(spec, str):
        raise (TypeError if none_ok else ValueError)(
            f"{field} must be {either}one of {list(PROFILE_NAMES)}, got {_quoted(spec)}")
    try:
        return _parse(spec, field)
    except _BaseError:
        raise ValueError(f"{field} must be {either}one of {list(PROFILE_NAMES)}, got {_quoted(spec)}; a profile may be "
                         f"followed by +point=choice overrides, e.g. {EXAMPLE!r}") from None


class _BaseError(Exception):
    pass


@functools.lru_cache(maxsize=256)
def _parse(spec: str, field: str) -> Profile:
    base, *parts = spec.split(SEPARATOR)
    if base not in PROFILES:
        raise _BaseError
    overrides: dict[str, str] = {}
    for part in parts:
        point, eq, choice = part.partition("=")
        if not eq:
            raise ValueError(f"{field}: override {_quoted(part)} must be point=choice, e.g. 'reduce=fp32', in {_quoted(spec)}")
        if point not in MENUS:
            raise _point_error(field, point)
        if choice not in MENUS[point]:
            raise _choice_error(field, point, choice)
        if point in overrides:
            raise ValueError(f"{field}: {point} is given twice in {_quoted(spec)}")
        overrides[point] = choice
    return _profile(base, overrides)


@functools.lru_cache(maxsize=256)
def profile(spec: str | None) -> Profile:
    """The profile of a valid spec (None: diffmoe's), for code that reads a validated config."""
    return parse_spec(DEFAULT_PROFILE if spec is None else spec)


def canonical_spec(spec: str, field: str = "numerics") -> str:
    return parse_spec(spec, field).spec


def profile_from_toml(text: str, source: str = "numerics file") -> Profile:
    """The profile a TOML text describes: `base = "vllm"` (required) and an optional `[points]`
    table of `point = "choice"` overrides. ValueError naming `source` and the key otherwise."""
    if len(text) > MAX_NUMERICS_FILE_CHARS:
        raise ValueError(f"{source}: a numerics file is at most {MAX_NUMERICS_FILE_CHARS} characters, got {len(text)}")
    try:
        data = _toml_loads(text)
    except ValueError as exc:  # tomllib.TOMLDecodeError is a ValueError
        raise ValueError(f"{source}: not valid TOML: {exc}") from None
    unknown = sorted(set(data) - {"base", "points"})
    if unknown:
        raise ValueError(f"{source}: unknown key(s) {unknown}; a numerics file holds base = \"PROFILE\" and a [points] table")
    base = data.get("base")
    if base not in PROFILES:
        raise ValueError(f"{source}: base must be one of {list(PROFILE_NAMES)}, got {_quoted(base)}")
    points = data.get("points", {})
    if not isinstance(points, dict):
        raise ValueError(f"{source}: points must be a table of point = \"choice\", got {_quoted(points)}")
    for point, choice in points.items():
        if point not in MENUS:
            raise _point_error(f"{source}: [points]", point)
        if choice not in MENUS[point]:
            raise _choice_error(f"{source}: [points]", point, choice)
    return _profile(base, dict(points))


def _toml_loads(text: str) -> dict[str, Any]:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - Python 3.10: the tomli dependency (pyproject.toml)
        try:
            import tomli as tomllib
        except ImportError:
            raise ValueError("reading a numerics file on Python 3.10 needs the tomli package (pip install tomli)") from None
    return tomllib.loads(text)


def profiles_table() -> str:
    """The built-in profiles as a markdown table (docs/numerics.md): a row per point, a column per
    profile; a choice equal to diffmoe's is shown plain, others in bold."""
    rows = ["| point | " + " | ".join(f"`{name}`" for name in PROFILE_NAMES) + " |",
            "|---" * (len(PROFILE_NAMES) + 1) + "|"]
    for point in POINT_NAMES:
        cells = []
        for name in PROFILE_NAMES:
            choice = PROFILES[name][point]
            cells.append(f"`{choice}`" if choice == _DIFFMOE[point] else f"**`{choice}`**")
        rows.append(f"| `{point}` | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def _check_tables() -> None:
    """The data holds together: names are spec-safe, every profile names every point with a choice
    from its menu. Run at import: a typo in a profile fails before anything is judged."""
    for point in POINTS:
        assert _NAME.fullmatch(point.name) and all(_NAME.fullmatch(c) for c in point.menu), point
        assert set(point.schemes) <= set(QUANT_SCHEMES), point
    for name, choices in PROFILES.items():
        assert _NAME.fullmatch(name) and set(choices) == set(POINT_NAMES), name
        assert all(choices[p] in MENUS[p] for p in POINT_NAMES), name
    assert all(key[1] in MENUS[key[0]] for key in SCHEME_ONLY) and NO_CLAMP[1] in MENUS[NO_CLAMP[0]]


_check_tables()
