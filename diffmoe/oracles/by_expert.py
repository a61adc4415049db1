"""Where a divergent buffer's failing elements lie, by expert.

The routed rows' buffers ([TK, *]: row t*K + k is token t's k-th slot, routed to expert
topk_ids[t, k]) are grouped by the expert each row went to. A divergence confined to one
expert's rows names a per-expert scale, stride or offset mix-up, and every routed expert's rows
failing but one names the kernel that scales every expert by that one's scale (vLLM 0.28 to
0.32's, in the museum); a new user given only "1376 of 2048 elements fail" could not tell them
apart (issue 46). A finding's message says so in those two cases; its figures carry the
breakdown always.

Owns that grouping and its words. Must not judge: the comparison decides which elements fail.
"""

from __future__ import annotations

import torch

from diffmoe.problem.vocabulary import Buffers

# The buffers whose rows are the routed rows (t*K + k), the reference's layout (reference/moe.py).
ROUTED_ROW_BUFFERS = frozenset({Buffers.GATE_UP_OUTPUT, Buffers.ACTIVATION_OUTPUT, Buffers.QUANTED_DOWN_INPUT,
                                Buffers.DOWN_OUTPUT})
# Experts listed in a finding's figures, the most failing first; the rest are counted.
SHOWN_EXPERTS = 8
DROPPED = -1  # a slot routed nowhere (topk_ids -1)


def _label(expert: int) -> str:
    return "the dropped slots" if expert == DROPPED else f"expert {expert}"


def _owner(expert: int) -> str:
    """The possessive: "expert 3's", "the dropped slots'"."""
    return "the dropped slots'" if expert == DROPPED else f"expert {expert}'s"


def by_expert(name: str, row_failures: torch.Tensor | None, topk_ids: torch.Tensor | None,
              total: int) -> tuple[dict, str | None]:
    """({"by_expert": ...} or {}, the phrase for the message or None) for buffer `name`, whose
    rows failed `row_failures` elements each ([rows] int), of `total` elements in all; topk_ids
    [T, K]. Nothing for a buffer that is not a routed rows' buffer or whose rows are not T*K."""
    if name not in ROUTED_ROW_BUFFERS or row_failures is None or topk_ids is None:
        return {}, None
    experts = topk_ids.detach().reshape(-1).to(device="cpu", dtype=torch.int64)
    failing = row_failures.detach().reshape(-1).to(device="cpu", dtype=torch.int64)
    if experts.numel() != failing.numel() or experts.numel() == 0 or total % experts.numel():
        return {}, None
    per_row = total // experts.numel()  # elements in one routed row
    slots = experts - DROPPED  # 0 for a dropped slot: one bincount per figure, not a mask per expert
    rows = torch.bincount(slots)
    failed_per = torch.bincount(slots, weights=failing.double(), minlength=rows.numel())
    routed = [int(i) + DROPPED for i in rows.nonzero().flatten()]
    counts = {e: (int(failed_per[e - DROPPED]), int(rows[e - DROPPED]) * per_row) for e in routed}
    failed = [e for e in routed if counts[e][0]]
    if not failed:
        return {}, None
    ranked = sorted(failed, key=lambda e: (-counts[e][0], e))
    shown = "; ".join(f"{_label(e)}: {counts[e][0]} of {counts[e][1]}" for e in ranked[:SHOWN_EXPERTS])
    if len(ranked) > SHOWN_EXPERTS:
        shown += f"; {len(ranked) - SHOWN_EXPERTS} more experts"
    figures = {"by_expert": shown, "failing_experts": len(failed), "routed_experts": len(routed)}
    phrase = None
    if len(failed) == 1 and len(routed) > 1:
        (e,) = failed
        phrase = f"by expert: only {_owner(e)} rows ({counts[e][0]} of their {counts[e][1]} elements)"
    elif len(routed) >= 3 and len(failed) == len(routed) - 1:
        (clean,) = set(routed) - set(failed)
        phrase = f"by expert: every routed expert's rows but {_owner(clean)}"
    return figures, phrase
