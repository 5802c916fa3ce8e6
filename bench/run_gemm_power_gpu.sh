#!/usr/bin/env bash
# The prefill GEMMs at the H200's power limit (690 W), on the GPU machine; results under $OUT.
#
#   OUT=/some/dir bash bench/run_gemm_power_gpu.sh      builds 7 candidates (~60 s on 16 cores), then ~6 minutes
#
# Why: FP8 GEMMs reach the power limit within a second, so their steady rate is what a long prefill gets; short graph
# replays rank them differently from run to run (docs/PERF.md "FP8 prefill GEMMs at the power limit", "The tile
# scheduler's swizzle per problem"). This times, sustained (`--sustain-all`: each alone for S seconds, two rounds in
# alternating order, one nvidia-smi sampling clock and power), the FP8 promotion builds against cuBLASLt (rowwise on
# issue 7's six shapes, tensorwise on the square ones) and the bf16 builds the shape rules pick against cuBLAS, each
# with the tile scheduler's swizzle the runtime gives it (rule.auto_swizzle); then every build at swizzle 1 and 8 on
# shapes around rule.SWIZZLE_BYTES (`--swizzles 1,8`; the swizzle is host-side Params, one cubin serves both).
# Needs CUTLASS's headers on the GPU machine: carry the nvidia-cutlass wheel in .whl/ (bench/gpu_run_lib.sh installs it).
set -u
OUT=${OUT:-/tmp/gemm-power-out}
S=${S:-1.0}
cd "$(dirname "$0")/.."
. bench/gpu_run_lib.sh

FP8=coopov128x128x128c2x1d,coopov128x128x128c2x1e64,coopov128x128x128c1x2
BF16=pp128x128x64c1x2,pp128x128x64c2x1,coop256x128x64c1x2,coop128x256x64c2x1
# GEMM_KERNELS: a folder of these builds made beforehand (the same --build command on the CPU machine, ~5 minutes on 2
# cores, 9 MB: carry it with the tree) to skip the build here
G=${GEMM_KERNELS:-/tmp/gemm-power-kernels}
if [ ! -f "$G/manifest.json" ]; then
  TAILN=3 step build timeout=400 env INGOT_CUTLASS_JOBS=${INGOT_CUTLASS_JOBS:-12} python3 bench/bench_gemm.py --build $G \
    --only $FP8,$BF16
fi
# the promotion interval of each FP8 build (and cuBLASLt's again): P = 128 where they promote, K where fast
TAILN=6 step promotion timeout=120 python3 bench/probe_fp8_promotion.py --kernels $G --shapes 4096x4096x4096
TAILN=8 step fp8row timeout=200 python3 bench/bench_gemm.py --kernels $G --modes fp8-row --shapes all \
  --sustain-all "$S" --out "$OUT/gemm_fp8-row.json"
TAILN=4 step fp8tensor timeout=80 python3 bench/bench_gemm.py --kernels $G --modes fp8-tensor --shapes square \
  --sustain-all "$S" --out "$OUT/gemm_fp8-tensor.json"
TAILN=8 step bf16 timeout=200 python3 bench/bench_gemm.py --kernels $G --modes bf16 --shapes all \
  --sustain-all "$S" --out "$OUT/gemm_bf16.json"
# swizzle 1 against 8 on either side of SWIZZLE_BYTES (the swept operand: 64 / 32 / 16 MiB in FP8)
TAILN=6 step swizzles timeout=200 python3 bench/bench_gemm.py --kernels $G --modes fp8-row,bf16 --swizzles 1,8 \
  --shapes 8192x8192x8192,8192x8192x4096,8192x16384x2048 --sustain-all "$S" --out "$OUT/gemm_swizzles.json"
finish
