"""The input watch (diffmoe/check/watchers.py `InputWatch`) names an input the candidate wrote, and
stays right while a thread the candidate left behind still writes it: a late writer
(tests/support/hostile_kernels.py's CorruptsItsInputsLate) negated the hidden states twice around the
watch's check, the count found no changed byte, and the check failed with an IndexError instead of
a finding (beside a second full suite, 2026-12-07)."""

from __future__ import annotations

import torch

from diffmoe.check import watchers
from diffmoe.findings import Oracles


def test_a_written_input_is_a_contract_finding_and_is_restored():
    hidden = torch.arange(8, dtype=torch.float32)
    watch = watchers.InputWatch({"hidden_states": hidden})
    hidden[3] = -1.0
    (finding,) = watch.finish("a call")
    assert finding.oracle == Oracles.CONTRACT and finding.buffers == ["hidden_states"]
    assert finding.figures["changed_bytes"] > 0 and 3 * 4 <= finding.figures["first_changed_byte"] < 4 * 4  # in element 3
    assert torch.equal(hidden, torch.arange(8, dtype=torch.float32))  # restored


def test_a_write_undone_while_the_watch_counts_still_gives_a_finding(monkeypatch):
    hidden = torch.arange(1, 9, dtype=torch.float32)
    watch = watchers.InputWatch({"hidden_states": hidden})
    hidden.mul_(-1)  # the late thread's first write
    real = watchers._same_bytes

    def checked_then_undone(a, b):
        same = real(a, b)
        hidden.mul_(-1)  # its second write lands between the check and the count
        return same

    monkeypatch.setattr(watchers, "_same_bytes", checked_then_undone)
    (finding,) = watch.finish("a call")  # before the snapshot: IndexError (no changed byte left to count)
    assert finding.figures["changed_bytes"] > 0 and finding.figures["first_changed_byte"] < 4  # in element 0


def test_an_untouched_input_gives_nothing():
    hidden = torch.ones(4)
    assert watchers.InputWatch({"hidden_states": hidden}).finish("a call") == []
