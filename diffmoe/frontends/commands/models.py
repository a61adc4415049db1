"""`diffmoe models`: the real models' MoE layers `--model NAME` sets (diffmoe.problem.models), with the
problem a decode step builds and the expert-parallel size that fits here.

Owns the table's columns and wording; the presets and the placement are diffmoe.problem.models', the
flags diffmoe/frontends/model_flags.py's.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from diffmoe.problem.config import MAX_PROBLEM_BYTES, problem_bytes
from diffmoe.problem.models import MODELS, ModelShape
from diffmoe.frontends.exits import PROG

NAME = "models"

# The token count `diffmoe models` sizes a decode step with (a check's default T is 8).
DECODE_TOKENS = 8
# The problem size `diffmoe models` suggests an EP size for: a check's peak resident memory is several
# times its problem (Qwen3-30B-A3B whole, a 2.25 GiB problem at T=8, peaked at 13.6 GiB: issue 42), so
# 1 GiB keeps a decode check within a few GiB of a 24 GiB machine.
SUGGESTED_PROBLEM_BYTES = 2**30


def add_parser(sub) -> argparse.ArgumentParser:
    models = sub.add_parser(NAME, help="the real models --model names: E, K, H, I, shared experts, quant, and what fits here",
                            description="The real models' MoE layers `--model NAME` sets (check, fuzz, tuned-configs); "
                                        "each cited in docs/models.md.")
    add_arguments(models)
    models.set_defaults(handler=run)
    return models


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


def run(args: argparse.Namespace, prog: str = f"{PROG} models") -> int:
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
