"""Every rounding point's menu as functions, and a profile bound to them.

`CHOICES[point][choice]` is the function of that choice (reference/rounding/quant.py,
activation.py, gemm_reduce.py; each cites where the choice is seen). The names are
diffmoe.problem.numerics's menus, which hold the profiles as data; this module checks at import
that the two agree, so a choice without a function, or a function without a menu entry, fails
before anything is judged. `rounding(spec)` binds a profile to its functions; reference/moe.py
calls every rounding point through it.

The points that differ by scaling unit (the scale, the codes, the NaN code) are one point per
unit (`tensor_scale`, `token_scale`, `group_scale`...): vLLM's per-tensor, per-token and
per-group kernels really do round differently.

Owns the choice registry, the binding of a profile to it and the docs menu table. Must not import
peers/, Triton or the harness's oracles.
"""

from __future__ import annotations

import functools
from typing import Callable

from diffmoe.problem.numerics import MENUS, POINTS, Profile, profile

from . import activation as act
from . import gemm_reduce as gr
from . import quant as q

_UNIT_CHOICES = {
    "scale": {"min_scale": q.scale_min_scale, "min_amax": q.scale_min_amax, "no_floor": q.scale_no_floor,
              "min_amax_product": q.scale_min_amax_product, "min_amax_product_1e10": q.scale_min_amax_product_1e10},
    "codes": {"divide": q.codes_divide, "reciprocal": q.codes_reciprocal, "reciprocal_amax": q.codes_reciprocal_amax},
    "nan_code": {"nan": q.nan_code_nan, "pos_max": q.nan_code_pos_max, "neg_max": q.nan_code_neg_max},
}

CHOICES: dict[str, dict[str, Callable]] = {
    "amax": {"propagate_nan": q.amax_propagate_nan, "drop_nan": q.amax_drop_nan},
    **{f"{unit}_{what}": dict(menu) for unit in ("tensor", "token", "group") for what, menu in _UNIT_CHOICES.items()},
    "fused_act_quant": {"chain": q.fused_chain, "fp32_block": q.fused_fp32_block},
    "activation_input": {"stored_bf16": act.input_stored_bf16, "fp32_product": act.input_fp32_product},
    "swiglu_clamp": {"fp32": act.clamp_fp32, "bf16": act.clamp_bf16, "none": act.clamp_none},
    "silu": {"divide": act.silu_divide, "reciprocal": act.silu_reciprocal, "sigmoid": act.silu_sigmoid,
             "torch": act.silu_torch},
    "silu_rounding": {"once": act.rounding_once, "silu_to_bf16": act.rounding_silu_to_bf16},
    "fp8_gemm": {"dequantize_first": gr.gemm_dequantize_first, "scales_after_dot": gr.gemm_scales_after_dot,
                 "ratio_rescaled": gr.gemm_ratio_rescaled},
    "router_weight": {"down_gemm": gr.weight_down_gemm, "reduce_fp32": gr.weight_reduce_fp32,
                      "reduce_bf16": gr.weight_reduce_bf16},
    "input_weight": {"fp32": gr.input_weight_fp32, "bf16": gr.input_weight_bf16},
    "reduce": {"fp32": gr.reduce_fp32, "fp32_from_zero": gr.reduce_fp32_from_zero, "bf16": gr.reduce_bf16,
               "bf16_from_zero": gr.reduce_bf16_from_zero, "bf16_k2_to_4": gr.reduce_bf16_k2_to_4,
               "fp32_from_zero_past_k2": gr.reduce_fp32_from_zero_past_k2},
}
UNIT_OF_SCHEME = {"fp8-tensor": "tensor", "fp8-token": "token", "fp8-block": "group"}


class Rounding:
    """A profile bound to its choice functions: `r.fn("reduce")` is the function of the profile's
    reduce choice, `r.unit_fn("scale", quant)` the one of the scale point of quant's scaling unit.
    Functions are looked up in CHOICES on every call, so a test may replace one entry."""

    def __init__(self, chosen: Profile):
        self.profile = chosen

    def choice(self, point: str) -> str:
        return self.profile[point]

    def fn(self, point: str) -> Callable:
        return CHOICES[point][self.profile[point]]

    def unit_fn(self, what: str, quant: str) -> Callable:
        """The function of point `<unit>_<what>` for quant's scaling unit (tensor, token or group)."""
        try:
            unit = UNIT_OF_SCHEME[quant]
        except KeyError:
            raise ValueError(f"quant must be an fp8 scheme, got {quant!r}") from None
        return self.fn(f"{unit}_{what}")

    @property
    def weighs_in_down_gemm(self) -> bool:
        """Whether the down GEMM multiplies by the router weight (router_weight='down' configs)."""
        return self.profile["router_weight"] in gr.WEIGHS_IN_DOWN_GEMM


@functools.lru_cache(maxsize=64)
def rounding(spec: str | None) -> Rounding:
    """The Rounding of a valid profile spec (None: diffmoe's)."""
    return Rounding(profile(spec))


def menu_table() -> str:
    """Every point and its menu as a markdown table (docs/numerics.md): each choice with the first
    sentence of its function's docstring."""
    rows = ["| point | what it decides | acts in | choices |", "|---|---|---|---|"]
    for point in POINTS:
        choices = "<br>".join(f"`{name}`: {_first_sentence(CHOICES[point.name][name])}" for name in point.menu)
        rows.append(f"| `{point.name}` | {point.question} | {point.stages} | {choices} |")
    return "\n".join(rows)


def _first_sentence(fn: Callable) -> str:
    text = " ".join((fn.__doc__ or "").split())
    cut = [i for i in (text.find(": "), text.find(". ")) if i > 0]
    return (text[: min(cut)] if cut else text.rstrip(".")).replace("|", "\\|")


def _check_registry() -> None:
    assert set(CHOICES) == set(MENUS), sorted(set(CHOICES) ^ set(MENUS))
    for point, menu in MENUS.items():
        assert set(CHOICES[point]) == set(menu), (point, sorted(set(CHOICES[point]) ^ set(menu)))
        assert all(fn.__doc__ for fn in CHOICES[point].values()), point


_check_registry()
