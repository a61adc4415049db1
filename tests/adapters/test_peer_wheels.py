"""The peer wheel cache (diffmoe/adapters/peer_wheels.py): pinned sha256, only the listed files kept,
the wheel deleted, one-line errors naming the fetch command, offline after one fetch.

These tests build their own small wheels (zip files) and fake `pip download`: no network. The
real vLLM wheel is fetched by tests/peers/test_peers_vllm.py.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import subprocess
import zipfile
from pathlib import Path

import pytest

from diffmoe.adapters import peer_wheels
from diffmoe.adapters.peer_wheels import PeerError, PeerWheel
from diffmoe.frontends import cli

KEPT = ("pkg/kernels/moe.py", "pkg/kernels/align.py", "pkg/configs/")
KEPT_FILES = ("pkg/kernels/moe.py", "pkg/kernels/align.py", "pkg/configs/a.json", "pkg/configs/b.json")


def make_wheel(path: Path, extra: dict[str, bytes] | None = None) -> str:
    files = {KEPT[0]: b"def moe(): return 1\n", KEPT[1]: b"def align(): return 2\n",
             "pkg/configs/a.json": b"{}", "pkg/configs/b.json": b"{}",
             "pkg/__init__.py": b"raise ImportError('a package __init__ must never run')\n",
             "pkg/big.bin": b"x" * 10_000, **(extra or {})}
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def fake_peer(tmp_path, monkeypatch):
    """A pinned peer 'toy' whose wheel is tmp_path/toy-1.0-py3-none-any.whl, the cache in tmp_path/cache."""
    wheel = tmp_path / "toy-1.0-py3-none-any.whl"
    digest = make_wheel(wheel)
    pin = PeerWheel(name="toy", package="toy", version="1.0", filename=wheel.name, sha256=digest, files=KEPT,
                    license="MIT")
    monkeypatch.setitem(peer_wheels.PEERS, "toy", pin)
    monkeypatch.setenv(peer_wheels.CACHE_ENV, str(tmp_path / "cache"))
    return pin, wheel


def test_the_vllm_pin():
    pin = peer_wheels.PEERS["vllm"]
    assert pin.requirement == "vllm==0.33.0" and len(pin.sha256) == 64 and int(pin.sha256, 16)
    # the adapter's files below fused_moe/, and the quant methods whose call sites it mirrors (peers/call_sites.py)
    assert all(f.startswith(("vllm/model_executor/layers/fused_moe/", "vllm/model_executor/layers/quantization/"))
               and f.endswith((".py", "/")) for f in pin.files)


def fetch_with_fake_pip(pin, wheel: Path, monkeypatch) -> list[str]:
    """Fetch peer 'toy' with `pip download` faked (it leaves `wheel`); returns pip's command line."""
    calls = []

    def fake_run(cmd, **kwargs):
        calls.append(cmd)
        (Path(cmd[cmd.index("-d") + 1]) / pin.filename).write_bytes(wheel.read_bytes())
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(peer_wheels.subprocess, "run", fake_run)
    peer_wheels.fetch("toy")
    return calls[0]


def test_the_lmdeploy_pin():
    pin = peer_wheels.PEERS["lmdeploy"]
    assert pin.requirement == "lmdeploy==0.18.0" and len(pin.sha256) == 64 and int(pin.sha256, 16)
    # the kernels, and the backend's MoE impl whose call it mirrors (peers/call_sites.py)
    assert all(f.startswith(("lmdeploy/pytorch/kernels/cuda/", "lmdeploy/pytorch/backends/cuda/moe/"))
               and f.endswith(".py") for f in pin.files)
    # a cp311-cp311 wheel: the pin names its interpreter, and the file name agrees
    assert pin.python == "3.11" and "-cp311-cp311-" in pin.filename


def test_a_cpython_specific_pin_downloads_for_its_interpreter_whatever_runs_pip(fake_peer, monkeypatch):
    pin, wheel = fake_peer
    monkeypatch.setitem(peer_wheels.PEERS, "toy", dataclasses.replace(pin, python="3.11"))
    cmd = fetch_with_fake_pip(pin, wheel, monkeypatch)
    assert cmd[cmd.index("--python-version") + 1] == "3.11" and cmd[cmd.index("--abi") + 1] == "cp311"
    assert cmd[cmd.index("--implementation") + 1] == "cp"


def test_a_py3_pin_leaves_the_interpreter_to_pip(fake_peer, monkeypatch):
    pin, wheel = fake_peer
    cmd = fetch_with_fake_pip(pin, wheel, monkeypatch)
    assert "--python-version" not in cmd and "--abi" not in cmd


def test_cache_dir_default_and_override(monkeypatch, tmp_path):
    monkeypatch.delenv(peer_wheels.CACHE_ENV, raising=False)
    assert peer_wheels.cache_dir() == Path("~/.cache/diffmoe/peers").expanduser()
    monkeypatch.setenv(peer_wheels.CACHE_ENV, str(tmp_path / "elsewhere"))
    assert peer_wheels.cache_dir() == tmp_path / "elsewhere"


def test_missing_peer_is_one_line_naming_the_fetch_command(fake_peer):
    with pytest.raises(PeerError) as exc:
        peer_wheels.peer_root("toy")
    message = str(exc.value)
    assert "\n" not in message and "`diffmoe peers fetch toy`" in message and peer_wheels.CACHE_ENV in message
    with pytest.raises(PeerError, match="unknown peer 'nope'"):
        peer_wheels.peer_root("nope")


def test_fetch_from_a_wheel_keeps_only_the_listed_files(fake_peer, tmp_path):
    pin, wheel = fake_peer
    root = peer_wheels.fetch("toy", wheel)
    assert root == tmp_path / "cache" / pin.dirname and peer_wheels.peer_root("toy") == root
    kept = sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())
    assert kept == sorted([*KEPT_FILES, peer_wheels.MANIFEST])
    assert (root / KEPT[0]).read_bytes() == b"def moe(): return 1\n"
    manifest = json.loads((root / peer_wheels.MANIFEST).read_text())
    assert manifest["sha256"] == pin.sha256 and manifest["files"] == list(KEPT)
    assert manifest["extracted"] == list(KEPT_FILES)
    (root / KEPT_FILES[-1]).unlink()  # a cache missing a file is not a cache
    assert not peer_wheels.is_cached("toy")
    assert wheel.exists()  # a wheel the caller handed over is theirs
    assert not any(p.name.endswith(".partial") for p in root.parent.iterdir())


def test_a_wheel_with_another_sha256_is_refused_and_nothing_is_cached(fake_peer, tmp_path):
    _, wheel = fake_peer
    make_wheel(wheel, {"pkg/kernels/moe.py": b"def moe(): return 'tampered'\n"})
    with pytest.raises(PeerError, match="refusing to use it"):
        peer_wheels.fetch("toy", wheel)
    assert not peer_wheels.is_cached("toy")


def test_fetch_downloads_without_dependencies_and_deletes_the_wheel(fake_peer, monkeypatch):
    pin, wheel = fake_peer
    calls = []
    saved = []

    def fake_run(cmd, **kwargs):
        calls.append(cmd)
        into = Path(cmd[cmd.index("-d") + 1])
        target = into / pin.filename
        target.write_bytes(wheel.read_bytes())
        saved.append(target)
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(peer_wheels.subprocess, "run", fake_run)
    root = peer_wheels.fetch("toy")
    assert calls and "--no-deps" in calls[0] and "toy==1.0" in calls[0] and calls[0][1:4] == ["-m", "pip", "download"]
    assert saved and not saved[0].exists()  # the downloaded wheel is gone
    assert (root / KEPT[1]).is_file()
    # offline after one fetch: a second fetch does not run pip
    monkeypatch.setattr(peer_wheels.subprocess, "run", lambda *a, **k: pytest.fail("fetched again"))
    assert peer_wheels.fetch("toy") == root


def test_a_cache_kept_under_another_file_list_is_a_miss_that_one_fetch_mends(fake_peer, monkeypatch):
    """A pin whose kept files grew (a call site added for tests/peers/test_peer_call_sites.py): the cache extracted
    under the old list is not a cache (peer_root names the fetch), and one fetch downloads and keeps the new list."""
    pin, wheel = fake_peer
    peer_wheels.fetch("toy", wheel)
    grown = dataclasses.replace(pin, files=(*KEPT, "pkg/__init__.py"))
    monkeypatch.setitem(peer_wheels.PEERS, "toy", grown)
    with pytest.raises(PeerError, match="run `diffmoe peers fetch toy` once"):
        peer_wheels.peer_root("toy")
    fetch_with_fake_pip(grown, wheel, monkeypatch)
    root = peer_wheels.peer_root("toy")
    assert (root / "pkg/__init__.py").is_file() and json.loads((root / peer_wheels.MANIFEST).read_text())["files"][-1] == "pkg/__init__.py"


def test_two_file_lists_of_one_release_keep_their_own_entries(fake_peer, monkeypatch):
    """Two versions of diffmoe sharing one cache (a CI cache used by two branches) keep different files of
    one release: each fetch keeps its own entry, and neither makes the other's a miss."""
    pin, wheel = fake_peer
    grown = dataclasses.replace(pin, files=(*KEPT, "pkg/__init__.py"))
    assert grown.dirname != pin.dirname and grown.dirname.startswith("toy-1.0-")
    first = peer_wheels.fetch("toy", wheel)
    monkeypatch.setitem(peer_wheels.PEERS, "toy", grown)
    second = peer_wheels.fetch("toy", wheel)
    assert second != first and (second / "pkg/__init__.py").is_file()
    monkeypatch.setitem(peer_wheels.PEERS, "toy", pin)
    assert peer_wheels.peer_root("toy") == first and not (first / "pkg/__init__.py").exists()


def test_a_failed_download_is_one_line(fake_peer, monkeypatch):
    monkeypatch.setattr(peer_wheels.subprocess, "run",
                        lambda cmd, **k: subprocess.CompletedProcess(cmd, 1, "", "ERROR: No matching distribution\n"))
    with pytest.raises(PeerError) as exc:
        peer_wheels.fetch("toy")
    assert "\n" not in str(exc.value) and "No matching distribution" in str(exc.value)
    assert not peer_wheels.is_cached("toy")


def test_the_peers_command_fetches_lists_and_refuses(fake_peer, capsys):
    _, wheel = fake_peer
    assert cli.main(["peers", "list"]) == 0
    assert "toy==1.0" in capsys.readouterr().out
    assert cli.main(["peers", "fetch", "toy", "--wheel", str(wheel.with_name("missing.whl"))]) == 2
    err = capsys.readouterr().err
    assert err.startswith("diffmoe: error: ") and "no wheel file" in err and err.count("\n") == 1, err
    assert cli.main(["peers", "fetch", "toy", "--wheel", str(wheel)]) == 0
    assert "sha256 verified" in capsys.readouterr().out
    assert cli.main(["peers", "list"]) == 0
    line = capsys.readouterr().out.split("toy==1.0")[1].splitlines()[0]
    assert line.rstrip().endswith("cached") and "not cached" not in line
    for usage in (["fetch", "unknown-peer"], ["fetch"], []):
        assert cli.main(["peers", *usage]) == 2
        err = capsys.readouterr().err
        assert err.startswith("diffmoe: error: ") and err.count("\n") == 1, err


@pytest.mark.parametrize("argv", [["-h"], ["--help"], ["fetch", "-h"], ["list", "--help"]])
def test_peers_help_exits_0(argv, capsys):
    """`diffmoe peers -h` exited 2 ("unrecognized arguments: -h", issue 49): help is help at every level."""
    assert cli.main(["peers", *argv]) == 0
    assert capsys.readouterr().out.startswith("usage: diffmoe peers")


def test_concurrent_fetches_download_once(fake_peer, monkeypatch):
    # pytest-xdist workers fetch the same peer at once: the lock makes the second wait and reuse
    import threading
    import time

    pin, wheel = fake_peer
    downloads = []

    def slow_run(cmd, **kwargs):
        downloads.append(cmd)
        time.sleep(0.3)  # both callers are inside fetch() by now
        (Path(cmd[cmd.index("-d") + 1]) / pin.filename).write_bytes(wheel.read_bytes())
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(peer_wheels.subprocess, "run", slow_run)
    roots, errors = [], []

    def fetch():
        try:
            roots.append(peer_wheels.fetch("toy"))
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=fetch) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(roots) == 2 and roots[0] == roots[1]
    assert len(downloads) == 1 and (roots[0] / KEPT[0]).is_file()


def test_a_hyphenated_distribution_is_found_under_its_wheel_name(tmp_path, monkeypatch):
    """pip saves liger-kernel as liger_kernel-0.8.5-py3-none-any.whl (PEP 427): the fetch finds it
    (it once looked for liger-kernel-0.8.5-*.whl and reported no wheel)."""
    wheel = tmp_path / "toy_kernel-1.0-py3-none-any.whl"
    digest = make_wheel(wheel)
    pin = PeerWheel(name="toy-kernel", package="toy-kernel", version="1.0", filename=wheel.name, sha256=digest,
                    files=KEPT, license="MIT")
    monkeypatch.setitem(peer_wheels.PEERS, "toy-kernel", pin)
    monkeypatch.setenv(peer_wheels.CACHE_ENV, str(tmp_path / "cache"))

    def fake_run(cmd, **kwargs):
        (Path(cmd[cmd.index("-d") + 1]) / wheel.name).write_bytes(wheel.read_bytes())
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(peer_wheels.subprocess, "run", fake_run)
    assert (peer_wheels.fetch("toy-kernel") / KEPT[0]).is_file()


def test_the_sglang_pins():
    """`diffmoe peers fetch sglang` is 0.5.23; 0.5.20 (the museum's buggy release) beside it, the
    same files of the cp311 wheel."""
    assert peer_wheels.PEERS["sglang"] is peer_wheels.PEERS["sglang==0.5.23"]
    for name, version in (("sglang==0.5.23", "0.5.23"), ("sglang==0.5.20", "0.5.20")):
        pin = peer_wheels.PEERS[name]
        assert pin.requirement == name and pin.version == version and len(pin.sha256) == 64 and int(pin.sha256, 16)
        assert pin.python == "3.11" and pin.filename.startswith(f"sglang-{version}-cp311-cp311-")
        assert all(f.startswith("sglang/") and f.endswith((".py", "/")) for f in pin.files)
    assert peer_wheels.PEERS["sglang==0.5.20"].sha256 != peer_wheels.PEERS["sglang"].sha256
