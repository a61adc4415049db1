"""`diffmoe tuned-configs` (diffmoe/tuned_configs/): a wrong entry planted into a copy of a config
file vLLM 0.33.0 ships is named by the sweep (exit 1), the file's shipped entry beside it passes, a
resume file makes a second sweep judge nothing again, the file names are read as the schemes they
say, the override reaches vLLM's launches, and usage errors exit 2 with one line.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before Triton is imported

import json
from pathlib import Path

import pytest

from diffmoe.adapters import peer_wheels
from diffmoe.adapters.loading import load_factory
from diffmoe.tuned_configs import command, sweep
from diffmoe.tuned_configs.files import config_files, parse_name
from diffmoe.tuned_configs.sweep import factory_tuned_configs

SHIPPED = "E=8,N=7168,device_name=NVIDIA_H100_80GB_HBM3,dtype=fp8_w8a8.json"


@pytest.fixture(scope="module")
def configs_folder() -> Path:
    try:
        root = peer_wheels.fetch("vllm==0.33.0")
    except peer_wheels.PeerError as exc:
        pytest.skip(f"vllm==0.33.0 is not in the peer cache and cannot be fetched ({exc})")
    return root / factory_tuned_configs(load_factory("vllm==0.33.0"))[0]


def _planted_copy(configs_folder: Path, tmp_path: Path, wrong: dict, batches=("1", "2")) -> Path:
    """A copy of SHIPPED holding its batch-1 entry as shipped at the first batch and `wrong` at the second."""
    shipped = json.loads((configs_folder / SHIPPED).read_text())
    folder = tmp_path / "configs"
    folder.mkdir()
    (folder / SHIPPED).write_text(json.dumps({"triton_version": "3.1.0", batches[0]: shipped["1"], batches[1]: wrong}))
    return folder


def test_a_planted_wrong_entry_is_named_and_the_shipped_one_passes(configs_folder, tmp_path, capsys):
    shipped = json.loads((configs_folder / SHIPPED).read_text())
    wrong = {**shipped["2"], "BLOCK_SIZE_K": 96}  # not a power of two: no tile of the GEMM can be laid out
    folder = _planted_copy(configs_folder, tmp_path, wrong)
    code = command.main(["--impl", "vllm==0.33.0", "--config-dir", str(folder), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 1 and not out["passed"]
    rows = {(r["file"], r["batch"]): r for r in out["rows"]}
    assert rows[(SHIPPED, 1)]["verdict"] == "PASS", rows[(SHIPPED, 1)]
    named = rows[(SHIPPED, 2)]
    assert named["verdict"] == "FAIL" and named["tile"]["BLOCK_SIZE_K"] == 96
    assert named["findings"][0].startswith("crash@gate_up_gemm") and "power of 2" in named["findings"][0], named
    assert {r["file"] for r in out["rows"]} == {SHIPPED, "(default config) fp8-tensor"}  # the default path too


def test_a_resume_file_carries_every_verdict_to_the_next_sweep(configs_folder, tmp_path, capsys):
    shipped = json.loads((configs_folder / SHIPPED).read_text())["1"]
    other_schedule = {**shipped, "num_warps": 2 * shipped["num_warps"], "num_stages": shipped["num_stages"] + 1}
    folder = _planted_copy(configs_folder, tmp_path, other_schedule, ("8", "16"))
    resume = tmp_path / "verdicts.jsonl"
    args = ["--impl", "vllm==0.33.0", "--config-dir", str(folder), "--resume", str(resume), "--json"]
    assert command.main(args) == 0
    first = json.loads(capsys.readouterr().out)["rows"]
    # batches 8 and 16 hold the same tile on the same shrunk problem (T = 8 for both) but for num_warps and
    # num_stages, compile options the interpreter drops: judged once
    assert [r["shared"] for r in first if r["file"] == SHIPPED] == [False, True]
    assert len(resume.read_text().splitlines()) == 3  # the entry's run and the default config at T=1 and T=8
    assert command.main(args) == 0
    second = json.loads(capsys.readouterr().out)["rows"]
    assert all(r["shared"] for r in second) and [r["verdict"] for r in second] == [r["verdict"] for r in first]


@pytest.mark.parametrize("impl", ["vllm==0.33.0", "sglang==0.5.23"])
def test_the_forced_tile_reaches_the_releases_launches(impl):
    """The override is the release's own: a tile forced through it is the one its GEMMs launch with
    (a tile no launch can take crashes at the first GEMM, the release's own choice passes)."""
    from diffmoe.judge.runner import run_differential
    from diffmoe.problem.config import MoEConfig

    try:
        peer_wheels.fetch(impl)
    except peer_wheels.PeerError as exc:
        pytest.skip(f"{impl} is not in the peer cache and cannot be fetched ({exc})")
    force = factory_tuned_configs(load_factory(impl))[1]
    config = MoEConfig(num_tokens=2, num_experts=2, topk=1, hidden=128, inter=128, quant="bf16")
    bad = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 48, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1, "num_warps": 4, "num_stages": 2}
    report = run_differential(config, force(bad))
    assert [(f.oracle, f.stage) for f in report.findings][:1] == [("crash", "gate_up_gemm")], report.render()
    assert run_differential(config, force(None)).passed


@pytest.mark.parametrize("name, scheme", [
    ("E=8,N=7168,device_name=NVIDIA_H100_80GB_HBM3.json", "bf16"),
    ("E=8,N=7168,device_name=NVIDIA_H100_80GB_HBM3,dtype=fp8_w8a8.json", "fp8-tensor"),
    ("E=256,N=128,device_name=NVIDIA_H20,dtype=fp8_w8a8,block_shape=[128,128].json", "fp8-block"),
    ("E=256,N=128,device_name=NVIDIA_H20,dtype=fp8_w8a8,block_shape=[64,64].json", None),
    ("E=64,N=1536,device_name=NVIDIA_A100-SXM4-80GB,dtype=int8_w8a16.json", None),
    ("E=64,N=1536,device_name=NVIDIA_H100,dtype=int4_w4a16,backend=flydsl.json", None),
    ("E=256,N=128,device_name=NVIDIA_H20,dtype=fp8_w8a8,block_shape=[128, 128].json", "fp8-block"),  # SGLang's
    ("E=128,N=768,device_name=NVIDIA_H20,dtype=fp8_w8a8,per_channel_quant=True.json", "fp8-token"),
    ("E=256,N=128,device_name=NVIDIA_B200,dtype=fp8_w8a8,block_shape=[128, 128]_down.json", None),
])
def test_a_files_name_says_its_scheme(name, scheme):
    f = parse_name(Path(name))
    assert f.scheme == scheme and (f.skip_reason is None) == (scheme is not None)


def test_the_shipped_folder_is_read_whole(configs_folder):
    files = config_files(configs_folder)
    assert len(files) > 300 and all(f.skip_reason or f.entries() for f in files)
    assert all(e.batch >= 1 for e in files[0].entries())  # "triton_version" is metadata, not an entry


def test_the_shrunk_problem():
    factory = load_factory("vllm==0.33.0")
    c = sweep.shrunk_config("fp8-block", 256, 4096, factory)
    assert (c.num_tokens, c.num_experts, c.topk, c.hidden, c.inter, c.fused) == (8, 4, 2, 256, 128, True)
    assert sweep.shrunk_config("bf16", 1, 3, factory).topk == 1
    c = sweep.shrunk_config("fp8-block", 256, 2, load_factory("sglang==0.5.23"))  # SGLang's own choices
    assert (c.num_tokens, c.hidden, c.inter, c.fused) == (2, 256, 256, False)


def test_sglangs_folders_per_triton_version_are_read_by_path():
    try:
        root = peer_wheels.fetch("sglang==0.5.23")
    except peer_wheels.PeerError as exc:
        pytest.skip(f"sglang==0.5.23 is not in the peer cache and cannot be fetched ({exc})")
    files = config_files(root / factory_tuned_configs(load_factory("sglang==0.5.23"))[0], "triton_3_4_0/*")
    assert files and all(f.name.startswith("triton_3_4_0/") for f in files)
    assert {f.scheme for f in files} >= {"bf16", "fp8-tensor", "fp8-block"}


@pytest.mark.parametrize("argv, says", [
    (["--impl", "liger"], "declares no tuned configs"),
    (["--impl", "peers.sglang:make_fallback_0_5_23"], "declares no tuned configs"),
    (["--impl", "no.such.module:make"], "cannot be imported"),
    (["--impl", "vllm", "--max-entries", "0"], "whole number >= 1"),
])
def test_usage_errors_exit_2_with_one_line(argv, says, capsys):
    from diffmoe.frontends.cli import main as cli_main

    assert cli_main(["tuned-configs", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert says in err and "Traceback" not in err, err


def test_a_glob_matching_no_file_is_a_usage_error(configs_folder, capsys):
    assert command.main(["--impl", "vllm", "--files", "no-such-*.json"]) == 2
    assert "matches no tuned-config file" in capsys.readouterr().err


def test_an_sglang_entry_asking_for_tma_runs_its_tma_path_and_passes():
    """SGLang's fused_moe.py pops USE_TMA and logs it with its logger's warning_once: before the
    adapter's logger had it, every such entry (20 of triton_3_7_1's) crashed, a diffmoe defect."""
    from diffmoe.judge.runner import run_differential
    from diffmoe.problem.config import MoEConfig

    try:
        peer_wheels.fetch("sglang==0.5.23")
    except peer_wheels.PeerError as exc:
        pytest.skip(f"sglang==0.5.23 is not in the peer cache and cannot be fetched ({exc})")
    force = factory_tuned_configs(load_factory("sglang==0.5.23"))[1]
    tile = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 32, "num_warps": 4,
            "num_stages": 6, "USE_TMA": True}  # triton_3_7_1/E=32,N=1792,device_name=NVIDIA_B300_SXM6_AC.json "1"
    report = run_differential(MoEConfig(num_tokens=1, num_experts=4, topk=2, hidden=256, inter=128, quant="bf16"), force(tile))
    assert report.passed, report.render()


def test_compile_options_make_no_other_run_on_the_interpreter_and_do_compiled():
    config = sweep.shrunk_config("bf16", 8, 4, load_factory("examples/torch_moe.py:make"))
    tile = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1}
    scheduled = {**tile, "num_warps": 8, "num_stages": 3, "waves_per_eu": 0, "kpack": 2}
    assert sweep.run_key(config, tile, interpreted=True) == sweep.run_key(config, scheduled, interpreted=True)
    assert sweep.run_key(config, tile, interpreted=False) != sweep.run_key(config, scheduled, interpreted=False)
    assert sweep.run_key(config, tile) != sweep.run_key(config, {**tile, "GROUP_SIZE_M": 8})  # a value-bearing key


def jit_parameters(source: str) -> dict[str, set[str]]:
    """The parameter names of every @triton.jit function in `source`."""
    import ast

    found = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef) and any("jit" in ast.unparse(d) for d in node.decorator_list):
            found[node.name] = {a.arg for a in node.args.args + node.args.kwonlyargs}
    return found


def test_jit_parameters_sees_a_kernel_taking_a_compile_option():
    source = "import triton\n@triton.jit\ndef k(x_ptr, num_warps: tl.constexpr):\n    pass\n"
    assert jit_parameters(source) == {"k": {"x_ptr", "num_warps"}}


@pytest.mark.parametrize("impl", ["vllm==0.33.0", "sglang==0.5.23"])
def test_no_kernel_of_the_release_takes_a_compile_option_as_a_parameter(impl):
    """The interpreter drops launch keywords that are not the kernel's parameters; a kernel that took
    one (e.g. num_stages as a constexpr) would make it value-bearing and sweep.INTERPRETER_IGNORED wrong."""
    try:
        root = peer_wheels.fetch(impl)
    except peer_wheels.PeerError as exc:
        pytest.skip(f"{impl} is not in the peer cache and cannot be fetched ({exc})")
    kernels = {}
    for path in root.rglob("*.py"):
        text = path.read_text(errors="replace")
        if "triton.jit" in text:
            kernels.update({f"{path.name}:{k}": p for k, p in jit_parameters(text).items()})
    assert any("fused_moe_kernel" in name for name in kernels), sorted(kernels)
    assert {name: p & sweep.INTERPRETER_IGNORED for name, p in kernels.items() if p & sweep.INTERPRETER_IGNORED} == {}


@pytest.mark.slow  # two sweeps of four runs each and a local Ray start: about 60 s on 2 loaded cores
def test_two_workers_on_a_local_ray_runtime_reach_the_sequential_verdicts(configs_folder, tmp_path, capsys):
    shipped = json.loads((configs_folder / SHIPPED).read_text())
    folder = _planted_copy(configs_folder, tmp_path, {**shipped["2"], "BLOCK_SIZE_K": 96})
    base = ["--impl", "vllm==0.33.0", "--config-dir", str(folder), "--json"]
    assert command.main(base) == 1
    sequential = json.loads(capsys.readouterr().out)
    resume = tmp_path / "verdicts.jsonl"
    # --workers 2 and no --cluster: the command starts a local Ray runtime itself (in a fresh
    # interpreter: tests/support/fresh_process.py says why)
    import fresh_process

    done = fresh_process.run(["-m", "diffmoe", "tuned-configs", *base, "--workers", "2", "--resume", str(resume)])
    assert done.returncode == 1, done.stderr[-2000:]
    parallel = json.loads(done.stdout)
    strip = lambda rows: [{k: v for k, v in r.items() if k != "seconds"} for r in rows]  # noqa: E731
    assert strip(parallel["rows"]) == strip(sequential["rows"]) and parallel["skipped"] == sequential["skipped"]
    assert any(r["verdict"] == "FAIL" for r in parallel["rows"])  # the planted entry, named on Ray too
    assert len(resume.read_text().splitlines()) == 4  # every distinct run's verdict, written as it arrived


def test_ctrl_c_keeps_every_verdict_reached_in_the_resume_file(configs_folder, tmp_path, monkeypatch):
    calls = []

    def judged_then_stopped(config, factory, name, oracles):
        calls.append(name)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return True, []

    monkeypatch.setattr(sweep, "judge", judged_then_stopped)  # no check runs: the sweep's bookkeeping alone
    folder = _planted_copy(configs_folder, tmp_path, {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1})
    resume = tmp_path / "verdicts.jsonl"
    rows = []
    with pytest.raises(KeyboardInterrupt):
        sweep.sweep(load_factory("vllm==0.33.0"), folder, "vllm==0.33.0", resume=resume, on_row=rows.append)
    assert len(calls) == 2 and [(r.batch, r.passed) for r in rows] == [(1, True)]
    assert [json.loads(line)["passed"] for line in resume.read_text().splitlines()] == [True]
    calls.clear()  # the next sweep judges only what the first did not reach
    monkeypatch.setattr(sweep, "judge", lambda config, factory, name, oracles: (calls.append(name), (True, []))[1])
    result = sweep.sweep(load_factory("vllm==0.33.0"), folder, "vllm==0.33.0", resume=resume)
    assert len(calls) == 3 and result.passed and [r.shared for r in result.rows][:2] == [True, False]


@pytest.mark.parametrize("argv, says", [
    (["--workers", "2", "--cluster", "remote"], "--cluster remote: expected local, auto"),
    (["--workers", "2", "--cluster", "unreachable"], "nothing answers at 127.0.0.1"),
    (["--workers", "257"], r"--workers must be in [1, 256], got 257"),
    (["--workers", "0"], "whole number >= 1"),
])  # "unreachable" is made a free port here: test ids stay the same in every xdist worker
def test_bad_workers_or_cluster_exit_2_with_one_line(configs_folder, tmp_path, argv, says, capsys):
    from diffmoe.frontends.cli import main as cli_main
    from redis_server import unused_port

    argv = [f"127.0.0.1:{unused_port()}" if a == "unreachable" else a for a in argv]
    resume = tmp_path / "verdicts.jsonl"
    assert cli_main(["tuned-configs", "--impl", "vllm==0.33.0", "--files", SHIPPED, "--resume", str(resume), *argv]) == 2
    assert not resume.exists() or resume.read_text() == ""  # nothing judged
    err = capsys.readouterr().err.strip()
    assert says in err and len(err.splitlines()) == 1 and "Traceback" not in err, err


SGLANG_K256 = "triton_3_5_1/E=512,N=256,device_name=NVIDIA_H100_80GB_HBM3,dtype=fp8_w8a8,block_shape=[128, 128].json"


@pytest.mark.slow  # four checks of SGLang's path: 17 s alone, 67 s beside a full suite (2026-12-05)
def test_sglangs_shipped_block_k_256_entry_is_named_and_its_block_k_128_neighbour_passes(tmp_path, capsys):
    """The whole-release sweep's one finding (docs/tuned-configs.md): SGLang 0.5.23 ships BLOCK_SIZE_K 256
    in a 128x128 block-quantised file, and its fused_moe_kernel scales a whole K tile by its first
    group's scales. Batch 48 of the same file (BLOCK_SIZE_K 128) passes; batch 64 as shipped fails."""
    try:
        root = peer_wheels.fetch("sglang==0.5.23")
    except peer_wheels.PeerError as exc:
        pytest.skip(f"sglang==0.5.23 is not in the peer cache and cannot be fetched ({exc})")
    shipped = json.loads((root / factory_tuned_configs(load_factory("sglang==0.5.23"))[0] / SGLANG_K256).read_text())
    assert (shipped["48"]["BLOCK_SIZE_K"], shipped["64"]["BLOCK_SIZE_K"]) == (128, 256)
    copy = tmp_path / "configs" / SGLANG_K256
    copy.parent.mkdir(parents=True)
    copy.write_text(json.dumps({"48": shipped["48"], "64": shipped["64"]}))
    assert command.main(["--impl", "sglang==0.5.23", "--config-dir", str(tmp_path / "configs"), "--json"]) == 1
    rows = {r["batch"]: r for r in json.loads(capsys.readouterr().out)["rows"] if r["file"] == SGLANG_K256}
    assert rows[48]["verdict"] == "PASS", rows[48]
    assert rows[64]["verdict"] == "FAIL" and any(f.startswith("differential@gate_up_gemm") for f in rows[64]["findings"]), rows[64]
