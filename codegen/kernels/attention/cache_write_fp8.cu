#include "../common.cuh"

// paged_attention_fp8's cache write: this step's K/V into the e4m3 cache [blocks, 2, ${BLOCK_SIZE}, ${KV_HEADS},
// ${HEAD_DIM}] at slot_mapping[t] (a negative slot writes nothing) as sat_rne(k / kv_scale[0][head]) and
// sat_rne(v / kv_scale[1][head]): an IEEE float32 division, then round-to-nearest-even saturating to +-448,
// exactly as ir/ops/quantized.py's reference (ir/quant/formats.py to_e4m3).
extern "C" __global__ void __launch_bounds__(${BLOCK}) ${KERNEL}(
    const ${DT}* __restrict__ k, const ${DT}* __restrict__ v, fp8e4m3* __restrict__ kv_cache,
    const long long* __restrict__ slot_mapping, const float* __restrict__ kv_scale, long long num_tokens) {
  constexpr int D = ${HEAD_DIM}, KV = ${KV_HEADS}, W = KV * D, BS = ${BLOCK_SIZE};
  const i64 t = blockIdx.x;
  if (t >= num_tokens) return;
  const i64 slot = slot_mapping[t];
  if (slot < 0) return;
  const i64 blk = slot / BS, off = slot % BS;
  fp8e4m3* kc = kv_cache + ((blk * 2 + 0) * BS + off) * W;
  fp8e4m3* vc = kv_cache + ((blk * 2 + 1) * BS + off) * W;
  for (int i = threadIdx.x; i < W; i += ${BLOCK}) {
    const int h = i / D;
    kc[i] = from_f32<fp8e4m3>(__fdiv_rn(to_f32(k[t * ${K_STRIDE} + i]), kv_scale[h]));
    vc[i] = from_f32<fp8e4m3>(__fdiv_rn(to_f32(v[t * ${V_STRIDE} + i]), kv_scale[KV + h]));
  }
}
