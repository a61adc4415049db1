"""Measure vLLM 0.33.0's kernel against the reference under both numerics profiles, stage by stage.

For each config, vLLM's kernel (peers/vllm/, from the peer cache) runs once with every
launch recorded; each stage of the reference then runs on vLLM's own inputs to that stage
(as the differential oracle does), under numerics "diffmoe" and "vllm", and the elements of
each buffer whose bits differ are counted (any NaN equals any NaN, as the compare holds). It
prints the per-stage table of docs/peers.md ("Testing vLLM's kernel").

    python bench/measure_numerics_profiles.py [--write docs/peers.md]

With --write it replaces the text between `<!-- numerics-profiles:start -->` and
`<!-- numerics-profiles:end -->` in the given file.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from benchkit import write_section  # noqa: E402
from diffmoe.tolerance.compare import ulp_distance  # noqa: E402
from diffmoe.problem.config import MoEConfig  # noqa: E402
from diffmoe.problem.inputs import make_problem  # noqa: E402
from diffmoe.problem.vocabulary import Stages  # noqa: E402
from peers.vllm import make  # noqa: E402
from reference.moe import reference_stage  # noqa: E402

SMALL = dict(num_tokens=8, num_experts=4, topk=2, hidden=128, inter=128)
CONFIGS = [  # (label, config): one per difference of the table, each the smallest that shows it
    ("fp8-token", MoEConfig(**SMALL, quant="fp8-token")),
    ("fp8-tensor", MoEConfig(**SMALL, quant="fp8-tensor")),
    ("fp8-block fused", MoEConfig(**SMALL, quant="fp8-block", fused=True)),
    ("bf16 K=3", MoEConfig(**{**SMALL, "topk": 3}, quant="bf16")),
    ("bf16 K=4", MoEConfig(**{**SMALL, "topk": 4}, quant="bf16")),
    ("fp8-token 1 NaN row", MoEConfig(**SMALL, quant="fp8-token", nan_rows=1)),
    ("fp8-block fused 1 NaN row", MoEConfig(**SMALL, quant="fp8-block", fused=True, nan_rows=1)),
    ("fp8-token 1 Inf row", MoEConfig(**SMALL, quant="fp8-token", inf_rows=1)),
    ("fp8-block fused 1 zero row", MoEConfig(**SMALL, quant="fp8-block", fused=True, zero_rows=1)),
    ("fp8-token K=1 input weight", MoEConfig(**{**SMALL, "topk": 1}, quant="fp8-token", router_weight="input",
                                             router="softmax-topk")),
]


class Recorder:
    """Every launch's reads (cloned before it runs) and writes (cloned after)."""

    def __init__(self):
        self.launches: list[tuple[str, dict, dict]] = []
        self._reads: dict = {}

    def before_launch(self, launch):
        self._reads = {n: v.clone() for n, v in launch.reads.items()}

    def after_launch(self, launch):
        self.launches.append((launch.stage, self._reads, {n: v.clone() for n, v in launch.writes.items()}))


def measure(config: MoEConfig) -> list[tuple[str, str, int, dict[str, int]]]:
    """(stage, buffer, elements, {profile: differing elements}) per buffer a launch wrote."""
    impl = make(config)
    problem = make_problem(config, impl.device)
    n1, n2 = impl.workspace_shapes()
    ws = (torch.zeros(n1, dtype=torch.uint8, device=impl.device), torch.zeros(n2, dtype=torch.uint8, device=impl.device))
    rec = Recorder()
    impl.run(problem, ws, output=torch.empty(config.num_tokens, config.hidden, dtype=torch.bfloat16, device=impl.device),
             recorder=rec)
    given = problem.inputs()
    rows = []
    for stage, reads, writes in rec.launches:
        if stage == Stages.ALIGN:
            continue
        inputs = {n: v for n, v in reads.items() if n not in given}
        differing = {}
        for profile in ("diffmoe", "vllm"):
            p = make_problem(config.replace(numerics=profile), impl.device)
            want = reference_stage(stage, inputs, p)
            for name, got in writes.items():
                d = ulp_distance(want[name].reshape(got.shape), got)
                differing.setdefault(name, {})[profile] = int((d != 0).sum())
        rows += [(stage, name, writes[name].numel(), differing[name]) for name in writes]
    return rows


def table() -> str:
    start = time.perf_counter()
    lines = ["| config | stage | buffer | differing under diffmoe | differing under vllm |", "|---|---|---|---|---|"]
    for label, config in CONFIGS:
        for stage, name, total, counts in measure(config):
            if counts["diffmoe"] or counts["vllm"]:
                lines.append(f"| {label} | {stage} | {name} | {counts['diffmoe']} of {total} | {counts['vllm']} of {total} |")
    seconds = time.perf_counter() - start
    head = (f"Measured in {seconds:.0f} s on the Triton interpreter (`python bench/measure_numerics_profiles.py`), "
            f"T=8 E=4 H=I=128 seed 0, K=2 unless named; every stage judged on vLLM's own inputs; rows where "
            f"both profiles give vLLM's bits exactly are left out.")
    return head + "\n\n" + "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", metavar="docs/peers.md", help="replace the numerics-profiles section of this file")
    args = parser.parse_args(argv)
    text = table()
    print(text)
    if args.write:
        return write_section(args.write, text, "<!-- numerics-profiles:start -->", "<!-- numerics-profiles:end -->")
    return 0


if __name__ == "__main__":
    sys.exit(main())
