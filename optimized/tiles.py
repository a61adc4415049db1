"""Tile sizes per backend.

The interpreter's cost is per program instance and per op, not per element (DESIGN.md:
a 64-row quant with one program per row ~0.2 s; one 128x256x512 fp8 tile ~0.05 s), so it
gets large pinned tiles: fewer programs, same numerics. CUDA gets the usual small-M
heuristic (routed rows per expert are few at small batch). BLOCK_K is 128 everywhere because
fp8-block scales change every 128 columns of the reduction dimension.
"""

from __future__ import annotations

from dataclasses import dataclass

import triton

from diffmoe.config import QUANT_BLOCK


@dataclass(frozen=True)
class Tiles:
    block_m: int  # GEMM rows per program; also the align padding
    block_n: int
    block_k: int
    gemm_warps: int
    gemm_stages: int
    rows_per_program: int  # row kernel
    cols_per_step: int  # row kernel column chunk (fp8-block: the 128 group)
    reduce_tokens: int
    reduce_cols: int


def choose_tiles(backend: str, routed_rows: int, quant: str, cols: int) -> Tiles:
    """Tiles for a run with `routed_rows` = TK (max over the calls the workspaces serve)."""
    group = quant == "fp8-block"
    if backend == "interpreter":
        return Tiles(
            block_m=32, block_n=256, block_k=QUANT_BLOCK, gemm_warps=4, gemm_stages=1,
            rows_per_program=32, cols_per_step=QUANT_BLOCK if group else 256,
            reduce_tokens=32, reduce_cols=256,
        )
    block_m = 16 if routed_rows <= 64 else 32 if routed_rows <= 1024 else 64
    return Tiles(
        block_m=block_m, block_n=128, block_k=QUANT_BLOCK, gemm_warps=4, gemm_stages=3,
        rows_per_program=4, cols_per_step=QUANT_BLOCK if group else min(1024, triton.next_power_of_2(cols)),
        reduce_tokens=4, reduce_cols=512,
    )
