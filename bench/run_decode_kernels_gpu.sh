#!/usr/bin/env bash
# Issue 7's decode kernels on the GPU machine, in one go: correctness tests, then benchmarks; results under $OUT.
#
#   OUT=/some/dir bash bench/run_decode_kernels_gpu.sh        (from the repository root)
#
# Makes ingot importable first (an editable install without dependencies; a symlinked package tree if pip cannot),
# runs the quantized GEMV and split-KV attention GPU tests (and the existing GEMV/attention ones, which now also
# reach the split kernel through the rule), then bench/bench_gemv_quant.py and bench/bench_decode_attention.py.
# Every step runs even when an earlier one fails; the exit status is the first failure's.
set -u
OUT=${OUT:-/tmp/decode-kernels-out}
cd "$(dirname "$0")/.."
. bench/gpu_run_lib.sh

step tests_new python3 -m pytest -m gpu -q -rs -s -p no:cacheprovider \
  tests/codegen/test_gemv_quant_gpu.py tests/codegen/test_decode_attention_gpu.py \
  --junitxml="$OUT/tests_new.xml"
step tests_existing python3 -m pytest -m gpu -q -rs -p no:cacheprovider \
  tests/codegen/test_gemv_gpu.py tests/codegen/test_kernels_gpu.py -k "gemv or attention" \
  --junitxml="$OUT/tests_existing.xml"
step bench_gemv_quant python3 bench/bench_gemv_quant.py --json "$OUT/bench_gemv_quant.json"
step bench_decode_attention python3 bench/bench_decode_attention.py --json "$OUT/bench_decode_attention.json"
grep -h '^{' "$OUT/bench_gemv_quant.log" "$OUT/bench_decode_attention.log" > "$OUT/bench.jsonl" 2>/dev/null || true
finish
