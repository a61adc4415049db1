"""The false-alarm campaign (diffmoe/fuzz/campaign.py): sampled serving configs plus the per-axis
corners, every oracle, the shipped implementation with the fixed planner. Every finding is a
false alarm; the exit status is 1 if there is any.

    .venv/bin/python bench/false_alarm_campaign.py --configs 300 --seed 0 --workers 2 --json-out CAMPAIGN.json
    .venv/bin/python bench/false_alarm_campaign.py --impl vllm --configs 300 --workers 2   # a peer: the configs it runs
    .venv/bin/python bench/false_alarm_campaign.py --configs 3000 --workers 64 --cluster auto   # a Ray cluster's nodes
    .venv/bin/python bench/false_alarm_campaign.py --model glm-4.5 --ep 0/160 --configs 20   # one model's shape

One line per config as it finishes (index, seconds, PASS or the findings and a replay
command), then a summary: configs run, false alarms, wall time, and how far each axis of the
profile was covered. Progress (configs done, rate, time left) goes to stderr: a bar on a
terminal, a line per config otherwise (diffmoe/cluster/progress.py). A reduced campaign runs
in the test suite (tests/fuzz/test_false_alarm_campaign.py).

Each config is a task of diffmoe/cluster/tasks.py (campaign.check_config): `--workers 1` runs them
here in order; `--workers N` (`--jobs N`, its older name) runs N at a time as Ray tasks on `--cluster`
(a local Ray runtime by default), the lines printed as configs finish and the JSON in the configs'
order. Ctrl-C cancels the checks under way, prints the summary of the ones finished and exits 130.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from diffmoe.cluster.tasks import Task, checked_cluster, run_tasks  # noqa: E402
from diffmoe.fuzz.campaign import (DEFAULT_COST_CAP, CampaignCheck, CampaignResult, check_config, corner_configs, model_configs,  # noqa: E402
                                   cost_units, sampled_configs)
from diffmoe.cluster.progress import Progress  # noqa: E402
from diffmoe.problem.config import MoEConfig  # noqa: E402


# --impl: the implementation judged, (factory, spec) (None: the shipped one); each task loads the spec itself
_IMPLEMENTATION: tuple = (None, None)
_one = check_config  # the task each config is (a name the tests replace)
# how many profile draws are looked through for `--configs` an implementation runs (Liger runs
# bf16 only, lmdeploy fp8-block unfused with a separate output: at cost cap 40, 124 of 2400 draws)
DRAWS_PER_CONFIG = 32


def runs(factory, config: MoEConfig) -> bool:
    """Whether the implementation runs `config` (its `supports`, under the profile it declares)."""
    from diffmoe.contract import factory_numerics, unsupported

    try:
        return unsupported(factory, config.replace(numerics=factory_numerics(factory))) is None
    except ValueError:  # a config its numerics profile cannot describe
        return False


def campaign_configs(count: int, seed: int, cost_cap: int, corners: bool, factory=None) -> list[MoEConfig]:
    """The sampled configs (the first `count` the implementation runs, from the profile's seeded
    stream: the same list for the same arguments) and the corners it runs."""
    if factory is None:
        return sampled_configs(count, seed, cost_cap) + (corner_configs() if corners else [])
    sampled = [c for c in sampled_configs(count * DRAWS_PER_CONFIG, seed, cost_cap) if runs(factory, c)][:count]
    return sampled + ([c for c in corner_configs() if runs(factory, c)] if corners else [])


def _coverage(configs: list[MoEConfig]) -> dict:
    return {
        "max_T": max(c.num_tokens for c in configs), "max_E": max(c.num_experts for c in configs),
        "max_K": max(c.topk for c in configs), "max_H": max(c.hidden for c in configs),
        "max_I": max(c.inter for c in configs),
        "schemes": sorted({c.quant for c in configs}),
        "fused": sum(c.fused for c in configs), "output_workspace": sum(c.output == "workspace" for c in configs),
        "below_maximum": sum(c.call_tokens is not None for c in configs),
        "special_rows": sum(c.special_rows > 0 for c in configs),
        "expert_scale_spread": sum(c.expert_scale_spread > 0 for c in configs),
        "softmax_topk": sum(c.router == "softmax-topk" for c in configs),
        "expert_map": sum(c.expert_map is not None for c in configs),
        "tie_heavy": sum(c.tie_heavy for c in configs),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--configs", type=int, default=300, help="sampled configs (default 300)")
    p.add_argument("--seed", type=int, default=0, help="campaign seed (default 0)")
    p.add_argument("--cost-cap", type=int, default=DEFAULT_COST_CAP, help=f"cost units per config (default {DEFAULT_COST_CAP})")
    p.add_argument("--no-corners", action="store_true", help="skip the per-axis corner configs")
    p.add_argument("--workers", "--jobs", type=int, default=1, dest="workers",
                   help="configs judged at a time, as Ray tasks when over 1 (default 1: in this process)")
    p.add_argument("--cluster", metavar="local|auto|ray://HOST:PORT",
                   help="where --workers N > 1 runs: local (a Ray runtime started here, the default), auto, ray://HOST:PORT")
    p.add_argument("--json-out", metavar="FILE", help="write every result as JSON")
    p.add_argument("--impl", metavar="SPEC", help="implementation to judge, as diffmoe check --impl (default: the shipped one); "
                                                  "only the configs it runs are drawn")
    p.add_argument("--model", metavar="NAME", help="every config at a real model's shape (diffmoe models lists them): the "
                                                   "profile's other draws kept, no cost cap, no corners")
    p.add_argument("--ep", metavar="RANK/SIZE", help="with --model: rank RANK of SIZE's expert map (diffmoe check --ep)")
    args = p.parse_args(argv)
    global _IMPLEMENTATION
    try:
        if args.impl:
            from diffmoe.frontends.cli import UsageError, load_implementation

            try:
                _IMPLEMENTATION = load_implementation(args.impl)
            except UsageError as exc:
                raise ValueError(str(exc)) from None
        if args.model is not None:
            from diffmoe.frontends.model_flags import check_fields

            shape = check_fields(args, {}, {})
            configs = [c for c in model_configs(args.configs * (DRAWS_PER_CONFIG if _IMPLEMENTATION[0] else 1), args.seed, shape)
                       if _IMPLEMENTATION[0] is None or runs(_IMPLEMENTATION[0], c)][:args.configs]
        elif args.ep is not None:
            raise ValueError("--ep needs --model")
        else:
            configs = campaign_configs(args.configs, args.seed, args.cost_cap, not args.no_corners, _IMPLEMENTATION[0])
    except (TypeError, ValueError) as exc:
        print(f"false_alarm_campaign: {exc}", file=sys.stderr)
        return 2
    try:  # before any config and before the progress starts
        checked_cluster(args.cluster, args.workers)
    except ValueError as exc:
        print(f"false_alarm_campaign: {exc}", file=sys.stderr)
        return 2
    start = time.perf_counter()
    done: dict[int, CampaignResult] = {}
    alarms_so_far = 0
    tasks = [Task(_one, CampaignCheck(c, args.impl), name=c.short()) for c in configs]
    # progress on stderr (a bar on a terminal, else a line per config); the results stay on stdout
    with Progress(sys.stderr, "false-alarm campaign", total=len(configs), unit="config") as progress:
        def on_result(index: int, result: CampaignResult) -> None:
            nonlocal alarms_so_far
            done[index] = result
            alarms_so_far += not result.passed
            status = "PASS" if result.passed else f"FALSE ALARM ({len(result.findings)} findings)"
            progress.write(f"[{len(done)}/{len(configs)}] {result.seconds:6.1f} s  {status}  {result.config.short()}  "
                           f"({cost_units(result.config)} units)", file=sys.stdout)
            for line in result.findings[:5]:
                progress.write(f"    {line[:300]}", file=sys.stdout)
            if result.findings:
                progress.write(f"    replay: {result.replay}", file=sys.stdout)
            progress.update(len(done), detail=f"{alarms_so_far} false alarm{'s' if alarms_so_far != 1 else ''}")

        try:
            from diffmoe.check.execution import default_device

            run = run_tasks(tasks, workers=args.workers, cluster=args.cluster, device=str(default_device()),
                            on_result=on_result)  # one GPU per check on CUDA
        except ValueError as exc:  # a --cluster that is not one, or cannot be reached: before any config
            print(f"false_alarm_campaign: {exc}", file=sys.stderr)
            return 2
    results = [done[i] for i in sorted(done)]
    wall = time.perf_counter() - start
    alarms = [r for r in results if not r.passed]
    summary = {
        "implementation": _IMPLEMENTATION[1] or "optimized",
        "configs": len(results), "sampled": args.configs,
        "corners": len(configs) - min(args.configs, len(configs)) if not args.no_corners else 0,
        "seed": args.seed, "cost_cap": args.cost_cap, "false_alarms": len(alarms), "wall_s": round(wall, 1),
        "workers": args.workers, "interrupted": run.interrupted,
        "check_s_total": round(sum(r.seconds for r in results), 1),
        "check_s_max": round(max((r.seconds for r in results), default=0.0), 1),
        "coverage": _coverage([r.config for r in results]) if results else {},
    }
    print(json.dumps(summary), flush=True)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({
            "summary": summary,
            "results": [{"config": r.config.to_dict(), "seconds": round(r.seconds, 2), "findings": r.findings,
                         "replay": r.replay} for r in results],
        }, indent=1))
    return 1 if alarms else 130 if run.interrupted else 0


if __name__ == "__main__":
    sys.exit(main())
