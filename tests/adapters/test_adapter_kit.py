"""The adapter kit (diffmoe/adapters/kit/): loading a package's files from a folder, a wheel or an
installed distribution; stubs made on demand that raise naming the symbol when called; the
stand-in ops' conventions (each one's departure from the other caught, the stated facts held)."""

from __future__ import annotations

import sys
import zipfile

import pytest
import torch

from diffmoe.adapters import kit
from diffmoe.adapters.kit import standins

PKG = {
    "toy/__init__.py": "raise ImportError('a package __init__ must never run')\n",
    "toy/helpers.py": "from toy_engine.distributed import get_group\nfrom toy_engine.utils import is_cuda\n"
                      "CUDA = is_cuda()\n\ndef twice(x):\n    return 2 * x\n",
    "toy/moe.py": "from .helpers import twice, CUDA\n\ndef run(x):\n    if CUDA:\n        return twice(x)\n"
                  "    from toy_engine.env import flags\n    return flags.value()\n",
}
FILES = [("toy.helpers", "toy/helpers.py"), ("toy.moe", "toy/moe.py")]


def stubs(cuda: bool = True) -> kit.Stubs:
    return kit.Stubs(["toy_engine"], values={"toy_engine.utils": {"is_cuda": lambda: cuda}})


@pytest.fixture
def folder(tmp_path):
    for rel, text in PKG.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    return tmp_path


@pytest.mark.parametrize("kind", ["folder", "wheel"])
def test_a_packages_files_load_by_path_with_their_imports_stubbed(folder, tmp_path, kind):
    if kind == "wheel":
        wheel = tmp_path / "toy-1.0-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w") as zf:
            for rel, text in PKG.items():
                zf.writestr(rel, text)
        source = kit.PackageSource.wheel(wheel)
    else:
        source = kit.PackageSource.folder(folder)
    loaded = kit.load_modules(source, FILES, stubs=stubs())
    assert loaded["toy.moe"].run(3) == 6  # the relative import resolved, no __init__ ran
    assert isinstance(loaded["toy_engine.distributed"], kit.StubModule)
    assert "toy.moe" not in sys.modules and "toy_engine" not in sys.modules  # nothing left behind


def test_a_hook_sees_each_file_right_after_it_loads(folder):
    """`loaded_hook(name, module)` runs after each file and before the next imports it (lmdeploy's adapter
    answers a device query there before the kernels that read it load)."""
    seen = []

    def hook(name, module):
        seen.append(name)
        if name == "toy.helpers":
            module.twice = lambda x: 10 * x  # the next file imports the patched name

    loaded = kit.load_modules(kit.PackageSource.folder(folder), FILES, stubs=stubs(), loaded_hook=hook)
    assert seen == ["toy.helpers", "toy.moe"] and loaded["toy.moe"].run(3) == 30


def test_a_stub_that_is_called_raises_naming_the_symbol(folder):
    loaded = kit.load_modules(kit.PackageSource.folder(folder), FILES, stubs=stubs(cuda=False))
    with loaded.installed(), pytest.raises(NotImplementedError, match=r"toy_engine\.env\.flags\.value is a stub"):
        loaded["toy.moe"].run(3)  # a call-time import of a module nobody loaded: a stub, called
    with pytest.raises(NotImplementedError, match=r"toy_engine\.distributed\.get_group is a stub"):
        loaded["toy.helpers"].get_group()
    assert "toy_engine.env" not in sys.modules


def test_sources_refuse_what_they_are_not():
    with pytest.raises(ValueError, match="folder must be an existing directory"):
        kit.PackageSource.folder("/nonexistent/dir")
    with pytest.raises(ValueError, match="distribution must be an installed distribution"):
        kit.PackageSource.distribution("no-such-distribution-xyz")
    assert kit.PackageSource.distribution("torch").kind == "folder"


def _align(ids, num_experts, block, invalid, blocks_past_total):
    numel = ids.numel()
    s = torch.full((numel + (num_experts + 1) * (block - 1) + 8,), -7, dtype=torch.int32)
    e = torch.full((s.numel() // block + 1,), -9, dtype=torch.int32)
    n = torch.zeros(1, dtype=torch.int32)
    standins.moe_align_block_size(ids, num_experts, block, s, e, n, invalid=invalid, blocks_past_total=blocks_past_total)
    return s, e, int(n)


def test_the_plus_one_bucket_sorts_the_minus_one_ids_first_under_expert_minus_one():
    ids = torch.tensor([[1, -1], [0, 1]])
    s, e, total = _align(ids, 2, 4, "bucket", None)
    assert total == 12 and s[:12].tolist() == [1, 4, 4, 4, 2, 4, 4, 4, 0, 3, 4, 4]
    assert e[:3].tolist() == [-1, 0, 1] and set(e[3:].tolist()) == {-9}  # past the total: unwritten
    s, e, total = _align(ids, 2, 4, "skip", 0)  # vLLM's: the -1 slot is neither counted nor placed
    assert total == 8 and s[:8].tolist() == [2, 4, 4, 4, 0, 3, 4, 4] and e[:2].tolist() == [0, 1]
    assert set(e[2:].tolist()) == {0}
    with pytest.raises(ValueError, match=r"topk_ids must lie in \[-1, 1\]"):
        _align(torch.tensor([[2, 0]]), 2, 4, "bucket", None)


def test_the_quant_conventions_are_each_their_own_rounding():
    torch.manual_seed(0)
    x = (torch.randn(64, 256) * 3).bfloat16()
    out = [torch.empty(64, 256, dtype=standins.FP8) for _ in range(2)]
    scales = [torch.empty(64, 1) for _ in range(2)]
    standins.quant_token(x, out[0], scales[0], codes="divide", floor=None)
    standins.quant_token(x, out[1], scales[1], codes="reciprocal", floor=None)
    assert torch.equal(scales[0], scales[1]) and not torch.equal(out[0].view(torch.uint8), out[1].view(torch.uint8))
    gs = [torch.empty(64, 2) for _ in range(2)]
    standins.quant_group(x, 128, out[0], gs[0], scale_rule="divide", codes="divide")
    standins.quant_group(x, 128, out[1], gs[1], scale_rule="product", codes="reciprocal_amax")
    assert not torch.equal(gs[0], gs[1])  # amax / 448 and amax * (1 / 448) differ in the last bit somewhere
    zero = torch.zeros(2, 128, dtype=torch.bfloat16)
    codes, s = torch.empty(2, 128, dtype=standins.FP8), torch.empty(2, 1)
    standins.quant_token(zero, codes, s, codes="reciprocal", floor=None, zero_scale_codes=0.0)
    assert float(s.max()) == 0 and float(codes.float().abs().max()) == 0  # SGLang's scale_inv = 0 for a zero row


def test_silu_and_mul_rounding_and_skipped_rows():
    torch.manual_seed(1)
    x = torch.randn(6, 256).bfloat16()
    once, twice = torch.empty(6, 128, dtype=torch.bfloat16), torch.empty(6, 128, dtype=torch.bfloat16)
    standins.silu_and_mul(x, once, rounding="once")
    standins.silu_and_mul(x, twice, rounding="silu_to_bf16")
    assert not torch.equal(once, twice)
    g = x[:, :128].float()
    assert torch.equal(once, (g / (1 + torch.exp(-g)) * x[:, 128:].float()).bfloat16())
    kept = torch.full((6, 128), 7.0, dtype=torch.bfloat16)
    standins.silu_and_mul(x, kept, skip_rows=torch.tensor([False, True, False, False, False, True]))
    assert torch.equal(kept[1], torch.full((128,), 7.0, dtype=torch.bfloat16)) and torch.equal(kept[0], once[0])


def test_moe_sum_precisions():
    torch.manual_seed(2)
    rows = torch.randn(16, 3, 128).bfloat16()
    fp32, bf16 = torch.empty(16, 128, dtype=torch.bfloat16), torch.empty(16, 128, dtype=torch.bfloat16)
    standins.moe_sum(rows, fp32, precision="fp32")
    standins.moe_sum(rows, bf16, precision="bf16_k2_to_4")
    assert torch.equal(fp32, rows.float().sum(1).bfloat16()) and not torch.equal(fp32, bf16)
    scaled = torch.empty_like(fp32)
    standins.moe_sum(rows, scaled, precision="fp32", scale=2.5)
    assert torch.equal(scaled, (rows.float().sum(1) * 2.5).bfloat16())


# ---- automatic launch attribution (kit/attribution.py) ----

def _attribution(recorder=None, names=None):
    from diffmoe.problem.config import MoEConfig
    from diffmoe.problem.inputs import make_problem

    config = MoEConfig(num_tokens=4, num_experts=4, topk=2, hidden=128, inter=128, quant="fp8-token", fused=False)
    problem = make_problem(config)
    return kit.Attribution(config, problem, recorder, names), problem


def test_attribution_names_each_launch_stage_and_buffers_from_the_tensors_it_touches():
    from diffmoe.check.recording import LaunchLog
    from diffmoe.problem.vocabulary import FP8_DTYPE, Stages

    log = LaunchLog(snapshot=False)
    attribution, problem = _attribution(log)
    codes, scales = torch.empty(4, 128, dtype=FP8_DTYPE), torch.empty(4, 1)
    attribution.op("quant", {"input": problem.hidden_states}, {"output": codes, "scale": scales}, lambda: None)
    gate_up = torch.empty(8, 256, dtype=torch.bfloat16)
    attribution.launch("gemm", (1,), {"a": codes, "b": problem.w1, "a_s": scales, "b_s": problem.w1_scale,
                                      "w": problem.topk_weights, "c": gate_up}, lambda: None)
    assert [(launch.stage, sorted(r.name for r in launch.writes)) for launch in log.launches] == [
        (Stages.QUANT_INPUT, ["quanted_gate_up_input", "quanted_gate_up_input_scales"]),
        (Stages.GATE_UP_GEMM, ["gate_up_output"])]
    # the router weights passed to the gate/up GEMM are not its read: the down GEMM's, as the pipeline says
    assert "topk_weights" not in {r.name for r in log.launches[1].reads}
    # why each has its stage, for `check --launches` (issue 49)
    assert log.launches[0].why == ("the adapter kit's attribution: reads hidden_states, which quant_input reads "
                                   "(the latest stage reading a buffer it reads)")
    assert "which gate_up_gemm reads" in log.launches[1].why


def test_attribution_follows_buffers_carved_from_one_allocation():
    """A kernel that carves its intermediates from one allocation (vLLM's and FlagGems' cache13: the
    down GEMM's output over the gate/up output's bytes, dead by then): the down GEMM's store is its
    write, down_output, not a read of gate_up_output, which made four bogus findings (issue 49); and
    two views of one allocation that share no byte are two buffers."""
    from diffmoe.check.recording import LaunchLog
    from diffmoe.problem.vocabulary import FP8_DTYPE, Stages

    log = LaunchLog(snapshot=False)
    attribution, problem = _attribution(log)
    tk, inter, hidden = 8, 128, 128
    codes, scales = torch.empty(4, hidden, dtype=FP8_DTYPE), torch.empty(4, 1)
    attribution.op("quant", {"input": problem.hidden_states}, {"output": codes, "scale": scales}, lambda: None)
    cache13 = torch.empty(tk * max(2 * inter, hidden), dtype=torch.bfloat16)
    cache1, cache3 = cache13[: tk * 2 * inter].view(tk, 2 * inter), cache13[: tk * hidden].view(tk, hidden)
    attribution.launch("gemm1", (1,), {"a": codes, "b": problem.w1, "a_s": scales, "b_s": problem.w1_scale,
                                       "c": cache1}, lambda: None)
    down_codes, down_scales = torch.empty(tk, inter, dtype=FP8_DTYPE), torch.empty(tk, 1)
    attribution.launch("act", (1,), {"x": cache1, "q": down_codes, "s": down_scales}, lambda: None)
    attribution.launch("gemm2", (1,), {"a": down_codes, "b": problem.w2, "a_s": down_scales,
                                       "b_s": problem.w2_scale, "c": cache3}, lambda: None)
    down = log.launches[-1]
    assert down.stage == Stages.DOWN_GEMM and [w.name for w in down.writes] == ["down_output"]
    assert "gate_up_output" not in {r.name for r in down.reads}
    assert "gate_up_output's bytes" in down.why and attribution.name_of(cache3) == "down_output"
    # disjoint views of one allocation: the second is a fresh write, not the first's read
    apart = torch.empty(2 * tk * hidden, dtype=torch.bfloat16)
    first, second = apart[: tk * hidden].view(tk, hidden), apart[tk * hidden:].view(tk, hidden)
    attribution.name(first, "private:scratch")
    attribution.launch("gemm2", (1,), {"a": down_codes, "b": problem.w2, "a_s": down_scales,
                                       "b_s": problem.w2_scale, "c": second}, lambda: None)
    assert [w.name for w in log.launches[-1].writes] == ["down_output"]
    assert attribution.name_of(second) == "down_output" and attribution.name_of(first) == "private:scratch"


def test_a_launch_reading_only_private_buffers_is_placed_with_their_writer_or_by_its_position():
    """A staged alignment (FlagGems'): its second kernel reads only the first's private counts. It was
    a ValueError ("reads none of the pipeline's buffers", issue 49); it is the alignment's."""
    from diffmoe.check.recording import LaunchLog
    from diffmoe.problem.vocabulary import Stages

    log = LaunchLog(snapshot=False)
    attribution, problem = _attribution(log)
    ids = attribution.name(problem.topk_ids.to(torch.int32), "topk_ids")
    counts, sorted_ids = torch.zeros(4, dtype=torch.int32), torch.empty(16, dtype=torch.int32)
    attribution.launch("count", (1,), {"topk_ids": ids, "counts": counts}, lambda: None)
    attribution.launch("scatter", (1,), {"counts": counts, "sorted_token_ids": sorted_ids}, lambda: None)
    scatter = log.launches[-1]
    assert scatter.stage == Stages.ALIGN and [w.name for w in scatter.writes] == ["sorted_token_ids"]
    assert "private:counts, which align wrote" in scatter.why
    attribution.launch("bookkeeping", (1,), {"flags": torch.zeros(2)}, lambda: None)  # nothing named: its position
    assert log.launches[-1].stage == Stages.ALIGN and "placed by its position" in log.launches[-1].why


def test_attribution_takes_the_adapters_names_and_refuses_a_launch_it_cannot_place():
    attribution, problem = _attribution(names={"scratch": "private:tile_offsets"})
    ids = attribution.name(problem.topk_ids.to(torch.int32), "topk_ids")
    scratch, sorted_ids = torch.empty(3, dtype=torch.int32), torch.empty(16, dtype=torch.int32)
    attribution.op("align", {"topk_ids": ids}, {"scratch": scratch, "sorted_token_ids": sorted_ids}, lambda: None)
    assert attribution.name_of(scratch) == "private:tile_offsets" and attribution.name_of(sorted_ids) == "sorted_token_ids"
    with pytest.raises(ValueError, match="mystery reads none of the pipeline's buffers .* no launch came before it"):
        _attribution()[0].launch("mystery", (1,), {"x": torch.empty(4)}, lambda: None)  # a run's first launch


def test_a_context_override_forces_its_value_inside_the_block_only():
    from diffmoe.adapters.kit.stubs import context_override

    get, override = context_override("test_override")
    assert get() is None
    with override({"BLOCK_SIZE_M": 16}):
        with override({"BLOCK_SIZE_M": 32}):
            assert get() == {"BLOCK_SIZE_M": 32}
        assert get() == {"BLOCK_SIZE_M": 16}
    assert get() is None
