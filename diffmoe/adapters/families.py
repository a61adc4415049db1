"""The fused_experts family without an adapter: a function with vLLM's or SGLang's `fused_experts`
signature, judged as it is (`--fn MODULE:FUNCTION --family vllm|sglang`, the `--impl` spec
`MODULE:FUNCTION@FAMILY`, `function_factory(fn, family)` in Python).

A family is how the function is called with a problem's tensors:

    vllm:    fn(hidden_states, w1, w2, topk_weights, topk_ids, use_fp8_w8a8=, per_channel_quant=,
                w1_scale=, w2_scale=, block_shape=)
    sglang:  fn(hidden_states, w1, w2, (topk_weights, topk_ids, None), moe_runner_config,
                use_fp8_w8a8=, per_channel_quant=, w1_scale=, w2_scale=, block_shape=)

with the scheme's flags (fp8-token: per-token activations and per-channel weights; fp8-block:
block_shape [128, 128]) and SGLang's runner config as a namespace of its defaults (silu, gated,
no routed scaling, every expert local, out of place). The function returns the [T, H] output.

The function allocates what it needs itself: the declared plan says so (no placement, 0 bytes
of ws1 and ws2). A plain function reports no launch, so what is judged is the output (the
differential at the reduce, the schedule, call-sequence and poison oracles on it). A function that
carries `active` (the thread-local slot its kernel proxies and stand-ins report to: the adapter
kit's ReportingKernel) runs under an automatic attribution (diffmoe.adapters.kit.attribution):
every launch is reported at its stage from the tensors it touches, and it is judged stage by stage
(examples/sglang_adapter.py; SGLang's function from its wheel, `--fn sglang==0.5.23:fused_experts`).
Under the Triton interpreter each launch's programs run in the schedule's order
(diffmoe.interpreter.grid_order).

Owns the families' calling conventions and the implementation a family function becomes. Must
not import an implementation (peers/, optimized/).
"""

from __future__ import annotations

import types
from typing import Callable

import torch

from diffmoe.contract import BATCH_INVARIANT, NUMERICS, PEER_WHEEL, resolve_factory
from diffmoe.problem.config import QUANT_BLOCK, MoEConfig

FAMILIES = ("vllm", "sglang")
SEPARATOR = "@"


def _quant_kwargs(config: MoEConfig, problem) -> dict:
    return dict(use_fp8_w8a8=config.is_fp8, per_channel_quant=config.quant == "fp8-token",
                w1_scale=problem.w1_scale, w2_scale=problem.w2_scale,
                block_shape=[QUANT_BLOCK, QUANT_BLOCK] if config.quant == "fp8-block" else None)


def _sglang_runner(config: MoEConfig):
    return types.SimpleNamespace(
        num_experts=config.num_experts, num_local_experts=config.num_experts, inplace=False, no_combine=False,
        activation="silu", is_gated=True, apply_router_weight_on_input=False, routed_scaling_factor=None,
        gemm1_alpha=None, gemm1_clamp_limit=None, swiglu_limit=None, gate_up_interleaved=True,
        no_combine_keep_router_weight=False)


def call(fn: Callable, family: str, config: MoEConfig, problem, ids: torch.Tensor | None = None) -> torch.Tensor:
    """`fn` called as `family` calls it on `problem` (module docstring), `ids` the int32 topk_ids."""
    ids = problem.topk_ids.to(torch.int32) if ids is None else ids
    if family == "vllm":
        return fn(problem.hidden_states, problem.w1, problem.w2, problem.topk_weights, ids, **_quant_kwargs(config, problem))
    if family == "sglang":
        return fn(problem.hidden_states, problem.w1, problem.w2, (problem.topk_weights, ids, None), _sglang_runner(config),
                  **_quant_kwargs(config, problem))
    raise ValueError(f"family must be one of {list(FAMILIES)}, got {family!r}")


def check_supported(config: MoEConfig) -> None:
    """What a family call cannot express: the fields the signature has no argument for."""
    for field, allowed in (("fused", False), ("router_weight", "down"), ("output", "separate"), ("expert_map", None),
                           ("activation", "silu")):
        if getattr(config, field) != allowed:
            raise ValueError(f"{field} must be {allowed!r} for a fused_experts family function: the signature has "
                             f"no argument for it, got {getattr(config, field)!r}")
    if config.routed_scaling_factor is not None:  # vLLM's fused_experts has no argument; SGLang's runner is not wired
        raise ValueError(f"routed_scaling_factor must be None for a fused_experts family function: the call passes "
                         f"none, got {config.routed_scaling_factor!r}")
    # Issue 49: a call that dropped these judged the function on a config it never ran. Per-tensor weights
    # beside per-token activations were passed as per_channel_quant=True (every expert scaled by expert 0's
    # scale in the function, a false alarm), and a SwiGLU limit was never passed.
    if config.swiglu_limit is not None:
        raise ValueError(f"swiglu_limit must be None for a fused_experts family function: the call passes no clamp, "
                         f"got {config.swiglu_limit!r}")
    if config.weight_scales is not None:  # act_scales is always the scheme's own (its quant names it)
        raise ValueError(f"weight_scales must be {config.quant}'s own for a fused_experts family function "
                         f"(per_channel_quant and block_shape express only the scheme's pair), got "
                         f"weight_scales={config.weight_scales!r}")


class FamilyFunction:
    """A fused_experts family function behind the plug-in contract (diffmoe.contract)."""

    orders_programs = True  # run() applies the schedule through diffmoe.interpreter.grid_order itself

    def __init__(self, fn: Callable, family: str, name: str, config: MoEConfig, device=None):
        from diffmoe.contract import default_device

        if family not in FAMILIES:
            raise ValueError(f"family must be one of {list(FAMILIES)}, got {family!r}")
        config.validate()
        check_supported(config)
        self.fn, self.family, self.name, self.config = fn, family, name, config
        # a function whose kernels report to `fn.active` (diffmoe.adapters.kit.ReportingKernel, stand-ins): each
        # launch attributed to its stage from the tensors it touches, `fn.buffer_names` naming the arguments
        # attribution cannot tell apart (diffmoe.adapters.kit.attribution)
        self.active = getattr(fn, "active", None)
        self.buffer_names = getattr(fn, "buffer_names", None)
        self.device = torch.device(device) if device is not None else default_device()
        self.max_tokens = config.num_tokens

    def workspace_plan(self, num_tokens: int):
        from diffmoe.contract import WorkspacePlan
        from diffmoe.problem.vocabulary import pipeline_stages

        return WorkspacePlan(planner=f"{self.name} (fresh allocations only)", buffer_list=(), placements=(),
                             stages=tuple(pipeline_stages(self.config)), workspace_bytes=(0, 0))

    def workspace_shapes(self, max_tokens: int | None = None) -> tuple[int, int]:
        return (0, 0)

    def run(self, problem, workspaces, *, output=None, schedule=None, recorder=None):
        from diffmoe.contract import RunResult, Schedule
        from diffmoe.interpreter import grid_order

        t, h = problem.num_tokens, self.config.hidden
        out = output if output is not None else torch.empty(t, h, dtype=torch.bfloat16, device=self.device)
        if t == 0:
            return RunResult(output=out)
        if self.active is None:
            with grid_order.program_order(schedule or Schedule()), torch.no_grad():
                result = call(self.fn, self.family, self.config, problem)
        else:
            result = self._attributed(problem, schedule, recorder)
        if not isinstance(result, torch.Tensor) or result.shape != (t, h):
            raise TypeError(f"{self.name} must return the [{t}, {h}] output, got "
                            f"{getattr(result, 'shape', type(result).__name__)}")
        out.copy_(result)
        return RunResult(output=out)

    def _attributed(self, problem, schedule, recorder) -> torch.Tensor:
        """The call with every launch attributed to its stage (diffmoe.adapters.kit.Attribution)."""
        from diffmoe.contract import Schedule, interpreter_enabled
        from diffmoe.adapters.kit import Attribution
        from diffmoe.interpreter import fast_path, fixes, grid_order

        if interpreter_enabled():  # a Triton function: the interpreter's exact casts and dots, as optimized/ runs
            from diffmoe.backend.conformance import gated_probe

            fast_path.install()
            fixes.install(probe=gated_probe)
        attribution = Attribution(self.config, problem, recorder, self.buffer_names)
        ids = attribution.name(problem.topk_ids.to(torch.int32), "topk_ids")
        self.active.reporter = attribution
        try:
            with grid_order.program_order(schedule or Schedule()), torch.no_grad():
                result = call(self.fn, self.family, self.config, problem, ids)
        finally:
            self.active.reporter = None
        return attribution.finish(result) if isinstance(result, torch.Tensor) else result


# What a function may carry for its factory, copied onto it (a peer wheel's function does, peers/sglang/core.py
# wheel_function): its numerics profile, the pinned wheel it runs from, whether it is batch-invariant; and
# `family` (the one signature it has: another is refused) and `supports` (its own refusals, after the family's)
CARRIED = (NUMERICS, PEER_WHEEL, BATCH_INVARIANT)


def function_factory(fn: Callable, family: str, name: str | None = None):
    """The factory of `fn` called as `family` calls it; `name` (default MODULE:FUNCTION@FAMILY) is what
    reports and replay lines call it. The factory carries what `fn` carries (CARRIED)."""
    if family not in FAMILIES:
        raise ValueError(f"--family must be one of {list(FAMILIES)}, got {family!r}")
    handle = resolve_factory(fn)  # a function carries a factory's attributes (CARRIED, `supports`)
    label = name or f"{handle.module or '?'}:{handle.qualname or '?'}{SEPARATOR}{family}"
    own_family = getattr(fn, "family", None)
    if own_family is not None and own_family != family:
        raise ValueError(f"--family must be {own_family!r} for {label}: the function has {own_family}'s "
                         f"fused_experts signature, got {family!r}")
    own_supports = handle.supports

    def make(config: MoEConfig, device=None) -> FamilyFunction:
        refused = own_supports(config) if own_supports is not None else None
        if refused is not None:
            raise ValueError(refused)
        return FamilyFunction(fn, family, label, config, device)

    def supports(config: MoEConfig) -> str | None:
        try:
            check_supported(config)
        except ValueError as exc:
            return str(exc)
        return own_supports(config) if own_supports is not None else None

    carried = handle.declared()
    for attribute in CARRIED:
        if carried[attribute] is not None:
            setattr(make, attribute, carried[attribute])

    make.supports = supports  # diffmoe.contract.SUPPORTS
    make.name = label
    return make
