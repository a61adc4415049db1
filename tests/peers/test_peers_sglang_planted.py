"""Bugs planted into SGLang 0.5.23's own code, each caught and named (issue 28): SGLang is loaded
from a modified copy of the peer cache (the adapter kit loads a folder; the cache itself is never
edited), and `--impl sglang` (peers/sglang/core.py) is judged on it.

  * overlapping caches: fused_moe.py's intermediate_cache3 (the down GEMM's store) made a view of
    intermediate_cache2 (its bf16 input): named by the runtime-aliasing oracle, both buffers named;
  * a dropped store mask: fused_moe_kernel's final store without `mask=c_mask`, so the padding rows
    of a block (sorted id = the sentinel T*K) store one row past the cache: the bounds oracle's
    out-of-bounds store naming the kernel, refused by the memory-safe interpreter, not a crash;
  * an off-by-one in the padded sorted ids: the align's padding entries hold T*K - 1 (the last routed
    slot) instead of the sentinel T*K, so the padding rows recompute and store the last row: named at
    the gate/up GEMM (two programs of one launch store the same row: the races oracle).
"""

from __future__ import annotations

import shutil

import pytest

from diffmoe.adapters import peer_wheels
from diffmoe.findings import Oracles
from diffmoe.judge.runner import run_differential
from diffmoe.problem.config import MoEConfig
from diffmoe.problem.vocabulary import Buffers, Stages

PEER = "sglang==0.5.23"
KERNELS = "sglang/kernels/ops/moe/fused_moe_triton_kernels.py"
FUSED_MOE = "sglang/srt/layers/moe/moe_runner/triton_utils/fused_moe.py"


@pytest.fixture(scope="module", autouse=True)
def sglang_wheel():
    try:
        peer_wheels.fetch(PEER)
    except peer_wheels.PeerError as exc:
        pytest.skip(f"{exc}")


def planted(tmp_path, monkeypatch, path: str, needle: str, replacement: str):
    """The peer cache copied under tmp_path with `needle` (once in `path`) replaced, and used."""
    source = peer_wheels.peer_root(PEER)
    copy = tmp_path / "cache" / source.name
    shutil.copytree(source, copy)
    text = (copy / path).read_text()
    assert text.count(needle) == 1, f"{path} no longer holds the planted line once: re-pin the plant"
    (copy / path).write_text(text.replace(needle, replacement))
    monkeypatch.setenv(peer_wheels.CACHE_ENV, str(tmp_path / "cache"))


def make():
    from peers.sglang import make

    return make


def config(**kw) -> MoEConfig:
    return MoEConfig(**{**dict(num_tokens=4, num_experts=4, topk=2, hidden=128, inter=128, quant="bf16", fused=False), **kw})


def test_unplanted_the_same_configs_pass():
    report = run_differential(config(), make(), oracles=[Oracles.RUNTIME_ALIASING, Oracles.BOUNDS, Oracles.DIFFERENTIAL,
                                                         Oracles.RACES])
    assert report.passed, report.render()


def test_overlapping_caches_are_named(tmp_path, monkeypatch):
    needle = "    intermediate_cache3 = torch.empty(\n        (num_tokens, topk, w2.shape[1]),"
    # hidden == inter: intermediate_cache2 [T*K, I] holds exactly intermediate_cache3's [T, K, H]
    planted(tmp_path, monkeypatch, FUSED_MOE, needle,
            "    intermediate_cache3 = intermediate_cache2.view(num_tokens, topk, w2.shape[1])\n"
            "    _unused = torch.empty(\n        (num_tokens, topk, w2.shape[1]),")
    report = run_differential(config(), make(), oracles=[Oracles.RUNTIME_ALIASING])
    assert not report.passed, report.render()
    finding = report.findings[0]
    assert finding.oracle == Oracles.RUNTIME_ALIASING and finding.stage == Stages.DOWN_GEMM, report.render()
    assert "down_output written by down_gemm clobbers activation_output" in finding.message, report.render()


def test_a_dropped_store_mask_is_an_out_of_bounds_store_not_a_crash(tmp_path, monkeypatch):
    needle = ("        c_mask = token_mask[:, None] & (offs_cn[None, :] < N)\n"
              "        tl.store(c_ptrs, accumulator, mask=c_mask)\n\n    if USE_GDC and not GDC_EARLY:")
    planted(tmp_path, monkeypatch, KERNELS, needle, needle.replace("tl.store(c_ptrs, accumulator, mask=c_mask)",
                                                                   "tl.store(c_ptrs, accumulator)"))
    report = run_differential(config(), make(), oracles=[Oracles.BOUNDS])
    assert {f.oracle for f in report.findings} == {Oracles.BOUNDS}, report.render()  # no crash finding
    finding = report.findings[0]
    assert finding.stage == Stages.GATE_UP_GEMM and "fused_moe_kernel stores" in finding.message, report.render()
    assert "outside the allocation" in finding.message and "was not performed" in finding.message, report.render()


def test_an_off_by_one_in_the_padded_sorted_ids_is_named(tmp_path, monkeypatch):
    """The align stand-in SGLang's file calls, wrapped so its padding is one short of the sentinel
    (a plant in the stand-in, the SGLang peer's op library, loaded fresh for the copied cache)."""
    from peers.sglang import standins as sglang_standins

    real = sglang_standins.moe_align_block_size

    def off_by_one(topk_ids, num_buckets, block_size, sorted_ids, *args, **kwargs):
        real(topk_ids, num_buckets, block_size, sorted_ids, *args, **kwargs)
        sorted_ids[sorted_ids == topk_ids.numel()] = topk_ids.numel() - 1

    monkeypatch.setattr(sglang_standins, "moe_align_block_size", off_by_one)
    planted(tmp_path, monkeypatch, FUSED_MOE, "def fused_experts(", "def fused_experts(")  # a fresh load sees the plant
    report = run_differential(config(), make(), oracles=[Oracles.DIFFERENTIAL, Oracles.RACES])
    assert not report.passed and report.findings[0].stage == Stages.GATE_UP_GEMM, report.render()
    # padding rows store the last routed row again: two programs of one launch write the same bytes
    assert any(f.oracle == Oracles.RACES and f.stage == Stages.GATE_UP_GEMM and Buffers.GATE_UP_OUTPUT in f.message
               for f in report.findings), report.render()
