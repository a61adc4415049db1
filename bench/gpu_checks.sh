#!/usr/bin/env bash
# The GPU-only checks, in one short script, for a machine with CUDA (run from the repo root after
# the README's GPU set-up). Everything else is exercised on the CPU by the test suite, including
# the compile gate, which needs no GPU. Budget: under 10 minutes end to end on an H200.
#
#   bash bench/gpu_checks.sh [OUT_DIR]
#   PY=python3 DEADLINE=480 TOKENS="1 1100" bash bench/gpu_checks.sh OUT   # a machine's own stack
#
# PY: the interpreter (default .venv/bin/python, else python3); without an installed diffmoe the
# repo root goes on PYTHONPATH and pytest loads the plugin by name. DEADLINE: seconds for the whole
# script (each step's limit is cut to what is left; steps past it are recorded as skipped).
# TOKENS: the token counts of the check grid. SKIP: a regex of step names to leave out (a rerun
# of what an earlier lease left unfinished, say SKIP='^bench$').
#
# In order of what a short lease should not miss:
# 1. doctor: the backend probes on the device (a defect that would select the software fallback
#    makes it say REFUSED and exit 1);
# 2. demo and a grid of `diffmoe check` runs through every oracle, kernels compiled;
# 3. the tolerance measurement on CUDA (the table's "cuda fp8 GEMM" row is derived, not yet measured);
# 4. the CUDA benchmark grid (tokens/s, TFLOP/s, GB/s against the H200's FP8 peak and HBM bandwidth);
# 5. the test modules that run compiled kernels on a GPU (the interpreter-only ones skip there);
# 5b. diffmoe museum (real vLLM bugs, vLLM's Triton GEMMs compiled), when the peer cache holds its wheels' files;
# 6. compile-check: the CI subset for this GPU's arch, native traits, spills forbidden (CI runs it
#    without a GPU too; here it checks that the arch the device reports is the one CI compiles for).
# Each step has its own time limit; summary.txt gets one line per step with its exit code.
set -uo pipefail
out=${1:-gpu-results}
mkdir -p "$out"
unset TRITON_INTERPRET
export TRITON_DEFAULT_FP_FUSION=1  # Triton 3.9's default, said explicitly (silences its warning)
py=${PY:-.venv/bin/python}
[ -x "$py" ] || command -v "$py" > /dev/null || py=python3
deadline=${DEADLINE:-600}
tokens=${TOKENS:-"1 300 1100"}
plugin=()
if ! $py -c "import importlib.metadata as m; m.version('diffmoe')" > /dev/null 2>&1; then
    export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
    plugin=(-p diffmoe.frontends.pytest_plugin)
fi
diffmoe=("$py" -m diffmoe)
status=0
step() {  # step NAME SECONDS COMMAND...: run, log, record
    local name=$1 limit=$2; shift 2
    local start=$SECONDS left=$((deadline - SECONDS))
    if [ -n "${SKIP:-}" ] && [[ $name =~ $SKIP ]]; then
        echo "$name: skipped (SKIP)" | tee -a "$out/summary.txt"; return
    fi
    if [ $left -le 5 ]; then
        echo "$name: skipped (deadline)" | tee -a "$out/summary.txt"; status=1; return
    fi
    [ $limit -le $left ] || limit=$left
    timeout "$limit" "$@" > "$out/$name.txt" 2>&1; local rc=$?
    echo "$name: rc=$rc ($((SECONDS - start)) s)" | tee -a "$out/summary.txt"
    [ $rc -eq 0 ] || status=1
}
$py -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee "$out/versions.txt"
$py -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.cuda.get_device_name())" \
    | tee "$out/device.txt" || exit 2
date -u +%Y-%m-%dT%H:%MZ >> "$out/device.txt"
arch=$($py -c "import torch; m, n = torch.cuda.get_device_capability(); print(f'sm_{m}{n}')")

step doctor 60 "${diffmoe[@]}" doctor --json
step demo 60 "${diffmoe[@]}" demo
for quant in bf16 fp8-tensor fp8-token fp8-block; do
    for fused in --unfused --fused; do
        [ "$quant" = bf16 ] && [ "$fused" = --fused ] && continue
        for t in $tokens; do  # decode, mid and prefill tile classes (1100 x K=2 routed rows: wgmma)
            step "check-$quant$fused-T$t" 40 "${diffmoe[@]}" check --tokens $t --experts 8 --topk 2 --hidden 512 \
                --inter 256 --quant $quant $fused --json
        done
    done
done
step tolerances 90 $py bench/measure_tolerances.py
step bench 150 $py -m pytest "${plugin[@]}" bench/bench_moe_throughput.py --benchmark-only --benchmark-json "$out/bench.json" -q
step tests 180 $py -m pytest -q -p no:cacheprovider -n 8 "${plugin[@]}" tests/reference/test_reference.py \
    tests/oracles/test_oracles_quiet.py
# this machine may have no network: copy ~/.cache/diffmoe/peers over, or set DIFFMOE_PEER_CACHE
if $py -c "import sys; from diffmoe import peer_wheels as p; sys.exit(not all(map(p.is_cached, ('vllm==0.28.0', 'vllm==0.30.0', 'vllm'))))"; then
    step museum 120 "${diffmoe[@]}" museum --json
fi
step compile-check 120 "${diffmoe[@]}" compile-check --arch "$arch" --variant native --forbid-spills native
[ -f "$out/bench.json" ] && $py bench/report_tables.py "$out/bench.json" --png "$out/throughput.png" > "$out/tables.md" 2>&1
exit $status
