"""Where each peer's own model layer calls the kernel an adapter runs, and what it passes there (issue 27 item 6).

For every release diffmoe runs, a `Site` row names a feature, the file in the release's wheel and the
function in it (the call site or the quant method that fills it), the source fragments that carry
what is passed there, and what the adapter passes. tests/peers/test_peer_call_sites.py reads each row in
the release's cached wheel files (diffmoe/adapters/peer_wheels.py keeps them) and compares the
adapters' own arguments with it: the keyword set of the call (`call_keywords`) and, per scale
pair, the flags the release's quant method sets (`*_PAIR_FLAGS`). An upstream change or an adapter
shortcut then fails a test; docs/peers.md, "How each adapter calls its peer", is this table in words.

Owns the call-site table and the readers of a wheel's source (ast, nothing executed). Must not
import a peer's code: it only reads files.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Site:
    """One feature at one call site in a release's wheel."""

    feature: str
    path: str  # inside the wheel
    function: str  # its qualified name in the file (Class.method)
    fragments: tuple[str, ...]  # source fragments the function holds (compared without whitespace)
    adapter: str  # what the adapter passes, in words (docs/peers.md)
    call: str | None = None  # the callee whose keyword set the adapter passes exactly ("self.fused_experts.apply")


# ---- vLLM -----------------------------------------------------------------------------------------------------

_MOE = "vllm/model_executor/layers/fused_moe"
_MK = f"{_MOE}/modular_kernel.py"
_NO_DP_EP = f"{_MOE}/prepare_finalize/no_dp_ep.py"
_FP8 = "vllm/model_executor/layers/quantization/fp8.py"
_CT = "vllm/model_executor/layers/quantization/compressed_tensors/compressed_tensors_moe/compressed_tensors_moe_w8a8_fp8.py"
_ORACLE = f"{_MOE}/oracle/fp8.py"
_UNQUANT = f"{_MOE}/unquantized_fused_moe_method.py"


def vllm_sites(version: str) -> tuple[Site, ...]:
    """The call sites of vLLM `version` (0.28.0, 0.30.0, 0.33.0) the adapter (peers/vllm/core.py) mirrors."""
    apply = "FusedMoEKernelModularImpl._fused_experts"
    sites = [
        Site("TritonExperts.apply's keywords", _MK, apply, ("self.fused_experts.apply(",),
             "exactly this keyword set (VllmTritonMoE.apply_kwargs)", call="self.fused_experts.apply"),
        Site("expert map", _MK, apply, ("global_num_experts=global_num_experts", "expert_map=expert_map"),
             "global_num_experts=E, expert_map=the config's map (None without one)"),
        Site("expert map, router weight, shared experts (the layer's)", f"{_MOE}/fused_moe_modular_method.py",
             "FusedMoEModularMethod.apply",
             ("global_num_experts=layer.global_num_experts", "expert_map=layer.expert_map",
              "apply_router_weight_on_input=layer.apply_router_weight_on_input", "shared_experts=shared_experts"),
             "E, the config's map, router_weight == 'input'; no SharedExperts module (diffmoe's shared experts "
             "are routed slots)"),
        Site("second GEMM's activation scale", _MK, apply, ("a2_scale=self.fused_experts.a2_scale",),
             "a2_scale=experts.a2_scale (None: dynamic)"),
        Site("router-weight placement", _MK, apply, ("apply_router_weight_on_input=apply_router_weight_on_input",),
             "apply_router_weight_on_input = router_weight == 'input'"),
        Site("router weight on the input", _NO_DP_EP, "MoEPrepareAndFinalizeNoDPEPModular.prepare",
             ("assert topk == 1", "a1 = a1 * topk_weights.to(a1.dtype)"),
             "hidden_states * topk_weights.to(bf16) before the input quant, K = 1 only"),
        Site("input quant's flags", _NO_DP_EP, "_quantize_input",
             ("per_act_token_quant=quant_config.per_act_token_quant", "block_shape=quant_config.block_shape"),
             "moe_kernel_quantize_input(quant_dtype, per_act_token_quant, block_shape) from the quant config; "
             "is_scale_swizzled / mx_alignment (MX and NVFP4 only) at their defaults", call="moe_kernel_quantize_input"),
        Site("block shape (128-block FP8)", _FP8, "Fp8MoEMethod.get_fused_moe_quant_config",
             ("make_fp8_moe_quant_config(", "block_shape=self.weight_block_size" if version == "0.28.0"
              else "block_shape=self.moe_block_shape"),
             "block_shape=[128, 128] for fp8-block, None otherwise"),
        Site("SwiGLU limit (FP8)", _FP8, "Fp8MoEMethod.get_fused_moe_quant_config",
             ('swiglu_limit=getattr(layer,"swiglu_limit",None)',),
             "gemm1_clamp_limit=swiglu_limit in the quant config, and FusedMoEConfig.swiglu_limit"),
        Site("SwiGLU limit (FP8) reaches the clamp", _ORACLE, "make_fp8_moe_quant_config",
             ("gemm1_clamp_limit=swiglu_limit", "per_out_ch_quant=per_out_ch_quant"),
             "gemm1_clamp_limit=swiglu_limit"),
        Site("SwiGLU limit (bf16)", _UNQUANT, "UnquantizedFusedMoEMethod.get_fused_moe_quant_config",
             ('gemm1_clamp_limit=getattr(layer,"swiglu_limit",None)', "gemm1_clamp_limit=gemm1_clamp_limit"),
             "gemm1_clamp_limit=swiglu_limit in the quant config, and FusedMoEConfig.swiglu_limit"),
        Site("per-channel weights, per-token activations", _CT, "CompressedTensorsW8A8Fp8MoEMethod.get_fused_moe_quant_config",
             ("is_per_token=self.input_quant.strategy==QuantizationStrategy.TOKEN", "per_act_token_quant=is_per_token",
              "per_out_ch_quant=is_per_token"),
             "per_act_token_quant=True, per_out_ch_quant=True for fp8-token with channel weights"),
    ]
    sites.append(Site("fused choice (silu + 128-block quant)", f"{_MOE}/experts/triton_moe.py", "TritonExperts.apply",
                      ("ops.silu_and_mul_per_block_quant(",),
                      "fused=True for fp8-block unless the release unfuses it under a clamp (vllm_core.RELEASES: "
                      "clamp_unfuses_block_quant, read here as `self.activation_config.clamp_limit is None`)"))
    if version == "0.33.0":
        sites.append(Site("per-tensor weights, per-token activations", _FP8, "Fp8MoEMethod.get_fused_moe_quant_config",
                          ("per_act_token_quant=self.per_act_token_quant",),
                          "per_act_token_quant=True, per_out_ch_quant=False for fp8-token with tensor weights"))
    else:
        # Fp8MoEMethod passes no per_act_token_quant before 0.31: its MoE never runs per-token activations
        sites.append(Site("per-tensor weights, per-token activations", _FP8, "Fp8MoEMethod.get_fused_moe_quant_config",
                          ("a2_scale=a2_scale,block_shape=",),
                          "per_act_token_quant=True, per_out_ch_quant=False (Fp8MoEMethod sets no per-token flag, and "
                          "compressed-tensors, Quark and online FP8 tie it to per-channel weights; "
                          "TritonExperts._supports_quant_scheme lists the pair)"))
    return tuple(sites)


# Per scale pair (weights, activations): the quant method of vLLM that builds it and the flags it sets in
# FusedMoEQuantConfig (fragments in vllm_sites); 0.28.0 and 0.30.0 build (tensor, token) nowhere (see the last
# row of vllm_sites), the adapter passes there what 0.33.0's Fp8MoEMethod does.
VLLM_PAIR_FLAGS = {
    ("tensor", "tensor"): ("Fp8MoEMethod", dict(per_act_token_quant=False, per_out_ch_quant=False, block_shape=None)),
    ("tensor", "token"): ("Fp8MoEMethod (0.33.0)", dict(per_act_token_quant=True, per_out_ch_quant=False, block_shape=None)),
    ("channel", "token"): ("CompressedTensorsW8A8Fp8MoEMethod",
                           dict(per_act_token_quant=True, per_out_ch_quant=True, block_shape=None)),
    ("block", "group"): ("Fp8MoEMethod", dict(per_act_token_quant=False, per_out_ch_quant=False, block_shape=[128, 128])),
}


# ---- SGLang ---------------------------------------------------------------------------------------------------

_SGL_RUNNER = "sglang/srt/layers/moe/moe_runner/triton.py"
_SGL_QUANT = "sglang/srt/layers/quantization"
_SGL_FUSED_MOE = "sglang/srt/layers/moe/moe_runner/triton_utils/fused_moe.py"
SGLANG_RUNNER_CONFIG = ("sglang/srt/layers/moe/moe_runner/base.py", "MoeRunnerConfig")  # the dataclass of the runner config
SGLANG_LAYER = ("sglang/srt/layers/moe/fused_moe_triton/layer.py", "FusedMoE.__init__")  # the layer that fills it
# the runner config fields the adapter sets apart from MoeRunnerConfig's defaults, and why (docs/peers.md)
SGLANG_RUNNER_SET = {
    "num_experts": "E, as FusedMoE fills it",
    "num_local_experts": "E: every expert local (expert parallelism is refused)",
    "inplace": "False: the problem's hidden states stay unwritten (the layer's default writes over them)",
    "routed_scaling_factor": "None, or make_scaled's 2.0",
}


def sglang_sites(version: str) -> tuple[Site, ...]:
    """The call sites of SGLang `version` (0.5.20, 0.5.23) the adapter (peers/sglang/core.py) mirrors."""
    call = "fused_experts_none_to_triton"
    return (
        Site("fused_experts' keywords", _SGL_RUNNER, call, ("fused_experts(",),
             "exactly this keyword set (SglangTritonMoE.fused_experts_kwargs)", call="fused_experts"),
        Site("scale layouts from the quant info", _SGL_RUNNER, call,
             ("use_fp8_w8a8=quant_info.use_fp8_w8a8", "per_channel_quant=quant_info.per_channel_quant",
              "block_shape=quant_info.block_shape", "w1_scale=quant_info.w13_scale"),
             "use_fp8_w8a8, per_channel_quant, block_shape, w1_scale/w2_scale as below"),
        Site("routed scaling factor, router-weight placement, clamp", _SGL_RUNNER, call,
             ("moe_runner_config=runner_config", "topk_output=dispatch_output.topk_output"),
             "the runner config: routed_scaling_factor (None, or make_scaled's 2.0), apply_router_weight_on_input "
             "False, swiglu_limit / gemm1_clamp_limit None (refused when set)"),
        Site("runner config (the layer's)", SGLANG_LAYER[0], SGLANG_LAYER[1],
             ("self.moe_runner_config=MoeRunnerConfig(", "num_local_experts=self.num_local_experts", "inplace=inplace",
              "routed_scaling_factor=routed_scaling_factor", "apply_router_weight_on_input=apply_router_weight_on_input",
              "swiglu_limit=swiglu_limit", "gemm1_clamp_limit=gemm1_clamp_limit"),
             "the layer's parameter defaults (inplace=True, no scaling factor, no clamp) but for SGLANG_RUNNER_SET"),
        Site("runner config", _SGL_FUSED_MOE, "fused_experts",
             ("moe_runner_config.routed_scaling_factor", "moe_runner_config.apply_router_weight_on_input",
              "moe_runner_config.swiglu_limit", "moe_runner_config.gemm1_clamp_limit"),
             "every field fused_experts reads (SglangTritonMoE.runner_config): MoeRunnerConfig's default "
             "(moe_runner/base.py) but num_experts = num_local_experts = E, inplace False, routed_scaling_factor"),
        Site("per-tensor and 128-block FP8", f"{_SGL_QUANT}/fp8.py", "Fp8MoEMethod.get_triton_quant_info",
             ("use_fp8_w8a8=notuse_rocm_mxfp8", "block_shape=self.weight_block_size", "a13_scale=layer.w13_input_scale"),
             "use_fp8_w8a8=True, per_channel_quant=False (not passed), block_shape=[128, 128] or None, a1_scale None"),
        Site("per-channel weights, per-token activations", f"{_SGL_QUANT}/w8a8_fp8.py",
             "W8A8FP8MoEMethod.get_triton_quant_info", ("use_fp8_w8a8=True", "per_channel_quant=True"),
             "use_fp8_w8a8=True, per_channel_quant=True for fp8-token"),
        Site("bf16", f"{_SGL_QUANT}/unquant.py", "UnquantizedFusedMoEMethod.get_triton_quant_info",
             ("w13_weight=layer.w13_weight",), "no quant flag (use_fp8_w8a8 False)"),
    )


# Per scale pair: SGLang's quant method and the flags its quant info sets (sglang_sites)
SGLANG_PAIR_FLAGS = {
    ("tensor", "tensor"): ("Fp8MoEMethod", dict(use_fp8_w8a8=True, per_channel_quant=False, block_shape=None)),
    ("channel", "token"): ("W8A8FP8MoEMethod", dict(use_fp8_w8a8=True, per_channel_quant=True, block_shape=None)),
    ("block", "group"): ("Fp8MoEMethod", dict(use_fp8_w8a8=True, per_channel_quant=False, block_shape=[128, 128])),
}


# ---- lmdeploy and Liger ---------------------------------------------------------------------------------------

_LMD = "lmdeploy/pytorch/backends/cuda/moe/blocked_fp8.py"
LMDEPLOY_SITES = (
    Site("fused_moe_blocked_fp8's keywords", _LMD, "TritonFusedMoEBlockedF8Impl.forward", ("fused_moe_blocked_fp8(",),
         "the six positional tensors and exactly this keyword set (LmdeployBlockedFP8MoE.call_kwargs)",
         call="fused_moe_blocked_fp8"),
    Site("expert map", _LMD, "TritonFusedMoEBlockedF8Impl.forward",
         ("ifexpert_listisnotNoneandlen(expert_list)!=self.num_experts:", "num_experts=num_experts"),
         "expert_offset=0, num_experts=None (every expert local; an expert map is refused)"),
    Site("input quant", _LMD, "TritonFusedMoEBlockedF8Impl.forward",
         ("quant_fp8(hidden_states,self.block_size,dtype=gate_up_weights.dtype,scale_fmt=self.scale_fmt)",),
         "quant_fp8(x, 128, dtype=w1.dtype, scale_fmt=None)", call="quant_fp8"),
    Site("out dtype, renormalize", _LMD, "TritonFusedMoEBlockedF8Impl.forward",
         ("out_dtype=hidden_states.dtype", "renormalize=self.renormalize"),
         "out_dtype=bf16 (the input's), renormalize=False (the problem's weights are final)"),
)

_LIGER = "liger_kernel/transformers/swiglu.py"
LIGER_SITES = (
    Site("LigerFusedMoEFunction.apply's arguments", _LIGER, "LigerExperts.forward",
         ("LigerFusedMoEFunction.apply(x,self.gate_up_proj,self.down_proj,top_k_index_2d,top_k_weights_2d)",),
         "the same five, positionally (LigerFusedMoE.apply_args)", call="LigerFusedMoEFunction.apply"),
    Site("top-k ids dtype", _LIGER, "LigerExperts.forward", (".to(torch.int32)",), "topk_ids.to(torch.int32)"),
)


def sites_of(peer: str) -> tuple[Site, ...]:
    """The rows of one peer-cache name (diffmoe.adapters.peer_wheels.PEERS): vllm==0.28.0, sglang==0.5.23, lmdeploy, ..."""
    name, _, version = peer.partition("==")
    if name == "vllm":
        return vllm_sites(version or "0.33.0")
    if name == "sglang":
        return sglang_sites(version or "0.5.23")
    return {"lmdeploy": LMDEPLOY_SITES, "liger": LIGER_SITES}[name]


# ---- reading a wheel's source ------------------------------------------------------------------------------------


def _squash(text: str) -> str:
    return re.sub(r"\s+", "", text)


def function_node(root: Path, site: Site) -> tuple[str, ast.FunctionDef]:
    """The source of `site.path` under `root` and the def `site.function` names; LookupError naming it if absent."""
    source = (Path(root) / site.path).read_text()
    scope: list = ast.parse(source).body
    node = None
    for part in site.function.split("."):
        node = next((n for n in scope if isinstance(n, (ast.ClassDef, ast.FunctionDef)) and n.name == part), None)
        if node is None:
            raise LookupError(f"{site.path} has no {site.function}")
        scope = node.body
    return source, node


def attribute_reads(root: Path, site: Site, name: str) -> frozenset[str]:
    """The attributes `site.function` reads on the variable `name` (`moe_runner_config.inplace` -> inplace)."""
    _, node = function_node(root, site)
    return frozenset(a.attr for a in ast.walk(node)
                     if isinstance(a, ast.Attribute) and isinstance(a.value, ast.Name) and a.value.id == name)


def parameter_defaults(root: Path, site: Site) -> dict:
    """The literal defaults of `site.function`'s keyword parameters (one without a literal default is left out)."""
    _, node = function_node(root, site)
    args = node.args
    pairs = [*zip(args.args[len(args.args) - len(args.defaults):], args.defaults),
             *((a, d) for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is not None)]
    defaults = {}
    for arg, value in pairs:
        try:
            defaults[arg.arg] = ast.literal_eval(value)
        except ValueError:
            pass
    return defaults


def dataclass_defaults(root: Path, path: str, cls: str) -> dict:
    """The literal defaults of a dataclass's fields in a wheel's file (a field without a literal one is left out)."""
    source = (Path(root) / path).read_text()
    node = next(n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == cls)
    defaults = {}
    for item in node.body:
        if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name) and item.value is not None:
            try:
                defaults[item.target.id] = ast.literal_eval(item.value)
            except ValueError:
                pass
    return defaults


def holds(root: Path, site: Site, fragment: str) -> bool:
    """Whether `site.function` holds `fragment` (whitespace ignored; a trailing comma may end a call)."""
    source, node = function_node(root, site)
    return _squash(fragment).replace(",)", ")") in _squash(ast.get_source_segment(source, node)).replace(",)", ")")


def missing_fragments(root: Path, site: Site) -> list[str]:
    """The fragments of `site` its function does not hold."""
    return [f for f in site.fragments if not holds(root, site, f)]


def calls(root: Path, site: Site) -> list[ast.Call]:
    """The calls of `site.call` in `site.function` (the callee as written, e.g. `self.fused_experts.apply`)."""
    _, node = function_node(root, site)
    return [c for c in ast.walk(node) if isinstance(c, ast.Call) and ast.unparse(c.func) == site.call]


def call_keywords(root: Path, site: Site) -> tuple[int, frozenset[str]]:
    """(number of positional arguments, keyword names) of the one call of `site.call` in `site.function`."""
    found = calls(root, site)
    if len(found) != 1:
        raise LookupError(f"{site.path}:{site.function} calls {site.call} {len(found)} times, expected once")
    return len(found[0].args), frozenset(k.arg for k in found[0].keywords)


def keyword_mismatch(expected: tuple[int, frozenset[str]], positional: int, keywords, *, ignore=()) -> str | None:
    """None when an adapter's call (`positional` arguments, `keywords`) is the call site's; else one line saying how not."""
    want_pos, want = expected
    got = frozenset(keywords)
    want = want - frozenset(ignore)
    if positional == want_pos and got == want:
        return None
    parts = []
    if positional != want_pos:
        parts.append(f"{positional} positional arguments, the call site passes {want_pos}")
    if want - got:
        parts.append(f"missing {sorted(want - got)}")
    if got - want:
        parts.append(f"not at the call site {sorted(got - want)}")
    return "; ".join(parts)


def flag_mismatch(expected: dict, passed: dict) -> str | None:
    """None when every flag in `expected` has its value in `passed`; else one line naming the flags that differ."""
    wrong = {k: (passed.get(k), v) for k, v in expected.items() if passed.get(k) != v}
    if not wrong:
        return None
    return ", ".join(f"{k}={got!r} where the layer passes {want!r}" for k, (got, want) in sorted(wrong.items()))
