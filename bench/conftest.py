"""Shared set-up of the pytest-benchmark suites in bench/.

Run them with one command (the root config collects tests/ only, so bench/ is named):

    python -m pytest bench/ --benchmark-only [--benchmark-json BENCH.json]

* Without a GPU the kernels run under the Triton interpreter (benchkit turns it on before
  Triton is imported); every benchmark records its backend so no interpreter time is ever
  read as kernel speed.
* Files are named bench_*.py; the collection hook below picks them up, so `python -m pytest`
  (tests/) never runs them.
* `measure` is the one way a suite times a call: untimed warm-up first (Triton compilation and
  autotuning on CUDA, the interpreter's first-call costs), then `rounds` timed calls, each
  followed by `torch.cuda.synchronize()` inside the timed region on CUDA (a launch returns
  before the kernel ends), and `benchmark.extra_info` filled with the config, backend,
  tokens/s and, on CUDA, the achieved TFLOP/s, GB/s and roofline fraction.

Options (defaults keep a CPU run of the whole directory to a few minutes):
  --moe-rounds N     timed calls per benchmark (default 2 on the interpreter, 20 on CUDA)
  --moe-grid G       "small" (interpreter sizes) or "full" (GPU sizes); default by backend
  --fuzz-examples N  examples of the fixed-planner fuzz throughput benchmark (default 5)
"""

from __future__ import annotations

from typing import Any, Callable

import pytest
import torch

# benchkit sets TRITON_INTERPRET (no GPU) before any suite imports Triton.
from benchkit import (
    BACKEND_CUDA,
    ProblemCache,
    bench_device,
    current_backend,
    roofline,
    routing_stats,
    synchronize,
)

from optimized import make_implementation  # noqa: E402 - after benchkit, see above
from reference import reference_moe  # noqa: E402

DEFAULT_ROUNDS = {BACKEND_CUDA: 20, "interpreter": 2}
DEFAULT_WARMUP = {BACKEND_CUDA: 3, "interpreter": 1}


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("diffmoe-bench", "diffmoe benchmarks")
    group.addoption("--moe-rounds", type=int, default=None, metavar="N",
                    help="timed calls per MoE benchmark (default: 2 on the interpreter, 20 on CUDA)")
    group.addoption("--moe-grid", choices=("small", "full"), default=None,
                    help="throughput grid: small (interpreter sizes) or full (GPU sizes); default by backend")
    group.addoption("--fuzz-examples", type=int, default=5, metavar="N",
                    help="examples of the fixed-planner fuzz throughput benchmark (default 5)")


def pytest_configure(config: pytest.Config) -> None:
    # Poisoned workspaces make numpy (under the interpreter) warn about overflow on purpose;
    # the oracles report what matters.
    config.addinivalue_line("filterwarnings", "ignore::RuntimeWarning:triton.runtime.interpreter")


def pytest_collect_file(file_path, parent):
    """Collect bench_*.py as test modules (the default pattern is test_*.py)."""
    # A file named on the command line is collected by pytest itself whatever its name.
    if file_path.suffix == ".py" and file_path.name.startswith("bench_") and not parent.session.isinitpath(file_path):
        return pytest.Module.from_parent(parent, path=file_path)
    return None


@pytest.fixture(scope="session")
def moe_backend() -> str:
    return current_backend()


@pytest.fixture(scope="session")
def moe_device():
    return bench_device()


@pytest.fixture(scope="session")
def moe_rounds(request: pytest.FixtureRequest) -> int:
    rounds = request.config.getoption("moe_rounds")
    if rounds is not None and rounds < 1:
        raise pytest.UsageError(f"--moe-rounds must be >= 1, got {rounds}")
    return rounds or DEFAULT_ROUNDS[current_backend()]


def _reference_provider(config, problem, device):
    return lambda: reference_moe(problem)


def _optimized_provider(config, problem, device):
    impl = make_implementation(config, device)  # built for this T: its tiles follow the batch size
    workspaces = impl.allocate_workspaces()  # allocated once, outside the timed region
    out = torch.empty(config.num_tokens, config.hidden, dtype=torch.bfloat16, device=device)
    return lambda: impl.run(problem, workspaces, output=out)


PROVIDERS = {"reference": _reference_provider, "optimized": _optimized_provider}


@pytest.fixture(scope="session")
def moe_providers() -> dict[str, Callable]:
    """name -> build(config, problem, device) -> a zero-argument callable running one MoE call.

    "reference": the pure-PyTorch reference (a fresh tensor per stage, every intermediate kept).
    "optimized": the Triton MoE built for `config`, with its workspaces and output buffer
    allocated once, so a call allocates nothing the timing would count.
    """
    return dict(PROVIDERS)


@pytest.fixture(scope="session")
def problem_cache(moe_device) -> ProblemCache:
    return ProblemCache(moe_device)


def _median_seconds(benchmark) -> float | None:
    stats = getattr(benchmark, "stats", None)  # None under --benchmark-disable
    return None if stats is None else stats.stats.median


@pytest.fixture
def measure(benchmark, moe_backend, moe_device, moe_rounds) -> Callable[..., Any]:
    """measure(fn, *, config, provider, group, problem=None, rounds=None, warmup=None, extra=None).

    Times `fn()` (one MoE call, or one harness run) and records extra_info. `problem` (the
    Problem the call runs) gives tokens/s and, on CUDA, the roofline figures from its routing.
    Returns fn's result from the last warm-up call (None with warmup=0), so a suite can check
    the call ran as intended.
    """

    def run(fn: Callable[[], Any], *, config, provider: str, group: str, problem=None,
            rounds: int | None = None, warmup: int | None = None, extra: dict | None = None) -> Any:
        benchmark.group = group
        result = None
        for _ in range(DEFAULT_WARMUP[moe_backend] if warmup is None else warmup):
            result = fn()  # untimed: compilation, autotuning, first-call costs
        synchronize(moe_device)

        def timed():
            fn()
            synchronize(moe_device)  # the kernels' time, not the launch's

        benchmark.pedantic(timed, setup=lambda: synchronize(moe_device), rounds=rounds or moe_rounds,
                           iterations=1, warmup_rounds=0)
        info = benchmark.extra_info
        info["provider"] = provider
        info["backend"] = moe_backend
        info["device"] = moe_device.type
        info["config"] = config.to_dict()
        info.update(extra or {})
        seconds = _median_seconds(benchmark)
        if problem is not None:
            info["tokens"] = config.num_tokens
            if seconds:
                info["tokens_per_s"] = round(config.num_tokens / seconds, 3)
                if moe_backend == BACKEND_CUDA:
                    active, rows = routing_stats(problem)
                    info["roofline"] = roofline(config, seconds, active_experts=active, routed_rows=rows)
        return result

    return run
