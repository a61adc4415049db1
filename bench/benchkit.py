"""Helpers shared by the benchmark suites and the report scripts (no pytest in here).

* the backend a run measures: "cuda" (compiled Triton kernels) or "interpreter"
  (TRITON_INTERPRET=1 on a CPU-only machine, where a time says nothing about kernel speed);
* the FLOP and byte model of one MoE call and the H200 roofline it is compared with;
* problems for a sweep over T that share one set of weights.

Importing this module turns the interpreter on when no GPU is present, before anything
imports Triton (Triton reads the switch when a kernel is decorated).
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from diffmoe.problem.config import MoEConfig  # noqa: E402
from diffmoe.problem.inputs import Problem, make_problem  # noqa: E402
from diffmoe.problem.vocabulary import weight_scale_shape  # noqa: E402

BACKEND_CUDA = "cuda"
BACKEND_INTERPRETER = "interpreter"
INTERPRETER_LABEL = "interpreter, not kernel speed"

# NVIDIA H200 SXM datasheet figures (dense, i.e. without 2:4 sparsity; the datasheet's headline
# tensor-core numbers are the sparse ones, twice these). They are peaks, not measurements: the
# roofline fractions below say how far a measured call is from them.
H200_DENSE_FP8_TFLOPS = 1979.0  # FP8 tensor core, dense
H200_DENSE_BF16_TFLOPS = 989.5  # BF16 tensor core, dense
H200_HBM3E_TBPS = 4.8  # HBM3e bandwidth, TB/s

# Issue 11: a peer's check at T=8 E=4 K=2 H=I=128 costs at most this many times the shipped
# implementation's check of the same config (bench/bench_peer_cost.py, bench/report_tables.py).
PEER_COST_BOUND = 3.0


def interpreter_on() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def current_backend() -> str:
    """What the optimized kernels run on in this process (mirrors optimized.backend)."""
    return BACKEND_CUDA if torch.cuda.is_available() and not interpreter_on() else BACKEND_INTERPRETER


def grid_name(option: str | None) -> str:
    """The throughput grid: the --moe-grid option, else "full" on CUDA and "small" on the interpreter."""
    return option or ("full" if current_backend() == BACKEND_CUDA else "small")


def bench_device() -> torch.device:
    # With an explicit index: tensors report cuda:0, and torch.device("cuda") != torch.device("cuda:0"),
    # so an implementation built for "cuda" would reject its own problem's tensors.
    if current_backend() == BACKEND_CUDA:
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def synchronize(device: torch.device) -> None:
    """Wait for queued kernels: a CUDA launch returns before the kernel ends."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ---- FLOP and byte model ----------------------------------------------------------------


def moe_flops(config: MoEConfig, routed_rows: int | None = None) -> int:
    """FLOPs of the two expert GEMMs: 2*TK*H*2I (gate-up) + 2*TK*I*H (down).

    routed_rows: rows that really reach a local expert (TK without an expert map). The
    activation, quantisation and reduce stages are O(TK*(H+I)) and left out, as usual.
    """
    tk = config.routed_rows if routed_rows is None else routed_rows
    h, i = config.hidden, config.inter
    return 2 * tk * h * (2 * i) + 2 * tk * i * h


def moe_bytes(config: MoEConfig, active_experts: int) -> int:
    """Compulsory HBM traffic of one call: the weights of the experts that receive a token
    (codes and their scales), the hidden states and routing in, the output out.

    Intermediates are left out on purpose: this is the traffic any implementation must move,
    so bytes / time is the effective bandwidth a roofline compares with the HBM peak.
    """
    t, k, h, i = config.num_tokens, config.topk, config.hidden, config.inter
    weight_elem = 1 if config.is_fp8 else 2  # fp8 codes or bf16
    per_expert = (2 * i * h + h * i) * weight_elem
    if config.is_fp8:  # fp32 scales of one expert's w1 and w2
        per_expert += 4 * (math.prod(weight_scale_shape(config, 1, 2 * i, h)) + math.prod(weight_scale_shape(config, 1, h, i)))
    activations_in = t * h * 2 + t * k * (4 + 4)  # bf16 hidden states, int32 ids, fp32 weights
    activations_out = t * h * 2  # bf16 output
    return active_experts * per_expert + activations_in + activations_out


def peak_tflops(config: MoEConfig) -> float:
    return H200_DENSE_FP8_TFLOPS if config.is_fp8 else H200_DENSE_BF16_TFLOPS


def roofline(config: MoEConfig, seconds: float, *, active_experts: int, routed_rows: int | None = None) -> dict:
    """Achieved TFLOP/s and GB/s of one call taking `seconds`, and its fraction of the H200
    roofline (attainable = min(peak compute, arithmetic intensity * peak bandwidth))."""
    flops = moe_flops(config, routed_rows)
    nbytes = moe_bytes(config, active_experts)
    intensity = flops / nbytes  # FLOP per byte
    attainable = min(peak_tflops(config), intensity * H200_HBM3E_TBPS)  # TFLOP/s
    achieved = flops / seconds / 1e12
    return {
        "flops": flops,
        "bytes": nbytes,
        "arithmetic_intensity": round(intensity, 3),
        "tflops": round(achieved, 3),
        "gbps": round(nbytes / seconds / 1e9, 3),
        "peak_tflops": peak_tflops(config),
        "peak_tbps": H200_HBM3E_TBPS,
        "attainable_tflops": round(attainable, 3),
        "roofline_fraction": round(achieved / attainable, 4),
        "bound": "memory" if intensity * H200_HBM3E_TBPS < peak_tflops(config) else "compute",
    }


def routing_stats(problem: Problem) -> tuple[int, int]:
    """(active local experts, routed rows that reach a local expert) of a problem."""
    ids = problem.topk_ids.long().flatten()
    if problem.expert_map is not None:
        ids = problem.expert_map.long()[ids]
    local = ids[ids >= 0]
    return int(torch.unique(local).numel()), int(local.numel())


# ---- problems for a T sweep ---------------------------------------------------------------


class ProblemCache:
    """Problems of one (shape, scheme) for several T, drawn once at the largest T.

    The weights dominate generation time (at GPU sizes, minutes on a CPU for a full sweep),
    so a sweep draws the problem once for the largest T and gives smaller T the first T rows
    of its hidden states and routing: every T sees the same weights. Only the latest problem is
    kept, so GPU memory holds one set of weights at a time (sweeps are ordered by shape).
    """

    def __init__(self, device: torch.device):
        self.device = device
        self._key: MoEConfig | None = None
        self._problem: Problem | None = None

    def get(self, config: MoEConfig, max_tokens: int) -> Problem:
        if config.num_tokens > max_tokens:
            raise ValueError(f"num_tokens must be at most max_tokens={max_tokens}, got {config.num_tokens}")
        # fused and planner do not change the inputs; the config the problem carries must still
        # match the implementation's, so it is replaced below.
        key = config.replace(num_tokens=max_tokens, fused=False, planner="fixed")
        if key != self._key:
            self._problem = None
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
            self._problem = make_problem(key, self.device)
            self._key = key
        big = self._problem
        t = config.num_tokens
        return dataclasses.replace(
            big,
            config=config,
            hidden_states=big.hidden_states[:t],
            topk_ids=big.topk_ids[:t],
            topk_weights=big.topk_weights[:t],
        )


# ---- docs/ sections ---------------------------------------------------------------------------


EXIT_MARKERS = 2  # exit code of a script asked to --write into a file without its markers


def write_section(path: str, text: str, start: str, end: str) -> int:
    """Put `text` between the markers in `path`; an exit code (0, 1 unreadable, 2 no markers)."""
    try:
        found = replace_between_markers(path, text, start, end)
    except OSError as exc:
        print(f"error: cannot update {path}: {exc}", file=sys.stderr)
        return 1
    if not found:
        print(f"error: {path} has no {start} ... {end} section", file=sys.stderr)
        return EXIT_MARKERS
    print(f"updated {path}")
    return 0


def replace_between_markers(path: str, text: str, start: str, end: str) -> bool:
    """Replace what lies between the markers in `path`; False when they are missing."""
    with open(path, encoding="utf-8") as fh:
        content = fh.read()
    a, b = content.find(start), content.find(end)
    if a < 0 or b < 0 or b < a:
        return False
    new = content[: a + len(start)] + "\n" + text.rstrip("\n") + "\n" + content[b:]
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(new)
    return True


# A default check of a small fused fp8-token config: what the watch benchmarks (bench_store_watch.py,
# bench_overflow_watch.py) time with their watch on and off.
WATCH_CONFIG = MoEConfig(num_tokens=16, num_experts=8, topk=2, hidden=128, inter=128, quant="fp8-token", fused=True,
                         output="separate", seed=0)


def time_a_default_check(benchmark, device: torch.device, group: str, side: str, config: MoEConfig = WATCH_CONFIG) -> None:
    """Time one default check (every default oracle and schedule) in the judge's process, 7
    rounds after a first call that pays the interpreter's first-call costs."""
    from diffmoe.judge.runner import DEFAULT_INTERPRETER_TIME_LIMIT, run_differential

    def check():
        return run_differential(config, device=device, isolation="none", time_limit=DEFAULT_INTERPRETER_TIME_LIMIT)

    report = check()
    assert report.passed, report.render()
    benchmark.group = group
    benchmark.pedantic(check, rounds=7, iterations=1)
    benchmark.extra_info.update({"side": side, "config": config.to_dict()})
