"""`--model NAME` and `--ep RANK/SIZE` on the command line.

check: a preset's fields (diffmoe.problem.models) are the base; every config flag given overrides its
field; `--ep` then turns the config's E and shared experts into rank RANK's expert map. fuzz: the
preset's fields become pins (a bound flag given for a field wins), `--ep` pins the map. tuned-configs:
`--model` keeps the files a model's layer loads (diffmoe.tuned_configs.files.for_model).

Owns the flags' parsing; `diffmoe models` (the preset table) is diffmoe/frontends/commands/models.py.
The table and the placement are diffmoe.problem.models'; this module only reads them.
"""

from __future__ import annotations

import argparse
from typing import Any

from diffmoe.problem.config import SCHEME_OF_ACT_SCALES
from diffmoe.problem.models import MODELS, ModelShape, expert_parallel_map, model, parse_ep


def add_flags(group: argparse._ArgumentGroup) -> None:
    """--model and --ep, on a config (check) or bounds (fuzz) group."""
    group.add_argument("--model", metavar="NAME",
                       help=f"a real model's MoE layer: E, K, H, I, shared experts, routed scaling, SwiGLU clamp and "
                            f"quant from its published config; other flags override ({', '.join(MODELS)}; `diffmoe models` lists them)")
    group.add_argument("--ep", metavar="RANK/SIZE",
                       help="expert parallelism: the expert map of rank RANK of SIZE (a contiguous slice of the routed "
                            "experts, every shared expert local); needs E known (--model or --experts)")


def preset(args: argparse.Namespace) -> ModelShape | None:
    """The --model preset, or None; ValueError naming --model and every preset."""
    name = getattr(args, "model", None)
    return None if name is None else model(name, "--model")


def check_fields(args: argparse.Namespace, fields: dict[str, Any], given: dict[str, Any]) -> dict[str, Any]:
    """`fields` (the config flags given) over the --model preset's, with --ep's expert map: ValueError
    naming the flag on a bad name, a bad RANK/SIZE, or --ep beside --expert-map."""
    shape = preset(args)
    merged = dict(fields)
    if shape is not None:
        base = shape.fields()
        if "quant" not in given and "act_scales" in given:  # --act-scales names the scheme the user wants
            base["quant"] = SCHEME_OF_ACT_SCALES[given["act_scales"]]
        if given.get("router", "softmax-topk") != "softmax-topk":
            base.pop("renormalize")  # renormalize applies to softmax-topk alone
        merged = {**base, **fields}
    if getattr(args, "ep", None) is not None:
        experts = merged.get("num_experts")
        merged["expert_map"] = _ep_map(args.ep, "expert_map" in merged, experts, merged.get("shared_experts", 0),
                                       None if experts is not None else
                                       "--ep needs the experts known: give --model NAME or --experts E")
    return merged


def fuzz_pins(args: argparse.Namespace, ranges: dict[str, tuple[int, int]], values: dict[str, tuple]) -> None:
    """Add the --model preset's fields and --ep's map to a fuzz's bounds, in place, where no bound flag
    already bounds the field; ValueError naming the flag."""
    shape = preset(args)
    if shape is not None:
        for name, value in shape.fields().items():
            if name in ranges or name in values:
                continue
            if name in ("num_experts", "topk", "hidden", "inter", "shared_experts"):
                ranges[name] = (value, value)
            elif value is not None:
                values[name] = (value,)
        if values.get("router", ("softmax-topk",)) != ("softmax-topk",) and getattr(args, "renormalize", None) is None:
            values.pop("renormalize", None)
    if getattr(args, "ep", None) is not None:
        experts, shared = ranges.get("num_experts", (0, 1)), ranges.get("shared_experts", (0, 0))
        pinned = experts[0] == experts[1] and shared[0] == shared[1]
        values["expert_map"] = (_ep_map(args.ep, "expert_map" in values, experts[0], shared[0], None if pinned else
                                        "--ep needs E pinned: give --model NAME or --experts E (and --shared-experts S, if any)"),)


def _ep_map(ep: str, has_map: bool, experts: int | None, shared: int, missing: str | None) -> tuple[int, ...]:
    """--ep's expert map of E experts (S shared); ValueError beside --expert-map, for a bad RANK/SIZE, or
    `missing` when E is not known."""
    if has_map:
        raise ValueError("--ep and --expert-map cannot be combined: --ep writes the expert map")
    rank, size = parse_ep(ep)
    if missing is not None:
        raise ValueError(missing)
    return expert_parallel_map(experts, shared, rank, size)
