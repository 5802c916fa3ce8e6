# Shared by the bench/run_*_gpu.sh scripts (source it from the repository root, with OUT set): makes ingot
# importable and gives `step`, which logs one command's output to $OUT/NAME.log and remembers the first failure.
#
#   step NAME [timeout=SECONDS] COMMAND...
#
# Every step runs even when an earlier one fails; end the script with `finish` (exit status: the first failure's).
# A step that runs past its timeout exits 124, which is a failure like any other (a hung kernel shows as that).
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 INGOT_CACHE_DIR=${INGOT_CACHE_DIR:-/tmp/ingot-kernel-cache} INGOT_TEST_SEED=${INGOT_TEST_SEED:-random}
# carried with the working tree when present: wheels the GPU machine lacks (.whl/, installed beside the system's
# packages) and built kernels (.gpu_cache/, a kernel cache: CUTLASS cubins take minutes to build)
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl > /dev/null 2>&1
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
# (or a tarball of one, .gpu_cache/cache.tgz: a kernel cache of the 1B model's formats is ~100 MB unpacked, over what
# a call carries)
if [ -d .gpu_cache ]; then
  mkdir -p "$INGOT_CACHE_DIR" && cp -rn .gpu_cache/. "$INGOT_CACHE_DIR"/ 2>/dev/null
  if [ -f .gpu_cache/cache.tgz ]; then tar xzf .gpu_cache/cache.tgz -C "$INGOT_CACHE_DIR" --skip-old-files && rm -f "$INGOT_CACHE_DIR/cache.tgz"; fi
fi
status=0
step() {
  local name=$1; shift
  local limit=""
  case ${1:-} in timeout=*) limit=${1#timeout=}; shift ;; esac
  echo "== $name: $*" | tee -a "$OUT/summary.txt"
  local start=$SECONDS
  if [ -n "$limit" ]; then timeout "$limit" "$@" > "$OUT/$name.log" 2>&1; else "$@" > "$OUT/$name.log" 2>&1; fi
  local rc=$?
  echo "== $name: exit $rc after $((SECONDS - start)) s" | tee -a "$OUT/summary.txt"
  tail -n "${TAILN:-25}" "$OUT/$name.log"
  [ $rc -ne 0 ] && [ $status -eq 0 ] && status=$rc
  return 0
}
finish() {
  echo "status $status" | tee -a "$OUT/summary.txt"
  exit $status
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
python3 -c "import ingot.codegen.kernels.gemv.quant_rule; print('ingot importable')" \
  || { echo "ingot is not importable: see $OUT/install.log"; exit 2; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > "$OUT/gpu.txt" 2>&1 || true
git rev-parse HEAD > "$OUT/commit.txt" 2>/dev/null || cat COMMIT > "$OUT/commit.txt" 2>/dev/null || true
