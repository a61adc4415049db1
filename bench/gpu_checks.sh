#!/usr/bin/env bash
# The GPU-only checks, in one short script, for a machine with CUDA (run from the repo root
# after the README's GPU set-up). Everything else is exercised on the CPU by the test suite.
#
#   bash bench/gpu_checks.sh [OUT_DIR]
#
# 1. doctor: every Triton primitive the optimized kernels rely on, compiled for this GPU;
# 2. demo and a few labelled edge cases through every oracle, kernels compiled (no interpreter);
# 3. the CUDA benchmark grid (tokens/s, TFLOP/s, GB/s against the H200 roofline) as JSON + tables.
set -uo pipefail
out=${1:-gpu-results}
mkdir -p "$out"
unset TRITON_INTERPRET
py=.venv/bin/python
status=0
$py -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.cuda.get_device_name())" || exit 2
.venv/bin/diffmoe doctor --json > "$out/doctor.json"; echo "doctor: rc=$?" | tee -a "$out/summary.txt"
.venv/bin/diffmoe demo > "$out/demo.txt" 2>&1; rc=$?; echo "demo: rc=$rc" | tee -a "$out/summary.txt"; [ $rc -eq 0 ] || status=1
for quant in bf16 fp8-tensor fp8-token fp8-block; do
    for fused in --unfused --fused; do
        [ "$quant" = bf16 ] && [ "$fused" = --fused ] && continue
        for t in 1 17 300; do
            .venv/bin/diffmoe check --tokens $t --experts 8 --topk 2 --hidden 512 --inter 256 --quant $quant $fused --json \
                > "$out/check-$quant$fused-T$t.json"; rc=$?
            echo "check $quant $fused T=$t: rc=$rc" | tee -a "$out/summary.txt"; [ $rc -eq 0 ] || status=1
        done
    done
done
$py -m pytest bench/bench_moe_throughput.py --benchmark-only --benchmark-json "$out/bench.json" -q > "$out/bench.txt" 2>&1
echo "bench: rc=$?" | tee -a "$out/summary.txt"
$py bench/report_tables.py "$out/bench.json" --png "$out/throughput.png" > "$out/tables.md" 2>&1
exit $status
