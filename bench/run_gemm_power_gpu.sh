#!/usr/bin/env bash
# The prefill GEMMs at the H200's power limit (690 W), on the GPU machine; results under $OUT.
#
#   OUT=/some/dir bash bench/run_gemm_power_gpu.sh      builds ~12 candidates (~70 s on 16 cores), then ~4 minutes
#
# Why: FP8 GEMMs reach the power limit within a second, and at 8192^3 (x and w 64 MB each, past the 50 MB L2) ingot's
# kernels held 1,155-1,192 MHz there against cuBLASLt's 1,335 (0.87x sustained, docs/PERF.md "FP8 prefill GEMMs at the
# power limit"). Suspect: DRAM traffic from the order the persistent scheduler visits tiles in (132 concurrent 128x128
# tiles down one or two tile columns read all of x every wave; a swizzle of 4-8 keeps them in an L2-sized block).
# This times the scheduler's swizzle / raster variants and the 128x64 epilogue subtiles sustained (`--sustain-all`:
# each alone for S seconds, two rounds in alternating order, one nvidia-smi sampling clock and power) against
# cuBLASLt on the two shapes past L2, rowwise and tensorwise, then bf16 against cuBLAS the same way (its short-burst
# figures are >= 1.0x; whether they hold at the power limit is the question).
# Needs CUTLASS's headers on the GPU machine: carry the nvidia-cutlass wheel in .whl/ (bench/gpu_run_lib.sh installs it).
set -u
OUT=${OUT:-/tmp/gemm-power-out}
S=${S:-1.0}
cd "$(dirname "$0")/.."
. bench/gpu_run_lib.sh

FP8=coopov128x128x128c1x2,coopov128x128x128c2x1,coopov128x128x128c2x1e64,coopov128x128x128c2x1s8,coopov128x128x128c1x2s4
FP8=$FP8,coopov128x128x128c1x2rn,coopov128x128x128c2x1s8e64,coopov128x128x128c1x2s4e64
BF16=pp128x128x64c1x2,pp128x128x64c2x1,coop256x128x64c1x2,coop128x256x64c2x1
# GEMM_KERNELS: a folder of these builds made beforehand (the same --build command on the CPU machine, ~7 minutes on 2
# cores, 16 MB: carry it with the tree) to skip the ~70 s build here
G=${GEMM_KERNELS:-/tmp/gemm-power-kernels}
if [ ! -f "$G/manifest.json" ]; then
  TAILN=3 step build timeout=400 env INGOT_CUTLASS_JOBS=${INGOT_CUTLASS_JOBS:-12} python3 bench/bench_gemm.py --build $G \
    --only $FP8,$BF16
fi
# the promotion interval of each FP8 build (and cuBLASLt's again): P = 128 where they promote, K where fast
TAILN=14 step promotion timeout=120 python3 bench/probe_fp8_promotion.py --kernels $G --shapes 4096x4096x4096
for mode in fp8-row fp8-tensor bf16; do
  TAILN=8 step "sustain_$mode" timeout=300 python3 bench/bench_gemm.py --kernels $G --modes $mode \
    --shapes 8192x8192x8192,8192x16384x2048 --sustain-all "$S" --out "$OUT/gemm_$mode.json"
done
finish
