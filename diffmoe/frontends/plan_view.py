"""`diffmoe plan`'s views of a workspace plan: the text table and the PNG.

Owns drawing a declared plan (one row per placed buffer, live stages, aliasing overlaps
marked; never-written slots and buffers kept outside the workspaces shown too). Judges nothing: the overlaps are the static-aliasing oracle's findings, passed in.
"""

from __future__ import annotations

from diffmoe.contract import WorkspacePlan


def _live_ranges(plan: WorkspacePlan):
    from diffmoe.oracles.static_aliasing import live_ranges

    return live_ranges(plan)


def _ws(index: int) -> str:
    return f"ws{index + 1}"


def render_plan(plan: WorkspacePlan, findings) -> str:
    """The plan as a table, one row per placed buffer, aliasing overlaps marked."""
    ranges = _live_ranges(plan)
    partners: dict[str, list[str]] = {}
    for f in findings:
        if len(f.buffers) == 2:
            a, b = f.buffers
            partners.setdefault(a, []).append(b)
            partners.setdefault(b, []).append(a)
    rows = [("buffer", "workspace", "offset", "bytes", "live stages", "overlap")]
    for p in plan.placements:
        r = ranges.get(p.buffer)
        live = "never written" if r is None else (
            plan.stages[r.first].name if r.first == r.last else f"{plan.stages[r.first].name}..{plan.stages[r.last].name}"
        )
        overlap = "ALIASES " + ", ".join(partners[p.buffer]) if p.buffer in partners else ""
        rows.append((p.buffer, _ws(p.workspace), str(p.offset), str(p.nbytes), live, overlap))
    widths = [max(len(row[c]) for row in rows) for c in range(len(rows[0]))]
    lines = [
        f"workspace plan: planner={plan.planner}  ws1={plan.workspace_bytes[0]} bytes  ws2={plan.workspace_bytes[1]} bytes",
        f"buffer list: {', '.join(plan.buffer_list)}",
        f"stages: {' -> '.join(s.name for s in plan.stages)}",
        "",
    ]
    for n, row in enumerate(rows):
        lines.append("  ".join(cell.ljust(widths[c]) for c, cell in enumerate(row)).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    lines.append("")
    if findings:
        lines.append(f"{len(findings)} aliasing overlap{'s' if len(findings) != 1 else ''}:")
        lines.extend(f"  {f.headline()}" for f in findings)
    else:
        lines.append("no overlap: buffers live at the same stage never share bytes")
    return "\n".join(lines)


NEVER_WRITTEN = "never written"
PRIVATE = "not in ws1/ws2"


def unplaced_buffers(plan: WorkspacePlan) -> list[str]:
    """Buffers the plan's stages write that no placement carves from ws1/ws2 (scales an
    implementation keeps in private buffers, an output the caller owns), pipeline order."""
    placed = {p.buffer for p in plan.placements}
    names: list[str] = []
    for stage in plan.stages:
        names.extend(n for n in stage.writes if n not in placed and n not in names)
    return names


def draw_plan_png(plan: WorkspacePlan, findings, path: str) -> list[str]:
    """Two panels (ws1, ws2): bytes across, stages down, each buffer a block over its live
    stages, overlaps of live buffers in red. Every declared slot is drawn: one no stage writes
    (the legacy plan's fused `activation_output`, whose slot flips the parity) spans every
    stage, grey and hatched, labelled "never written"; buffers the stages write outside the
    workspaces (private scale buffers, a separate output) are listed under the panels.
    Returns the labels drawn, in drawing order."""
    import matplotlib

    matplotlib.use("Agg")  # files only, never a window
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    ranges = _live_ranges(plan)
    stages = [s.name for s in plan.stages]
    tab10 = plt.get_cmap("tab10")
    palette = [tab10(i) for i in range(10) if i != 3]  # tab10's red is kept for overlaps
    labels: list[str] = []
    fig, axes = plt.subplots(1, 2, figsize=(12, 0.6 * len(stages) + 2), sharey=True)
    for ws, ax in enumerate(axes):
        size = max(plan.workspace_bytes[ws], 1)
        for n, p in enumerate(plan.placements):
            if p.workspace != ws:
                continue
            r = ranges.get(p.buffer)
            if r is None:  # a slot no stage writes: it still takes its bytes (and its parity)
                label = f"{p.buffer} ({NEVER_WRITTEN})"
                ax.add_patch(Rectangle((p.offset, 0), p.nbytes, max(len(stages), 1), facecolor="lightgrey", alpha=0.5,
                                       hatch="..", edgecolor="dimgrey", linestyle="--"))
                y = len(stages) / 2
            else:
                label = p.buffer
                ax.add_patch(Rectangle((p.offset, r.first), p.nbytes, r.last - r.first + 1, facecolor=palette[n % len(palette)], alpha=0.45, edgecolor="black"))
                y = r.last + 0.75
            ax.text(p.offset + p.nbytes / 2, y, label, ha="center", va="center", fontsize=8, zorder=5,
                    bbox=dict(facecolor="white", alpha=0.8, edgecolor="none", pad=1))
            labels.append(label)
        for f in findings:
            for br in f.byte_ranges:
                if br.region != _ws(ws):
                    continue
                live = [ranges[b] for b in f.buffers if b in ranges]
                if len(live) < 2:
                    continue
                first, last = max(x.first for x in live), min(x.last for x in live)
                ax.add_patch(Rectangle((br.start, first), br.end - br.start, last - first + 1, facecolor="red", alpha=0.6, hatch="//", edgecolor="red"))
        ax.set_xlim(0, size)
        ax.set_ylim(len(stages), 0)  # stages run downwards
        ax.set_yticks([i + 0.5 for i in range(len(stages))], stages)
        ax.set_xlabel("bytes")
        ax.set_title(f"{_ws(ws)} ({plan.workspace_bytes[ws]} bytes)")
    unplaced = [f"{name} ({PRIVATE})" for name in unplaced_buffers(plan)]
    if unplaced:
        fig.text(0.5, 0.01, "written outside the workspaces: " + ", ".join(unplaced), ha="center", fontsize=8)
        labels.extend(unplaced)
    verdict = f"{len(findings)} aliasing overlap(s) in red" if findings else "no overlap"
    fig.suptitle(f"workspace plan, planner={plan.planner}: {verdict}")
    fig.tight_layout(rect=(0, 0.04 if unplaced else 0, 1, 1))
    fig.savefig(path, format="png", dpi=100)
    plt.close(fig)
    return labels
