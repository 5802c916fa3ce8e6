#!/usr/bin/env bash
# The bulk-copy decode GEMV (codegen/kernels/gemv/bulk.cu, INGOT_GEMV_BULK=1) on the GPU machine, in one go; results
# under $OUT. What decides whether it becomes the default (docs/PERF.md, "Bulk-copy GEMV": first run 2026-11-30).
#
#   OUT=/some/dir bash bench/run_bulk_gemv_gpu.sh            correctness, then the kernel benchmarks (~5 min)
#   OUT=/some/dir E2E=1 bash bench/run_bulk_gemv_gpu.sh      also the end-to-end A/B on the 1B shape (~+10 min:
#                                                            default / bulk / both fusions off / early PDL trigger /
#                                                            bulk + early trigger, then a launch-by-launch profile)
#   OUT=/some/dir E2E_ONLY=1 bash bench/run_bulk_gemv_gpu.sh the end-to-end part alone (a device call is at most
#                                                            10 minutes: run the two parts as two calls)
#
# Order: the plain bulk variants' GPU tests first (every other bulk piece builds on them: if they fail or hang, the
# rest is moot), then the fused (rms_norm / swiglu prologue) and FP8 bulk variants, the decode-fusion end-to-end test
# (template GEMMs, so no cold CUTLASS build), then bench_gemv --bulk, --chain (the figure that matters: a 16-layer
# qkv/o/gate_up/down chain with PDL in one CUDA graph), the chain with decode fusion's fused GEMVs (--fused) and with
# an rms_norm launch before every GEMV (--interleave norm), and bench_gemv_quant --bulk. A mistake in an mbarrier
# shows as a hang, hence the time-outs (exit 124).
set -u
OUT=${OUT:-/tmp/bulk-gemv-out}
cd "$(dirname "$0")/.."
. bench/gpu_run_lib.sh

T="python3 -m pytest -m gpu -q -rs -x -p no:cacheprovider"
if [ "${E2E_ONLY:-0}" != 1 ]; then
step bulk_plain timeout=300 $T tests/codegen/test_gemv_bulk_gpu.py
step bulk_fused timeout=200 $T tests/codegen/test_decode_fusion_gpu.py -k bulk
step bulk_fp8 timeout=200 $T tests/codegen/test_gemv_bulk_quant_gpu.py
step fusion_e2e timeout=300 env INGOT_NO_CUTLASS=1 $T tests/runtime/test_cuda_backend.py -k "fusion or pdl"
step bench_bulk timeout=200 python3 bench/bench_gemv.py --bulk --m 1 8 32 --json "$OUT/gemv_bulk.json"
step bench_chain timeout=200 python3 bench/bench_gemv.py --chain --m 1 8 32 --json "$OUT/gemv_chain.json"
# the chain as the model runs it: fused GEMVs (decode fusion's prologues), then an rms_norm launch before every GEMV;
# whichever takes bulk.cu's lead over kernel.cu away explains the end-to-end result
step bench_chain_fused timeout=200 python3 bench/bench_gemv.py --chain --fused --m 1 8 \
  --json "$OUT/gemv_chain_fused.json"
step bench_chain_interleave timeout=200 python3 bench/bench_gemv.py --chain --interleave norm --m 1 8 \
  --json "$OUT/gemv_chain_interleave.json"
# the same with every template kernel triggering the next grid before its wait (INGOT_PDL_TRIGGER=early, rendered
# at compile time): if the small kernels take the lead away, this is what should give it back
step bench_chain_interleave_early timeout=200 env INGOT_PDL_TRIGGER=early python3 bench/bench_gemv.py --chain \
  --interleave norm --m 1 8 --json "$OUT/gemv_chain_interleave_early.json"
step pdl_early_tests timeout=300 env INGOT_PDL_TRIGGER=early INGOT_NO_CUTLASS=1 $T tests/runtime/test_cuda_backend.py \
  tests/runtime/test_engine_cuda.py tests/codegen/test_gemv_bulk_gpu.py
step bench_bulk_fp8 timeout=200 python3 bench/bench_gemv_quant.py --bulk --formats fp8-w8a16 --m 1 8 32 \
  --json "$OUT/gemv_quant_bulk.json"
fi

if [ "${E2E:-0}" = 1 ] || [ "${E2E_ONLY:-0}" = 1 ]; then
  # one checkpoint, five artifact sets (the CUTLASS kernels are shared through INGOT_CACHE_DIR), then the figures;
  # HF / torch.compile once, with the default artifacts
  MB="--max-num-batched-tokens 16384"
  W=/tmp/bulk-e2e
  step e2e_compile timeout=1200 env INGOT_AUTOTUNE=0 python3 bench/bench_e2e.py --compile-only --workdir $W/default \
    $MB --formats bf16,fp8-w8a16,fp8-w8a16-lmhead
  # the default has decode fusion and rope-cache fusion on; nofusion turns both off; early: INGOT_PDL_TRIGGER=early
  for v in bulk:INGOT_GEMV_BULK=1 nofusion:INGOT_DECODE_FUSION=0,INGOT_ROPE_CACHE_FUSION=0 \
           early:INGOT_PDL_TRIGGER=early bulk-early:INGOT_GEMV_BULK=1,INGOT_PDL_TRIGGER=early; do
    name=${v%%:*}; envs=${v#*:}
    mkdir -p $W/$name && ln -sfn $W/default/llama1b-ckpt $W/$name/llama1b-ckpt
    step e2e_compile_$name timeout=900 env INGOT_AUTOTUNE=0 ${envs//,/ } python3 bench/bench_e2e.py --compile-only --reuse \
      --workdir $W/$name $MB --formats bf16,fp8-w8a16
  done
  E="--reuse $MB --decode-steps 1,8 --batches 1,64"
  step e2e_default timeout=400 python3 bench/bench_e2e.py $E --workdir $W/default \
    --formats bf16,fp8-w8a16,fp8-w8a16-lmhead --prefill-repeats 3 --out "$OUT/e2e_default.json"
  for name in bulk nofusion early bulk-early; do
    step e2e_$name timeout=300 python3 bench/bench_e2e.py $E --workdir $W/$name --formats bf16,fp8-w8a16 --skip-hf \
      --out "$OUT/e2e_$name.json"
  done
  # where the batch-1 step's time goes, launch by launch (plain launches between events: read shares), default vs
  # bulk-early: the per-layer GEMVs against the chain's figures
  step e2e_profile timeout=300 python3 bench/bench_profile.py $W/default/llama1b_bf16.ingot \
    $W/bulk-early/llama1b_bf16.ingot $MB --json "$OUT/profile.json"
fi
finish
