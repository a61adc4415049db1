"""Measure how far the optimized path actually is from the reference, per (scheme, buffer).

The tolerance table (diffmoe/tolerance/table.py) states bounds with reasons; this script measures
the differences those bounds must cover, end to end and teacher-forced, over the labelled
edge cases plus seeded random configs, and prints the table of docs/tolerances.md: for each
row the worst measured max ULP, max |diff|, fraction of differing elements, and whether the
rule held everywhere.

    python bench/measure_tolerances.py [--seeds N] [--write docs/tolerances.md]

With --write it replaces the text between `<!-- tolerances:start -->` and
`<!-- tolerances:end -->` in the given file.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from collections import defaultdict

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from benchkit import write_section  # noqa: E402
from diffmoe.tolerance.compare import compare, ulp_distance  # noqa: E402
from diffmoe.problem.config import QUANT_SCHEMES, MoEConfig  # noqa: E402
from diffmoe.contract import default_device  # noqa: E402
from diffmoe.problem.edge_cases import edge_cases  # noqa: E402
from diffmoe.tolerance.gemm_interval import stage_bound  # noqa: E402
from diffmoe.problem.inputs import make_problem  # noqa: E402
from diffmoe.check.recording import LaunchLog  # noqa: E402
from diffmoe.tolerance.table import END_TO_END, FORCED, rule_for  # noqa: E402
from diffmoe.problem.vocabulary import Buffers, Stages, materialised_buffers, pipeline_stages  # noqa: E402
from optimized import make_implementation  # noqa: E402
from reference import reference_moe  # noqa: E402


def random_configs(quant: str, fused: bool, seeds: int) -> list[MoEConfig]:
    rng = random.Random(f"{quant}-{fused}")
    out = []
    for seed in range(seeds):
        e = rng.randint(1, 8)
        step = 128 if quant == "fp8-block" else 16
        out.append(MoEConfig(
            num_tokens=rng.randint(1, 48), num_experts=e, topk=rng.randint(1, e),
            hidden=step * rng.randint(1, 3), inter=step * rng.randint(1, 3),
            quant=quant, fused=fused, seed=seed,
        ))
    return out


class Worst:
    def __init__(self) -> None:
        self.max_ulp = 0
        self.max_abs = 0.0
        self.differing = 0
        self.total = 0
        self.failures = 0
        self.cases = 0
        self.rule = ""
        self.widened = 0  # derived rules: elements whose interval holds more than one bf16 value
        self.wider = 0  # derived rules: ... more than two (near zero, where the sum cancels)
        self.derived = False

    def add_interval(self, ref: torch.Tensor, bound) -> None:
        """A derived rule's width: how many bf16 values each element's interval holds."""
        if bound is None:
            return
        lo = (ref.double() - bound[0]).to(ref.dtype)
        hi = (ref.double() + bound[1]).to(ref.dtype)
        finite = torch.isfinite(bound[0]) & torch.isfinite(bound[1])
        values = torch.where(finite, ulp_distance(lo, hi) + 1, 1)
        self.widened += int((values > 1).sum())
        self.wider += int((values > 2).sum())
        self.derived = True

    def width(self) -> str:
        if not self.total or not self.derived:
            return "-"
        return f"1 in {1 - self.widened / self.total:.2%}, <= 2 in {1 - self.wider / self.total:.2%}"

    def add(self, c) -> None:
        self.max_ulp = max(self.max_ulp, c.max_ulp)
        self.max_abs = max(self.max_abs, c.max_abs)
        self.differing += c.differing
        self.total += c.total
        self.failures += 0 if c.ok else 1
        self.cases += 1
        self.rule = c.rule.describe()


# the tolerance table's backend axis: compiled kernels on a GPU, otherwise the interpreter
BACKEND = "interpreter" if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0") else "cuda"


def measure(configs: list[MoEConfig]) -> dict[tuple[str, str, str], Worst]:
    table: dict[tuple[str, str, str], Worst] = defaultdict(Worst)
    for cfg in configs:
        problem = make_problem(cfg, default_device())  # where the implementation runs
        ref = reference_moe(problem).intermediates
        impl = make_implementation(cfg)
        log = LaunchLog(snapshot=True)
        result = impl.run(problem, impl.allocate_workspaces(), recorder=log)
        got = {**log.snapshots, Buffers.OUTPUT: result.output}
        for name in materialised_buffers(cfg):
            c = compare(name, ref[name], got[name], rule_for(cfg.quant, name, END_TO_END, backend=BACKEND))
            table[(cfg.quant, name, END_TO_END)].add(c)
        for stage in pipeline_stages(cfg):
            fed = {n: ref[n] for n in stage.reads if n in ref}
            outputs = impl.run_stage(stage.name, fed, problem)
            for name in stage.writes:
                rule = rule_for(cfg.quant, name, FORCED, fused=stage.name == Stages.ACT_QUANT, backend=BACKEND)
                mode = FORCED + (" (fused)" if stage.name == Stages.ACT_QUANT else "")
                bound = stage_bound(rule, name, ref[name], fed, problem)
                table[(cfg.quant, name, mode)].add(compare(name, ref[name], outputs[name], rule, bound=bound))
                table[(cfg.quant, name, mode)].add_interval(ref[name], bound)
    return table


def render(table: dict[tuple[str, str, str], Worst], configs: int, seconds: float) -> str:
    lines = [
        f"Measured over {configs} configs (labelled edge cases and seeded random ones, both fused flags) in "
        f"{seconds:.0f} s on the Triton interpreter (`python bench/measure_tolerances.py`).",
        "",
        "| scheme | buffer | mode | rule | derived width (bf16 values an interval holds) | max ULP seen | max abs diff seen | elements differing | rule held |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    order = {name: i for i, name in enumerate(materialised_buffers(MoEConfig(quant="fp8-token"))
                                                + [Buffers.ACTIVATION_OUTPUT])}
    for (quant, name, mode), w in sorted(table.items(), key=lambda kv: (QUANT_SCHEMES.index(kv[0][0]), order.get(kv[0][1], 99), kv[0][2])):
        frac = f"{w.differing / w.total:.2%}" if w.total else "-"
        held = "yes" if w.failures == 0 else f"**no ({w.failures} of {w.cases})**"
        lines.append(f"| {quant} | {name} | {mode} | {w.rule} | {w.width()} | {w.max_ulp} | {w.max_abs:.3g} | {frac} | {held} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=6, help="random configs per scheme and fused flag")
    parser.add_argument("--write", metavar="docs/tolerances.md", help="replace the tolerances section of this file")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    configs = []
    for quant in QUANT_SCHEMES:
        for fused in ([False] if quant == "bf16" else [False, True]):
            configs += list(edge_cases(quant, fused=fused).values()) + random_configs(quant, fused, args.seeds)
    table = measure(configs)
    text = render(table, len(configs), time.perf_counter() - start)
    print(text)
    if args.write:
        written = write_section(args.write, text, "<!-- tolerances:start -->", "<!-- tolerances:end -->")
        if written:
            return written
    return 0 if all(w.failures == 0 for w in table.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
