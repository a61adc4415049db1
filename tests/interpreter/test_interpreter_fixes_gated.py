"""The probe-gated interpreter fixes (diffmoe/interpreter/fixes.py, GATED_FIXES): each doctor
probe finds its defect on triton 3.9's own interpreter and nothing with the fix in place; a fix
is applied only where its probe found the defect, and only on the Triton it was written for.

What these defects break is a third-party kernel: lmdeploy 0.18's blocked-FP8 MoE
(tests/peers/test_peers_lmdeploy.py runs it).
"""

from __future__ import annotations

import json

import pytest
import torch
import triton
import triton.language as tl

from diffmoe.backend import conformance
from diffmoe.backend import doctor
from diffmoe.interpreter import fixes
from diffmoe.backend.conformance import DEFECT, OK

pytestmark = pytest.mark.skipif(not conformance.interpreter_enabled(),
                                reason="fixes the Triton interpreter (TRITON_INTERPRET=1)")

CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def _fixes_installed_after():
    fixes.install(probe=conformance.gated_probe)
    yield
    fixes.install(probe=conformance.gated_probe)


@pytest.mark.parametrize("key", fixes.GATED_FIXES)
def test_each_probe_finds_its_defect_without_the_fix_and_none_with_it(key):
    with fixes.suspended(gated=True):
        assert key not in fixes.gated_installed()
        without = conformance.run_probe(key, CPU, True)
    assert without.status == DEFECT and without.mismatches > 0, without
    assert key in fixes.gated_installed()
    with_fix = conformance.run_probe(key, CPU, True)
    assert with_fix.status == OK and with_fix.mismatches == 0, with_fix


def test_without_a_probe_the_gated_fixes_wait_for_one(monkeypatch):
    """The interpreter layer does not import the backend's probes (issue 44): a bare install()
    patches the casts and dots and says the gated fixes were not checked; the first call that
    gives the probe applies them."""
    fixes.uninstall()
    monkeypatch.setattr(fixes, "_probe", None)
    monkeypatch.setattr(fixes, "_gated_verdicts", {})
    bare = fixes.install()
    assert bare.installed and bare.reason.endswith(fixes.NO_PROBE) and fixes.gated_installed() == ()
    probed = fixes.install(probe=conformance.gated_probe)
    assert set(fixes.gated_installed()) == set(fixes.GATED_FIXES) and "probe-gated fixes applied" in probed.reason
    assert fixes.DEFECT == conformance.DEFECT


def test_suspended_keeps_the_gated_fixes_and_gated_suspends_them_too():
    with fixes.suspended():
        assert not fixes.installed() and fixes.gated_installed() == fixes.GATED_FIXES
    with fixes.suspended(gated=True):
        assert not fixes.installed() and fixes.gated_installed() == ()
    assert fixes.installed() and fixes.gated_installed() == fixes.GATED_FIXES


def test_a_fix_whose_probe_finds_nothing_is_not_applied(monkeypatch):
    fixes.uninstall()
    monkeypatch.setitem(fixes._gated_verdicts, "builtin_alias", OK)  # as a Triton that resolves aliases would probe
    status = fixes.install()
    assert "builtin_alias" not in fixes.gated_installed() and "not needed: builtin_alias ok" in status.reason
    assert set(fixes.gated_installed()) == set(fixes.GATED_FIXES) - {"builtin_alias"}
    monkeypatch.undo()
    fixes.uninstall()


def test_another_triton_version_gets_no_gated_fix(monkeypatch):
    from triton.runtime import interpreter

    fixes.uninstall()
    before = interpreter.InterpreterBuilder.__dict__["binary_op"], interpreter._patch_lang
    monkeypatch.setattr(triton, "__version__", "3.10.0")
    assert not fixes.install().installed
    with fixes._lock:
        reason = fixes._install_gated_locked()
    assert "3.10.0" in reason and "nothing patched" in reason and fixes.gated_installed() == ()
    assert (interpreter.InterpreterBuilder.__dict__["binary_op"], interpreter._patch_lang) == before
    monkeypatch.undo()
    fixes.uninstall()


@triton.jit
def _sum_rows_kernel(x_ptr, y_ptr, COLS: tl.constexpr):
    r = tl.arange(0, COLS)
    tl.store(y_ptr + tl.program_id(0), tl.sum(tl.load(x_ptr + tl.program_id(0) * COLS + r), axis=0))


def test_a_bf16_sum_rounds_every_add_left_to_right():
    """1 + 2^-8 is a tie (kept at 1), so two such adds leave 1; one float32 sum would give 1 + 2^-7."""
    x = torch.tensor([[1.0, 2.0**-8, 2.0**-8, 0.0], [3.0, -1.0, 0.5, 0.25]]).bfloat16()
    y = torch.empty(2, dtype=torch.bfloat16)
    _sum_rows_kernel[(2,)](x, y, COLS=4)
    want = []
    for row in x:
        acc = row[0]
        for v in row[1:]:
            acc = (acc.float() + v.float()).bfloat16()
        want.append(acc)
    assert torch.equal(y, torch.stack(want)) and y[0].item() == 1.0 != (x[0].float().sum()).bfloat16().item()


def test_the_doctor_shows_the_gated_defects_unguarded_when_they_are_suspended(capsys):
    with fixes.suspended(gated=True):
        assert doctor.doctor_main(True) == 1
    rows = {p["primitive"]: p for p in json.loads(capsys.readouterr().out)["primitives"]}
    for key in fixes.GATED_FIXES:
        assert rows[key]["status"] == DEFECT and not rows[key]["trusted"], rows[key]
        assert rows[key]["workaround"].startswith("NONE: "), rows[key]


_CONFIGS = [triton.Config({"BLOCK": 64}), triton.Config({"BLOCK": 16}), triton.Config({"BLOCK": 32})]


def _doubling(**autotune):
    @triton.autotune(configs=_CONFIGS, key=["n"], **autotune)
    @triton.jit
    def kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * 2.0, mask=offs < n)

    return kernel


def _run(kernel, n=100):
    x = torch.randn(n, generator=torch.Generator().manual_seed(5))
    y = torch.full_like(x, float("nan"))
    kernel[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](x, y, n)
    return x, y


def test_an_autotuned_kernel_raises_without_the_fix_and_runs_its_first_config_with_it():
    kernel = _doubling()
    with fixes.suspended(gated=True), pytest.raises(RuntimeError, match="0 active drivers"):
        _run(kernel)
    assert "autotune_driver" in fixes.gated_installed()
    x, y = _run(kernel)
    assert torch.equal(y, x * 2.0)
    assert kernel.best_config is _CONFIGS[0]  # every config timed alike: the first one kept


def test_the_untimed_choice_is_made_after_tritons_own_pruning_and_a_kernels_own_benchmarker_is_kept():
    pruned = _doubling(prune_configs_by={"early_config_prune": lambda configs, nargs, **kw: configs[1:]})
    x, y = _run(pruned)
    assert torch.equal(y, x * 2.0) and pruned.best_config is _CONFIGS[1]
    timed = []

    def own_bench(kernel_call, quantiles):  # a kernel's own benchmarker: it, not the fix, times the configs
        kernel_call()
        timed.append(len(timed))
        return [float(-len(timed))] * len(quantiles)  # each config faster than the one before

    mine = _doubling(do_bench=own_bench)
    x, y = _run(mine)
    assert torch.equal(y, x * 2.0) and len(timed) == len(_CONFIGS) and mine.best_config is _CONFIGS[-1]


@triton.jit
def _per_expert_offsets(sizes_ptr, out_ptr, N, NUM_EXPERTS: tl.constexpr):
    """unsloth's grouped GEMM's shape: the expert's first row in int64, from the tl.range index."""
    start = 0
    for expert in tl.range(NUM_EXPERTS):
        tl.store(out_ptr + expert, expert.to(tl.int64) * N + start)
        start += tl.load(sizes_ptr + expert)


def test_a_kernel_converting_its_tl_range_index_raises_without_the_fix_and_runs_with_it():
    """Issue 49: `expert_idx.to(tl.int64)` raised "'int' object has no attribute 'to'" inside Triton."""
    sizes, out = torch.tensor([3, 0, 5], dtype=torch.int32), torch.zeros(3, dtype=torch.int64)
    n = 2**30  # expert * N passes int32's range: the conversion comes first, as it must compiled
    with fixes.suspended(gated=True), pytest.raises(Exception, match="'int' object has no attribute 'to'"):
        _per_expert_offsets[(1,)](sizes, out, n, NUM_EXPERTS=3)
    assert "range_index" in fixes.gated_installed()
    _per_expert_offsets[(1,)](sizes, out, n, NUM_EXPERTS=3)
    assert out.tolist() == [0, n + 3, 2 * n + 3]
