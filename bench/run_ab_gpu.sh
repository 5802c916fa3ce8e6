#!/usr/bin/env bash
# An end-to-end A/B of switches on the GPU machine: the Llama-1B-shaped checkpoint compiled once per variant (each
# with its own INGOT_* variables, compile-time and run-time alike), then RUNS rounds of bench_e2e.py runs, the
# variants' order reversed every other round, and bench/ab_summary.py's medians against the first variant.
#
#   OUT=/dir bash bench/run_ab_gpu.sh base "qr_off:INGOT_QKV_ROPE_FUSION=0"
#   OUT=/dir FORMATS=fp8-w8a16 RUNS=3 bash bench/run_ab_gpu.sh base "all:INGOT_GEMV_KW=all,INGOT_QKV_ROPE_FUSION=all"
#
# A variant is NAME or NAME:VAR=VALUE[,VAR=VALUE...]; the first is the reference. Each run: batch 1 and 64 (or
# BATCHES with STEPS, e.g. BATCHES=1,16,32,64 STEPS=64,32,32,32), 1 and 8 decode steps a call, no HF references
# (bench_e2e.py --skip-hf), INGOT_AUTOTUNE=0 at compile time so that the variants differ only by their switches.
# Results under $OUT: e2e_<i>_<variant>.json, summary.txt / summary.json.
# From the repository root or anywhere (the script goes there); bench/gpu_run_lib.sh installs what .whl/ carries and
# seeds the kernel cache from .gpu_cache/. About 2 minutes a compile after the first, 10 s a run.
# NAME@DIR[:VAR=VALUE,...]: the variant's artifacts are compiled with the files under DIR (a folder mirroring the
# repository's layout, relative to the repository root) in place of the repository's, e.g. the previous version of a
# kernel template, made on the CPU side by `bash bench/make_overlay.sh REV DIR PATH...` and carried with the tree:
#   OUT=/dir bash bench/run_ab_gpu.sh new "old@.gpu_run/old"
# The repository's own files are put back after the compile (the runs use the artifacts, not the sources).
# SHARED=1: the variants differ only by run-time switches (INGOT_DECODE_OVERLAP, INGOT_STEPS_GRAPH, ...), so only
# the first variant's artifact is compiled and every variant runs it.
set -u
OUT=${OUT:-/tmp/ab-out}
FORMATS=${FORMATS:-bf16}
RUNS=${RUNS:-3}
W=${WORKDIR:-/tmp/ab-work}
cd "$(dirname "$0")/.."
[ $# -ge 2 ] || { echo "usage: OUT=/dir bash bench/run_ab_gpu.sh NAME[@DIR][:VAR=VALUE,...] ..."; exit 2; }
. bench/gpu_run_lib.sh
MB="--max-num-batched-tokens 16384"
names=()
envs=()
overlays=()
for v in "$@"; do
  name=${v%%:*}
  e=""
  [ "$name" != "$v" ] && e=${v#*:}
  overlay=""
  case $name in *@*) overlay=${name#*@}; name=${name%%@*} ;; esac
  case $name in ""|*/*|*" "*) echo "bad variant name: '$name'"; exit 2 ;; esac
  [ -z "$overlay" ] || [ -d "$overlay" ] || { echo "variant $name: no folder '$overlay'"; exit 2; }
  names+=("$name")
  envs+=("${e//,/ }")
  overlays+=("$overlay")
done
# an earlier A/B's runs in the same OUT would join this one's summary (ab_summary.py reads every e2e_*.json there)
rm -f "$OUT"/e2e_*.json
# with_overlay DIR COMMAND...: COMMAND run with DIR's files in place of the repository's, which are put back after
with_overlay() {
  local dir=$1; shift
  [ -n "$dir" ] || { "$@"; return; }
  local keep; keep=$(mktemp -d)
  local files; mapfile -t files < <(cd "$dir" && find . -type f | sed 's|^\./||')
  for f in "${files[@]}"; do
    if [ -e "$f" ]; then mkdir -p "$keep/$(dirname "$f")" && cp -p "$f" "$keep/$f"; fi
    mkdir -p "$(dirname "$f")" && cp "$dir/$f" "$f"
  done
  "$@"
  for f in "${files[@]}"; do
    if [ -e "$keep/$f" ]; then cp -p "$keep/$f" "$f"; else rm -f "$f"; fi
  done
  rm -rf "$keep"
}
SHARED=${SHARED:-0}
work() { if [ "$SHARED" = 1 ]; then echo "$W/${names[0]}"; else echo "$W/${names[$1]}"; fi; }
for i in "${!names[@]}"; do
  n=${names[$i]}
  [ "$SHARED" = 1 ] && [ "$i" -gt 0 ] && break
  mkdir -p "$W/$n"
  [ "$i" -gt 0 ] && ln -sfn "$W/${names[0]}/llama1b-ckpt" "$W/$n/llama1b-ckpt"
  # shellcheck disable=SC2086 (the variant's assignments, word-split on purpose)
  with_overlay "${overlays[$i]}" step "compile_$n" timeout=600 env INGOT_AUTOTUNE=0 ${envs[$i]} python3 \
    bench/bench_e2e.py --compile-only --reuse --workdir "$W/$n" $MB --formats "$FORMATS"
done
k=0
for r in $(seq 1 "$RUNS"); do
  order=("${!names[@]}")
  [ $((r % 2)) -eq 0 ] && mapfile -t order < <(printf '%s\n' "${order[@]}" | tac)
  for i in "${order[@]}"; do
    k=$((k + 1))
    n=${names[$i]}
    # shellcheck disable=SC2086
    TAILN=2 step "e2e_${k}_$n" timeout=180 env ${envs[$i]} python3 bench/bench_e2e.py --reuse $MB --decode-steps 1,8 \
      --batches "${BATCHES:-1,64}" --steps "${STEPS:-64,32}" --skip-hf --prefill-repeats 1 --formats "$FORMATS" \
      --workdir "$(work "$i")" --out "$OUT/e2e_${k}_$n.json"
  done
done
python3 bench/ab_summary.py "$OUT" --format "${FORMATS%%,*}" --json "$OUT/summary.json" | tee "$OUT/summary.txt"
finish
