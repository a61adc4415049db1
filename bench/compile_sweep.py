"""The full compile sweep: every specialization of the optimized MoE compiled for sm_90 and sm_100,
native and software-fallback traits, summarised as the compile tables of docs/gpu.md.

    TRITON_INTERPRET=0 .venv/bin/python bench/compile_sweep.py [--write docs/gpu.md] [--json OUT.json]

No GPU needed (diffmoe/backend/compile_gate.py). Progress on stderr as `diffmoe compile-check --sweep`
shows it (diffmoe/cluster/progress.py). Rows group specializations by stage, scheme and (for the
GEMMs, whose BLOCK_M follows it) tile class; each cell is the worst over the group: the most
registers, spill bytes and shared memory, and every matrix instruction seen.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import defaultdict

os.environ["TRITON_INTERPRET"] = "0"  # before anything imports triton
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # benchkit

from benchkit import write_section  # noqa: E402
from diffmoe.backend import compile_gate as gate  # noqa: E402
from diffmoe.problem.config import QUANT_SCHEMES  # noqa: E402
from diffmoe.problem.vocabulary import Stages  # noqa: E402

ARCHS = ("sm_90", "sm_100")
START, END = "<!-- compile-sweep:start -->", "<!-- compile-sweep:end -->"
GEMM_STAGES = (Stages.GATE_UP_GEMM, Stages.DOWN_GEMM)
STAGE_ORDER = [Stages.QUANT_INPUT, Stages.GATE_UP_GEMM, Stages.ACTIVATION, Stages.QUANT_DOWN_INPUT, Stages.ACT_QUANT,
               Stages.DOWN_GEMM, Stages.REDUCE]


def group_key(r: gate.CompileResult) -> tuple:
    tile = r.tile_class if r.stage in GEMM_STAGES else "any"
    tile_rank = list(gate.TILE_CLASSES).index(tile) if tile in gate.TILE_CLASSES else -1
    return (STAGE_ORDER.index(r.stage) if r.stage in STAGE_ORDER else 99, r.stage, QUANT_SCHEMES.index(r.quant),
            r.quant, tile_rank, tile)


def cell(results: list[gate.CompileResult]) -> str:
    bad = [r for r in results if r.status != gate.OK]
    if bad:
        return f"{bad[0].status} ({len(bad)})"
    regs = max(r.registers or 0 for r in results)
    spills = max(r.spills for r in results)
    smem = max(r.shared or 0 for r in results)
    mmas = sorted({r.mma for r in results if r.mma and r.mma != "none"})
    return f"{regs} | {spills} | {smem / 1024:.0f} | {', '.join(mmas) or '-'}"


def table(results: list[gate.CompileResult], variant: str) -> list[str]:
    groups: dict[tuple, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    for r in results:
        if r.variant == variant:
            groups[group_key(r)][r.arch].append(r)
    head = "| stage | scheme | tile class | " + " | ".join(
        f"{a} regs | {a} spill B | {a} smem KiB | {a} MMA" for a in ARCHS) + " |"
    lines = [head, "|" + "---|" * (3 + 4 * len(ARCHS))]
    for key in sorted(groups):
        _, stage, _, quant, _, tile = key
        cells = [cell(groups[key][a]) if groups[key][a] else "- | - | - | -" for a in ARCHS]
        lines.append(f"| {stage} | {quant} | {tile} | " + " | ".join(cells) + " |")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", metavar="docs/gpu.md", help="replace the compile-sweep section of this file")
    ap.add_argument("--json", metavar="OUT.json", help="also write every specialization's result")
    ap.add_argument("--jobs", type=int, default=None)
    ap.add_argument("--from-json", metavar="OUT.json", help="render the tables from an earlier --json run instead")
    args = ap.parse_args()

    configs = gate.sweep_configs()
    if args.from_json:
        with open(args.from_json) as fh:
            data = json.load(fh)
        report = gate.GateReport([gate.CompileResult(**r) for r in data["results"]], data["archs"], data["configs"],
                                 data["seconds"], tuple(data["forbid_spills"]))
        seconds = data["seconds"]
    else:
        from optimized import make_implementation

        from diffmoe.frontends.cli import GateProgress

        start = time.perf_counter()
        progress = GateProgress(sys.stderr, len(configs), label="compile sweep")  # a bar on a terminal, else lines
        try:
            report = gate.run_gate(make_implementation, configs, ARCHS, jobs=args.jobs, progress=progress.compiled,
                                   capture_progress=progress.captured)
        finally:
            progress.close()
        seconds = time.perf_counter() - start
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(report.to_dict(), fh)
    failures = report.failures()
    lines = [
        f"Measured {time.strftime('%Y-%m-%d')} on a 2-core CPU machine without a GPU (triton "
        f"{__import__('triton').__version__}): {len(report.results)} specializations from {len(configs)} configs, "
        f"{', '.join(ARCHS)}, both trait sets, compiled in {seconds:.0f} s with 2 compiler processes on a machine "
        f"shared with other work; "
        f"{len(failures)} not compiled. Command: `TRITON_INTERPRET=0 .venv/bin/python bench/compile_sweep.py --write docs/gpu.md`.",
        "",
        "Native traits (what a GPU whose probes pass runs). Each cell: registers | spill bytes (stores + loads) | "
        "shared memory KiB | matrix instruction; the worst over the group (order table on and off, fused or not, "
        "router weight placement, output placement, H = 2048 and 7168). A specialization several schemes share (the "
        "unfused activation, the reduce) is listed under the first scheme that launched it.",
        "",
        *table(report.results, "native"),
        "",
        "Software fallback (`safe`: bf16 and e4m3 rounding by integer ops, fp8 decoded by bits, float32 dots): correct "
        "everywhere, which is why the interpreter runs it, and why CUDA refuses it by default.",
        "",
        *table(report.results, "safe"),
    ]
    text = "\n".join(lines)
    print(text)
    if args.write:
        return write_section(args.write, text, START, END) or (1 if failures else 0)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
