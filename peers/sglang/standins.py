"""SGLang's compiled CUDA ops as the adapter kit's stand-ins with SGLang's conventions, and the values
the kit's stubs carry for the names SGLang's files evaluate (peers/sglang/core.py loads the files).

The sources cited are
the CUDA/JIT files of the same wheel; sgl-kernel's own ops are a separate package, cited through
the Triton twin this wheel holds):
  * moe_align_block_size (sgl_kernel; kernels/jit/csrc/moe/moe_align_kernel.cu, the same
    contract): the +1 bucket: ids -1 .. E-1 shifted by one, bucket 0 (expert -1) sorted first,
    every sorted id first the sentinel TK, the expert ids past the padded total left unwritten;
  * per-tensor FP8 (csrc/gemm/per_tensor_quant_fp8.cuh): scale = atomic max of amax / 448, no
    floor; codes x * (1 / scale); fmax(fmin(x, 448), -448) (NaN -> +448);
  * per-token FP8 (csrc/gemm/per_token_quant_fp8.cuh, its per-CTA kernel, the one small batches
    get): scale = amax / 448, no floor; codes x * (1 / scale); NaN -> +448;
  * per-token-group FP8 (csrc/gemm/per_token_group_quant.cuh): amax floored at 1e-10, scale =
    amax * (1 / 448), codes x * (448 / amax); NaN -> +448;
  * silu_and_mul (csrc/elementwise/activation.cuh): silu(g) = g / (1 + expf(-g)) in float32,
    times up in float32, rounded once; rows whose expert is -1 skipped under the expert filter;
  * moe_sum_reduce (sgl_kernel; its Triton twin moe_sum_reduce_triton in
    fused_moe_triton_kernels.py): float32 sum over top-k, times the routed scaling factor,
    rounded once.

Each op reports itself to the run in progress (`ACTIVE.reporter.op`), which names its tensors.

Owns SGLang's op signatures, the conventions they pass the kit and the stub values. Must not hold
SGLang source: every line here is diffmoe's own.
"""

from __future__ import annotations

import contextlib
import threading
import types

import torch

from diffmoe.adapters.kit import standins
from diffmoe.adapters.kit.stubs import context_override

MOE = "sglang.srt.layers.moe.moe_runner.triton_utils"
OPS = "sglang.kernels.ops"

ACTIVE = threading.local()  # the run in progress on this thread: its RunReporter


def _report(op: str, reads: dict, writes: dict, compute):
    reporter = getattr(ACTIVE, "reporter", None)
    return compute() if reporter is None else reporter.op(op, reads, writes, compute)


# ---- SGLang's CUDA ops, as the kit's stand-ins with SGLang's conventions (module docstring) ----


def moe_align_block_size(topk_ids, num_buckets, block_size, sorted_ids, expert_ids, num_tokens_post_pad, cumsum_buffer,
                         pad_sorted_token_ids=False, ignore_invalid_expert=False):
    if not pad_sorted_token_ids or ignore_invalid_expert:
        raise NotImplementedError("moe_align_block_size stand-in: only the padded, +1-bucket form fused_experts calls")
    _report("moe_align_block_size", {"topk_ids": topk_ids},
            {"sorted_token_ids": sorted_ids, "expert_ids": expert_ids, "num_tokens_post_padded": num_tokens_post_pad},
            lambda: standins.moe_align_block_size(topk_ids, num_buckets - 1, block_size, sorted_ids, expert_ids,
                                                  num_tokens_post_pad, invalid="bucket", blocks_past_total=None))


def per_tensor_quant_fp8(input, output_q, output_s, is_static=False):
    _report("per_tensor_quant_fp8", {"input": input}, {"output": output_q, "scale": output_s},
            lambda: standins.quant_tensor(input, output_q, output_s, static=is_static, codes="reciprocal"))


def sgl_per_token_quant_fp8(input, output_q, output_s):
    _report("per_token_quant_fp8", {"input": input}, {"output": output_q, "scale": output_s},
            lambda: standins.quant_token(input, output_q, output_s, codes="reciprocal", floor=None))


def per_token_group_quant(input, output_q=None, output_s=None, group_size=128, scale_ue8m0=False, fuse_silu_and_mul=False,
                          masked_m=None, *args, **kwargs):
    if scale_ue8m0 or fuse_silu_and_mul or masked_m is not None or args or any(v for v in kwargs.values()):
        raise NotImplementedError("per_token_group_quant stand-in: only the plain row-major form the MoE path calls")
    _report("per_token_group_quant", {"input": input}, {"output": output_q, "scale": output_s},
            lambda: standins.quant_group(input, group_size, output_q, output_s, scale_rule="product",
                                         codes="reciprocal_amax", nan_code=standins.FP8_MAX))
    return output_q, output_s


def silu_and_mul(input, out=None, expert_ids=None, expert_step=1, *, sorted_token_ids=None, **kwargs):
    if sorted_token_ids is not None:
        raise NotImplementedError("silu_and_mul stand-in: the sorted (TMA) row filter is not supported")
    out = out if out is not None else input.new_empty(*input.shape[:-1], input.shape[-1] // 2)
    skip = None if expert_ids is None else expert_ids.reshape(-1)[torch.arange(input.shape[0]) // expert_step] == -1
    _report("silu_and_mul", {"input": input}, {"output": out},
            lambda: standins.silu_and_mul(input, out, rounding="once", skip_rows=skip))
    return out


def moe_sum_reduce(input, output, routed_scaling_factor):  # inside the combine, reported as the reduce
    standins.moe_sum(input, output, precision="fp32", scale=routed_scaling_factor)


def _runtime():
    return types.SimpleNamespace(moe=types.SimpleNamespace(enable_fused_moe_sum_all_reduce=False),
                                 deterministic=types.SimpleNamespace(enable_deterministic_inference=False))


class _Flags:
    """sglang.srt.environ.envs: every flag the path reads at its default, off."""

    def __getattr__(self, name):
        return types.SimpleNamespace(get=lambda: False)


def _decorator_factory(*args, **kwargs):
    return lambda fn: fn


# SGLang's tile-config override (triton_utils' override_config and the get_config its
# try_get_optimal_moe_config reads first), per call in flight: diffmoe tuned-configs forces each entry through it
# as SGLang's: get_config() is the config an override_config block forces, else None
get_config, override_config = context_override("sglang_override_config")


def stub_values(cuda: bool) -> dict:
    no = lambda *a, **k: False  # noqa: E731
    utils = {n: no for n in ("is_hip", "is_cpu", "is_xpu", "is_musa", "cpu_has_amx_support", "is_sm90_supported",
                             "is_gfx1250_supported", "get_bool_env_var")}
    utils.update(is_cuda=lambda: cuda, ceil_align=lambda x, y: (x + y - 1) // y * y,
                 get_device_name=lambda device_id=0: torch.cuda.get_device_name(device_id) if torch.cuda.is_available()
                 else "interpreter")
    return {
        "sglang.srt.utils": utils,
        "sglang.srt.utils.custom_op": {"register_custom_op": _decorator_factory},
        "sglang.srt.utils.patch_torch": {"register_fake_if_exists": _decorator_factory},
        "sglang.srt.environ": {"envs": _Flags()},
        "sglang.kernels.jit.utils": {"is_arch_support_pdl": no},
        "sglang.srt.batch_invariant_ops": {"is_batch_invariant_mode_enabled": no},
        "sglang.srt.distributed": {"get_tp_group": lambda: None},
        "sglang.srt.distributed.device_communicators.pynccl_allocator": {
            "use_symmetric_memory": lambda *a, **k: contextlib.nullcontext()},
        "sglang.srt.layers.dp_attention": {"is_allocation_symmetric": no},
        "sglang.srt.runtime_context": {"get_exec": _runtime, "get_parallel": lambda: types.SimpleNamespace(tp_group=None)},
        "sglang.srt.layers.moe.utils": {"get_moe_padding_size": lambda *a, **k: 0},
        "sglang.srt.layers.moe.moe_runner": {"MoeRunnerConfig": types.SimpleNamespace},
        MOE: {"get_config": get_config, "override_config": override_config},
        # the CUDA ops (module docstring), where SGLang imports them
        "sgl_kernel": {"moe_sum_reduce": moe_sum_reduce, "silu_and_mul": silu_and_mul},
        f"{OPS}.moe": {"moe_align_block_size": moe_align_block_size},
        f"{OPS}.quantization": {"sgl_per_token_quant_fp8": sgl_per_token_quant_fp8,
                                 "per_token_group_quant": per_token_group_quant},  # 0.5.20 imports it from here
        f"{OPS}.quantization.per_tensor_quant_fp8": {"per_tensor_quant_fp8": per_tensor_quant_fp8},
        f"{OPS}.quantization.per_token_group_quant": {"per_token_group_quant": per_token_group_quant},
        f"{OPS}.activation.activation": {"silu_and_mul": silu_and_mul},
    }
