"""The peers as packages (issue 44, item 5): one package per project with one release table, what
each adapter runs declared (diffmoe.adapters.kit.Supports), nothing changed by importing them, and
the old module paths served for one release with a warning.

No wheel is needed: building a factory reads no peer file (the files load at the first run).
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import warnings

import pytest

from diffmoe.adapters import peer_wheels
from diffmoe.adapters.kit import Rule, Supports
from diffmoe.adapters.loading import load_factory
from diffmoe.contract import (
    IMPLEMENTATION_ALIASES, PEER_PROJECTS, WHEEL_FUNCTIONS, peer_factory_spec, peer_release_tables, resolve_factory,
)
from diffmoe.problem.config import MoEConfig

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_every_release_of_every_table_has_an_alias_a_pin_and_a_factory():
    for project, table in peer_release_tables().items():
        assert table.DEFAULT in table.RELEASES and table.PROJECT == project
        assert IMPLEMENTATION_ALIASES[project] == IMPLEMENTATION_ALIASES[f"{project}=={table.DEFAULT}"]
        assert peer_wheels.PEERS[project] is peer_wheels.PEERS[f"{project}=={table.DEFAULT}"]
        for version in table.RELEASES:
            name = f"{project}=={version}"
            assert peer_wheels.PEERS[name].version == version
            make = load_factory(name)
            assert f"{make.__module__}:{make.__qualname__}" == IMPLEMENTATION_ALIASES[name] == peer_factory_spec(name)
            assert make.__module__ == PEER_PROJECTS[project]  # one package per project, no module per release
            assert peer_wheels.peer(resolve_factory(make).peer_wheel).version == version
    assert set(WHEEL_FUNCTIONS) == {f"sglang=={v}" for v in peer_release_tables()["sglang"].RELEASES}


def test_adding_a_release_is_one_row(monkeypatch):
    """A row planted in vLLM's table is a release: its alias, its wheel name and its factory follow."""
    table = peer_release_tables()["vllm"]
    row = dataclasses.replace(table.RELEASES["0.33.0"], version="0.99.0", sha256="0" * 64)
    monkeypatch.setitem(table.RELEASES, "0.99.0", row)
    assert peer_factory_spec("vllm==0.99.0") == "peers.vllm:make_0_99_0"
    assert peer_wheels.release_wheels("vllm", table.RELEASES, table.DEFAULT)["vllm==0.99.0"].version == "0.99.0"
    make = load_factory("peers.vllm:make_0_99_0")
    assert make.release is row and resolve_factory(make).peer_wheel == "vllm==0.99.0"


def test_an_unknown_release_or_project_is_one_line():
    with pytest.raises(ValueError, match=r"vllm must be one of the releases diffmoe runs \(0.28.0, 0.30.0, 0.33.0\), got '0.1.0'"):
        peer_factory_spec("vllm==0.1.0")
    with pytest.raises(ValueError, match="peer must be one of"):
        peer_factory_spec("tensorrt")
    with pytest.raises(ValueError, match="has no callable 'make_0_1_0'"):
        load_factory("peers.vllm:make_0_1_0")


@pytest.mark.parametrize("alias", ["vllm", "vllm==0.28.0", "sglang", "liger==0.8.0", "lmdeploy"])
def test_every_peer_declares_what_it_runs(alias):
    """No hand-written refusal ladder: each factory's `supports` is a Supports, quiet on a config it
    runs and one line naming the field on one it does not."""
    supports = resolve_factory(load_factory(alias)).supports
    assert isinstance(supports, Supports) and "activation" in supports.fields()
    runs = {"vllm": dict(quant="bf16"), "sglang": dict(quant="bf16"), "liger": dict(quant="bf16"),
            "lmdeploy": dict(quant="fp8-block")}[alias.partition("==")[0]]
    c = MoEConfig(num_tokens=4, num_experts=4, topk=2, hidden=256, inter=256, fused=False, **runs)
    assert supports(c) is None
    refused = supports(c.replace(router_weight="input", topk=1) if alias.startswith(("sglang", "liger", "lmdeploy"))
                       else c.replace(routed_scaling_factor=2.0))
    assert refused is not None and refused.startswith(("router_weight must be 'down'", "routed_scaling_factor must be None"))


def test_importing_the_peers_changes_no_environment():
    code = ("import os, json; before = dict(os.environ)\n"
            "import peers, peers.vllm, peers.sglang, peers.liger, peers.lmdeploy, peers.common, peers.vllm.core\n"
            "print(json.dumps({k: v for k, v in os.environ.items() if before.get(k) != v}))")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {}


@pytest.mark.parametrize("old, name, new", [
    ("peers.vllm_0_28", "make", "peers.vllm:make_0_28_0"),
    ("peers.sglang_0_5_23", "make_fallback", "peers.sglang:make_fallback_0_5_23"),
    ("peers.liger_0_8_0", "make_wide", "peers.liger:make_wide_0_8_0"),
    ("peers.liger_0_8", "make", "peers.liger:make_0_8_5"),
    ("peers.lmdeploy_0_18", "make", "peers.lmdeploy:make_0_18_0"),
])
def test_an_old_factory_path_works_for_one_release_with_a_warning(old, name, new):
    sys.modules.pop(old, None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        factory = load_factory(f"{old}:{name}")
    assert factory is load_factory(new)  # the same object: a replay line names the new path
    assert any(issubclass(w.category, DeprecationWarning) and new.split(":")[1] in str(w.message) for w in caught)


def test_an_old_module_path_gives_the_moved_module_s_names():
    sys.modules.pop("peers.vllm_core", None)
    with pytest.warns(DeprecationWarning, match="peers.vllm.core"):
        from peers import vllm_core
    from peers.vllm import core

    assert vllm_core.quant_config is core.quant_config
    with pytest.warns(DeprecationWarning, match="peers.common.launch_grid"):
        from peers import launch_grid
    assert launch_grid is core.__dict__.get("launch_grid", launch_grid)


# ---- the declared rules themselves (diffmoe.adapters.kit.Supports) ---------------------------------

RULES = Supports(
    "a kernel",
    Rule("quant", ("bf16", "fp8-block"), "it has no per-tensor path"),
    Rule("fused", lambda c: (c.quant == "fp8-block",), when=lambda c: c.quant == "fp8-block", condition="quant='fp8-block'",
         why="it always fuses there"),
    Rule("hidden", refused=(384,), when=lambda c: c.quant == "fp8-block", condition="quant='fp8-block'", why="a tail"),
    Rule("swiglu_limit", why="no clamp"),
)


@pytest.mark.parametrize("fields, message", [
    (dict(quant="fp8-token"), "quant must be 'bf16' or 'fp8-block' for a kernel: it has no per-tensor path, got 'fp8-token'"),
    (dict(quant="fp8-block", fused=False), "fused must be true with quant='fp8-block' for a kernel: it always fuses there, got false"),
    (dict(quant="fp8-block", fused=True, hidden=384), "hidden must be other than 384 with quant='fp8-block' for a kernel: a tail, got 384"),
    (dict(quant="bf16", swiglu_limit=7.0), "swiglu_limit must be None for a kernel: no clamp, got 7.0"),
])
def test_a_broken_rule_is_one_line_naming_the_field(fields, message):
    c = MoEConfig(**{**dict(num_tokens=2, num_experts=2, topk=1, hidden=256, inter=256, fused=False), **fields})
    assert RULES(c) == message
    with pytest.raises(ValueError, match="^" + message.split(":")[0]):
        RULES.check(c)


def test_a_config_every_rule_holds_is_supported():
    assert RULES(MoEConfig(num_tokens=2, num_experts=2, topk=1, hidden=256, inter=256, quant="bf16", fused=False)) is None
    assert RULES(MoEConfig(num_tokens=2, num_experts=2, topk=1, hidden=256, inter=256, quant="fp8-block", fused=True)) is None


def test_a_rule_on_no_field_or_with_both_lists_is_refused():
    with pytest.raises(ValueError, match="field must be a MoEConfig field, got 'quantization'"):
        Rule("quantization", ("bf16",))
    with pytest.raises(ValueError, match="allowed or refused"):
        Rule("quant", ("bf16",), refused=("fp8-block",))
    with pytest.raises(TypeError, match="rules must be Rule objects"):
        Supports("x", "quant must be bf16")


@pytest.mark.parametrize("peer, files", [("vllm", "peers.vllm.core:VllmFiles"), ("liger", "peers.liger.core:LigerFiles"),
                                         ("lmdeploy", "peers.lmdeploy.core:LmdeployFiles")])
def test_every_peer_loads_its_files_with_the_adapter_kit(peer, files):
    """Every peer on the kit: its files executed by diffmoe.adapters.kit.load_modules (SGLang's adapter was
    written on it; vLLM's, Liger's and lmdeploy's loaders are the kit's since issue 44)."""
    import importlib

    import torch

    from diffmoe.adapters import kit

    try:
        peer_wheels.fetch(peer)
    except peer_wheels.PeerError as exc:
        if os.environ.get("CI", "").lower() == "true":
            raise
        pytest.skip(f"no {peer} wheel here and no network: {exc}")
    module, _, name = files.partition(":")
    cls = getattr(importlib.import_module(module), name)
    if peer == "vllm":
        cls = cls.of_release(peer_release_tables()["vllm"].RELEASES["0.33.0"])
    elif peer == "liger":
        cls = cls.of_release("liger")
    loaded = cls.get(torch.device("cpu"))
    assert isinstance(loaded.modules, kit.LoadedModules) and loaded.modules.stubs is None
    with loaded.installed():
        assert all(sys.modules[n] is m for n, m in loaded.modules.items())
    assert not any(n in sys.modules and sys.modules[n] is m for n, m in loaded.modules.items() if n.startswith(peer))
