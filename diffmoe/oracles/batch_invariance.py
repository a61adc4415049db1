"""The batch-invariance oracle: a token's results must not depend on the batch it is computed in.

Owns the judgement, bitwise, per token, of a smaller (or, for T = 1, a larger) call against the
first order's run (the T call), and the one call it makes where the check has none to lend:

  * with call-sequence running (T >= 2, a check's default), its small call on a fresh instance
    and fresh workspaces (the first T // 16 tokens, at least one; `check.sub_batch`) is judged:
    no call of its own. That call ran under the second poison pattern when poison is selected, so
    a divergence is confirmed on a call of the same tokens of its own, under the T call's order
    and pattern (a dependence on workspace bytes stays the poison oracle's finding);
  * otherwise (the fuzz's cheap set, a selection without call-sequence) the last token alone
    (T = 1, on a fresh instance built for this config);
  * for T = 1, the token behind LARGER_BATCH - 1 tokens drawn from the same distribution.

Compared per token: the output row, the per-token stage results (the quantised input and its
scales) and the token's computed routed rows (ROUTED_ROW_BUFFERS: gate/up, activation, quantised
down input and scales, down rows). The finding names the first stage, pipeline order, whose
per-token results change, the token and the two batches.

Why: serving engines batch requests together, and users ask that a request's output not depend
on its neighbours (vLLM's batch-invariant mode and its tests over batch sizes 4, 16, 64, 257;
the most requested MoE correctness property in vLLM and SGLang issues). A kernel that picks a
tile or a split from the batch size changes a row's accumulation order and so its bits; the
differential cannot see it (any float32 order lies in the derived interval) and neither can the
schedule or call-sequence oracles (each compares calls of one batch size). A tile chosen for
batches of at most X tokens shows on any check with T > X >= T // 16; one chosen above X on
checks with T // 16 <= X < T: across the fuzz's batch sizes both are met (a check no longer
makes the 2T + 1 call it made while the oracle was opt-in, issue 48).

Batch-dependent by design, reported as such (a skip with that reason, not a finding): fp8-tensor,
whose dynamic activation scale is the amax of the whole batch. An implementation that declares
`batch_invariant = False` (a factory attribute, diffmoe.contract) is not held to it.

In a check's default selection since issue 48: reusing call-sequence's call, it costs a default
check a comparison (docs/oracles.md has the figures). Must not judge values against the
reference: the runs are compared with each other.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import torch

from diffmoe.contract import BATCH_INVARIANT, factory_batch_invariant
from diffmoe.findings import Finding, Oracles
from diffmoe.oracles.base import Oracle
from diffmoe.problem.inputs import ROUTED_ROW_BUFFERS, make_problem, tokens_of
from diffmoe.problem.vocabulary import Buffers, materialised_buffers, producer_stage
from diffmoe.tolerance.compare import Rule, compare

if TYPE_CHECKING:
    from diffmoe.check.execution import Check, Run

# buffers with one row per token (the quantised input; per-token or per-group scales)
TOKEN_ROW_BUFFERS = (Buffers.QUANTED_GATE_UP_INPUT, Buffers.QUANTED_GATE_UP_INPUT_SCALES, Buffers.OUTPUT)
# A one-token check's other batch: the token behind two others (what the oracle's larger batch,
# 2T + 1, was for T = 1 before it went into the default set, issue 48)
LARGER_BATCH = 3
BY_DESIGN = {
    "fp8-tensor": "batch-dependent by design: fp8-tensor's dynamic activation scale is the amax of the whole batch",
}


def batch_dependent_by_design(check: Check) -> str | None:
    """Why this config's results depend on the batch by construction, or None."""
    return BY_DESIGN.get(check.config.quant)


class BatchInvariance(Oracle):
    name = Oracles.BATCH_INVARIANCE
    checks = "a token's output and per-token stage results do not depend on the batch it is in"
    how = ("bitwise, per token, against the T call: call-sequence's small call on a fresh pair (the first T // 16 "
           "tokens), or without it the last token alone (T = 1); a one-token call behind two other tokens (T = 3); "
           "the first stage whose per-token rows change is named; fp8-tensor is batch-dependent by design")
    rank = 65

    def finish(self, check: Check) -> list[Finding]:
        why = batch_dependent_by_design(check)
        if why is None and factory_batch_invariant(check.factory) is False:
            why = f"the implementation does not claim it ({BATCH_INVARIANT} = False on its factory)"
        if why is None and check.problem.num_tokens == 0:
            why = "a zero-token call has no token to move"
        if why is not None:
            check.skipped[self.name] = why
            return []
        t = check.problem.num_tokens
        if check.sub_batch is not None:
            small, run = check.sub_batch
            n = small.num_tokens
            where = f"token {{token}} in a T={n} call (the batch's first {n}) and in its T={t} batch"
            found = self._judge(check, check.runs[0], run, {i: i for i in range(n)}, where)
            if not found or not check.selected(Oracles.POISON):
                return found
            # call-sequence made that call under the second poison pattern: a divergence is
            # confirmed on a call of its own under the T call's order and pattern, so a dependence
            # on workspace bytes stays the poison oracle's finding
            run = check.execute_fresh(check.config, small, f"the batch-invariance run: the first {n} tokens (T={n})")
            return self._judge(check, check.runs[0], run, {i: i for i in range(n)}, where)
        if t >= 2:
            probe = t - 1
            alone = check.execute_fresh(check.config, replace(check.problem, **tokens_of(check.problem, [probe])),
                                        f"the batch-invariance run: token {probe} alone (T=1)")
            return self._judge(check, check.runs[0], alone, {probe: 0}, f"token {{token}} alone (T=1) and in its T={t} batch")
        return self._behind_other_tokens(check)

    def _behind_other_tokens(self, check: Check) -> list[Finding]:
        """A one-token call has no smaller batch: the token behind LARGER_BATCH - 1 tokens drawn
        from the same distribution, on an instance built for that capacity."""
        big_cfg = check.config.replace(num_tokens=LARGER_BATCH, call_tokens=None)
        pad = make_problem(big_cfg.replace(seed=(check.config.seed + 1) % (2**31)), check.device)
        moved = replace(check.problem, config=big_cfg, **{
            name: torch.cat([value[: LARGER_BATCH - 1], getattr(check.problem, name)])
            for name, value in tokens_of(pad, slice(None)).items()})
        big = check.execute_fresh(big_cfg, moved,
                                  f"the batch-invariance run: the token behind {LARGER_BATCH - 1} other tokens (T={LARGER_BATCH})")
        return self._judge(check, check.runs[0], big, {0: LARGER_BATCH - 1},
                           f"token {{token}} alone (T=1) and at position {{position}} of a T={LARGER_BATCH} batch")

    @staticmethod
    def _judge(check: Check, base: Run, other: Run, positions: dict[int, int], where: str) -> list[Finding]:
        """The first buffer, pipeline order, whose rows for a token differ between `base` (the T
        call) and `other`, where token i of the T call is token positions[i]."""
        k = check.config.topk
        computed = check.problem.computed_slots().view(-1, k)  # [T, K]
        for name in materialised_buffers(check.config):
            if name not in base.buffers or name not in other.buffers:
                continue
            a, b = base.buffers[name], other.buffers[name]
            if not a.is_floating_point() and a.dtype != torch.float8_e4m3fn:
                continue  # the align stage's ids and counts: batch-structural by nature
            for token, position in positions.items():
                if name in TOKEN_ROW_BUFFERS and a.dim() >= 1 and a.shape[0] == check.problem.num_tokens:
                    rows_a, rows_b = a[token], b[position]
                elif name in ROUTED_ROW_BUFFERS and a.dim() >= 1 and a.shape[0] == check.problem.num_tokens * k:
                    keep = computed[token]
                    rows_a = a[token * k:(token + 1) * k][keep]
                    rows_b = b[position * k:(position + 1) * k][keep]
                else:
                    continue
                c = compare(name, rows_a, rows_b, Rule.bitwise("a token's rows must not depend on its batch"))
                if not c.ok:
                    said = where.format(token=token, position=position)
                    return [Finding(
                        oracle=Oracles.BATCH_INVARIANCE, stage=producer_stage(check.config, name), buffers=[name],
                        message=f"{name} of {said} differ: {c.differing} of {c.total} elements "
                                f"(max {c.max_ulp} ulp, max |diff| {c.max_abs:.6g}); the first stage whose per-token "
                                "results depend on the batch",
                        figures={"token": token, "position": position, "batches": said, **c.figures()},
                    )]
        return []
