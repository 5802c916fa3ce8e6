#!/usr/bin/env bash
# Row groups in the quantized decode GEMV (quant.cu, opt-in: INGOT_GEMV_KW=all) and bucket 16's wide shape
# (rule.WIDE_N_SHAPE) on the GPU machine; results under $OUT. What decides whether quant.cu's row groups become the
# default (docs/PERF.md, "Row groups in the decode GEMV": the bf16 ones are, measured in the ninth session).
#
#   OUT=/some/dir bash bench/run_rowgroups_gpu.sh            GPU tests, then the kernel benchmarks (~3 min)
#   OUT=/some/dir E2E=1 bash bench/run_rowgroups_gpu.sh      also the end-to-end A/B of FP8 artifacts (~+6 min)
#
# Order: quant.cu's GPU tests first (its row-group cases set INGOT_GEMV_KW=all themselves; a wrong in-CTA sum or
# K part shows there), the bf16 GEMV tests (bucket 16's wide case is new), then bench_gemv_quant with row groups
# beside its kw1 rows (the configuration without them, same run), bench_gemv at M = 16.
set -u
OUT=${OUT:-/tmp/rowgroups-out}
cd "$(dirname "$0")/.."
. bench/gpu_run_lib.sh

T="python3 -m pytest -m gpu -q -rs -p no:cacheprovider"
step quant_tests timeout=300 $T tests/codegen/test_gemv_quant_gpu.py
step gemv_tests timeout=200 $T tests/codegen/test_gemv_gpu.py
step bench_quant timeout=200 env INGOT_GEMV_KW=all python3 bench/bench_gemv_quant.py --formats fp8-w8a16 fp8-w8a8 \
  nvfp4-w4a16 --shapes "3072,2048;2048,2048;2048,8192" --m 1 8 --json "$OUT/gemv_quant_kw.json"
step bench_gemv16 timeout=120 python3 bench/bench_gemv.py --m 16 --json "$OUT/gemv_m16.json"

if [ "${E2E:-0}" = 1 ]; then
  # FP8 weight-only artifacts with and without quant.cu's row groups (the switch is read at compile time), then
  # alternating runs: batch 1 (K = 1 and 8) and batch 64
  MB="--max-num-batched-tokens 16384"
  W=/tmp/rowgroups-e2e
  step e2e_compile timeout=600 env INGOT_AUTOTUNE=0 python3 bench/bench_e2e.py --compile-only --workdir $W/default \
    $MB --formats bf16,fp8-w8a16
  mkdir -p $W/all && ln -sfn $W/default/llama1b-ckpt $W/all/llama1b-ckpt
  step e2e_compile_all timeout=300 env INGOT_AUTOTUNE=0 INGOT_GEMV_KW=all python3 bench/bench_e2e.py --compile-only \
    --reuse --workdir $W/all $MB --formats fp8-w8a16
  E="--reuse $MB --decode-steps 1,8 --batches 1,64 --skip-hf --formats fp8-w8a16"
  i=0
  for name in default all all default default all; do i=$((i + 1))
    step e2e_${i}_$name timeout=120 python3 bench/bench_e2e.py $E --workdir $W/$name --out "$OUT/e2e_${i}_$name.json"
  done
fi
finish
