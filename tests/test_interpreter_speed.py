"""The interpreter fast path (diffmoe/interpreter_speed.py): helpers skip re-patching a language
already patched, and nothing an interpreted kernel computes changes."""

from __future__ import annotations

import pytest
import torch

import optimized  # noqa: F401 - picks the interpreter without a GPU, installs the fast path
from diffmoe import interpreter_speed
from diffmoe.config import MoEConfig
from diffmoe.problem import make_problem
from diffmoe.triton_pin import triton_release

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="interpreter only")

CONFIG = MoEConfig(num_tokens=5, num_experts=3, topk=2, hidden=128, inter=128, quant="fp8-block", fused=True, seed=3)


def run_once() -> tuple[torch.Tensor, ...]:
    impl = optimized.make_implementation(CONFIG)
    result = impl.run(make_problem(CONFIG), impl.allocate_workspaces())
    return (result.output, *(t for _, t in sorted(result.intermediates.items()) if isinstance(t, torch.Tensor)))


@pytest.fixture
def patch_walks(monkeypatch):
    from triton.runtime import interpreter

    walks = []
    original = interpreter._patch_lang

    def counting(fn):
        walks.append(fn)
        return original(fn)

    monkeypatch.setattr(interpreter, "_patch_lang", counting)
    return walks


def test_helpers_skip_the_walk_and_the_bits_do_not_change(patch_walks):
    assert triton_release()[1] == interpreter_speed.SUPPORTED_TRITON, "the fast path is pinned to the tested release"
    assert interpreter_speed.installed()
    fast = run_once()
    fast_walks = len(patch_walks)
    interpreter_speed.uninstall()
    try:
        patch_walks.clear()
        slow = run_once()
        slow_walks = len(patch_walks)
    finally:
        assert interpreter_speed.install() == "installed"
    # one walk per launch is left; triton's own path walks again at every helper call
    assert fast_walks < slow_walks / 2, (fast_walks, slow_walks)
    assert len(fast) == len(slow)
    for a, b in zip(fast, slow):
        assert a.dtype == b.dtype and torch.equal(a.view(torch.uint8), b.view(torch.uint8))


def test_install_is_idempotent():
    assert interpreter_speed.install() == "installed" and interpreter_speed.install() == "installed"


def test_the_overflow_sanitizer_is_skipped_only_while_its_assertions_are_off():
    """With debug off the sanitizer's device_assert checks nothing; install turns it off then,
    uninstall puts it back, and the bits are those of the sanitizing interpreter (first test)."""
    from triton.runtime import interpreter

    builder = interpreter.interpreter_builder
    assert not builder.options.debug and not builder.options.sanitize_overflow
    interpreter_speed.uninstall()
    try:
        assert builder.options.sanitize_overflow, "uninstall puts triton's option back"
        debug_options = builder.options.__class__(debug=True)
        builder.options = debug_options
        interpreter_speed.install()
        assert builder.options is debug_options and builder.options.sanitize_overflow, "debug keeps its checks"
        interpreter_speed.uninstall()
        builder.options = builder.options.__class__()
    finally:
        assert interpreter_speed.install() == "installed"
    assert not builder.options.sanitize_overflow
