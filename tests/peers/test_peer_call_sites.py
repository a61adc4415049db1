"""Each adapter calls its peer as the peer's own model layer does (issue 27 item 6): per release, the call
sites in the release's wheel (peers/call_sites.py, read from the cached files) hold what the adapter
mirrors; the adapter's own arguments (its keyword sets, its scale flags per pair, the SwiGLU limit)
are the call site's; and an adapter that passes a wrong flag or drops a keyword is caught."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import dataclasses  # noqa: E402
import shutil  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

from diffmoe.adapters import peer_wheels  # noqa: E402
from diffmoe.adapters.loading import load_factory  # noqa: E402
from diffmoe.contract import peer_factory_spec  # noqa: E402
from diffmoe.problem.config import SCALE_PAIRS, MoEConfig  # noqa: E402
from diffmoe.problem.inputs import make_problem  # noqa: E402
from peers import call_sites as cs  # noqa: E402
from peers.vllm import core as vllm_core  # noqa: E402

VLLM = ("vllm==0.28.0", "vllm==0.30.0", "vllm==0.33.0")
SGLANG = ("sglang==0.5.20", "sglang==0.5.23")
PEERS = (*VLLM, *SGLANG, "lmdeploy", "liger")
SMALL = dict(num_tokens=3, num_experts=4, topk=2, hidden=256, inter=256, random_orders=0, seed=1)
# config.SCALE_PAIRS as configs
PAIR = {("tensor", "tensor"): dict(quant="fp8-tensor"), ("tensor", "token"): dict(quant="fp8-token", weight_scales="tensor"),
        ("channel", "token"): dict(quant="fp8-token"), ("block", "group"): dict(quant="fp8-block")}


def _root(spec: str):
    """The release's cached files: downloaded and verified on first use only (as the peers' own tests do)."""
    try:
        return peer_wheels.fetch(spec)
    except peer_wheels.PeerError as exc:
        pytest.skip(f"{spec} is not in the peer cache and cannot be fetched ({exc}); run `{peer_wheels.fetch_command(spec)}`")


def _site(spec: str, call: str) -> cs.Site:
    return next(s for s in cs.sites_of(spec) if s.call == call)


def _pair_config(pair, spec: str, **kw) -> MoEConfig:
    fused = spec.startswith("vllm") and pair == ("block", "group")
    return MoEConfig(**{**SMALL, **PAIR[pair], "fused": fused, **kw})


# ---- the call sites, read from each release's wheel --------------------------------------------------------------


@pytest.mark.parametrize("spec", PEERS)
def test_every_call_site_holds_what_the_adapter_mirrors(spec):
    root = _root(spec)
    missing = {s.feature: cs.missing_fragments(root, s) for s in cs.sites_of(spec)}
    assert {f: m for f, m in missing.items() if m} == {}
    assert all(len(cs.calls(root, s)) == 1 for s in cs.sites_of(spec) if s.call)


def test_an_upstream_change_at_a_call_site_is_caught(tmp_path):
    """A copy of vLLM 0.33.0's no_dp_ep.py whose prepare stops weighting the input: its row names the fragment;
    a call that gains a keyword no longer matches the adapter's set."""
    root = _root("vllm==0.33.0")
    site = next(s for s in cs.vllm_sites("0.33.0") if s.feature == "router weight on the input")
    changed = tmp_path / site.path
    changed.parent.mkdir(parents=True)
    changed.write_text((root / site.path).read_text().replace("a1 = a1 * topk_weights.to(a1.dtype)", "pass"))
    assert cs.missing_fragments(tmp_path, site) == ["a1 = a1 * topk_weights.to(a1.dtype)"]
    apply = _site("vllm==0.33.0", "self.fused_experts.apply")
    (tmp_path / apply.path).write_text((root / apply.path).read_text().replace(
        "            a2_scale=self.fused_experts.a2_scale,\n", "            a2_scale=self.fused_experts.a2_scale, gate=None,\n"))
    expected = cs.call_keywords(tmp_path, apply)
    assert "gate" in expected[1]
    assert "missing ['gate']" in cs.keyword_mismatch(expected, 0, cs.call_keywords(root, apply)[1])
    shutil.rmtree(tmp_path / "vllm")


# ---- vLLM ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("spec", VLLM)
def test_vllm_calls_apply_and_the_input_quant_with_the_layers_keywords(spec):
    root = _root(spec)
    config = _pair_config(("channel", "token"), spec, swiglu_limit=7.0)
    impl = load_factory(spec)(config)
    q = vllm_core.quant_config(config)
    experts = impl.files.experts(config, q)
    kw = impl.apply_kwargs(experts, None, None, None, make_problem(config), None, None)
    assert cs.keyword_mismatch(cs.call_keywords(root, _site(spec, "self.fused_experts.apply")), 0, kw) is None
    assert kw["global_num_experts"] == config.num_experts
    # the experts' own a2_scale, told apart from a literal None by a static one (diffmoe's schemes have none)
    static = impl.files.experts(config, dataclasses.replace(q, a2_scale=torch.ones(1)))
    assert impl.apply_kwargs(static, None, None, None, make_problem(config), None, None)["a2_scale"] is static.a2_scale
    quantize = cs.call_keywords(root, _site(spec, "moe_kernel_quantize_input"))
    assert cs.keyword_mismatch(quantize, 2, vllm_core.quantize_kwargs(q), ignore=vllm_core.MX_ONLY_QUANTIZE_KEYWORDS) is None
    # the SwiGLU limit where the quant methods put it (gemm1_clamp_limit) and where the layer does (FusedMoEConfig)
    assert q.gemm1_clamp_limit == 7.0 and experts.moe_config.swiglu_limit == 7.0
    assert vllm_core.quant_config(MoEConfig(**{**SMALL, "quant": "bf16"}, swiglu_limit=7.0)).gemm1_clamp_limit == 7.0


@pytest.mark.parametrize("spec", VLLM)
@pytest.mark.parametrize("pair", sorted(SCALE_PAIRS), ids="/".join)
def test_vllm_passes_each_pairs_flags_as_its_quant_method_does(spec, pair):
    assert set(cs.VLLM_PAIR_FLAGS) == set(SCALE_PAIRS)
    passed = vars(vllm_core.quant_config(_pair_config(pair, spec)))
    assert cs.flag_mismatch(cs.VLLM_PAIR_FLAGS[pair][1], passed) is None


@pytest.mark.parametrize("spec", VLLM)
def test_vllm_release_rows_are_what_each_wheels_apply_does(spec):
    """peers/vllm/core.py RELEASES, the adapter's per-release choices (the fused choice under a clamp, the map at
    the alignment), read in the release's TritonExperts.apply."""
    version = spec.partition("==")[2]
    release, root = vllm_core.RELEASES[version], _root(spec)
    site = next(s for s in cs.vllm_sites(version) if s.function == "TritonExperts.apply")
    assert release.clamp_unfuses_block_quant == cs.holds(root, site, "self.activation_config.clamp_limit is None")
    assert release.drops_remote_at_align == cs.holds(root, site, "ignore_invalid_experts=skip_invalid")


def test_a_vllm_adapter_passing_the_wrong_flag_or_dropping_a_keyword_is_caught():
    """Per-channel weights claimed for per-tensor ones (per_out_ch_quant=True), and apply called without the
    experts' a2_scale (the adapter's call before this check), each rejected with the field named."""
    wrong = vars(vllm_core.quant_config(_pair_config(("channel", "token"), "vllm")))
    assert "per_out_ch_quant=True where the layer passes False" in cs.flag_mismatch(
        cs.VLLM_PAIR_FLAGS[("tensor", "token")][1], wrong)
    spec = "vllm==0.33.0"
    expected = cs.call_keywords(_root(spec), _site(spec, "self.fused_experts.apply"))
    assert "missing ['a2_scale']" in cs.keyword_mismatch(expected, 0, expected[1] - {"a2_scale"})


# ---- SGLang --------------------------------------------------------------------------------------------------------


def _sglang_pairs():
    return sorted(cs.SGLANG_PAIR_FLAGS)


@pytest.mark.parametrize("spec", SGLANG)
def test_sglang_calls_fused_experts_with_the_runners_keywords_and_each_pairs_flags(spec):
    expected = cs.call_keywords(_root(spec), _site(spec, "fused_experts"))
    make = load_factory(spec)
    for pair in _sglang_pairs():
        config = _pair_config(pair, spec)
        kw = make(config).fused_experts_kwargs(make_problem(config))
        assert cs.keyword_mismatch(expected, 0, kw) is None
        assert cs.flag_mismatch(cs.SGLANG_PAIR_FLAGS[pair][1], kw) is None, pair
    # the pair no SGLang quant method builds is refused, not passed with a borrowed flag
    assert "weight_scales" in make.supports(_pair_config(("tensor", "token"), spec))


def _runner_departures(spec: str, runner: dict) -> set[str]:
    """The fields SGLang's fused_experts reads that `runner` sets apart from MoeRunnerConfig's defaults."""
    root = _root(spec)
    site = next(s for s in cs.sglang_sites(spec.partition("==")[2]) if s.feature == "runner config")
    reads = cs.attribute_reads(root, site, "moe_runner_config")
    assert reads <= set(runner), f"the adapter's runner config lacks {sorted(reads - set(runner))}"
    # a field the layer passes from one of its parameters takes that parameter's default, else the dataclass's
    layer = next(s for s in cs.sglang_sites(spec.partition("==")[2]) if s.function == cs.SGLANG_LAYER[1])
    defaults = {**cs.dataclass_defaults(root, *cs.SGLANG_RUNNER_CONFIG), **cs.parameter_defaults(root, layer)}
    return {f for f in reads if runner[f] != defaults[f]}


@pytest.mark.parametrize("spec", SGLANG)
def test_sglang_runner_config_is_the_layers_default_but_for_the_named_fields(spec):
    config = _pair_config(("block", "group"), spec)
    runner = vars(load_factory(spec)(config).runner_config())
    assert _runner_departures(spec, runner) == {"num_experts", "num_local_experts", "inplace"} <= set(cs.SGLANG_RUNNER_SET)
    assert runner["num_experts"] == runner["num_local_experts"] == config.num_experts
    scaled = load_factory(peer_factory_spec(spec, "make_scaled"))(config)
    assert _runner_departures(spec, vars(scaled.runner_config())) - {"num_experts", "num_local_experts", "inplace"} == {
        "routed_scaling_factor"}


def test_an_sglang_runner_config_with_a_field_of_its_own_is_caught():
    spec = "sglang==0.5.23"
    runner = vars(load_factory(spec)(_pair_config(("block", "group"), spec)).runner_config())
    assert "apply_router_weight_on_input" in _runner_departures(spec, {**runner, "apply_router_weight_on_input": True})
    with pytest.raises(AssertionError, match="lacks \\['swiglu_limit'\\]"):
        _runner_departures(spec, {k: v for k, v in runner.items() if k != "swiglu_limit"})


def test_an_sglang_call_with_the_wrong_flag_or_positional_arguments_is_caught():
    spec = "sglang==0.5.23"
    config = _pair_config(("channel", "token"), spec)
    kw = load_factory(spec)(config).fused_experts_kwargs(make_problem(config))
    assert "per_channel_quant=False where the layer passes True" in cs.flag_mismatch(
        cs.SGLANG_PAIR_FLAGS[("channel", "token")][1], {**kw, "per_channel_quant": False})
    # the adapter's call before this check: five positional arguments and four keywords
    old = cs.keyword_mismatch(cs.call_keywords(_root(spec), _site(spec, "fused_experts")), 5,
                              {"use_fp8_w8a8", "per_channel_quant", "w1_scale", "w2_scale", "block_shape"})
    assert "5 positional arguments, the call site passes 0" in old and "'a1_scale'" in old


# ---- lmdeploy and Liger ----------------------------------------------------------------------------------------------


def test_lmdeploy_calls_its_kernel_and_quant_as_its_moe_impl_does():
    root = _root("lmdeploy")
    config = _pair_config(("block", "group"), "lmdeploy")
    impl = load_factory("lmdeploy")(config)
    problem = make_problem(config)
    call = cs.call_keywords(root, _site("lmdeploy", "fused_moe_blocked_fp8"))
    assert cs.keyword_mismatch(call, 6, impl.call_kwargs(problem)) is None
    assert impl.call_kwargs(problem)["num_experts"] is None  # every expert local: the layer passes None
    assert cs.keyword_mismatch(cs.call_keywords(root, _site("lmdeploy", "quant_fp8")), 2, impl.quant_kwargs(problem)) is None
    # the adapter's call before this check: nine positional arguments, num_experts=E
    old = cs.keyword_mismatch(call, 9, {"out_dtype", "num_experts"})
    assert "9 positional arguments" in old and "'topk_weights'" in old


def test_liger_calls_its_function_as_its_experts_module_does():
    root = _root("liger")
    config = MoEConfig(**{**SMALL, "quant": "bf16"})
    args = load_factory("liger")(config).apply_args(make_problem(config))
    expected = cs.call_keywords(root, _site("liger", "LigerFusedMoEFunction.apply"))
    assert cs.keyword_mismatch(expected, len(args), ()) is None and str(args[3].dtype) == "torch.int32"
    assert cs.keyword_mismatch(expected, 4, ()) == "4 positional arguments, the call site passes 5"
