"""`--model NAME` and `--ep RANK/SIZE` on the command line, and `diffmoe models` (the preset table).

check: a preset's fields (diffmoe.problem.models) are the base; every config flag given overrides its
field; `--ep` then turns the config's E and shared experts into rank RANK's expert map. fuzz: the
preset's fields become pins (a bound flag given for a field wins), `--ep` pins the map. tuned-configs:
`--model` keeps the files a model's layer loads (diffmoe.tuned_configs.files.for_model).

Owns the flags' parsing and the `models` command. The table and the placement are
diffmoe.problem.models'; this module only reads them.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from diffmoe.problem.config import MAX_PROBLEM_BYTES, SCHEME_OF_ACT_SCALES, problem_bytes
from diffmoe.problem.models import MODELS, ModelShape, expert_parallel_map, model, parse_ep

# The token count `diffmoe models` sizes a decode step with (a check's default T is 8).
DECODE_TOKENS = 8
# The problem size `diffmoe models` suggests an EP size for: a check's peak resident memory is several
# times its problem (Qwen3-30B-A3B whole, a 2.25 GiB problem at T=8, peaked at 13.6 GiB: issue 42), so
# 1 GiB keeps a decode check within a few GiB of a 24 GiB machine.
SUGGESTED_PROBLEM_BYTES = 2**30


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


# ---- diffmoe models ----------------------------------------------------------------------------------
def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print the table as one JSON object")


def rows() -> list[dict[str, Any]]:
    """One row per preset: its fields, the problem a decode step builds, and the smallest EP size that fits."""
    out = []
    for shape in MODELS.values():
        fields = shape.fields()
        whole = problem_bytes(DECODE_TOKENS, fields["topk"], shape.hidden, shape.inter, fields["num_experts"])
        out.append(dict(name=shape.name, experts=shape.experts, shared_experts=shape.shared_experts, topk=shape.topk,
                        hidden=shape.hidden, inter=shape.inter, quant=shape.quant,
                        routed_scaling_factor=shape.routed_scaling_factor, swiglu_limit=shape.swiglu_limit,
                        problem_gib=round(whole / 2**30, 2), suggested_ep=_smallest_ep(shape, SUGGESTED_PROBLEM_BYTES),
                        smallest_ep=_smallest_ep(shape, MAX_PROBLEM_BYTES),
                        source=shape.source, note=shape.note))
    return out


def _smallest_ep(shape: ModelShape, budget: int) -> int | None:
    """The fewest EP ranks whose rank 0 (the one holding the most experts) builds a decode-step problem
    within `budget` bytes; 1 when the whole layer does, None when no size does."""
    fields = shape.fields()
    for size in range(1, shape.experts + 1):
        local = -(-shape.experts // size) + shape.shared_experts
        if problem_bytes(DECODE_TOKENS, fields["topk"], shape.hidden, shape.inter, local) <= budget:
            return size
    return None


def run(args: argparse.Namespace, prog: str = "diffmoe models") -> int:
    table = rows()
    if args.json:
        print(json.dumps({"models": table, "decode_tokens": DECODE_TOKENS,
                          "max_problem_gib": MAX_PROBLEM_BYTES / 2**30,
                          "suggested_problem_gib": SUGGESTED_PROBLEM_BYTES / 2**30}, sort_keys=True))
        return 0
    head = (f"{'model':<20} {'E':>4} {'S':>2} {'K':>3} {'H':>6} {'I':>6}  {'quant':<10} {'scale':>6} {'clamp':>6} "
            f"{'GiB@T=8':>8}  {'allowed':<10} {'suggested':<10}")
    print(head)
    for r in table:
        print(f"{r['name']:<20} {r['experts']:>4} {r['shared_experts']:>2} {r['topk']:>3} {r['hidden']:>6} {r['inter']:>6}  "
              f"{r['quant']:<10} {_num(r['routed_scaling_factor']):>6} {_num(r['swiglu_limit']):>6} {r['problem_gib']:>8.2f}  "
              f"{_ep(r['smallest_ep']):<10} {_ep(r['suggested_ep']):<10}")
    print(f"E routed experts, S shared (a check fuses them: E+S experts, K+S slots). GiB@T=8: the float32 problem a {DECODE_TOKENS}-token "
          f"check of the whole layer builds. allowed: the whole layer, or the fewest expert-parallel ranks whose rank 0 is within "
          f"the {MAX_PROBLEM_BYTES // 2**30} GiB a config may build; suggested: within {SUGGESTED_PROBLEM_BYTES // 2**30} GiB "
          f"(a check's peak resident memory is several times its problem). Sources: docs/models.md. "
          f"Use: {prog.rsplit(' ', 1)[0]} check --model NAME [--ep 0/N]")
    return 0


def _ep(size: int | None) -> str:
    return "no" if size is None else ("whole" if size == 1 else f"--ep 0/{size}")


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"
