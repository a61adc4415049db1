"""A divergence grouped by expert (diffmoe/oracles/by_expert.py): a finding says when one expert's
rows hold every failure, or every routed expert's rows but one (issue 46); its figures carry the
breakdown always. Labelled cases of the grouping, then two planted kernels judged end to end and
the shipped kernel quiet."""

from __future__ import annotations

import pytest
import torch

from bug_zoo import ExpertZeroWeightScale
from diffmoe.findings import Oracles
from diffmoe.oracles.by_expert import by_expert
from diffmoe.problem.config import MoEConfig
from diffmoe.problem.vocabulary import Buffers
from diffmoe.runner import run_differential
from optimized.moe import TritonFP8MoE

# T=8 tokens, K=2 slots: rows t*K + k; every expert of E=4 routed at seed 0 (checked below)
CONFIG = MoEConfig(num_tokens=8, num_experts=4, topk=2, hidden=256, inter=256, quant="fp8-tensor", fused=False)


# ---- the grouping, labelled cases ---------------------------------------------------------------

TOPK = torch.tensor([[0, 1], [2, 3], [1, 2], [3, 0]])  # rows 0..7 -> experts 0 1 2 3 1 2 3 0
COLUMNS = 4


def _rows(*failing_per_row):
    return torch.tensor(failing_per_row)


def test_one_experts_rows_are_named():
    figures, phrase = by_expert(Buffers.DOWN_OUTPUT, _rows(0, 0, 4, 0, 0, 1, 0, 0), TOPK, 8 * COLUMNS)
    assert phrase == "by expert: only expert 2's rows (5 of their 8 elements)"
    assert figures["by_expert"] == "expert 2: 5 of 8" and figures["failing_experts"] == 1


def test_every_expert_but_one_is_named_by_the_clean_one():
    figures, phrase = by_expert(Buffers.GATE_UP_OUTPUT, _rows(0, 4, 4, 4, 1, 0, 2, 0), TOPK, 8 * COLUMNS)
    assert phrase == "by expert: every routed expert's rows but expert 0's"
    assert figures["by_expert"] == "expert 3: 6 of 8; expert 1: 5 of 8; expert 2: 4 of 8"


@pytest.mark.parametrize("failing,experts", [((1, 1, 1, 1, 0, 0, 0, 0), 4), ((1, 0, 0, 1, 0, 0, 0, 0), 2)],
                         ids=["all", "two"])
def test_a_spread_divergence_gets_figures_but_no_phrase(failing, experts):
    figures, phrase = by_expert(Buffers.DOWN_OUTPUT, _rows(*failing), TOPK, 8 * COLUMNS)
    assert phrase is None and figures["failing_experts"] == experts


def test_dropped_slots_are_their_own_group():
    topk = torch.tensor([[0, -1], [1, -1]])
    _, phrase = by_expert(Buffers.DOWN_OUTPUT, _rows(0, 3, 0, 1), topk, 4 * COLUMNS)
    assert phrase == "by expert: only the dropped slots' rows (4 of their 8 elements)"


@pytest.mark.parametrize("name,rows", [(Buffers.OUTPUT, (1, 0, 0, 0, 0, 0, 0, 0)),  # [T, H]: rows are tokens
                                        (Buffers.DOWN_OUTPUT, (1, 0, 0))])  # not T*K rows
def test_nothing_for_rows_that_are_not_the_routed_rows(name, rows):
    assert by_expert(name, _rows(*rows), TOPK, len(rows) * COLUMNS) == ({}, None)


def test_a_single_routed_expert_gets_no_phrase():
    assert by_expert(Buffers.DOWN_OUTPUT, _rows(1, 1), torch.tensor([[5], [5]]), 2 * COLUMNS)[1] is None


# ---- end to end: planted kernels --------------------------------------------------------------


class OneExpertScaledTwice(TritonFP8MoE):
    """Both GEMMs dequantise expert 2's weights with twice its per-tensor scale (a per-expert
    scale read one element off, for one expert): every other expert's rows are right."""

    def _gemm(self, stage, ctx, problem, layout, a, a_scale, w, w_scale, out, weights, **kwargs):
        if w_scale is not None and w_scale[1] is not None and w_scale[1].dim() == 1:  # [L] per-tensor weight scales
            scales = w_scale[1].clone()
            scales[2] *= 2
            w_scale = (w_scale[0], scales)
        super()._gemm(stage, ctx, problem, layout, a, a_scale, w, w_scale, out, weights, **kwargs)


def _differential_messages(factory) -> list[str]:
    report = run_differential(CONFIG, factory, oracles=[Oracles.DIFFERENTIAL])
    return [f.message for f in report.findings if f.oracle == Oracles.DIFFERENTIAL]


def test_the_config_routes_every_expert():
    from diffmoe.problem.inputs import make_problem

    assert set(make_problem(CONFIG).topk_ids.flatten().tolist()) == {0, 1, 2, 3}


def test_a_kernel_wrong_for_one_expert_is_named_by_that_expert():
    messages = _differential_messages(OneExpertScaledTwice)
    assert messages and all("by expert: only expert 2's rows" in m for m in messages), messages


def test_the_expert_zero_scale_bug_is_named_by_the_expert_it_gets_right():
    messages = _differential_messages(ExpertZeroWeightScale)
    assert messages and all("by expert: every routed expert's rows but expert 0's" in m for m in messages), messages


def test_the_shipped_kernel_is_quiet():
    assert _differential_messages(TritonFP8MoE) == []
