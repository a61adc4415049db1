"""Guarded workspaces and tensors: out-of-bounds writes are found at the right offset, in-bounds
writes are not; poison patterns fill only the bodies and mean what the docs say."""

import math

import pytest
import torch

from diffmoe.check.guards import CANARY, POISON_PATTERNS, GuardedTensor, GuardedWorkspaces
from diffmoe.findings import ByteRange, Oracles
from diffmoe.problem.vocabulary import FP8_DTYPE


def _past_the_view(view: torch.Tensor, extra_before: int, extra_after: int) -> torch.Tensor:
    """The bytes a buggy kernel could address around `view`, as an out-of-bounds pointer would."""
    start = view.storage_offset() - extra_before
    return view.as_strided((extra_before + view.numel() + extra_after,), (1,), start)


def test_workspaces_are_contiguous_uint8_bodies():
    guarded = GuardedWorkspaces((1000, 24))
    ws1, ws2 = guarded.workspaces
    assert (ws1.dtype, ws1.numel(), ws2.numel()) == (torch.uint8, 1000, 24)
    assert ws1.is_contiguous() and ws2.is_contiguous()
    assert guarded.region_names() == {ws1.data_ptr(): "ws1", ws2.data_ptr(): "ws2"}
    for ws in (ws1, ws2):  # the guard keeps the body as aligned as the allocation
        assert (ws.data_ptr() - ws.untyped_storage().data_ptr()) % 16 == 0


def test_in_bounds_writes_are_quiet():
    guarded = GuardedWorkspaces((4096, 512))
    ws1, ws2 = guarded.workspaces
    ws1.fill_(0)
    ws2.view(torch.bfloat16).fill_(1.0)
    assert guarded.check_red_zones() == []


def test_one_byte_past_the_end_is_found_at_that_offset():
    guarded = GuardedWorkspaces((4096, 512))
    ws2 = guarded.workspaces[1]
    _past_the_view(ws2, 0, 1)[512] = 0
    (f,) = guarded.check_red_zones()
    assert f.oracle == Oracles.RED_ZONE
    assert f.byte_ranges == [ByteRange("ws2", 512, 513)]
    assert f.figures == {"region": "ws2", "guard": "after", "first_bad_offset": 512, "bad_bytes": 1}
    assert "after the end of ws2" in f.message and "offset 512" in f.message


def test_bytes_before_the_start_are_found_with_negative_offsets():
    guarded = GuardedWorkspaces((64, 64))
    ws1 = guarded.workspaces[0]
    _past_the_view(ws1, 8, 0)[0:3] = 1  # bytes -8, -7, -6
    (f,) = guarded.check_red_zones()
    assert f.figures["guard"] == "before" and f.figures["first_bad_offset"] == -8 and f.figures["bad_bytes"] == 3
    assert f.byte_ranges == [ByteRange("ws1", -8, -5)]


def test_both_sides_and_both_workspaces_are_reported():
    guarded = GuardedWorkspaces((64, 64))
    for ws in guarded.workspaces:
        wide = _past_the_view(ws, 1, 10)
        wide[0] = 0
        wide[-1] = 0
    findings = guarded.check_red_zones()
    assert [(f.figures["region"], f.figures["guard"], f.figures["first_bad_offset"]) for f in findings] == [
        ("ws1", "before", -1),
        ("ws1", "after", 73),
        ("ws2", "before", -1),
        ("ws2", "after", 73),
    ]
    guarded.reset_guards()
    assert guarded.check_red_zones() == []


def test_poison_fills_bodies_only():
    guarded = GuardedWorkspaces((100, 30))
    for pattern in POISON_PATTERNS:
        guarded.poison(pattern)
        for ws in guarded.workspaces:
            assert ws.eq(pattern).all()
        assert guarded.check_red_zones() == []
    with pytest.raises(ValueError, match="byte"):
        guarded.poison(256)


def test_poison_patterns_mean_what_the_docs_say():
    first, second = POISON_PATTERNS
    assert CANARY not in POISON_PATTERNS
    for dtype in (torch.bfloat16, torch.float32, FP8_DTYPE):
        size = torch.empty((), dtype=dtype).element_size()
        nan = torch.full((size,), first, dtype=torch.uint8).view(dtype).float().item()
        other = torch.full((size,), second, dtype=torch.uint8).view(dtype).float().item()
        assert math.isnan(nan), dtype
        assert math.isfinite(other) and other < 0, dtype
    assert torch.full((1,), second, dtype=torch.uint8).view(FP8_DTYPE).float().item() == -0.203125


def test_zero_byte_workspace():
    guarded = GuardedWorkspaces((0, 16))
    assert guarded.workspaces[0].numel() == 0
    assert guarded.check_red_zones() == []
    _past_the_view(guarded.workspaces[0], 0, 1)[0] = 0
    (f,) = guarded.check_red_zones()
    assert f.figures["first_bad_offset"] == 0 and f.figures["guard"] == "after"


def test_guard_size_must_keep_alignment():
    with pytest.raises(ValueError, match="guard_bytes"):
        GuardedWorkspaces((16, 16), guard_bytes=10)


# ---- a guarded caller-supplied tensor ------------------------------------------------------------


def test_guarded_output_catches_a_write_past_its_end():
    out = GuardedTensor((4, 8), torch.bfloat16)
    assert out.tensor.shape == (4, 8) and out.tensor.dtype == torch.bfloat16 and out.tensor.is_contiguous()
    out.tensor.fill_(2.0)  # every element, in bounds
    assert out.check_red_zones("output") == []
    raw = _past_the_view(out.tensor.view(-1).view(torch.uint8), 0, 2)
    raw[64:66] = 0  # one bf16 element past [4, 8]
    (f,) = out.check_red_zones("output")
    assert f.oracle == Oracles.RED_ZONE and f.buffers == ["output"]
    assert f.byte_ranges == [ByteRange("output", 64, 66)] and f.figures["bad_bytes"] == 2


def test_guarded_output_poison_and_region_name():
    out = GuardedTensor((3, 5), torch.float32)
    out.poison(0xFF)
    assert torch.isnan(out.tensor).all()
    out.poison(0xA5)
    assert out.tensor.eq(out.tensor[0, 0]).all() and not torch.isnan(out.tensor).any()
    assert out.region_names("output") == {out.tensor.data_ptr(): "output"}
    assert out.check_red_zones() == []
