#!/usr/bin/env bash
# An overlay for bench/run_ab_gpu.sh's NAME@DIR variants: each PATH (relative to the repository root) as it is at git
# revision REV, written under DIR with the same relative path. Run on the machine with the repository's history (the
# GPU machine's copy has none), then carry DIR with the working tree (e.g. under .gpu_run/, which git ignores here).
#
#   bash bench/make_overlay.sh HEAD~1 .gpu_run/old codegen/kernels/gemv/kernel.cu codegen/kernels/gemv/rule.py
set -eu
[ $# -ge 3 ] || { echo "usage: bash bench/make_overlay.sh REV DIR PATH..."; exit 2; }
rev=$1 dir=$2
shift 2
cd "$(dirname "$0")/.."
git rev-parse --verify --quiet "$rev^{commit}" > /dev/null || { echo "no such revision: $rev"; exit 2; }
for p in "$@"; do
  git cat-file -e "$rev:$p" 2>/dev/null || { echo "$p is not in $rev"; exit 2; }
  mkdir -p "$dir/$(dirname "$p")"
  git show "$rev:$p" > "$dir/$p"
  echo "$dir/$p <- $rev:$p"
done
