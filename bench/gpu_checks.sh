#!/usr/bin/env bash
# The GPU-only checks, in one short script, for a machine with CUDA (run from the repo root after
# the README's GPU set-up). Everything else is exercised on the CPU by the test suite, including
# the compile gate, which needs no GPU. Budget: under 10 minutes end to end on an H200.
#
#   bash bench/gpu_checks.sh [OUT_DIR]
#
# 1. doctor: the backend probes on the device (a defect that would select the software fallback
#    makes it say REFUSED and exit 1);
# 2. compile-check: the CI subset for this GPU's arch, native traits, spills forbidden;
# 3. demo and a grid of `diffmoe check` runs through every oracle, kernels compiled;
# 4. the test suite's kernel and implementation modules with compiled kernels;
# 4b. the museum of real vLLM bugs, when the peer cache holds its wheels' files;
# 5. the tolerance measurement on CUDA (the table's "cuda fp8 GEMM" row is derived, not yet measured);
# 6. the CUDA benchmark grid (tokens/s, TFLOP/s, GB/s against the H200's FP8 peak and HBM bandwidth).
# Each step has its own time limit; summary.txt gets one line per step with its exit code.
set -uo pipefail
out=${1:-gpu-results}
mkdir -p "$out"
unset TRITON_INTERPRET
export TRITON_DEFAULT_FP_FUSION=1  # Triton 3.9's default, said explicitly (silences its warning)
py=.venv/bin/python
status=0
step() {  # step NAME SECONDS COMMAND...: run, log, record
    local name=$1 limit=$2; shift 2
    local start=$SECONDS
    timeout "$limit" "$@" > "$out/$name.txt" 2>&1; local rc=$?
    echo "$name: rc=$rc ($((SECONDS - start)) s)" | tee -a "$out/summary.txt"
    [ $rc -eq 0 ] || status=1
}
$py -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.cuda.get_device_name())" \
    | tee "$out/device.txt" || exit 2
date -u +%Y-%m-%dT%H:%MZ >> "$out/device.txt"
arch=$($py -c "import torch; m, n = torch.cuda.get_device_capability(); print(f'sm_{m}{n}')")

step doctor 60 .venv/bin/diffmoe doctor --json
step compile-check 120 .venv/bin/diffmoe compile-check --arch "$arch" --variant native --forbid-spills native
step demo 60 .venv/bin/diffmoe demo
for quant in bf16 fp8-tensor fp8-token fp8-block; do
    for fused in --unfused --fused; do
        [ "$quant" = bf16 ] && [ "$fused" = --fused ] && continue
        for t in 1 300 1100; do  # decode, mid and prefill tile classes (1100 x K=2 routed rows: wgmma)
            step "check-$quant$fused-T$t" 40 .venv/bin/diffmoe check --tokens $t --experts 8 --topk 2 --hidden 512 \
                --inter 256 --quant $quant $fused --json
        done
    done
done
step tests 180 $py -m pytest -q -p no:cacheprovider tests/test_optimized_moe.py tests/test_optimized_kernels.py \
    tests/test_oracles_quiet.py
# the museum (diffmoe/museum.py) with vLLM's Triton GEMMs compiled, when the three wheels' files are in the
# peer cache (this machine may have no network: copy ~/.cache/diffmoe/peers or set DIFFMOE_PEER_CACHE)
if $py -c "import sys; from diffmoe import peer_wheels as p; sys.exit(not all(map(p.is_cached, ('vllm==0.28.0', 'vllm==0.30.0', 'vllm'))))"; then
    step museum 120 .venv/bin/diffmoe museum --json
fi
step tolerances 90 $py bench/measure_tolerances.py
step bench 150 $py -m pytest bench/bench_moe_throughput.py --benchmark-only --benchmark-json "$out/bench.json" -q
$py bench/report_tables.py "$out/bench.json" --png "$out/throughput.png" > "$out/tables.md" 2>&1
exit $status
