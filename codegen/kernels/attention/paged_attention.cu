#include "../common.cuh"

// Causal attention of a ragged token batch over the paged KV cache (after cache_write ran).
// Grid (token, kv head): a block handles the ${GROUP} query heads that share KV head blockIdx.y, one
// warp per query head at a time; lane l holds features l, l + 32, ... of q and of the output.
// Token t belongs to the sequence s with query_start_loc[s] <= t < query_start_loc[s + 1]; its position
// is seq_lens[s] - n_s + (t - query_start_loc[s]) and it attends to positions [lo, pos], lo from the
// sliding window (0 without one). Scores: q.k * scale, then softcap * tanh(score / softcap) if
// softcap > 0; the softmax is the online one (running max and sum), in float32.
extern "C" __global__ void __launch_bounds__(${WARPS} * 32) ${KERNEL}(
    const ${DT}* __restrict__ q, const ${CT}* __restrict__ kv_cache, const int* __restrict__ block_tables,
    const int* __restrict__ seq_lens, const int* __restrict__ query_start_loc, ${DT}* __restrict__ out,
    int num_tokens, int num_seqs, int max_blocks) {
  constexpr int D = ${HEAD_DIM}, KV = ${KV_HEADS}, G = ${GROUP}, H = KV * G, BS = ${BLOCK_SIZE};
  constexpr int DPL = (D + 31) / 32, WARPS = ${WARPS}, WINDOW = ${SLIDING_WINDOW};
  constexpr float SCALE = ${SCALE}, SOFTCAP = ${SOFTCAP};
  const int t = blockIdx.x, kvh = blockIdx.y, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (t >= num_tokens) return;
  // the last s with query_start_loc[s] <= t (empty sequences share a start with the next one)
  int lo_s = 0, hi_s = num_seqs;
  while (lo_s < hi_s) {
    const int mid = (lo_s + hi_s + 1) >> 1;
    if (query_start_loc[mid] <= t) lo_s = mid; else hi_s = mid - 1;
  }
  const int s = lo_s;
  const bool owned = s < num_seqs && t >= query_start_loc[0];
  const int start = owned ? query_start_loc[s] : 0;
  const int n = owned ? query_start_loc[s + 1] - start : 0;
  const int qpos = owned ? seq_lens[s] - n + (t - start) : -1;
  const int first = WINDOW > 0 ? max(0, qpos - WINDOW + 1) : 0;
  const int* table = block_tables + (i64)(owned ? s : 0) * max_blocks;
  for (int g = warp; g < G; g += WARPS) {
    const int h = kvh * G + g;
    float qv[DPL], acc[DPL];
#pragma unroll
    for (int j = 0; j < DPL; ++j) {
      const int d = lane + 32 * j;
      qv[j] = d < D ? to_f32(q[(i64)t * ${Q_STRIDE} + h * D + d]) : 0.0f;
      acc[j] = 0.0f;
    }
    float m = -__int_as_float(0x7f800000), l = 0.0f;  // -inf
    for (int p = first; p <= qpos; ++p) {
      const i64 blk = table[p / BS];
      const ${CT}* kp = kv_cache + ((blk * 2 + 0) * BS + p % BS) * (KV * D) + kvh * D;
      const ${CT}* vp = kv_cache + ((blk * 2 + 1) * BS + p % BS) * (KV * D) + kvh * D;
      float dot = 0.0f;
#pragma unroll
      for (int j = 0; j < DPL; ++j) {
        const int d = lane + 32 * j;
        if (d < D) dot += qv[j] * to_f32(kp[d]);
      }
      float score = warp_sum(dot) * SCALE;
      if (SOFTCAP > 0.0f) score = SOFTCAP * tanhf(score / (SOFTCAP > 0.0f ? SOFTCAP : 1.0f));
      const float m_new = fmaxf(m, score);
      const float corr = expf(m - m_new), e = expf(score - m_new);
      l = l * corr + e;
#pragma unroll
      for (int j = 0; j < DPL; ++j) {
        const int d = lane + 32 * j;
        if (d < D) acc[j] = acc[j] * corr + e * to_f32(vp[d]);
      }
      m = m_new;
    }
    const float inv = owned ? 1.0f / l : 0.0f;
#pragma unroll
    for (int j = 0; j < DPL; ++j) {
      const int d = lane + 32 * j;
      if (d < D) out[(i64)t * (H * D) + h * D + d] = from_f32<${DT}>(owned ? acc[j] * inv : 0.0f);
    }
  }
}
