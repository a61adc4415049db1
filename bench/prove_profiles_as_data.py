"""Prove the profiles-as-data reference bit-identical to the per-profile modules it replaced.

Before issue 27 the reference's numerics profiles were code: reference/numerics.py (vllm),
numerics_liger.py and numerics_lmdeploy.py, dispatched by profile name in reference/moe.py. Now
every profile is data (diffmoe.problem.numerics) over one function per rounding-point choice
(reference/rounding/). This script loads the old modules from a git revision into a temporary
package and, for each built-in profile, over every labelled edge case (diffmoe.problem.edge_cases)
of each scheme the profile describes (fused and unfused) and a few hundred configs drawn by the
fuzzing strategy (diffmoe.fuzz.strategies.moe_configs, derandomized), compares bitwise (the raw
bits: a NaN's sign and payload count):

  * every output and reported intermediate of reference_moe;
  * every reference_stage result, on the old chain's own buffers and on another profile's (the
    diffmoe chain's, or vllm's for diffmoe), as the teacher-forcing and differential oracles feed it;
  * gemm_exact of both GEMM stages on the same inputs.

Two behaviours changed on purpose; configs that meet them are counted apart (`deliberate`), never
as mismatches of the conversion:
  * a profile weighing the router weight in the reduce (liger, lmdeploy) with router_weight='input'
    weighed it twice (on the input, then in the reduce); it now weighs it once, on the input;
  * the liger profile with a fused FP8 config quantised diffmoe's activation of the bf16 gate/up
    output in the fused stage, and its own activation of the float32 product unfused; the fused
    stage now quantises the activation the unfused chain computes (the metamorphic invariant).

    python bench/prove_profiles_as_data.py [--old REV] [--examples N] [--write docs/numerics.md]

--old defaults to the parent of the conversion (the commit adding reference/rounding/points.py). Exit 0 when every comparison
outside the deliberate changes is bit-identical, 1 otherwise. With --write it replaces the text
between `<!-- profiles-as-data:start -->` and `<!-- profiles-as-data:end -->` in the given file.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from benchkit import write_section
from diffmoe.fuzz.strategies import moe_configs
from diffmoe.problem.config import QUANT_SCHEMES, MoEConfig
from diffmoe.problem.edge_cases import edge_cases
from diffmoe.problem.inputs import make_problem
from diffmoe.problem.vocabulary import Stages, pipeline_stages

import reference.moe as new

ROOT = Path(__file__).resolve().parents[1]
OLD_FILES = ("moe.py", "numerics.py", "numerics_liger.py", "numerics_lmdeploy.py")
# The schemes each profile describes: lmdeploy's is fp8-block only (the config refuses others).
PROFILE_SCHEMES = {"diffmoe": QUANT_SCHEMES, "vllm": QUANT_SCHEMES, "liger": QUANT_SCHEMES, "lmdeploy": ("fp8-block",)}
DEFAULT_EXAMPLES = 200  # strategy-drawn configs per profile
START, END = "<!-- profiles-as-data:start -->", "<!-- profiles-as-data:end -->"


def deliberate(config: MoEConfig, what: str) -> str | None:
    """Which deliberate change (module docstring) the comparison `what` of this config meets, or None."""
    if config.numerics in ("liger", "lmdeploy") and config.router_weight == "input":
        return "router weight on the input, weighed again in the reduce"
    if config.numerics == "liger" and config.is_fp8 and (
            what.startswith(Stages.ACT_QUANT) or (config.fused and what.startswith("reference_moe"))):
        return "liger's fused stage quantised diffmoe's activation"
    return None


def old_revision() -> str:
    """The last revision of the per-profile modules: the parent of the commit that added
    reference/rounding/points.py (the conversion)."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, check=True, capture_output=True, text=True).stdout.strip()

    added = git("log", "--diff-filter=A", "--reverse", "--format=%H", "--", "reference/rounding/points.py").split()
    if not added:
        raise SystemExit("reference/rounding/points.py is not committed yet: pass --old REV")
    return git("rev-parse", f"{added[0]}^")


def load_old(revision: str, into: Path):
    """The old reference/moe.py and its profile modules of `revision`, as package old_reference."""
    package = into / "old_reference"
    package.mkdir()
    (package / "__init__.py").write_text("")
    for name in OLD_FILES:
        text = subprocess.run(["git", "show", f"{revision}:reference/{name}"], cwd=ROOT, check=True,
                              capture_output=True, text=True).stdout
        (package / name).write_text(text)
    sys.path.insert(0, str(into))
    return importlib.import_module("old_reference.moe")


def drawn(n: int, quants: tuple[str, ...]) -> list[MoEConfig]:
    """n configs of the fuzzing strategy (every opt-in input and feature), the same on every run."""
    from hypothesis import HealthCheck, Phase, given, settings

    found: list[MoEConfig] = []

    @settings(max_examples=n, derandomize=True, database=None, phases=[Phase.generate], deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(moe_configs(quant=quants, features=True, planner=None))
    def collect(config):
        found.append(config)

    collect()
    return found


@dataclass
class Tally:
    configs: int = 0
    skipped: int = 0  # configs the profile cannot describe (the config refuses them)
    tensors: int = 0
    elements: int = 0
    mismatches: int = 0
    deliberate_configs: int = 0
    deliberate_mismatches: int = 0
    first: list[str] = field(default_factory=list)


def bits(t: torch.Tensor) -> torch.Tensor:
    ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    return t.contiguous().view(ints[t.element_size()]) if t.is_floating_point() else t


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(bits(a), bits(b))


def chain(module, problem) -> dict[str, torch.Tensor]:
    """Every buffer of the unfused chain, stage by stage, by `module`'s reference_stage."""
    buffers: dict[str, torch.Tensor] = {}
    for spec in pipeline_stages(problem.config.replace(fused=False)):
        buffers.update(module.reference_stage(spec.name, buffers, problem))
    return buffers


def _stage(module, stage: str, inputs: dict, problem):
    """reference_stage's outputs, or the exception it raised (a stage that cannot run on these inputs)."""
    try:
        return module.reference_stage(stage, inputs, problem)
    except Exception as exc:  # noqa: BLE001 - compared with the other side's
        return exc


def compare_config(config: MoEConfig, other: str, old, tally: Tally, num_tokens: int | None = None) -> None:
    problem = make_problem(config, num_tokens=num_tokens)
    pairs: list[tuple[str, torch.Tensor, torch.Tensor]] = []
    old_run, new_run = old.reference_moe(problem), new.reference_moe(problem)
    pairs.append(("reference_moe output", old_run.output, new_run.output))
    pairs += [(f"reference_moe {n}", old_run.intermediates[n], new_run.intermediates.get(n, torch.empty(0)))
              for n in old_run.intermediates]
    stages = [s.name for s in pipeline_stages(config.replace(fused=False))]
    if config.is_fp8:
        stages.append(Stages.ACT_QUANT)
    other_problem = make_problem(config.replace(numerics=other), num_tokens=num_tokens)
    for label, buffers in (("own", chain(old, problem)), (other, chain(old, other_problem))):
        for stage in stages:
            reads = next((s.reads for s in pipeline_stages(config.replace(fused=stage == Stages.ACT_QUANT))
                          if s.name == stage), ())
            inputs = {n: buffers[n] for n in reads if n in buffers} if label != "own" else dict(buffers)
            got_old, got_new = _stage(old, stage, inputs, problem), _stage(new, stage, inputs, problem)
            if isinstance(got_old, Exception) or isinstance(got_new, Exception):  # both refuse the same way, or differ
                agree = type(got_old) is type(got_new)
                pairs.append((f"{stage} on {label} buffers raises {got_old!r} / {got_new!r}", torch.tensor(0),
                              torch.tensor(0 if agree else 1)))
                continue
            pairs += [(f"{stage} on {label} buffers: {n}", got_old[n], got_new.get(n, torch.empty(0))) for n in got_old]
        for stage in (Stages.GATE_UP_GEMM, Stages.DOWN_GEMM):
            for part, a, b in zip(("exact", "magnitude"), old.gemm_exact(stage, buffers, problem)[:2],
                                  new.gemm_exact(stage, buffers, problem)[:2]):
                pairs.append((f"gemm_exact {stage} {part} on {label} buffers", a, b))
    tally.configs += 1
    tally.deliberate_configs += any(deliberate(config, what) and not same(a, b) for what, a, b in pairs)
    for what, a, b in pairs:
        tally.tensors += 1
        tally.elements += a.numel()
        if not same(a, b):
            if deliberate(config, what):
                tally.deliberate_mismatches += 1
                continue
            tally.mismatches += 1
            if len(tally.first) < 10:
                tally.first.append(f"{config.short()} numerics={config.numerics} tokens={num_tokens}: {what}")


def prove(revision: str, examples: int) -> tuple[dict[str, Tally], float]:
    started = time.perf_counter()
    tallies: dict[str, Tally] = {}
    with tempfile.TemporaryDirectory() as tmp:
        old = load_old(revision, Path(tmp))
        for profile, schemes in PROFILE_SCHEMES.items():
            tally = tallies[profile] = Tally()
            other = "vllm" if profile == "diffmoe" else "diffmoe"
            configs: list[tuple[MoEConfig, int | None]] = []
            for quant in schemes:
                for fused in ((False,) if quant == "bf16" else (False, True)):
                    cases = list(edge_cases(quant, fused=fused).values())
                    configs += [(c, None) for c in cases] + [(cases[0], 0)]  # and a zero-token call
            configs += [(c, None) for c in drawn(examples, schemes)]
            for config, tokens in configs:
                try:
                    config = config.replace(numerics=profile)
                except ValueError:  # a config this profile cannot describe (swiglu_limit without a clamp)
                    tally.skipped += 1
                    continue
                compare_config(config, other, old, tally, tokens)
            print(f"{profile}: {tally.configs} configs ({tally.skipped} skipped), {tally.tensors} tensors, "
                  f"{tally.elements} elements, {tally.mismatches} mismatches; deliberate: {tally.deliberate_configs} "
                  f"configs, {tally.deliberate_mismatches} tensors differ", flush=True)
            for line in tally.first:
                print("  MISMATCH", line)
    return tallies, time.perf_counter() - started


def section(tallies: dict[str, Tally], revision: str, examples: int, seconds: float) -> str:
    rows = ["| profile | configs | skipped | tensors compared | elements | mismatches | deliberate changes: configs, tensors differing |",
            "|---|---|---|---|---|---|---|"]
    for name, t in tallies.items():
        rows.append(f"| `{name}` | {t.configs} | {t.skipped} | {t.tensors} | {t.elements:,} | {t.mismatches} | "
                    f"{t.deliberate_configs}, {t.deliberate_mismatches} |")
    return (f"Measured {datetime.date.today().isoformat()} in {seconds:.0f} s against the old modules of revision "
            f"`{revision[:12]}` (`python bench/prove_profiles_as_data.py --examples {examples}`): for each profile, the "
            f"labelled edge cases of every scheme it describes (fused and unfused, and a zero-token call each) and "
            f"{examples} strategy-drawn configs; skipped: configs the profile cannot describe (a SwiGLU limit without a "
            f"clamp).\n\n" + "\n".join(rows) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", metavar="REV", help="the git revision holding the old modules (default: the last one)")
    parser.add_argument("--examples", type=int, default=DEFAULT_EXAMPLES, help="strategy-drawn configs per profile")
    parser.add_argument("--write", metavar="docs/numerics.md", help="replace the profiles-as-data section of this file")
    args = parser.parse_args(argv)
    revision = args.old or old_revision()
    tallies, seconds = prove(revision, args.examples)
    text = section(tallies, revision, args.examples, seconds)
    print(text)
    failed = any(t.mismatches for t in tallies.values())
    if args.write and not failed:
        status = write_section(args.write, text, START, END)
        if status:
            return status
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
