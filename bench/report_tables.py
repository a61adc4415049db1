"""Turn a pytest-benchmark JSON into the benchmark tables of docs/performance.md (and a plot).

    python -m pytest bench/ --benchmark-only --benchmark-json BENCH.json
    python bench/report_tables.py BENCH.json [--png plot.png] [--write docs/performance.md] [--stat median]

Tables, all from the one JSON, so every ratio compares figures measured in the same run:

* throughput, one table per (backend, shape, scheme): rows T, columns the providers
  (reference, optimized unfused, optimized fused) in tokens/s, then optimized / reference.
  Interpreter figures are labelled "interpreter, not kernel speed"; on CUDA a second table
  gives the optimized path's achieved TFLOP/s, GB/s and fraction of the H200 roofline;
* oracle overhead: each oracle alone against the bare run, and every oracle together;
* the static aliasing check on its own;
* fuzzing: fixed-planner examples per second, and the legacy planner's time and examples to
  the first failure and to the end of shrinking;
* peer check cost: each peer's check against the shipped implementation's on the same config
  (bench/bench_peer_cost.py), with issue 11's 3x bound.

--png plots tokens/s against T per provider; --write replaces the text between
`<!-- bench:start -->` and `<!-- bench:end -->` in the given file (exit status 2 when the
markers are missing).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict

from benchkit import BACKEND_CUDA, INTERPRETER_LABEL, PEER_COST_BOUND, write_section
from diffmoe.problem.config import QUANT_SCHEMES
from diffmoe.contract import DEFAULT_IMPLEMENTATION_NAME

MARK_START = "<!-- bench:start -->"
MARK_END = "<!-- bench:end -->"
STATS = ("median", "min", "mean")


def _num(x: float, digits: int = 3) -> str:
    """A figure with `digits` significant digits, without scientific notation for usual sizes."""
    if x == 0:
        return "0"
    if abs(x) >= 10 ** digits:
        return f"{x:,.0f}"
    return f"{x:.{digits}g}"


def _seconds(s: float) -> str:
    if s >= 1:
        return f"{s:.2f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.3g} ms"
    return f"{s * 1e6:.3g} us"


def _backend_label(backend: str) -> str:
    return "CUDA, compiled kernels" if backend == BACKEND_CUDA else INTERPRETER_LABEL


def _variant(b: dict) -> str:
    info = b["extra_info"]
    if info.get("provider") == "reference":
        return "reference"
    return "optimized fused" if info.get("fused") else "optimized unfused"


VARIANT_ORDER = ("reference", "optimized unfused", "optimized fused")


def split(data: dict) -> dict[str, list[dict]]:
    parts: dict[str, list[dict]] = defaultdict(list)
    for b in data.get("benchmarks", []):
        group = b.get("group") or ""
        kind = group.split(" ", 1)[0] if group.startswith("throughput") else group
        parts[kind].append(b)
    return parts


def _header(data: dict, stat: str) -> list[str]:
    machine = data.get("machine_info", {})
    cpu = machine.get("cpu", {}).get("brand_raw") or machine.get("processor") or "?"
    when = data.get("datetime", "?")
    backends = sorted({b["extra_info"]["backend"] for b in data.get("benchmarks", []) if "backend" in b["extra_info"]})
    return [
        f"Measured {when[:19]} on {cpu} ({machine.get('node', '?')}), backend {', '.join(backends)}, "
        f"pytest-benchmark {data.get('version', '?')}; each figure is the {stat} of the rounds shown.",
    ]


# ---- throughput ---------------------------------------------------------------------------


def throughput_tables(benchmarks: list[dict], stat: str) -> list[str]:
    groups: dict[tuple, dict[int, dict[str, dict]]] = defaultdict(lambda: defaultdict(dict))
    for b in benchmarks:
        info = b["extra_info"]
        key = (info["backend"], info.get("shape", "?"), info["quant"])
        groups[key][info["tokens"]][_variant(b)] = b
    lines: list[str] = []
    def order(key: tuple) -> tuple:
        backend, shape, quant = key
        return (backend, shape, QUANT_SCHEMES.index(quant) if quant in QUANT_SCHEMES else len(QUANT_SCHEMES), quant)

    for (backend, shape, quant), by_t in sorted(groups.items(), key=lambda kv: order(kv[0])):
        variants = [v for v in VARIANT_ORDER if any(v in row for row in by_t.values())]
        rounds = sorted({b["stats"]["rounds"] for row in by_t.values() for b in row.values()})
        lines += [
            f"**{quant}, {shape}** ({_backend_label(backend)}; tokens/s, {stat} of {'/'.join(map(str, rounds))} "
            f"round(s) after an untimed warm-up)",
            "",
        ]
        ratio_cols = [v for v in variants if v != "reference"] if "reference" in variants else []
        head = ["T", *[f"{v} tok/s" for v in variants], *[f"{v.replace('optimized ', 'opt ')} / reference" for v in ratio_cols]]
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for t in sorted(by_t):
            row = by_t[t]
            tps = {v: t / row[v]["stats"][stat] for v in variants if v in row}
            cells = [str(t), *[_num(tps[v]) if v in tps else "-" for v in variants]]
            for v in ratio_cols:
                cells.append(f"{tps[v] / tps['reference']:.3g}x" if v in tps and "reference" in tps else "-")
            lines.append("| " + " | ".join(cells) + " |")
        if backend != BACKEND_CUDA:
            lines += ["", "The optimized path ran under the Triton interpreter and the reference as PyTorch on the CPU: "
                          "the ratio compares the two as run here, not the kernels."]
        else:
            lines += ["", *roofline_table(by_t, stat)]
        lines.append("")
    return lines


def roofline_table(by_t: dict[int, dict[str, dict]], stat: str) -> list[str]:
    """Achieved TFLOP/s and GB/s of the optimized variants, as a fraction of the H200 roofline."""
    variants = [v for v in VARIANT_ORDER[1:] if any(v in row for row in by_t.values())]
    head = ["T"] + [f"{v} {col}" for v in variants for col in ("TFLOP/s", "GB/s", "% of roofline")]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    bound = ""
    for t in sorted(by_t):
        cells = [str(t)]
        for v in variants:
            b = by_t[t].get(v)
            roof = b["extra_info"].get("roofline") if b else None
            if not roof:
                cells += ["-", "-", "-"]
                continue
            s = b["stats"][stat]
            tflops = roof["flops"] / s / 1e12
            cells += [_num(tflops), _num(roof["bytes"] / s / 1e9), f"{100 * tflops / roof['attainable_tflops']:.3g}% ({roof['bound']})"]
            bound = f"peaks: {roof['peak_tflops']} TFLOP/s dense, {roof['peak_tbps']} TB/s (H200 datasheet)"
        lines.append("| " + " | ".join(cells) + " |")
    return lines + ["", f"Roofline: attainable = min(peak, FLOP/byte x bandwidth), FLOPs of the two GEMMs, bytes of "
                        f"weights touched and activations in/out; {bound}."]


# ---- oracle overhead, static aliasing, fuzz ------------------------------------------------


def oracle_table(benchmarks: list[dict], stat: str) -> list[str]:
    by_variant = {b["extra_info"]["variant"]: b for b in benchmarks}
    base = by_variant.get("none")
    if base is None:
        return ["(no baseline run in this JSON)"]
    info = base["extra_info"]
    cfg = info["config"]
    t0 = base["stats"][stat]
    lines = [
        f"**Oracle overhead** ({_backend_label(info['backend'])}; config T={cfg['num_tokens']} E={cfg['num_experts']} "
        f"K={cfg['topk']} H={cfg['hidden']} I={cfg['inter']} {cfg['quant']} {'fused' if cfg['fused'] else 'unfused'}; "
        f"{stat} of {base['stats']['rounds']} round(s)). Baseline: `run_differential(..., oracles=())`, one "
        "schedule; each oracle alone on top of it:",
        "",
        "| oracles | schedules | seconds | x baseline | overhead |",
        "|---|---|---|---|---|",
    ]
    for variant, b in by_variant.items():
        s = b["stats"][stat]
        label = {"none": "none (baseline)", "all": "all (default run)",
                 "previous": "previous default (2026-12-02)"}.get(variant, variant)
        overhead = "-" if variant == "none" else f"{s - t0:+.2f} s"
        lines.append(f"| {label} | {', '.join(b['extra_info']['schedules'])} | {s:.2f} | {s / t0:.2f} | {overhead} |")
    if "previous" in by_variant and "all" in by_variant:
        prev, now = by_variant["previous"]["stats"][stat], by_variant["all"]["stats"][stat]
        lines += ["", f"The default run against the previous default: {now / prev:.2f}x ({(now / prev - 1) * 100:+.0f} %)."]
    if any(b["stats"][stat] < t0 for b in by_variant.values()):
        lines += ["", "A negative overhead is run-to-run noise, not a saving."]
    return lines


def static_table(benchmarks: list[dict], stat: str) -> list[str]:
    lines = ["**Static aliasing check alone** (plain Python, no kernels):", "",
             "| what | time per call | rounds | findings |", "|---|---|---|---|"]
    for b in benchmarks:
        info = b["extra_info"]
        findings = info.get("findings", "-")
        lines.append(f"| {info.get('what', b['name'])} | {_seconds(b['stats'][stat])} | {b['stats']['rounds']} | {findings} |")
    return lines


def peer_table(benchmarks: list[dict], stat: str) -> list[str]:
    """bench/bench_peer_cost.py: each peer's check against the shipped implementation's on the same config."""
    shipped = {(b["extra_info"]["config"]["quant"], b["extra_info"]["config"]["fused"]): b["stats"][stat]
               for b in benchmarks if b["extra_info"]["impl"] == DEFAULT_IMPLEMENTATION_NAME}
    first = benchmarks[0]["extra_info"]
    cfg = first["config"]
    lines = [
        f"**Peer check cost** ({_backend_label(first['backend'])}; T={cfg['num_tokens']} E={cfg['num_experts']} "
        f"K={cfg['topk']} H={cfg['hidden']} I={cfg['inter']}, every oracle, default schedules; {stat} of "
        f"{benchmarks[0]['stats']['rounds']} round(s)):",
        "",
        "| config | implementation | seconds | x shipped | bound |",
        "|---|---|---|---|---|",
    ]
    for b in benchmarks:
        info, s = b["extra_info"], b["stats"][stat]
        key = (info["config"]["quant"], info["config"]["fused"])
        label = f"{key[0]} {'fused' if key[1] else 'unfused'}"
        if info["impl"] == DEFAULT_IMPLEMENTATION_NAME:
            lines.append(f"| {label} | optimized | {s:.2f} | 1.00 | - |")
        elif key in shipped:
            ratio = s / shipped[key]
            verdict = "within" if ratio <= PEER_COST_BOUND else "OVER"
            lines.append(f"| {label} | {info['impl']} | {s:.2f} | {ratio:.2f} | {verdict} {PEER_COST_BOUND:g}x |")
        else:
            lines.append(f"| {label} | {info['impl']} | {s:.2f} | (no shipped run) | - |")
    return lines


def _short_config(c: dict) -> str:
    return (f"T={c['num_tokens']} E={c['num_experts']} K={c['topk']} H={c['hidden']} I={c['inter']} {c['quant']} "
            f"{'fused' if c['fused'] else 'unfused'} planner={c['planner']} output={c['output']}")


def fuzz_table(benchmarks: list[dict], stat: str) -> list[str]:
    lines = []
    for b in sorted(benchmarks, key=lambda b: b["extra_info"].get("planner", "")):
        info = b["extra_info"]
        label = _backend_label(info["backend"])
        if info.get("planner") == "fixed":
            eps = info["examples"] / info["seconds"] if info.get("seconds") else float("nan")
            lines += [
                f"**Fuzzing, fixed planner** ({label}): `fuzz(max_examples={info['max_examples']}, seed={info['seed']}, "
                f"planner=\"fixed\")`: {info['examples']} examples in {info['seconds']:.1f} s = "
                f"**{eps:.3g} examples/s**, {'no finding' if info['passed'] else 'a finding (see the JSON)'}.",
                "",
            ]
        elif info.get("planner") == "legacy":
            if not info.get("found"):
                lines += [f"**Fuzzing, legacy planner** ({label}): no failure in {info['examples']} examples.", ""]
                continue
            lines += [
                f"**Fuzzing, legacy planner** ({label}), as `diffmoe fuzz --planner legacy --seed {info['seed']}`:",
                "",
                "| phase | examples | seconds |",
                "|---|---|---|",
                f"| to the first failing config | {info['generate_examples']} | {info['seconds_to_first_failure']:.1f} |",
                f"| shrinking | {info['shrink_examples']} | {info['seconds_shrinking']:.1f} |",
                f"| total | {info['examples']} | {info['seconds']:.1f} |",
                "",
                f"Minimal config: {_short_config(info['minimal_config'])}; caught by "
                f"{', '.join(info.get('finding_oracles', []))}.",
                "",
            ]
    return lines


def render(data: dict, stat: str) -> str:
    parts = split(data)
    lines = [*_header(data, stat), ""]
    if parts.get("throughput"):
        lines += ["## Throughput", "", *throughput_tables(parts["throughput"], stat)]
    if parts.get("oracle overhead"):
        lines += ["## Oracle overhead", "", *oracle_table(parts["oracle overhead"], stat), ""]
    if parts.get("static aliasing"):
        lines += [*static_table(parts["static aliasing"], stat), ""]
    if parts.get("fuzz"):
        lines += ["## Fuzzing", "", *fuzz_table(parts["fuzz"], stat)]
    if parts.get("peer cost"):
        lines += ["## Peer check cost", "", *peer_table(parts["peer cost"], stat), ""]
    return "\n".join(lines).rstrip() + "\n"


def plot(data: dict, stat: str, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series: dict[tuple, dict[str, list[tuple[int, float]]]] = defaultdict(lambda: defaultdict(list))
    for b in split(data).get("throughput", []):
        info = b["extra_info"]
        t = info["tokens"]
        series[(info["backend"], info.get("shape", "?"), info["quant"])][_variant(b)].append((t, t / b["stats"][stat]))
    if not series:
        raise SystemExit("no throughput benchmarks in this JSON: nothing to plot")
    keys = sorted(series, key=lambda k: (k[0], k[1], QUANT_SCHEMES.index(k[2]) if k[2] in QUANT_SCHEMES else 99))
    cols = min(4, len(keys))
    rows = (len(keys) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 3.4 * rows), squeeze=False)
    for ax, key in zip(axes.flat, keys):
        backend, shape, quant = key
        for variant in VARIANT_ORDER:
            points = sorted(series[key].get(variant, []))
            if points:
                ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=variant)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("T (tokens)")
        ax.set_ylabel("tokens/s")
        ax.set_title(f"{quant}, {shape}\n{_backend_label(backend)}", fontsize=8)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(keys):]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json", help="pytest-benchmark JSON (from --benchmark-json)")
    parser.add_argument("--png", metavar="FILE", help="plot tokens/s against T per provider")
    parser.add_argument("--write", metavar="FILE", help="replace the bench section of this file")
    parser.add_argument("--stat", choices=STATS, default="median", help="statistic of the rounds (default median)")
    args = parser.parse_args(argv)
    try:
        with open(args.json, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, json.JSONDecodeError) as exc:
        print(f"error: cannot read {args.json}: {exc}", file=sys.stderr)
        return 1
    text = render(data, args.stat)
    print(text)
    if args.png:
        plot(data, args.stat, args.png)
        print(f"wrote {args.png}")
    if args.write:
        return write_section(args.write, text, MARK_START, MARK_END)
    return 0


if __name__ == "__main__":
    sys.exit(main())
