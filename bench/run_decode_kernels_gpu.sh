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
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 INGOT_CACHE_DIR=${INGOT_CACHE_DIR:-/tmp/ingot-kernel-cache} INGOT_TEST_SEED=${INGOT_TEST_SEED:-random}
cd "$(dirname "$0")/.."
status=0
step() {  # step NAME COMMAND...: run, log to $OUT/NAME.log, remember the first failure
  local name=$1; shift
  echo "== $name: $*" | tee -a "$OUT/summary.txt"
  "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  echo "== $name: exit $rc" | tee -a "$OUT/summary.txt"
  tail -n 25 "$OUT/$name.log"
  [ $rc -ne 0 ] && [ $status -eq 0 ] && status=$rc
  return 0
}

if ! python3 -c "import ingot.codegen.kernels.gemv.quant_rule" 2>/dev/null; then
  python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/install.log" 2>&1 || true
fi
if ! python3 -c "import ingot.codegen.kernels.gemv.quant_rule" 2>/dev/null; then
  # the package maps ingot.<x> to ./<x> (pyproject.toml); a symlinked tree does the same
  tree=/tmp/ingot-pkg; rm -rf "$tree"; mkdir -p "$tree/ingot"
  for f in ingot/*.py; do ln -s "$PWD/$f" "$tree/ingot/"; done
  for d in ir frontend passes codegen runtime quant; do ln -s "$PWD/$d" "$tree/ingot/$d"; done
  export PYTHONPATH="$tree:$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
python3 -c "import ingot.codegen.kernels.gemv.quant_rule, ingot.codegen.kernels.attention.split_rule; print('ingot importable')" \
  || { echo "ingot is not importable: see $OUT/install.log"; exit 2; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > "$OUT/gpu.txt" 2>&1 || true
git rev-parse HEAD > "$OUT/commit.txt" 2>/dev/null || true

step tests_new python3 -m pytest -m gpu -q -rs -s -p no:cacheprovider \
  tests/codegen/test_gemv_quant_gpu.py tests/codegen/test_decode_attention_gpu.py \
  --junitxml="$OUT/tests_new.xml"
step tests_existing python3 -m pytest -m gpu -q -rs -p no:cacheprovider \
  tests/codegen/test_gemv_gpu.py tests/codegen/test_kernels_gpu.py -k "gemv or attention" \
  --junitxml="$OUT/tests_existing.xml"
step bench_gemv_quant python3 bench/bench_gemv_quant.py --json "$OUT/bench_gemv_quant.json"
step bench_decode_attention python3 bench/bench_decode_attention.py --json "$OUT/bench_decode_attention.json"
grep -h '^{' "$OUT/bench_gemv_quant.log" "$OUT/bench_decode_attention.log" > "$OUT/bench.jsonl" 2>/dev/null || true
echo "status $status" | tee -a "$OUT/summary.txt"
exit $status
