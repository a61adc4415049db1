"""Poison and red zones: workspaces and output tensors surrounded by guard bytes.

Each guarded region is one uint8 allocation: guard, body, guard. The body is what the
implementation gets; the guards hold a canary byte. A changed guard byte after a call is an
out-of-bounds write (a red-zone finding). Filling the body with a poison byte before a call,
and running again under another poison, shows reads of memory the call never wrote: the
output then depends on the poison.

POISON_PATTERNS: 0xFF makes every element a NaN (bf16 0xFFFF, float32 0xFFFFFFFF and e4m3fn
0xFF are all NaN), so a stray read tends to poison the output visibly; 0xA5 makes every
element a small negative number (e4m3fn 0xA5 = -0.203125, bf16 0xA5A5 ~ -2.9e-16), so it
differs from the first pattern in every dtype, and a read of unwritten memory changes the
result between the two runs.

Owns guarded allocations. Must not decide a finding's oracle beyond red-zone: poison is judged by poison.py.
"""

from __future__ import annotations

import math

import torch

from diffmoe.findings import ByteRange, Finding, Oracles
from diffmoe.interpreter.address_analysis import _view_extent
from diffmoe.problem.vocabulary import WORKSPACE_NAMES

POISON_PATTERNS = (0xFF, 0xA5)
CANARY = 0xCD  # guard byte; neither poison, nor a value kernels write by default (zero)
DEFAULT_GUARD_BYTES = 256
GUARD_ALIGNMENT = 16  # keeps the body as aligned as the allocation for vectorised access


def _check_byte(value: int, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= 0xFF:
        raise ValueError(f"{what} must be a byte value in [0, 255], got {value!r}")
    return value


class _GuardedBytes:
    """One allocation [guard | body | guard] of uint8."""

    def __init__(self, nbytes: int, device: torch.device | str, guard_bytes: int) -> None:
        if not isinstance(nbytes, int) or isinstance(nbytes, bool) or nbytes < 0:
            raise ValueError(f"workspace bytes must be an int >= 0, got {nbytes!r}")
        if not isinstance(guard_bytes, int) or guard_bytes <= 0 or guard_bytes % GUARD_ALIGNMENT:
            raise ValueError(f"guard_bytes must be a positive multiple of {GUARD_ALIGNMENT}, got {guard_bytes!r}")
        self.nbytes = nbytes
        self.guard_bytes = guard_bytes
        self.raw = torch.empty(guard_bytes + nbytes + guard_bytes, dtype=torch.uint8, device=device)
        self.body = self.raw[guard_bytes : guard_bytes + nbytes]  # contiguous uint8 view
        self.before = self.raw[:guard_bytes]
        self.after = self.raw[guard_bytes + nbytes :]
        self.reset_guards()
        self.poison(POISON_PATTERNS[0])

    def reset_guards(self) -> None:
        self.before.fill_(CANARY)
        self.after.fill_(CANARY)

    def poison(self, pattern: int) -> None:
        self.body.fill_(_check_byte(pattern, "poison pattern"))

    def check(self, label: str) -> list[Finding]:
        findings = []
        for side, guard, origin in (("before", self.before, -self.guard_bytes), ("after", self.after, self.nbytes)):
            bad = (guard != CANARY).nonzero().flatten().cpu()  # offsets into this guard
            if bad.numel() == 0:
                continue
            first, last = origin + int(bad[0]), origin + int(bad[-1])
            where = "before the start" if side == "before" else "after the end"
            findings.append(
                Finding(
                    oracle=Oracles.RED_ZONE,
                    message=(
                        f"{bad.numel()} guard byte{'s' if bad.numel() != 1 else ''} {where} of {label} changed, "
                        f"first at offset {first} of {label} ({label} has {self.nbytes} bytes)"
                    ),
                    byte_ranges=[ByteRange(label, first, last + 1)],
                    figures={"region": label, "guard": side, "first_bad_offset": first, "bad_bytes": bad.numel()},
                )
            )
        return findings


class GuardedWorkspaces:
    """ws1 and ws2 as uint8 bodies between guard bytes.

    `workspaces` is what an implementation's `run` receives; `poison` fills both bodies;
    `check_red_zones` reports changed guard bytes; `region_names` labels the bodies for the
    runtime aliasing oracle.
    """

    def __init__(self, nbytes: tuple[int, int], device: torch.device | str = "cpu", guard_bytes: int = DEFAULT_GUARD_BYTES) -> None:
        if len(nbytes) != len(WORKSPACE_NAMES):
            raise ValueError(f"nbytes must give the bytes of {list(WORKSPACE_NAMES)}, got {nbytes!r}")
        self._regions = [_GuardedBytes(n, device, guard_bytes) for n in nbytes]

    @property
    def workspaces(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self._regions[0].body, self._regions[1].body

    @property
    def nbytes(self) -> tuple[int, int]:
        return self._regions[0].nbytes, self._regions[1].nbytes

    def poison(self, pattern: int) -> None:
        for region in self._regions:
            region.poison(pattern)

    def reset_guards(self) -> None:
        """Rewrite the canaries, e.g. after a finding, to check the next call on its own."""
        for region in self._regions:
            region.reset_guards()

    def check_red_zones(self) -> list[Finding]:
        findings = []
        for label, region in zip(WORKSPACE_NAMES, self._regions):
            findings.extend(region.check(label))
        return findings

    def region_names(self) -> dict[int, str]:
        return {region.body.data_ptr(): label for label, region in zip(WORKSPACE_NAMES, self._regions)}


class GuardedTensor:
    """A caller-supplied tensor (e.g. the output) with guard bytes on both sides."""

    def __init__(
        self,
        shape: tuple[int, ...],
        dtype: torch.dtype,
        device: torch.device | str = "cpu",
        guard_bytes: int = DEFAULT_GUARD_BYTES,
    ) -> None:
        self.shape = tuple(shape)
        self.dtype = dtype
        element = torch.empty((), dtype=dtype).element_size()
        self._region = _GuardedBytes(math.prod(self.shape) * element, device, guard_bytes)
        self.tensor = self._region.body.view(dtype).view(self.shape)  # contiguous

    def poison(self, pattern: int) -> None:
        self._region.poison(pattern)

    def reset_guards(self) -> None:
        self._region.reset_guards()

    def check_red_zones(self, name: str = "output") -> list[Finding]:
        findings = self._region.check(name)
        for finding in findings:
            finding.buffers = [name]
        return findings

    def region_names(self, name: str = "output") -> dict[int, str]:
        return {self.tensor.data_ptr(): name}


class WritesPoisoned:
    """A LaunchRecorder for a sampled run (diffmoe/interpreter/program_sample.py): before each Triton
    launch, every view it declares it writes is filled with the run's poison byte, so an element no
    chosen program stores holds this run's poison, not what an earlier buffer sharing those workspace
    bytes left (the same in both runs of a sampled check, and so indistinguishable from a write). A
    write view that overlaps a view the launch reads is left alone (an in-place launch reads it)."""

    def __init__(self, pattern: int) -> None:
        self.pattern = _check_byte(pattern, "poison pattern")

    def before_launch(self, launch) -> None:
        if not launch.triton:
            return
        reads = [extent for v in launch.reads.values() if (extent := _view_extent(v)) is not None]
        for view in launch.writes.values():
            extent = _view_extent(view)
            if extent is None:  # not a tensor, or empty
                continue
            start, end = extent[0], extent[0] + extent[1]
            if any(start < r_start + r_length and r_start < end for r_start, r_length in reads):
                continue
            poison = torch.tensor([self.pattern] * view.element_size(), dtype=torch.uint8).view(view.dtype)
            view.copy_(poison.to(view.device).expand(view.shape))

    def after_launch(self, launch) -> None:
        pass
