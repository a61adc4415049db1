"""SGLang 0.5.23's fused_experts via the adapter kit, stage by stage: `diffmoe check --impl examples/sglang_adapter.py:make`."""
import functools
import logging
import torch

from diffmoe.adapters import function_factory, kit, peer_wheels
from peers.sglang.standins import ACTIVE, MOE, OPS, stub_values  # SGLang's CUDA ops as kit stand-ins, its stub values

FILES = [(m, m.replace(".", "/") + ".py") for m in (f"{OPS}.quantization.fp8_utils", f"{OPS}.quantization.fp8_kernel",
         f"{OPS}.moe.fused_moe_triton_kernels", f"{OPS}.moe.moe_align_small_numel", f"{MOE}.fused_moe_triton_config",
         f"{MOE}.moe_align_block_size", f"{MOE}.fused_moe")]

@functools.cache
def files():  # SGLang's files by path from the wheel's cache; everything else they import is a stub
    root = kit.PackageSource.folder(peer_wheels.peer_root("sglang==0.5.23"))
    modules = kit.load_modules(root, FILES, stubs=kit.Stubs(["sglang", "sgl_kernel", "aiter", "deep_gemm"], stub_values(True)))
    kernels = modules[f"{OPS}.moe.fused_moe_triton_kernels"]  # its launches reported, attributed to stages by buffer
    kernels.fused_moe_kernel = kit.ReportingKernel("fused_moe_kernel", kernels.fused_moe_kernel, ACTIVE)
    logging.getLogger(f"{MOE}.fused_moe_triton_config").setLevel(logging.ERROR)  # "no tuned config for E, N"
    return modules

def fused_experts(*args, **kwargs):
    with files().installed(), torch.compiler.set_stance("force_eager"):  # its @torch.compile sum, eagerly
        return files()[f"{MOE}.fused_moe"].fused_experts(*args, **kwargs)

fused_experts.active, fused_experts.numerics, fused_experts.peer_wheel = ACTIVE, "sglang", "sglang==0.5.23"
fused_experts.supports = lambda c: ("hidden and inter must be other than 128 for fp8-block (SGLang's per-token path)" if
    c.quant == "fp8-block" and 128 in (c.hidden, c.inter) else "weight_scales must be None (one flag ties SGLang's pairs)" if c.weight_scales else None)
make = function_factory(fused_experts, "sglang")
