#include "../common.cuh"

// Writes this step's K/V into the paged cache [blocks, 2, ${BLOCK_SIZE}, ${KV_HEADS}, ${HEAD_DIM}]
// at slot_mapping[t] = block * ${BLOCK_SIZE} + offset (a negative slot writes nothing). k/v rows are
// ${K_STRIDE} / ${V_STRIDE} elements apart; values are rounded (saturating for fp8) to the cache type.
extern "C" __global__ void __launch_bounds__(${BLOCK}) ${KERNEL}(
    const ${DT}* __restrict__ k, const ${DT}* __restrict__ v, ${CT}* __restrict__ kv_cache,
    const long long* __restrict__ slot_mapping, long long num_tokens) {
  constexpr int W = ${KV_HEADS} * ${HEAD_DIM}, BS = ${BLOCK_SIZE};
  const i64 t = blockIdx.x;
  if (t >= num_tokens) return;
  const i64 slot = slot_mapping[t];
  if (slot < 0) return;
  const i64 blk = slot / BS, off = slot % BS;
  ${CT}* kc = kv_cache + ((blk * 2 + 0) * BS + off) * W;
  ${CT}* vc = kv_cache + ((blk * 2 + 1) * BS + off) * W;
  for (int i = threadIdx.x; i < W; i += ${BLOCK}) {
    kc[i] = from_f32<${CT}>(to_f32(k[t * ${K_STRIDE} + i]));
    vc[i] = from_f32<${CT}>(to_f32(v[t * ${V_STRIDE} + i]));
  }
}
