"""How much memory the two-workspace rule costs, against what liveness allows and what
separate buffers would take.

For every config of a sweep (schemes x fused x output placement x planner x T, E, K, H, I):

* ws1+ws2: `plan_workspaces(config, T).workspace_bytes`, summed;
* liveness bound: the most bytes ever live at once. A buffer is live from the stage that
  writes it to the last stage that reads it, inclusive (pipeline_stages; a stage's inputs and
  outputs are live together, as the static aliasing oracle says). Only the plan's workspace
  buffers count (buffer_spec of the declared list, minus any slot nothing writes). No
  allocator of these buffers can use fewer bytes, whatever their placement;
* separate: the same buffers each in its own allocation, as the reference holds its
  intermediates (activation scales and a caller-supplied output live outside the
  workspaces on the optimized side, so they are left out of all three figures).

Every buffer is linear in T and none depends on E, so the ratios do not depend on T or E; the
three FP8 schemes have the same buffers (only their scales differ). The script checks this
rather than assuming it: configs are merged into one row only when their ratios agree.

    python bench/workspace_memory.py [--png docs/images/workspace_memory.png] [--write docs/performance.md] [--full]

--write replaces the text between `<!-- workspace-memory:start -->` and
`<!-- workspace-memory:end -->` in the given file (exit status 2 when the markers are missing).
--full also prints one row per (layout, K, H, I).
"""

from __future__ import annotations

import argparse
import itertools
import sys
from collections import defaultdict
from dataclasses import dataclass

from benchkit import write_section  # first: sets the interpreter switch when no GPU
from diffmoe.problem.config import MAX_PROBLEM_BYTES, QUANT_SCHEMES, MoEConfig, problem_bytes
from diffmoe.problem.vocabulary import buffer_spec, materialised_buffers, pipeline_stages
from optimized.workspace_planner import plan_workspaces

MARK_START = "<!-- workspace-memory:start -->"
MARK_END = "<!-- workspace-memory:end -->"

TOKENS = (1, 64, 4096)
EXPERTS = (8, 64)
TOPK = (1, 2, 8)
HIDDEN_INTER = ((256, 256), (4096, 1024), (1024, 4096), (7168, 2048))
FAR = 1.25  # ws1+ws2 at least this many times the bound is called "far from the bound"
SHOW_TOKENS = 4096  # bytes in the tables are for this T (ratios are the same for every T)
MIB = 2**20


@dataclass(frozen=True)
class Measure:
    config: MoEConfig
    ws1: int
    ws2: int
    bound: int
    separate: int
    bound_stage: str

    @property
    def workspaces(self) -> int:
        return self.ws1 + self.ws2

    @property
    def ws_over_bound(self) -> float:
        return self.workspaces / self.bound

    @property
    def separate_over_bound(self) -> float:
        return self.separate / self.bound

    @property
    def ws_over_separate(self) -> float:
        return self.workspaces / self.separate

    def ratios(self) -> tuple[float, float]:
        return (round(self.ws_over_bound, 6), round(self.separate_over_bound, 6))


def workspace_buffers(config: MoEConfig) -> list[str]:
    """The plan's buffers that some stage writes (the legacy plan's fused slot is never written)."""
    plan = plan_workspaces(config, config.num_tokens)
    written = set(materialised_buffers(config))
    return [name for name in plan.buffer_list if name in written]


def liveness_bound(config: MoEConfig) -> tuple[int, str]:
    """(max over stages of the bytes of workspace buffers live there, the stage where it peaks)."""
    stages = pipeline_stages(config)
    live_bytes = [0] * len(stages)
    for name in workspace_buffers(config):
        first = next(i for i, s in enumerate(stages) if name in s.writes)
        last = max((i for i, s in enumerate(stages) if name in s.reads and i >= first), default=first)
        nbytes = buffer_spec(config, name).nbytes
        for i in range(first, last + 1):
            live_bytes[i] += nbytes
    peak = max(range(len(stages)), key=lambda i: live_bytes[i])
    return live_bytes[peak], stages[peak].name


def measure(config: MoEConfig) -> Measure:
    ws1, ws2 = plan_workspaces(config, config.num_tokens).workspace_bytes
    bound, stage = liveness_bound(config)
    separate = sum(buffer_spec(config, name).nbytes for name in workspace_buffers(config))
    return Measure(config, ws1, ws2, bound, separate, stage)


def sweep() -> list[Measure]:
    out = []
    for quant in QUANT_SCHEMES:
        for fused, output, planner in itertools.product((False, True), ("separate", "workspace"), ("fixed", "legacy")):
            if fused and quant == "bf16":
                continue
            for t, e, k, (h, i) in itertools.product(TOKENS, EXPERTS, TOPK, HIDDEN_INTER):
                fields = dict(num_tokens=t, num_experts=e, topk=k, hidden=h, inter=i, quant=quant, fused=fused,
                              output=output, planner=planner)
                if problem_bytes(t, k, h, i, e) > MAX_PROBLEM_BYTES:
                    continue  # a config this large is refused before allocation; its plan needs no problem
                out.append(measure(MoEConfig(**fields)))
    return out


# ---- grouping -----------------------------------------------------------------------------


def layout_of(c: MoEConfig) -> tuple[str, str, str]:
    """(scheme family, fusion, output placement): what decides the buffer list."""
    family = "bf16" if c.quant == "bf16" else "fp8"
    return family, "fused" if c.fused else "unfused", c.output


@dataclass
class Row:
    layout: tuple[str, str, str]
    planners: tuple[str, ...]
    k: int
    h: int
    i: int
    sample: Measure  # at SHOW_TOKENS

    def label(self) -> str:
        family, fusion, output = self.layout
        return f"{family} {fusion}, output={output}, planner={'/'.join(self.planners)}"


def group(measures: list[Measure]) -> tuple[list[Row], list[str]]:
    """Merge configs that differ only in T, E, the FP8 scheme and (where identical) the planner.

    Returns the rows and, for any group whose ratios do not agree, a note (and no merge)."""
    by_key: dict[tuple, list[Measure]] = defaultdict(list)
    for m in measures:
        c = m.config
        by_key[(layout_of(c), c.planner, c.topk, c.hidden, c.inter)].append(m)
    notes = []
    merged: dict[tuple, tuple[tuple[float, float], Measure]] = {}
    for key, items in by_key.items():
        ratios = {m.ratios() for m in items}
        if len(ratios) != 1:
            notes.append(f"ratios differ across T/E/scheme for {key}: {sorted(ratios)}")
        sample = max(items, key=lambda m: (m.config.num_tokens == SHOW_TOKENS, m.config.quant == "fp8-token"))
        merged[key] = (items[0].ratios(), sample)
    # A layout whose fixed and legacy plans agree on every shape (all unfused and bf16 ones)
    # gets one row per shape labelled with both planners.
    per_planner: dict[tuple, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    for (layout, planner, k, h, i), (ratios, sample) in sorted(merged.items(), key=lambda kv: kv[0][2:]):
        per_planner[layout][planner].append((k, h, i, ratios, sample.ws1, sample.ws2, sample.bound, sample.separate))
    rows: list[Row] = []
    for (layout, planner, k, h, i), (_ratios, sample) in merged.items():
        figures = per_planner[layout]
        if len({tuple(v) for v in figures.values()}) == 1:
            if planner != min(figures):
                continue  # the other planner's identical row stands for both
            planners = tuple(sorted(figures))
        else:
            planners = (planner,)
        rows.append(Row(layout, planners, k, h, i, sample))
    order = {"bf16": 0, "fp8": 1, "unfused": 0, "fused": 1, "separate": 0, "workspace": 1, "fixed": 0, "legacy": 1}
    out = sorted(rows, key=lambda r: (tuple(order[x] for x in r.layout), order[r.planners[0]], r.k, r.h, r.i))
    return out, notes


# ---- rendering ----------------------------------------------------------------------------


def _set(values) -> str:
    return "{" + ", ".join(str(v) for v in values) + "}"


def _mib(n: int) -> str:
    return f"{n / MIB:.1f}"


def compact_table(rows: list[Row]) -> list[str]:
    """One line per layout and planner: the range of each ratio over every (K, H, I)."""
    by_label: dict[str, list[Row]] = defaultdict(list)
    for r in rows:
        by_label[r.label()].append(r)
    lines = [
        "| layout | ws1+ws2 / bound | worst at (K, H, I) | separate / bound | ws1+ws2 / separate |",
        "|---|---|---|---|---|",
    ]
    for label, items in by_label.items():
        wb = [r.sample.ws_over_bound for r in items]
        sb = [r.sample.separate_over_bound for r in items]
        wsep = [r.sample.ws_over_separate for r in items]
        worst = max(items, key=lambda r: r.sample.ws_over_bound)
        where = f"({worst.k}, {worst.h}, {worst.i})" if max(wb) >= 1.005 else "-"  # all at the bound
        lines.append(
            f"| {label} | {min(wb):.2f}-{max(wb):.2f} | {where} | "
            f"{min(sb):.2f}-{max(sb):.2f} | {min(wsep):.2f}-{max(wsep):.2f} |"
        )
    return lines


def full_table(rows: list[Row]) -> list[str]:
    lines = [
        f"| layout | K | H | I | ws1 MiB | ws2 MiB | ws1+ws2 MiB | bound MiB (peak stage) | separate MiB | ws/bound | separate/bound |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        m = r.sample
        lines.append(
            f"| {r.label()} | {r.k} | {r.h} | {r.i} | {_mib(m.ws1)} | {_mib(m.ws2)} | {_mib(m.workspaces)} | "
            f"{_mib(m.bound)} ({m.bound_stage}) | {_mib(m.separate)} | {m.ws_over_bound:.2f} | {m.separate_over_bound:.2f} |"
        )
    return lines


def far_lines(rows: list[Row]) -> list[str]:
    """The configs where ws1+ws2 is at least FAR times the bound, one line per (layout, H, I, ratio)."""
    far: dict[tuple, list[Row]] = defaultdict(list)
    for r in rows:
        if r.sample.ws_over_bound >= FAR:
            far[(r.label(), r.h, r.i, round(r.sample.ws_over_bound, 2))].append(r)
    if not far:
        return [f"The two-workspace rule stays within {FAR:.2f}x of the liveness bound for every config swept."]
    lines = [f"Where the two-workspace rule is far from the bound (ws1+ws2 >= {FAR:.2f}x the bound), worst first:", ""]
    for (label, h, i, ratio), items in sorted(far.items(), key=lambda kv: (-kv[0][3], kv[0][0])):
        m = items[0].sample
        ks = ", ".join(str(r.k) for r in items)
        lines.append(
            f"- {label}, H={h}, I={i}, K in {{{ks}}}: ws1+ws2 = **{ratio:.2f}x** the bound, e.g. at K={items[0].k}, "
            f"T={m.config.num_tokens}: {_mib(m.ws1)} + {_mib(m.ws2)} = {_mib(m.workspaces)} MiB against "
            f"{_mib(m.bound)} MiB live at {m.bound_stage}."
        )
    return lines


def legacy_cost(measures: list[Measure]) -> str:
    """How many more bytes the legacy plan takes than the fixed one, fused FP8 (the only
    layouts where they differ: the legacy list keeps a slot for the unwritten activation)."""
    fixed = {m.config.replace(planner="legacy"): m for m in measures if m.config.fused and m.config.planner == "fixed"}
    pairs = [(m, fixed[m.config]) for m in measures if m.config.fused and m.config.planner == "legacy"]
    ratios = [(lg.workspaces / fx.workspaces, lg) for lg, fx in pairs]
    worst_ratio, worst = max(ratios, key=lambda x: x[0])
    best_ratio = min(r for r, _ in ratios)
    return (f"Fused FP8: the legacy plan (the aliasing bug) also takes {best_ratio:.2f}x to {worst_ratio:.2f}x the "
            f"fixed plan's ws1+ws2 (worst: {worst.config.short()}): its list keeps the never-written "
            "activation_output, which is sized like a real buffer and shifts every colour after it.")


def render(measures: list[Measure], full: bool) -> str:
    rows, notes = group(measures)
    worst = max(measures, key=lambda m: m.ws_over_bound)
    best = min(measures, key=lambda m: m.ws_over_bound)
    lines = [
        f"{len(measures)} configs swept (`python bench/workspace_memory.py`): schemes {', '.join(QUANT_SCHEMES)}; "
        f"fused and unfused; output separate and in ws1; fixed and legacy planner; T in {_set(TOKENS)}, "
        f"E in {_set(EXPERTS)}, K in {_set(TOPK)}, (H, I) in {_set(HIDDEN_INTER)}, less the combinations whose "
        f"problem would exceed MAX_PROBLEM_BYTES ({MAX_PROBLEM_BYTES // 2**30} GiB; a plan needs no problem, but a config does). "
        "The bound is the most bytes of workspace buffers live at one stage; separate is the same buffers "
        "in their own allocations. Ratios agree across T, E and the three FP8 schemes"
        + (" (checked)." if not notes else f", except: {'; '.join(notes)}."),
        "",
        *compact_table(rows),
        "",
        f"Over the whole sweep ws1+ws2 is {best.ws_over_bound:.2f}x to {worst.ws_over_bound:.2f}x the liveness bound "
        f"(worst: {worst.config.short()}).",
        "",
        legacy_cost(measures),
        "",
        *far_lines(rows),
    ]
    if full:
        lines += ["", f"Every (layout, K, H, I), bytes at T={SHOW_TOKENS}:", "", *full_table(rows)]
    return "\n".join(lines)


def plot(measures: list[Measure], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows, _ = group(measures)
    labels = list(dict.fromkeys(r.label() for r in rows))
    shapes = list(dict.fromkeys((r.k, r.h, r.i) for r in rows))
    fig, axes = plt.subplots(2, 1, figsize=(max(12, 1.6 * len(labels)), 8), sharex=True)
    colors = plt.get_cmap("tab20").colors  # 12 shapes: the default 10-colour cycle would repeat
    width = 0.8 / len(shapes)
    for panel, (ax, attr, title) in enumerate(zip(
        axes, ("ws_over_bound", "separate_over_bound"),
        ("ws1+ws2 / liveness bound", "separate buffers / liveness bound"),
    )):
        for s, shape in enumerate(shapes):
            values = []
            for label in labels:
                match = [r for r in rows if r.label() == label and (r.k, r.h, r.i) == shape]
                values.append(getattr(match[0].sample, attr) if match else 0.0)
            xs = [x + (s - (len(shapes) - 1) / 2) * width for x in range(len(labels))]
            ax.bar(xs, values, width, color=colors[s % len(colors)],
                   label=f"K={shape[0]} H={shape[1]} I={shape[2]}" if panel == 0 else None)
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_ylabel("ratio")
        ax.set_title(title)
    axes[0].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    axes[-1].set_xticks(range(len(labels)))
    axes[-1].set_xticklabels([label.replace(", ", "\n") for label in labels], fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--png", metavar="FILE", help="also plot the ratios to this PNG")
    parser.add_argument("--write", metavar="FILE", help="replace the workspace-memory section of this file")
    parser.add_argument("--full", action="store_true", help="also print one row per (layout, K, H, I)")
    args = parser.parse_args(argv)
    measures = sweep()
    text = render(measures, args.full)
    print(text)
    if args.png:
        plot(measures, args.png)
        print(f"\nwrote {args.png}")
    if args.write:
        return write_section(args.write, text, MARK_START, MARK_END)
    return 0


if __name__ == "__main__":
    sys.exit(main())
