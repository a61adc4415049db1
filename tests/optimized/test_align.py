"""The aligned layout (optimized.align) against a plain-Python construction of the layout its
docstring documents, on labelled routings and on random small routings.

Documented layout: sorted_token_ids lists the flat routed-row indices t*K + k grouped by global
expert id in ascending order (ascending row index within an expert, the stable order), each
expert's segment padded with the sentinel TK up to a multiple of BLOCK_M; expert_ids holds one
entry per BLOCK_M block, the expert mapped through expert_map (-1 kept for non-local experts);
num_tokens_post_padded is the padded length; the function returns the number of blocks.
Dropped slots (topk_ids -1) form one last segment, after every expert's, whose blocks are -1.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from optimized.align import align_routed_rows, max_blocks, max_padded_rows

BLOCK_MS = (16, 32, 64)
GARBAGE = -7  # pre-fill of the output buffers: any slot align should write and did not shows up


def python_layout(topk_ids: list[list[int]], expert_map: list[int] | None, num_experts: int, block_m: int):
    """The documented layout, built one expert at a time with lists."""
    flat = [e for row in topk_ids for e in row]
    routed = len(flat)
    sorted_ids: list[int] = []
    block_experts: list[int] = []
    for expert in [*range(num_experts), -1]:  # -1: the dropped slots, last
        rows = [r for r, e in enumerate(flat) if e == expert]
        if not rows:
            continue  # an expert without rows takes no block at all
        padded = -(-len(rows) // block_m) * block_m
        sorted_ids += rows + [routed] * (padded - len(rows))
        local = expert if expert_map is None or expert < 0 else expert_map[expert]
        block_experts += [local] * (padded // block_m)
    return sorted_ids, block_experts, len(sorted_ids)


def run_align(topk_ids: torch.Tensor, expert_map: torch.Tensor | None, num_experts: int, block_m: int):
    """align_routed_rows into buffers of exactly the documented maximum sizes: a write past
    either bound raises instead of landing in spare room."""
    routed = topk_ids.numel()
    sorted_ids = torch.full((max_padded_rows(routed, num_experts, block_m),), GARBAGE, dtype=torch.int32)
    expert_ids = torch.full((max_blocks(routed, num_experts, block_m),), GARBAGE, dtype=torch.int32)
    post_padded = torch.full((1,), GARBAGE, dtype=torch.int32)
    blocks = align_routed_rows(topk_ids, expert_map, num_experts, block_m, sorted_ids, expert_ids, post_padded)
    return blocks, sorted_ids, expert_ids, post_padded


def random_routing(num_tokens: int, num_experts: int, topk: int, seed: int, experts: list[int] | None = None) -> torch.Tensor:
    """[T, K] int32, K distinct experts per token drawn from `experts` (default: all)."""
    gen = torch.Generator().manual_seed(seed)
    pool = torch.tensor(experts if experts is not None else list(range(num_experts)))
    rows = [pool[torch.randperm(len(pool), generator=gen)[:topk]] for _ in range(num_tokens)]
    return torch.stack(rows).to(torch.int32)


def _one_expert(num_tokens: int, num_experts: int, topk: int, seed: int) -> torch.Tensor:
    """Every token picks expert 3 plus K-1 distinct others."""
    others = random_routing(num_tokens, num_experts, topk - 1, seed, experts=[e for e in range(num_experts) if e != 3])
    return torch.cat([torch.full((num_tokens, 1), 3, dtype=torch.int32), others], dim=1)


def _dropped(topk_ids: torch.Tensor, every: int) -> torch.Tensor:
    """Every `every`-th slot (flat order) set to -1, a dropped slot."""
    ids = topk_ids.clone()
    ids.view(-1)[::every] = -1
    return ids


# label -> (topk_ids, expert_map or None, E)
CASES = {
    "T=1": (random_routing(1, 6, 2, seed=1), None, 6),
    "T=1-K=E": (random_routing(1, 5, 5, seed=2), None, 5),  # every expert gets one row: the bounds are attained
    "all-tokens-one-expert-K=1": (torch.full((40, 1), 2, dtype=torch.int32), None, 4),
    "all-tokens-one-expert-K=2": (_one_expert(23, 5, 2, seed=3), None, 5),
    "empty-experts": (random_routing(12, 8, 2, seed=4, experts=[1, 4, 6]), None, 8),
    "empty-first-and-last-expert": (random_routing(9, 6, 2, seed=5, experts=[1, 2, 3, 4]), None, 6),
    "expert-map-with-minus-1": (random_routing(11, 6, 2, seed=6), [0, -1, 1, -1, 2, -1], 6),
    "expert-map-reordered-locals": (random_routing(10, 5, 3, seed=7), [2, -1, 0, 1, -1], 5),
    "K=E": (random_routing(7, 3, 3, seed=8), None, 3),
    "prime-E": (random_routing(19, 7, 3, seed=9), None, 7),
    "prime-E-large-T": (random_routing(97, 13, 2, seed=10), None, 13),
    "E=1": (torch.zeros(5, 1, dtype=torch.int32), None, 1),
    "segment-exactly-64": (torch.full((64, 1), 1, dtype=torch.int32), None, 3),  # no padding for BLOCK_M 16/32/64
    "segment-65": (torch.full((65, 1), 1, dtype=torch.int32), None, 3),  # one row past a block: a whole padded block
    "dropped-slots": (_dropped(random_routing(9, 5, 2, seed=13), every=3), None, 5),
    "dropped-slots-with-expert-map": (_dropped(random_routing(11, 6, 2, seed=14), every=4), [0, -1, 1, -1, 2, -1], 6),
    "all-slots-dropped": (torch.full((6, 2), -1, dtype=torch.int32), None, 4),
    "all-slots-dropped-with-expert-map": (torch.full((3, 1), -1, dtype=torch.int32), [-1, 0], 2),
}


@pytest.mark.parametrize("block_m", BLOCK_MS, ids=lambda b: f"BLOCK_M={b}")
@pytest.mark.parametrize("label", list(CASES))
def test_align_matches_the_documented_layout(label, block_m):
    topk_ids, expert_map, num_experts = CASES[label]
    em = None if expert_map is None else torch.tensor(expert_map, dtype=torch.int32)
    blocks, sorted_ids, expert_ids, post_padded = run_align(topk_ids, em, num_experts, block_m)
    want_ids, want_experts, want_total = python_layout(topk_ids.tolist(), expert_map, num_experts, block_m)

    assert int(post_padded) == want_total
    assert want_total % block_m == 0
    assert blocks == len(want_experts) == want_total // block_m
    assert sorted_ids[:want_total].tolist() == want_ids
    assert expert_ids[:blocks].tolist() == want_experts


def test_bounds_are_attained_when_every_expert_gets_one_row():
    # One token routed to all E experts and one dropped slot: each of the E + 1 segments is 1 row
    # padded to BLOCK_M, the worst case of both bounds, so they are tight, not merely safe.
    for block_m in BLOCK_MS:
        for num_experts in (1, 3, 8):
            topk_ids = torch.tensor([[*range(num_experts), -1]], dtype=torch.int32)
            blocks, _, _, post_padded = run_align(topk_ids, None, num_experts, block_m)
            assert int(post_padded) == max_padded_rows(num_experts + 1, num_experts, block_m)
            assert blocks == max_blocks(num_experts + 1, num_experts, block_m)


def test_align_rewrites_buffers_in_place_for_a_smaller_batch():
    """The implementation keeps one set of buffers for its largest batch and realigns a smaller
    batch into them: the result must not depend on what a previous, larger call left there."""
    num_experts, block_m = 5, 16
    big = random_routing(40, num_experts, 2, seed=11)
    small = random_routing(3, num_experts, 2, seed=12)
    routed = big.numel()
    sorted_ids = torch.empty(max_padded_rows(routed, num_experts, block_m), dtype=torch.int32)
    expert_ids = torch.empty(max_blocks(routed, num_experts, block_m), dtype=torch.int32)
    post_padded = torch.empty(1, dtype=torch.int32)
    align_routed_rows(big, None, num_experts, block_m, sorted_ids, expert_ids, post_padded)
    blocks = align_routed_rows(small, None, num_experts, block_m, sorted_ids, expert_ids, post_padded)
    want_ids, want_experts, want_total = python_layout(small.tolist(), None, num_experts, block_m)
    assert int(post_padded) == want_total and blocks == len(want_experts)
    assert sorted_ids[:want_total].tolist() == want_ids
    assert expert_ids[:blocks].tolist() == want_experts


@st.composite
def routings(draw):
    num_experts = draw(st.integers(1, 9))
    topk = draw(st.integers(1, num_experts))
    num_tokens = draw(st.integers(1, 24))
    # a subset of experts the tokens may use (at least K of them), to get empty experts often
    allowed = draw(st.lists(st.integers(0, num_experts - 1), min_size=topk, max_size=num_experts, unique=True))
    rows = [draw(st.permutations(allowed))[:topk] for _ in range(num_tokens)]
    if draw(st.booleans()):  # dropped slots (-1), anywhere
        rows = [[-1 if draw(st.booleans()) else e for e in row] for row in rows]
    expert_map = None
    if draw(st.booleans()):
        local = draw(st.lists(st.booleans(), min_size=num_experts, max_size=num_experts).filter(any))
        order = draw(st.permutations(list(range(sum(local)))))
        it = iter(order)
        expert_map = [next(it) if keep else -1 for keep in local]
    block_m = draw(st.sampled_from(BLOCK_MS))
    return rows, expert_map, num_experts, block_m


@settings(max_examples=300, deadline=None, database=None)
@given(routings())
def test_random_routings_match_and_stay_within_the_bounds(case):
    rows, expert_map, num_experts, block_m = case
    topk_ids = torch.tensor(rows, dtype=torch.int32)
    em = None if expert_map is None else torch.tensor(expert_map, dtype=torch.int32)
    # run_align's buffers have exactly the bound sizes: an overrun raises here
    blocks, sorted_ids, expert_ids, post_padded = run_align(topk_ids, em, num_experts, block_m)
    routed = topk_ids.numel()
    want_ids, want_experts, want_total = python_layout(rows, expert_map, num_experts, block_m)
    assert want_total <= max_padded_rows(routed, num_experts, block_m)
    assert len(want_experts) <= max_blocks(routed, num_experts, block_m)
    assert int(post_padded) == want_total
    assert blocks == len(want_experts)
    assert sorted_ids[:want_total].tolist() == want_ids
    assert expert_ids[:blocks].tolist() == want_experts
