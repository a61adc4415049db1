"""Tile sizes per backend.

The interpreter's cost is per program instance and per op, not per element (DESIGN.md:
a 64-row quant with one program per row ~0.2 s; one 128x256x512 fp8 tile ~0.05 s), so it
gets large pinned tiles: fewer programs, same numerics. CUDA gets the usual small-M
heuristic (routed rows per expert are few at small batch). BLOCK_K is 128 everywhere because
fp8-block scales change every 128 columns of the reduction dimension.

Owns the tile table. Must not launch anything.
"""

from __future__ import annotations

from dataclasses import dataclass

import triton

from diffmoe.problem.config import QUANT_BLOCK


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
    # per-tensor quantisation reduces the per-program amax partials this many at a time: a fixed
    # width, not next_power_of_2(programs), which recompiled for every power of two of the batch
    # and spilled 224 B at the largest (issue 10, sm_90 PTX)
    amax_partials_per_step: int
    # fp8 tl.dot(max_num_imprecise_acc=...): 0 asks for full float32 accumulation, which Triton
    # grants on sm_90 only by widening fp8 to fp16 for mma.sync; QUANT_BLOCK (one 128-wide K step
    # per dot) lets wgmma accumulate one K block in the tensor core, then promotes to float32 (see
    # tile table in docs/gpu.md, "Compiling for a GPU you don't have"; tolerance row "cuda fp8 GEMM")
    fp8_imprecise_acc: int


def choose_tiles(backend: str, routed_rows: int, quant: str, cols: int) -> Tiles:
    """Tiles for a run with `routed_rows` = TK (max over the calls the workspaces serve)."""
    group = quant == "fp8-block"
    if backend == "interpreter":
        return Tiles(
            block_m=32, block_n=256, block_k=QUANT_BLOCK, gemm_warps=4, gemm_stages=1,
            rows_per_program=32, cols_per_step=QUANT_BLOCK if group else 256,
            reduce_tokens=32, reduce_cols=256, amax_partials_per_step=1024, fp8_imprecise_acc=0,
        )
    block_m = 16 if routed_rows <= 64 else 32 if routed_rows <= 1024 else 64
    return Tiles(
        block_m=block_m, block_n=128, block_k=QUANT_BLOCK, gemm_warps=4, gemm_stages=3,
        rows_per_program=4, cols_per_step=QUANT_BLOCK if group else min(1024, triton.next_power_of_2(cols)),
        reduce_tokens=4, reduce_cols=512, amax_partials_per_step=256,
        # wgmma needs BLOCK_M a multiple of 64 (one warpgroup of 4 warps owns 64 rows): decode tiles
        # (16, 32 rows) keep mma.sync, exact float32 accumulation of fp16-widened fp8 operands
        fp8_imprecise_acc=QUANT_BLOCK if block_m >= 64 else 0,
    )
