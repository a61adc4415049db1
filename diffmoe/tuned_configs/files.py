"""The tuned-config files a release ships: what each file's name says and the entries it holds.

vLLM names a file `E=<E>,N=<N>,device_name=<GPU>[,dtype=<dtype>][,block_shape=[<n>,<k>]][,backend=...].json`
(fused_moe.py get_config_file_name); SGLang the same with `block_shape=[<n>, <k>]`, `,per_channel_quant=True`
and a `_down` suffix (a config for its down GEMM alone), in one folder per Triton version
(fused_moe_triton_config.py get_config_file_name; a file is named by its path below the folder). Each maps batch sizes ("1", "2", ..., "4096") to a tile config
(BLOCK_SIZE_M/N/K, GROUP_SIZE_M, num_warps, num_stages, some AMD keys); a "triton_version" key
records the tuning's Triton and is not an entry. A file is kept when its dtype and block shape
name a scheme diffmoe judges (SCHEMES); the others are listed with the reason they are skipped.

Owns parsing names and entries. Must not run anything: sweep.py judges the entries.
"""

from __future__ import annotations

import fnmatch
import json
import re
from dataclasses import dataclass
from pathlib import Path

from diffmoe.problem.config import QUANT_BLOCK

_NAME = re.compile(r"^E=(?P<E>\d+),N=(?P<N>\d+),device_name=(?P<device>[^,]+?)(?:,dtype=(?P<dtype>[^,]+?))?"
                   r"(?:,block_shape=\[(?P<bn>\d+), ?(?P<bk>\d+)\])?(?P<per_channel>,per_channel_quant=True)?"
                   r"(?:,backend=(?P<backend>[^,]+?))?(?P<down>_down)?\.json$")


@dataclass(frozen=True)
class ConfigFile:
    """One tuned-config file of a release, as its name describes it."""

    path: Path
    experts: int  # E
    n: int  # N: the intermediate size the file was tuned for
    device: str
    dtype: str | None  # None: unquantised (bf16 / fp16 activations and weights)
    block_shape: tuple[int, int] | None
    backend: str | None
    per_channel: bool = False  # SGLang's per_channel_quant=True: per-token activation and per-channel weight scales
    down_only: bool = False  # SGLang's `_down` file: the down GEMM's config alone
    name: str = ""  # the path below the release's config folder


    @property
    def scheme(self) -> str | None:
        """The diffmoe quant scheme the file's entries are judged under, or None (skip_reason says why)."""
        if self.backend is not None or self.down_only:
            return None
        if self.dtype in (None, "bf16"):
            return "bf16" if self.block_shape is None else None
        if self.dtype == "fp8_w8a8":
            if self.block_shape is None:
                # vLLM's name does not tell per-tensor from per-token: per-tensor is judged
                return "fp8-token" if self.per_channel else "fp8-tensor"
            return "fp8-block" if self.block_shape == (QUANT_BLOCK, QUANT_BLOCK) else None
        return None

    @property
    def skip_reason(self) -> str | None:
        if self.scheme is not None:
            return None
        if self.backend is not None:
            return f"backend={self.backend}: not the Triton fused_moe_kernel"
        if self.down_only:
            return "a down-GEMM-only config (_down): the override forces one config on both GEMMs"
        if self.dtype == "fp8_w8a8":
            return f"block_shape={list(self.block_shape)}: diffmoe's fp8-block scheme has {QUANT_BLOCK}x{QUANT_BLOCK} blocks"
        return f"dtype={self.dtype}{'' if self.block_shape is None else f' block_shape={list(self.block_shape)}'}: " \
               "a quantisation diffmoe does not judge"

    def entries(self) -> list[Entry]:
        """The file's entries in batch order; a ValueError naming the file for one that is not a tile config."""
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError) as exc:
            raise ValueError(f"{self.path}: not a readable JSON tuned-config file ({exc})") from None
        if not isinstance(data, dict):
            raise ValueError(f"{self.path}: a tuned-config file maps batch sizes to configs, got {type(data).__name__}")
        found = []
        for key, tile in data.items():
            if not key.isdigit():
                continue  # "triton_version": metadata, not an entry
            if not isinstance(tile, dict) or not all(isinstance(v, (int, float, str)) for v in tile.values()):
                raise ValueError(f"{self.path}: entry {key!r} must be a flat object of tile parameters, got {tile!r}")
            found.append(Entry(self.name, int(key), dict(tile)))
        return sorted(found, key=lambda e: e.batch)


@dataclass(frozen=True)
class Entry:
    """One batch size of one file and the tile config it maps to."""

    file: str
    batch: int
    tile: dict

    def tile_text(self) -> str:
        short = {"BLOCK_SIZE_M": "M", "BLOCK_SIZE_N": "N", "BLOCK_SIZE_K": "K", "GROUP_SIZE_M": "G", "num_warps": "w",
                 "num_stages": "s"}
        return " ".join(f"{short.get(k, k)}={v}" for k, v in self.tile.items())


def parse_name(path: Path, name: str | None = None) -> ConfigFile | None:
    """The file's description from its name (`name`: its path below the config folder, default its file
    name), or None for a name that is not a tuned-config file's."""
    m = _NAME.match(path.name)
    if m is None:
        return None
    block = (int(m["bn"]), int(m["bk"])) if m["bn"] is not None else None
    return ConfigFile(path, int(m["E"]), int(m["N"]), m["device"], m["dtype"], block, m["backend"],
                      per_channel=m["per_channel"] is not None, down_only=m["down"] is not None, name=name or path.name)


def config_files(folder: Path, pattern: str = "*.json") -> list[ConfigFile]:
    """Every tuned-config file below `folder` whose path below it, or file name, matches the glob `pattern`."""
    if not folder.is_dir():
        raise ValueError(f"no tuned-config folder {folder}")
    found = []
    for p in sorted(folder.rglob("*.json")):
        rel = p.relative_to(folder).as_posix()
        if p.is_file() and (fnmatch.fnmatchcase(rel, pattern) or fnmatch.fnmatchcase(p.name, pattern)):
            found.append(parse_name(p, rel))
    return [f for f in found if f is not None]


# Tensor-parallel degrees whose shard of a model's I a release may have tuned a file for.
TP_DEGREES = (1, 2, 4, 8, 16)


def model_key(experts: int, shared_experts: int, inter: int) -> tuple[frozenset[int], frozenset[int]]:
    """The (E, N) values a model's files are named with: E its routed experts, or with its shared
    experts fused (SGLang's E=257 for DeepSeek-V3); N its intermediate size per tensor-parallel
    shard (the engines name a file by w2's last dimension, I / TP), for TP in TP_DEGREES."""
    return (frozenset({experts, experts + shared_experts}),
            frozenset(inter // tp for tp in TP_DEGREES if inter % tp == 0))


def for_model(files: list[ConfigFile], experts: int, shared_experts: int, inter: int) -> list[ConfigFile]:
    """The files a model's MoE layer would load (model_key), in their order."""
    es, ns = model_key(experts, shared_experts, inter)
    return [f for f in files if f.experts in es and f.n in ns]

