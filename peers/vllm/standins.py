"""Stand-in modules for what vLLM's MoE files import beyond the five the adapter runs.

The vLLM adapter (peers/vllm/core.py) executes five files of a vLLM release's wheel by path
(fused_moe.py, moe_align_block_size.py, modular_kernel.py, utils.py, experts/triton_moe.py).
Everything else they import is a module built here, registered under its vllm name only while
those files run; no vllm package `__init__` runs:

* `vllm._custom_ops` and fp8_utils' group quant: peers/vllm/ops.py's torch versions of the
  compiled ops;
* small explicit stand-ins (envs, logger, platform, activation dispatch, the quant config, the
  LoRA mixin, the `fused_moe` package's get_config and override_config: the tile-config override
  `diffmoe tuned-configs` forces entries through) holding only what the executed code reads;
* for every other imported name, a placeholder class: it can be imported, annotated with,
  subclassed and compared, and raises NotImplementedError naming itself when called, so a code
  path this adapter does not support fails loudly instead of running a guess.

Longer than 400 lines because every module vLLM's five files import is stood in here, one table
(standin_modules) and the small classes it names: split, the table would name another file's.

Owns the stand-in modules. Must not hold vLLM source: every line here is diffmoe's own.
"""

from __future__ import annotations

import enum
import logging
import sys
import types
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from diffmoe.adapters.kit.stubs import context_override

from .ops import (
    FP8,
    moe_align_block_size,
    moe_sum,
    per_token_group_quant_fp8,
    scaled_fp8_quant,
    silu_and_mul,
    silu_and_mul_per_block_quant,
)


# ---- stand-in modules -------------------------------------------------------------------------


def placeholder(module: str, name: str) -> type:
    """A class standing for `module.name`: importable, usable in annotations and as a base,
    raising NotImplementedError when called."""
    where = f"{module}.{name}"

    def refuse(cls, *args, **kwargs):
        raise NotImplementedError(f"{where} is not provided by diffmoe's vLLM stand-ins (peers/vllm/ops.py): this "
                                  "code path is not supported by the adapter")

    return type(name, (), {"__new__": refuse, "__module__": module, "__qualname__": name,
                           "__doc__": f"diffmoe placeholder for {where}"})


class StandInModule(types.ModuleType):
    """A module whose missing attributes are placeholders (or registered submodules)."""

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        sub = sys.modules.get(f"{self.__name__}.{attr}")
        if sub is not None:
            return sub
        value = placeholder(self.__name__, attr)
        setattr(self, attr, value)
        return value


class StrictModule(types.ModuleType):
    """A module holding only what is set on it (envs: a placeholder would be truthy)."""

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        raise AttributeError(f"diffmoe's stand-in {self.__name__} has no {attr!r} (peers/vllm/ops.py)")


_NULL_HANDLER = logging.NullHandler()


class _Logger:
    """vllm.logger's logger: the standard one, its *_once methods once per message."""

    _seen: set[tuple[str, str]] = set()

    def __init__(self, name: str):
        # vLLM's messages (e.g. "Using default MoE config") reach whoever configures logging; by
        # default they are not printed (a library's NullHandler), as no vLLM log is a verdict
        logging.getLogger("vllm").addHandler(_NULL_HANDLER)
        self._log = logging.getLogger(name)

    def __getattr__(self, level: str):
        once = level.endswith("_once")
        method = getattr(self._log, level.removesuffix("_once"))

        def log(msg, *args, scope=None, **kwargs):
            if once:
                key = (self._log.name, str(msg))
                if key in self._seen:
                    return
                self._seen.add(key)
            method(msg, *args, **kwargs)

        return log


class Platform:
    """vllm.platforms.current_platform, as far as the executed code asks. A CUDA device reports
    its capability (vLLM then takes its sm_90 choices, e.g. SWAP_AB); otherwise none."""

    simple_compile_backend = "eager"

    def __init__(self, device: torch.device | None = None):
        self.capability = None
        if device is not None and device.type == "cuda" and torch.cuda.is_available():
            self.capability = torch.cuda.get_device_capability(device)

    def fp8_dtype(self) -> torch.dtype:
        return FP8

    def is_fp8_fnuz(self) -> bool:
        return False

    def supports_fp8(self) -> bool:
        return True

    def is_rocm(self) -> bool:
        return False

    def is_xpu(self) -> bool:
        return False

    def is_cpu(self) -> bool:
        return False

    def is_cuda(self) -> bool:
        return self.capability is not None

    def is_cuda_alike(self) -> bool:
        return self.capability is not None

    def is_device_capability(self, capability) -> bool:
        if self.capability is None:
            return False
        want = capability if isinstance(capability, tuple) else divmod(int(capability), 10)
        return tuple(self.capability) == tuple(want)

    def has_device_capability(self, capability) -> bool:
        if self.capability is None:
            return False
        want = capability if isinstance(capability, tuple) else divmod(int(capability), 10)
        return tuple(self.capability) >= tuple(want)

    def is_device_capability_family(self, capability) -> bool:
        return self.is_device_capability(capability)


class MoEActivation(enum.Enum):
    """vLLM's activation names (the adapter runs SILU only)."""

    SILU = "silu"
    GELU = "gelu"
    GELU_TANH = "gelu_tanh"
    RELU2 = "relu2"
    SWIGLUOAI = "swigluoai"
    SITU = "situ"
    SWIGLUOAI_UNINTERLEAVE = "swigluoai_uninterleave"
    SWIGLUSTEP = "swiglustep"
    SILU_NO_MUL = "silu_no_mul"
    GELU_NO_MUL = "gelu_no_mul"
    GELU_TANH_NO_MUL = "gelu_tanh_no_mul"
    RELU2_NO_MUL = "relu2_no_mul"

    @property
    def is_gated(self) -> bool:
        return not self.value.endswith("_no_mul")


@dataclass
class ApplyMoEActivationConfig:
    clamp_limit: float | None = None
    alpha: float = 1.0
    beta: float = 0.0
    activation_situ_beta: float | None = None
    activation_situ_linear_beta: float | None = None

    @classmethod
    def from_configs(cls, moe_config, quant_config) -> ApplyMoEActivationConfig:
        """As vLLM's activation.py from_configs: the quant config's gemm1_clamp_limit, else the
        layer's swiglu_limit (how a model's SwiGLU clamp reaches TritonExperts)."""
        clamp = getattr(quant_config, "gemm1_clamp_limit", None)
        return cls(clamp_limit=clamp if clamp is not None else getattr(moe_config, "swiglu_limit", None))


def apply_moe_activation(activation, output, input, activation_config=None, topk_ids=None, expert_map=None,
                         valid_token_counts=None) -> None:
    """The SILU branch of vLLM's dispatch: torch.ops._C.silu_and_mul(output, input)."""
    if activation != MoEActivation.SILU or (activation_config is not None and activation_config.clamp_limit is not None):
        raise NotImplementedError(f"activation {activation} is not supported by the adapter (silu only)")
    if valid_token_counts is not None:
        raise NotImplementedError("pad-aware activation is not supported by the adapter")
    silu_and_mul(output, input)


def apply_moe_activation_supported(activation) -> bool:
    return activation == MoEActivation.SILU


@dataclass
class FusedMoEParallelConfig:
    use_all2all_kernels: bool = False
    use_fi_nvl_two_sided_kernels: bool = False
    use_fi_nvl_one_sided_kernels: bool = False


@dataclass
class FusedMoEConfig:
    """The layer description TritonExperts keeps (it reads only the parallel config, under LoRA)."""

    num_experts: int
    moe_parallel_config: FusedMoEParallelConfig = field(default_factory=FusedMoEParallelConfig)
    swiglu_limit: float | None = None
    swiglu_alpha: float | None = None
    swiglu_beta: float | None = None
    activation_situ_beta: float | None = None
    activation_situ_linear_beta: float | None = None


@dataclass
class FusedMoEQuantConfig:
    """vllm's FusedMoEQuantConfig as the Triton experts read it: the activation quant dtype,
    per-token or 1x128-block activations, the weight scales; no static activation scales, no
    bias, no zero points, no LoRA clamp."""

    quant_dtype: torch.dtype | None = None
    per_act_token_quant: bool = False
    block_shape: list[int] | None = None
    w1_scale: torch.Tensor | None = None
    w2_scale: torch.Tensor | None = None
    per_out_ch_quant: bool = False
    a1_scale: torch.Tensor | None = None
    a2_scale: torch.Tensor | None = None
    a1_gscale: torch.Tensor | None = None
    a2_gscale: torch.Tensor | None = None
    w1_bias: torch.Tensor | None = None
    w2_bias: torch.Tensor | None = None
    w1_zp: torch.Tensor | None = None
    w2_zp: torch.Tensor | None = None
    g1_alphas: torch.Tensor | None = None
    g2_alphas: torch.Tensor | None = None
    gemm1_clamp_limit: float | None = None
    gemm1_alpha: float | None = None
    gemm1_beta: float | None = None
    ocp_mx_scheme: str | None = None

    @property
    def weight_quant_dtype(self):
        return self.quant_dtype

    @property
    def is_quantized(self) -> bool:
        return self.quant_dtype is not None

    @property
    def use_fp8_w8a8(self) -> bool:
        return self.quant_dtype == FP8

    use_int8_w8a8 = property(lambda self: False)
    use_int8_w8a16 = property(lambda self: False)
    use_fp8_w8a16 = property(lambda self: False)
    use_int4_w4a16 = property(lambda self: False)
    use_nvfp4_w4a16 = property(lambda self: False)

    def config_name(self, dtype: torch.dtype) -> str | None:
        """As vllm's _get_config_dtype_str: "fp8_w8a8", "float32" for float32 activations, else None."""
        if self.use_fp8_w8a8:
            return "fp8_w8a8"
        return "float32" if dtype == torch.float else None


class LoRAExpertsMixin:
    """No LoRA: TritonExperts only reads `_lora_context` (None) on this path."""

    _lora_context = None

    @staticmethod
    def supports_lora() -> bool:
        return False


def _math_utils() -> dict[str, Any]:
    def cdiv(a: int, b: int) -> int:
        return -(a // -b)

    def round_up(x: int, y: int) -> int:
        return cdiv(x, y) * y

    def next_power_of_2(n: int) -> int:
        return 1 if n < 1 else 1 << (n - 1).bit_length()

    return {"cdiv": cdiv, "round_up": round_up, "next_power_of_2": next_power_of_2}


def _refuse_allocator(device) -> None:
    raise NotImplementedError("vllm.triton_utils.allocation.set_triton_allocator: the tensor-descriptor path is off here")


# vLLM's tile-config override (its fused_moe package's override_config and the get_config fused_moe.py reads
# first), per call in flight: diffmoe tuned-configs forces each shipped entry through it
# as vLLM's: get_config() is the config an override_config block forces, else None
get_config, override_config = context_override("vllm_override_config")


def _device_name_as_file_name(device: torch.device | None) -> Callable[[], str]:
    def name() -> str:
        if device is not None and device.type == "cuda" and torch.cuda.is_available():
            return torch.cuda.get_device_name(device).replace(" ", "_")
        return "diffmoe_triton_interpreter"

    return name


def standin_modules(device: torch.device | None = None) -> dict[str, types.ModuleType]:
    """Every vllm module the five executed files import, except those five, by full name.

    Packages on the way (vllm, vllm.model_executor, ...) are StandInModules with an empty
    __path__; the caller registers the real files' modules beside these."""
    import triton
    import triton.language as tl

    explicit: dict[str, dict[str, Any]] = {
        "vllm._custom_ops": {
            "moe_align_block_size": moe_align_block_size, "moe_sum": moe_sum, "scaled_fp8_quant": scaled_fp8_quant,
            "silu_and_mul_per_block_quant": silu_and_mul_per_block_quant,
        },
        "vllm.logger": {"init_logger": _Logger},
        "vllm.platforms": {"current_platform": Platform(device)},
        "vllm.triton_utils": {"tl": tl, "triton": triton},
        "vllm.triton_utils.allocation": {"set_triton_allocator": _refuse_allocator},
        "vllm.utils.math_utils": _math_utils(),
        "vllm.utils.platform_utils": {"get_device_name_as_file_name": _device_name_as_file_name(device)},
        "vllm.utils.torch_utils": {"direct_register_custom_op": lambda *a, **k: None, "PIN_MEMORY": False},
        "vllm.model_executor.layers.fused_moe": {"get_config": get_config, "override_config": override_config},
        "vllm.model_executor.layers.fused_moe.activation": {
            "MoEActivation": MoEActivation, "ApplyMoEActivationConfig": ApplyMoEActivationConfig,
            "apply_moe_activation": apply_moe_activation, "apply_moe_activation_supported": apply_moe_activation_supported,
        },
        "vllm.model_executor.layers.fused_moe.config": {
            "FusedMoEQuantConfig": FusedMoEQuantConfig, "FusedMoEConfig": FusedMoEConfig,
            "FusedMoEParallelConfig": FusedMoEParallelConfig,
        },
        "vllm.model_executor.layers.fused_moe.experts.lora_experts_mixin": {"LoRAExpertsMixin": LoRAExpertsMixin},
        "vllm.model_executor.layers.quantization.utils.fp8_utils": {
            "per_token_group_quant_fp8": per_token_group_quant_fp8, "is_deep_gemm_e8m0_used": lambda: False,
        },
        "vllm.model_executor.layers.quantization.utils.quant_utils": {"FP8_DTYPE": FP8},
    }
    envs = StrictModule("vllm.envs")
    for name, value in {"VLLM_TRITON_USE_TD": None, "VLLM_BATCH_INVARIANT": False, "VLLM_TUNED_CONFIG_FOLDER": None}.items():
        setattr(envs, name, value)
    modules: dict[str, types.ModuleType] = {"vllm.envs": envs}
    # modules whose names the executed files import but whose contents are placeholders only
    bare = [
        "vllm._aiter_ops", "vllm.model_executor.models.utils",
        "vllm.model_executor.layers.fused_moe.moe_output",
        "vllm.model_executor.layers.fused_moe.routed_experts_capturer",
        "vllm.model_executor.layers.fused_moe.runner.shared_experts",
        "vllm.model_executor.layers.fused_moe.topk_weight_and_reduce",
        "vllm.model_executor.layers.quantization.utils.config_utils",
        "vllm.model_executor.layers.quantization.utils.int8_utils",
        "vllm.model_executor.layers.quantization.utils.mxfp4_utils",
        "vllm.model_executor.layers.quantization.utils.mxfp6_utils",
        "vllm.model_executor.layers.quantization.utils.mxfp8_utils",
        "vllm.model_executor.layers.quantization.utils.nvfp4_emulation_utils",
        "vllm.model_executor.layers.quantization.utils.w8a8_utils",
        "vllm.utils.multi_stream_utils", "vllm.v1.worker.ubatching", "vllm.v1.worker.workspace",
    ]
    for name in [*explicit, *bare]:
        module = StandInModule(name)
        module.__dict__.update(explicit.get(name, {}))
        modules[name] = module
    # every package on the way, so that `import a.b.c` resolves from sys.modules alone
    for name in list(modules):
        parts = name.split(".")
        for i in range(1, len(parts)):
            pkg = ".".join(parts[:i])
            if pkg not in modules:
                modules[pkg] = StandInModule(pkg)
    for name in ("vllm.model_executor.layers.fused_moe.experts",):
        modules.setdefault(name, StandInModule(name))
    for module in modules.values():
        module.__path__ = []  # a package for the import system; harmless on leaves
    return modules


def link_parents(modules: dict[str, types.ModuleType]) -> None:
    """Set each module as an attribute of its parent (what `import a.b as m` reads)."""
    for name, module in modules.items():
        parent, _, leaf = name.rpartition(".")
        if parent in modules:
            setattr(modules[parent], leaf, module)
