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

The pins themselves (version, sha256, the files kept) are each project's release table,
peers/PROJECT/releases.py, one row per release, read by name (diffmoe.contract.PEER_PROJECTS).

Owns the wheel record, the cache layout, the fetch. Must not import a peer's code or an
implementation: it only moves files (the release tables are data, read through the contract).
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


def release_wheels(project: str, releases: dict, default: str) -> dict[str, PeerWheel]:
    """A project's `diffmoe peers fetch` names from its release table (peers/PROJECT/releases.py):
    `PROJECT==V` for each release, and `PROJECT` for the default one (the same wheel and cache)."""
    wheels = {f"{project}=={v}": r.wheel for v, r in releases.items()}
    return {project: wheels[f"{project}=={default}"], **wheels}


_PEERS: dict[str, PeerWheel] | None = None


def peers() -> dict[str, PeerWheel]:
    """Every pinned wheel by `diffmoe peers fetch` name, read once from each project's release table
    (diffmoe.contract.PEER_PROJECTS: one row per release, nothing here to add)."""
    global _PEERS
    if _PEERS is None:
        from diffmoe.contract import peer_release_tables

        found: dict[str, PeerWheel] = {}
        for project, table in peer_release_tables().items():
            found.update(release_wheels(project, table.RELEASES, table.DEFAULT))
        _PEERS = found
    return _PEERS


def __getattr__(name: str):
    if name == "PEERS":  # read when first asked: the tables live with the adapters (peers/PROJECT/releases.py)
        return peers()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class PeerError(RuntimeError):
    """A peer cannot be fetched or is not cached; the message is one line naming the fix."""


def cache_dir() -> Path:
    """The cache root: $DIFFMOE_PEER_CACHE, else ~/.cache/diffmoe/peers."""
    env = os.environ.get(CACHE_ENV)
    return Path(env).expanduser() if env else DEFAULT_CACHE.expanduser()


def peer(name: str) -> PeerWheel:
    known = peers()
    if name not in known:
        raise PeerError(f"unknown peer {name!r}; known peers: {sorted(known)}")
    return known[name]


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
