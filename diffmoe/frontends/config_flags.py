"""The config on the command line: check's, plan's and compile-check's config flags (or --config
FILE.json, --model NAME, --ep RANK/SIZE, --numerics / --numerics-file) turned into one MoEConfig.

Owns the flags' table (CONFIG_FLAGS: flag -> MoEConfig field) and their parsing; the config's own
checks are MoEConfig's (diffmoe/problem/config.py), whose message a UsageError carries. --model and
--ep are diffmoe/frontends/model_flags.py's.
"""

from __future__ import annotations

import argparse
from typing import Any

from diffmoe.problem.config import (
    ALL_ROUTING_SKEWS, MAX_CONFIG_JSON_CHARS, MAX_EXPERT_SCALE_SPREAD, MAX_OUTLIER_CHANNELS, MAX_RANDOM_ORDERS, MAX_TOKENS,
    OUTPUT_PLACEMENTS, PLANNERS, QUANT_SCHEMES, ROUTER_WEIGHT_PLACEMENTS, ROUTERS, MoEConfig,
)
from diffmoe.problem.config import (
    ACT_SCALES, MAX_ROUTED_SCALING_FACTOR, MAX_SHARED_EXPERTS, MAX_SWIGLU_LIMIT, SCALE_PAIRS, SCHEME_OF_ACT_SCALES,
    WEIGHT_SCALES,
)
from diffmoe.problem.numerics import EXAMPLE as NUMERICS_EXAMPLE
from diffmoe.problem.numerics import MAX_NUMERICS_FILE_CHARS, PROFILE_NAMES, parse_spec, profile_from_toml
from diffmoe.frontends import model_flags
from diffmoe.frontends.exits import UsageError
from diffmoe.frontends.flags import _float, _int, _non_negative_int, _read_small_text

# Config flags -> MoEConfig fields. Unset flags keep MoEConfig's defaults.
CONFIG_FLAGS = {
    "tokens": "num_tokens",
    "experts": "num_experts",
    "topk": "topk",
    "hidden": "hidden",
    "inter": "inter",
    "quant": "quant",
    "fused": "fused",
    "planner": "planner",
    "output": "output",
    "router_weight": "router_weight",
    "skew": "skew",
    "expert_map": "expert_map",
    "seed": "seed",
    "call_tokens": "call_tokens",
    "router": "router",
    "renormalize": "renormalize",
    "expert_scale_spread": "expert_scale_spread",
    "outlier_channels": "outlier_channels",
    "zero_rows": "zero_rows",
    "nan_rows": "nan_rows",
    "inf_rows": "inf_rows",
    "tie_heavy": "tie_heavy",
    "random_orders": "random_orders",
    "numerics": "numerics",
    "swiglu_limit": "swiglu_limit",
    "dropped_slots": "dropped_slots",
    "shared_experts": "shared_experts",
    "weight_scales": "weight_scales",
    "act_scales": "act_scales",
    "routed_scaling_factor": "routed_scaling_factor",
}
# The flags that set several config fields at once (diffmoe/frontends/model_flags.py): a preset and a placement.
MODEL_FLAGS = ("model", "ep")


def _add_config_options(p: argparse.ArgumentParser) -> None:
    d = MoEConfig()
    g = p.add_argument_group("config (defaults are MoEConfig's; or give --config FILE.json)")
    model_flags.add_flags(g)
    g.add_argument("--tokens", type=_int, metavar="T", help=f"tokens (default {d.num_tokens}; engines run 1-512 decode, "
                                                              f"8192-65536 chunked prefill, to 262144 and beyond: up to {MAX_TOKENS})")
    g.add_argument("--experts", type=_int, metavar="E", help=f"experts (default {d.num_experts})")
    g.add_argument("--topk", type=_int, metavar="K", help=f"experts per token (default {d.topk})")
    g.add_argument("--hidden", type=_int, metavar="H", help=f"hidden size (default {d.hidden})")
    g.add_argument("--inter", type=_int, metavar="I", help=f"intermediate size (default {d.inter})")
    g.add_argument("--quant", choices=QUANT_SCHEMES, help=f"quant scheme (default {d.quant})")
    fused = g.add_mutually_exclusive_group()
    fused.add_argument("--fused", dest="fused", action="store_const", const=True, help="fused activation + FP8 quant")
    fused.add_argument("--unfused", dest="fused", action="store_const", const=False, help="separate kernels (default)")
    g.add_argument("--planner", choices=PLANNERS, help=f"workspace planner (default {d.planner})")
    g.add_argument("--output", choices=OUTPUT_PLACEMENTS, help=f"final output placement (default {d.output})")
    g.add_argument("--router-weight", choices=ROUTER_WEIGHT_PLACEMENTS, help=f"where the router weight applies (default {d.router_weight})")
    g.add_argument("--skew", choices=ALL_ROUTING_SKEWS, help=f"routing distribution (default {d.skew})")
    g.add_argument("--expert-map", metavar="A,B,...", help="global -> local expert map, -1 for remote (write --expert-map=0,-1,1)")
    g.add_argument("--seed", type=_non_negative_int, metavar="S", help=f"problem seed (default {d.seed})")
    i = p.add_argument_group("inputs (each changes only its own part of the problem; the spread and the outliers are on by default)")
    i.add_argument("--call-tokens", type=_int, metavar="N", help="T of the call, 0..--tokens: workspaces are built for --tokens, the call carries N (default: --tokens)")
    i.add_argument("--router", choices=ROUTERS, help=f"how router weights are made (default {d.router}; softmax-topk: softmax over all E, then top-K)")
    i.add_argument("--renormalize", action="store_const", const=True, help="softmax-topk: divide the K weights by their sum")
    i.add_argument("--expert-scale-spread", type=_int, metavar="OCTAVES", help=f"per-expert weight scale spread, 0..{MAX_EXPERT_SCALE_SPREAD} octaves (default {d.expert_scale_spread}; 0 turns it off)")
    i.add_argument("--outlier-channels", type=_int, metavar="N", help=f"input channels of each expert's weights scaled up 2x..8x, 0..{MAX_OUTLIER_CHANNELS} (default {d.outlier_channels}; 0 turns them off)")
    i.add_argument("--zero-rows", type=_int, metavar="N", help="all-zero (padding) tokens in the call (default 1 when the call keeps an ordinary token beside it, else 0)")
    i.add_argument("--nan-rows", type=_int, metavar="N", help="tokens holding one NaN (default 1 when the activations' scales are not per tensor and the call keeps an ordinary token beside it and the padding token, else 0)")
    i.add_argument("--inf-rows", type=_int, metavar="N", help="tokens holding one +-Inf (default 0)")
    i.add_argument("--tie-heavy", action="store_const", const=True, help="hidden states with many values on e4m3 rounding midpoints")
    m = p.add_argument_group("MoE-model features (opt-in)")
    m.add_argument("--swiglu-limit", type=_float, metavar="LIMIT", help=f"SwiGLU clamp: silu(min(gate, LIMIT)) * clamp(up, -LIMIT, LIMIT), LIMIT in (0, {MAX_SWIGLU_LIMIT:g}] (gpt-oss: 7.0)")
    m.add_argument("--dropped-slots", type=_int, metavar="N", help="routed slots (of T*K) whose topk_ids entry is -1, contributing nothing (default 0)")
    m.add_argument("--routed-scaling-factor", type=_float, metavar="F", help=f"the routed sum times F before its last rounding, F in (0, {MAX_ROUTED_SCALING_FACTOR:g}] (DeepSeek-V3: 2.5)")
    s = p.add_argument_group("scale granularity (--quant names a weights/activations pair; these set each axis)")
    pairs = ", ".join(f"{w}/{a}" for w, a in SCALE_PAIRS)
    s.add_argument("--weight-scales", choices=WEIGHT_SCALES, help=f"FP8 weight scales per tensor, per output channel or per 128x128 block (default: --quant's own; weights/activations pairs: {pairs})")
    s.add_argument("--act-scales", choices=ACT_SCALES, help="FP8 activation scales per tensor, per token or per 1x128 group, computed per call: names --quant (tensor: fp8-tensor, token: fp8-token, group: fp8-block)")
    m.add_argument("--shared-experts", type=_int, metavar="S", help=f"the last S experts are shared, fused into every token's last S slots with weight 1, 0..min({MAX_SHARED_EXPERTS}, K-1) (default 0)")
    g.add_argument("--random-orders", type=_int, metavar="N", help=f"random program orders beside identity and reversed, 0..{MAX_RANDOM_ORDERS} (default {d.random_orders}; seeds --seed+1..--seed+N)")
    numerics = g.add_mutually_exclusive_group()
    numerics.add_argument("--numerics", metavar="PROFILE[+POINT=CHOICE...]",
                          help=f"the rounding the reference follows: one of {', '.join(PROFILE_NAMES)}, optionally with "
                               f"overrides ({NUMERICS_EXAMPLE}; default: the one the implementation declares, diffmoe's "
                               "unless it names one; vllm's kernel declares vllm)")
    numerics.add_argument("--numerics-file", metavar="FILE.toml",
                          help='the same from a TOML file: base = "vllm" and a [points] table of overrides')
    g.add_argument("--config", metavar="FILE.json", help="read the whole config from a JSON file instead")


def parse_expert_map(text: str) -> tuple[int, ...]:
    """'0,-1,1' -> (0, -1, 1)."""
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError:
        raise UsageError(f"--expert-map must be comma-separated integers such as 0,-1,1, got {text!r}") from None


def config_from_args(args: argparse.Namespace) -> MoEConfig:
    """The config the flags (or --config FILE) describe; UsageError with the config's own message."""
    given = {flag: getattr(args, flag) for flag in (*CONFIG_FLAGS, *MODEL_FLAGS, "numerics_file")
             if getattr(args, flag, None) is not None}
    if args.config is not None:
        if given:
            flags = ", ".join("--" + f.replace("_", "-") for f in given)
            raise UsageError(f"--config cannot be combined with config flags ({flags})")
        return config_from_file(args.config)
    fields: dict[str, Any] = {CONFIG_FLAGS[flag]: value for flag, value in given.items() if flag in CONFIG_FLAGS}
    if "expert_map" in fields:
        fields["expert_map"] = parse_expert_map(fields["expert_map"])
    if "numerics" in fields:
        fields["numerics"] = numerics_spec(fields["numerics"])
    if "numerics_file" in given:
        fields["numerics"] = numerics_from_file(given["numerics_file"])
    if "act_scales" in fields:  # --act-scales names quant's scheme; with --quant too, the config says if they disagree
        fields.setdefault("quant", SCHEME_OF_ACT_SCALES[fields["act_scales"]])
    try:
        fields = model_flags.check_fields(args, fields, given)  # --model's fields under the flags, --ep's map
        config = MoEConfig(**fields)
        # one padding token and one NaN token unless --zero-rows / --nan-rows say otherwise
        # (config.flag_zero_rows and flag_nan_rows say why and when)
        return config.with_flag_rows(fields)
    except (TypeError, ValueError) as exc:
        raise UsageError(str(exc)) from None


def numerics_spec(text: str) -> str:
    """--numerics: the canonical spec of a profile, or a UsageError naming the flag (and the point
    and its menu, for a bad override)."""
    try:
        return parse_spec(text, "--numerics").spec
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def numerics_from_file(path: str) -> str:
    """--numerics-file: the canonical spec of the profile a TOML file describes, or a UsageError
    naming the file (and the key, the point and its menu)."""
    text = _read_small_text(path, "numerics file", MAX_NUMERICS_FILE_CHARS)
    try:
        return profile_from_toml(text, f"--numerics-file {path}").spec
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def config_from_file(path: str) -> MoEConfig:
    text = _read_small_text(path, "config file", MAX_CONFIG_JSON_CHARS)
    if len(text) > MAX_CONFIG_JSON_CHARS:
        raise UsageError(f"config file {path} is larger than {MAX_CONFIG_JSON_CHARS} characters; a config is a short JSON object")
    try:
        return MoEConfig.from_json(text)
    except (TypeError, ValueError) as exc:
        raise UsageError(f"invalid config in {path}: {exc}") from None
