"""The peer wheel cache: third-party MoE kernels (peers/) are loaded from their own pinned wheels.

A peer package cannot be a pip extra beside diffmoe's torch/triton pins (vllm 0.33.0 pins
torch==2.14.0; lmdeploy 0.18.0 pins torch<=2.12.1 and triton<=3.7.1), and no third-party source is copied into this repository
(liger-kernel 0.8.5 could be an extra, but it is fetched the same way, so that every peer runs
the pinned files and nothing else of its package). Instead
`diffmoe peers fetch NAME` runs

    python -m pip download --no-deps --only-binary :all: --platform PLATFORM [--python-version V
        --implementation cp --abi cpVV] NAME==VERSION -d TMP

checks the wheel's sha256 against the constant pinned here, extracts only the files the
adapter loads (PeerWheel.files) into the cache directory, writes a small manifest, and deletes
the wheel. After one fetch everything is offline: `peer_root(name)` only reads the cache.

Cache directory: $DIFFMOE_PEER_CACHE when set, else ~/.cache/diffmoe/peers; a peer lives in
<cache>/<name>-<version>-<list key>/ with its files at their paths inside the wheel
(<cache>/vllm-0.33.0-1a2b3c4d/vllm/model_executor/layers/fused_moe/fused_moe.py, ...). The list key
(PeerWheel.dirname): two versions of diffmoe keeping different files of one release (a CI cache shared
by branches) each keep their own entry instead of fetching over each other's.

Command line (diffmoe/frontends/commands/peers.py):

    diffmoe peers fetch NAME [--wheel FILE.whl]   download (or take FILE.whl), verify, extract;
                                                  NAME: vllm (0.33.0), vllm==0.28.0, vllm==0.30.0,
                                                  vllm==0.33.0, lmdeploy, liger, sglang (0.5.23),
                                                  sglang==0.5.20, sglang==0.5.23
    diffmoe peers list                            every known peer, its pin and whether it is cached

Owns the pinned wheels (name, version, sha256, files kept) and the cache layout. Must not
import a peer's code or an implementation: it only moves files.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

try:
    import fcntl
except ImportError:  # not POSIX: fetches are not serialised
    fcntl = None

CACHE_ENV = "DIFFMOE_PEER_CACHE"
DEFAULT_CACHE = Path("~/.cache/diffmoe/peers")
MANIFEST = "diffmoe-peer.json"


@dataclass(frozen=True)
class PeerWheel:
    """One pinned third-party wheel and the files of it an adapter loads."""

    name: str  # the `diffmoe peers fetch NAME` name
    package: str  # the PyPI distribution
    version: str
    filename: str  # the wheel pip downloads for this platform
    sha256: str
    files: tuple[str, ...]  # paths inside the wheel kept in the cache; "dir/" keeps every file below dir/
    license: str
    platform: str = "manylinux_2_28_x86_64"  # pip download --platform: the pinned file on any machine
    # a CPython-specific wheel (cpXY-cpXY): its interpreter version, so that pip picks the pinned file
    # whatever Python runs the fetch; None for a py3 / abi3 wheel
    python: str | None = None

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"

    @property
    def dirname(self) -> str:
        """<name>-<version>-<the first 8 hex digits of the kept-file list's sha256> (module doc)."""
        key = hashlib.sha256("\n".join(self.files).encode()).hexdigest()[:8]
        return f"{self.name}-{self.version}-{key}"


_VLLM_MOE = "vllm/model_executor/layers/fused_moe"
_LMDEPLOY_KERNELS = "lmdeploy/pytorch/kernels/cuda"
# The vLLM files the adapters load (peers/vllm_core.py), the same paths in every supported release.
_VLLM_FILES = (
    f"{_VLLM_MOE}/fused_moe.py",  # fused_moe_kernel, invoke_fused_moe_triton_kernel, configs
    f"{_VLLM_MOE}/moe_align_block_size.py",  # the Python side of the alignment op
    f"{_VLLM_MOE}/experts/triton_moe.py",  # TritonExperts: workspace_shapes, apply (the carving)
    f"{_VLLM_MOE}/utils.py",  # _resize_cache, moe_kernel_quantize_input, enable_swap_ab
    f"{_VLLM_MOE}/modular_kernel.py",  # FusedMoEExperts(Modular): TritonExperts' base classes
    f"{_VLLM_MOE}/configs/",  # the tuned tile configs fused_moe.py reads per GPU name (~340 JSON files, ~1.1 MB)
    # the call sites the adapter mirrors, read (never run) by tests/test_peer_call_sites.py (peers/call_sites.py)
    f"{_VLLM_MOE}/fused_moe_modular_method.py",  # FusedMoEModularMethod.apply: the layer's expert map, router weight
    f"{_VLLM_MOE}/prepare_finalize/no_dp_ep.py",  # prepare: the router weight on the input, the input quant's flags
    f"{_VLLM_MOE}/oracle/fp8.py",  # make_fp8_moe_quant_config: the SwiGLU limit as gemm1_clamp_limit, the scale flags
    f"{_VLLM_MOE}/unquantized_fused_moe_method.py",  # bf16's quant config: the SwiGLU limit as gemm1_clamp_limit
    "vllm/model_executor/layers/quantization/fp8.py",  # Fp8MoEMethod: per-tensor and 128-block FP8, its flags
    # CompressedTensorsW8A8Fp8MoEMethod: per-channel weights beside per-token activations
    "vllm/model_executor/layers/quantization/compressed_tensors/compressed_tensors_moe/compressed_tensors_moe_w8a8_fp8.py",
)


def _vllm(version: str, sha256: str) -> PeerWheel:
    return PeerWheel(name="vllm", package="vllm", version=version,
                     filename=f"vllm-{version}-cp38-abi3-manylinux_2_28_x86_64.whl", sha256=sha256,
                     files=_VLLM_FILES, license="Apache-2.0")


# Every supported vLLM release (peers/vllm_core.py RELEASES), by `diffmoe peers fetch` name; each
# sha256 measured on the wheel PyPI served on 2026-12-04 (sizes in bytes beside it).
VLLM_RELEASES: dict[str, PeerWheel] = {
    "vllm==0.28.0": _vllm("0.28.0", "addb0ffdaafd8155d75e9b3f5ddb3da28fdee9e8a7097ede91f7db2e9e1a3889"),  # 314,500,103
    "vllm==0.30.0": _vllm("0.30.0", "ef52ee58c410ead0b8afb190838fa4cbcb52075596f67862a03859d984966ac4"),  # 314,883,777
    "vllm==0.33.0": _vllm("0.33.0", "4b6bdec4ab269990bf70d45a3c1e94c3760a27064513760193b26d6f0da883aa"),  # 336,361,138
}
_LIGER = "liger_kernel"
# The Liger files the adapter loads (peers/liger_core.py), the same paths in every supported release.
_LIGER_FILES = (
    f"{_LIGER}/ops/fused_moe.py",  # LigerFusedMoEFunction (its forward: the run sequence), compute_routing_metadata
    f"{_LIGER}/ops/fused_moe_kernels.py",  # the routing, fused up-proj + SwiGLU, down-proj and gather-sum kernels
    f"{_LIGER}/ops/utils.py",  # ensure_contiguous (the forward's decorator)
    f"{_LIGER}/utils.py",  # infer_device (ops/utils.py imports it)
    f"{_LIGER}/transformers/swiglu.py",  # LigerExperts.forward: the call site tests/test_peer_call_sites.py reads
)
# Every supported Liger-Kernel release, by `diffmoe peers fetch` name; each sha256 measured on the wheel PyPI
# served (0.8.5 on 2026-12-04: 910,117 bytes; 0.8.0 and 0.8.1 on 2026-12-05: 403,120 and 506,445 bytes).
LIGER_RELEASES: dict[str, PeerWheel] = {
    f"liger=={v}": PeerWheel(name="liger", package="liger-kernel", version=v, filename=f"liger_kernel-{v}-py3-none-any.whl",
                             sha256=sha256, files=_LIGER_FILES, license="BSD-2-Clause")
    for v, sha256 in (("0.8.0", "e1f03eeb4ba6a6a413d585dacf92c4c15d164bab5844fa4ead2fede6bcac469c"),
                      ("0.8.1", "90836c1e9de22a1c57a640775fb79151ea704748cf9c3f6658dddaa06fff1989"),
                      ("0.8.5", "60789cd576af073ab9b192b570d2597fd0cdad489cd62fb44fb16256d43754c9"))
}
_SGLANG_MOE = "sglang/srt/layers/moe/moe_runner/triton_utils"
# The SGLang files the adapter loads (peers/sglang_core.py), the same paths in both supported
# releases.
_SGLANG_FILES = (
    f"{_SGLANG_MOE}/fused_moe.py",  # fused_experts, _fused_moe_kernel_sequence, moe_combine_topk: the run sequence
    f"{_SGLANG_MOE}/moe_align_block_size.py",  # the Python side of the alignment op (+1 bucket)
    f"{_SGLANG_MOE}/fused_moe_triton_config.py",  # try_get_optimal_moe_config: the tile config
    "sglang/kernels/ops/moe/fused_moe_triton_kernels.py",  # fused_moe_kernel, invoke_fused_moe_kernel, moe_sum_reduce_triton
    "sglang/kernels/ops/moe/moe_align_small_numel.py",  # the Triton align for one-token batches over > 63 experts
    "sglang/kernels/ops/quantization/fp8_kernel.py",  # scaled_fp8_quant, the per-token-group quants
    "sglang/kernels/ops/quantization/fp8_utils.py",  # fp8_dtype_to_triton (fp8_kernel.py imports it)
    f"{_SGLANG_MOE}/configs/",  # the tuned tile configs per Triton release and GPU (~390 JSON files, ~1.6 MB)
    # the call sites the adapter mirrors, read (never run) by tests/test_peer_call_sites.py (peers/call_sites.py)
    "sglang/srt/layers/moe/fused_moe_triton/layer.py",  # FusedMoE.__init__: the runner config the layer fills
    "sglang/srt/layers/moe/moe_runner/triton.py",  # fused_experts_none_to_triton: the fused_experts call
    "sglang/srt/layers/moe/moe_runner/base.py",  # MoeRunnerConfig: the runner fields fused_experts reads
    "sglang/srt/layers/quantization/fp8.py",  # Fp8MoEMethod.get_triton_quant_info: per-tensor and 128-block FP8
    "sglang/srt/layers/quantization/w8a8_fp8.py",  # W8A8Fp8MoEMethod.get_triton_quant_info: per-channel weights
    "sglang/srt/layers/quantization/unquant.py",  # UnquantizedFusedMoEMethod.get_triton_quant_info: bf16
)


def _sglang(version: str, filename: str, sha256: str) -> PeerWheel:
    return PeerWheel(name="sglang", package="sglang", version=version, filename=filename, sha256=sha256,
                     files=_SGLANG_FILES, license="Apache-2.0", platform="manylinux_2_34_x86_64", python="3.11")


# Every supported SGLang release, by `diffmoe peers fetch` name; each sha256 measured on the wheel
# PyPI served on 2026-12-05 (sizes in bytes beside it).
SGLANG_RELEASES: dict[str, PeerWheel] = {
    "sglang==0.5.20": _sglang("0.5.20", "sglang-0.5.20-cp311-cp311-manylinux_2_34_x86_64.whl",
                              "1573527042f4f6b4ead838302818595fc77fdc611dbcc2e40cd150fbc8f8513c"),  # 27,393,709
    "sglang==0.5.23": _sglang("0.5.23", "sglang-0.5.23-cp311-cp311-manylinux_2_34_x86_64.whl",
                              "00b3cd5b265ac76c64185fbb6b95424f324ddd9f428d0306b77bc9db9d859937"),  # 39,063,923
}
PEERS: dict[str, PeerWheel] = {
    "vllm": VLLM_RELEASES["vllm==0.33.0"],  # the default vLLM pin: `--impl vllm`, the same cache as vllm==0.33.0
    **VLLM_RELEASES,
    "lmdeploy": PeerWheel(
        name="lmdeploy",
        package="lmdeploy",
        version="0.18.0",
        filename="lmdeploy-0.18.0-cp311-cp311-manylinux_2_28_x86_64.whl",
        # measured on the wheel PyPI served on 2026-12-04 (106,690,261 bytes)
        sha256="e6790a25dcdb0345c160567fdf2ac604fec319389523a8b806834c9d92c8ffe1",
        files=(
            f"{_LMDEPLOY_KERNELS}/moe/blocked_fp8.py",  # fused_moe_blocked_fp8: both blocked-FP8 GEMMs, the sequence
            f"{_LMDEPLOY_KERNELS}/moe/fused_moe.py",  # the route sort kernels, moe_reduce, _make_intermediate
            f"{_LMDEPLOY_KERNELS}/activation.py",  # silu_and_mul
            f"{_LMDEPLOY_KERNELS}/blocked_gemm_fp8.py",  # quant_fp8: the 1x128-group activation quant
            f"{_LMDEPLOY_KERNELS}/utils.py",  # get_device_props (the launch grids read it)
            # the call site the adapter mirrors (TritonFusedMoEBlockedF8Impl.forward), read by
            # tests/test_peer_call_sites.py (peers/call_sites.py)
            "lmdeploy/pytorch/backends/cuda/moe/blocked_fp8.py",
        ),
        license="Apache-2.0",
        python="3.11",
    ),
    "liger": LIGER_RELEASES["liger==0.8.5"],  # the default Liger pin: `--impl liger`, the same cache as liger==0.8.5
    **LIGER_RELEASES,
    "sglang": SGLANG_RELEASES["sglang==0.5.23"],  # the default SGLang pin: `--impl sglang`
    **SGLANG_RELEASES,
}


class PeerError(RuntimeError):
    """A peer cannot be fetched or is not cached; the message is one line naming the fix."""


def cache_dir() -> Path:
    """The cache root: $DIFFMOE_PEER_CACHE, else ~/.cache/diffmoe/peers."""
    env = os.environ.get(CACHE_ENV)
    return Path(env).expanduser() if env else DEFAULT_CACHE.expanduser()


def peer(name: str) -> PeerWheel:
    if name not in PEERS:
        raise PeerError(f"unknown peer {name!r}; known peers: {sorted(PEERS)}")
    return PEERS[name]


def fetch_command(name: str) -> str:
    return f"diffmoe peers fetch {name}"


def _manifest_ok(root: Path, wheel: PeerWheel) -> bool:
    try:
        data = json.loads((root / MANIFEST).read_text())
    except (OSError, ValueError):
        return False
    extracted = data.get("extracted")
    return (data.get("sha256") == wheel.sha256 and data.get("version") == wheel.version
            and data.get("files") == list(wheel.files) and isinstance(extracted, list)
            and all((root / f).is_file() for f in extracted))


def _members(wheel: PeerWheel, names: list[str], wheel_name: str) -> list[str]:
    """The wheel's members PeerWheel.files names (a "dir/" entry: every file below it)."""
    chosen = []
    for entry in wheel.files:
        if entry.endswith("/"):
            below = sorted(n for n in names if n.startswith(entry) and not n.endswith("/"))
            if not below:
                raise PeerError(f"{wheel_name} has no files under {entry}")
            chosen += below
        elif entry in names:
            chosen.append(entry)
        else:
            raise PeerError(f"{wheel_name} has no {entry}")
    return chosen


def peer_root(name: str) -> Path:
    """The cached root of peer `name` (its files at their wheel paths below it), or PeerError
    with one line naming the fetch command."""
    wheel = peer(name)
    root = cache_dir() / wheel.dirname
    if not _manifest_ok(root, wheel):
        raise PeerError(not_cached_message([name], root))
    return root


def not_cached_message(names: list[str], where: Path) -> str:
    """One line: the peers `names` are not in the cache at `where`, and the fetch for each."""
    fetches = " and ".join(f"`{fetch_command(n)}`" for n in names)
    return (f"{', '.join(peer(n).requirement for n in names)} {'is' if len(names) == 1 else 'are'} not in the peer "
            f"cache ({where}); run {fetches} once (needs network; set {CACHE_ENV} to move the cache)")


def is_cached(name: str) -> bool:
    try:
        peer_root(name)
    except PeerError:
        return False
    return True


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _download(wheel: PeerWheel, into: Path) -> Path:
    # the pinned wheel's platform whatever this machine is: only its .py files are kept, and the
    # sha256 pins that one file
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "--platform", wheel.platform]
    if wheel.python is not None:
        abi = "cp" + wheel.python.replace(".", "")
        cmd += ["--python-version", wheel.python, "--implementation", "cp", "--abi", abi]
    cmd += [wheel.requirement, "-d", str(into), "--quiet"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["(no output)"]
        raise PeerError(f"pip download {wheel.requirement} failed (exit {done.returncode}): {tail[0]}")
    # a wheel's file name spells the distribution with underscores (PEP 427: liger-kernel is
    # liger_kernel-0.8.5-py3-none-any.whl)
    found = sorted(into.glob(f"{wheel.package.replace('-', '_')}-{wheel.version}-*.whl"))
    if not found:
        raise PeerError(f"pip download {wheel.requirement} left no wheel in {into}")
    return found[0]


def _extract(wheel: PeerWheel, wheel_file: Path, root: Path) -> int:
    """Verify and extract the kept files into a fresh `root`; returns the bytes written."""
    digest = sha256_of(wheel_file)
    if digest != wheel.sha256:
        raise PeerError(f"{wheel_file.name} has sha256 {digest}, the pin for {wheel.requirement} is {wheel.sha256}; "
                        "refusing to use it")
    staging = root.with_name(root.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    written = 0
    with zipfile.ZipFile(wheel_file) as zf:
        members = _members(wheel, zf.namelist(), wheel_file.name)
        for member in members:
            target = (staging / member).resolve()
            if staging.resolve() not in target.parents:
                raise PeerError(f"{wheel_file.name}: member {member!r} points outside the cache")
            target.parent.mkdir(parents=True, exist_ok=True)
            data = zf.read(member)
            target.write_bytes(data)
            written += len(data)
    (staging / MANIFEST).write_text(json.dumps({
        "name": wheel.name, "package": wheel.package, "version": wheel.version, "wheel": wheel_file.name,
        "sha256": wheel.sha256, "license": wheel.license, "files": list(wheel.files), "extracted": members,
    }, indent=1) + "\n")
    shutil.rmtree(root, ignore_errors=True)
    staging.rename(root)
    return written


def fetch(name: str, wheel_file: str | os.PathLike | None = None) -> Path:
    """Put peer `name` in the cache and return its root: nothing to do when it is cached; else
    pip-download the pinned wheel (or take `wheel_file`, e.g. one downloaded elsewhere), check its
    sha256, keep only PeerWheel.files and delete the downloaded wheel (a given one is left alone)."""
    wheel = peer(name)
    root = cache_dir() / wheel.dirname
    if _manifest_ok(root, wheel):
        return root
    root.parent.mkdir(parents=True, exist_ok=True)
    # One fetch at a time per peer (pytest-xdist workers, two shells): the second waits, then
    # finds the files cached instead of extracting over the first one's staging folder.
    with open(root.parent / f"{wheel.dirname}.lock", "a") as lock:
        if fcntl is not None:
            fcntl.flock(lock, fcntl.LOCK_EX)
        if _manifest_ok(root, wheel):
            return root
        return _fetch_locked(wheel, root, wheel_file)


def _fetch_locked(wheel: PeerWheel, root: Path, wheel_file: str | os.PathLike | None) -> Path:
    if wheel_file is not None:
        path = Path(wheel_file)
        if not path.is_file():
            raise PeerError(f"no wheel file {str(path)!r}")
        _extract(wheel, path, root)
        return root
    with tempfile.TemporaryDirectory(prefix=f"diffmoe-{wheel.name}-", dir=root.parent) as tmp:
        downloaded = _download(wheel, Path(tmp))
        try:
            _extract(wheel, downloaded, root)
        finally:
            downloaded.unlink(missing_ok=True)  # the wheel goes whatever happened
    return root


def tree_bytes(root: Path) -> int:
    """The bytes a cached peer's files take."""
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())
