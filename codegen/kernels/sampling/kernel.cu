#include "../common.cuh"

// Greedy sampling: token[s] = argmax(logits[s, :]) over ${VOCAB} entries, exactly numpy's argmax: the
// first index on ties (-0.0 == 0.0), and NaN above every number (the first NaN wins). One block per row;
// each thread reads ${VEC}-element packs, ${UNROLL} packs in flight, keeping its best (value, index);
// then a warp-shuffle and a shared-memory reduction of the pairs.

// Is (x, i) ahead of (best, bi)? NaN first, then the larger value, then the lower index.
__device__ __forceinline__ bool argmax_ahead(float x, int i, float best, int bi) {
  const bool x_nan = x != x, best_nan = best != best;
  if (x_nan || best_nan) return x_nan && (!best_nan || i < bi);
  return x > best || (x == best && i < bi);
}

struct alignas(sizeof(${DT}) * ${VEC}) ${KERNEL}_pack { ${DT} v[${VEC}]; };

extern "C" __global__ void __launch_bounds__(${BLOCK}) ${KERNEL}(
    const ${DT}* __restrict__ logits, long long* __restrict__ tokens, long long num_rows) {
  constexpr int V = ${VOCAB}, VEC = ${VEC}, PACKS = V / VEC, UNROLL = ${UNROLL}, BLOCK = ${BLOCK};
  const i64 row = blockIdx.x;
  if (row >= num_rows) return;
  const ${KERNEL}_pack* packs = reinterpret_cast<const ${KERNEL}_pack*>(logits + row * V);
  float best = -__int_as_float(0x7f800000);
  int idx = V;  // V: nothing seen yet; any element, -inf included, is ahead of it
  for (int p0 = threadIdx.x; p0 < PACKS; p0 += BLOCK * UNROLL) {
    ${KERNEL}_pack pk[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      if (p0 + u * BLOCK < PACKS) pk[u] = packs[p0 + u * BLOCK];
    }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int p = p0 + u * BLOCK;
      if (p < PACKS) {
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
          const float x = to_f32(pk[u].v[e]);
          if (argmax_ahead(x, p * VEC + e, best, idx)) { best = x; idx = p * VEC + e; }
        }
      }
    }
  }
  for (int o = 16; o > 0; o >>= 1) {
    const float ob = __shfl_xor_sync(0xffffffffu, best, o);
    const int oi = __shfl_xor_sync(0xffffffffu, idx, o);
    if (argmax_ahead(ob, oi, best, idx)) { best = ob; idx = oi; }
  }
  __shared__ float sb[32];
  __shared__ int si[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) { sb[warp] = best; si[warp] = idx; }
  __syncthreads();
  if (warp == 0) {
    best = lane < BLOCK / 32 ? sb[lane] : -__int_as_float(0x7f800000);
    idx = lane < BLOCK / 32 ? si[lane] : V;
    for (int o = 16; o > 0; o >>= 1) {
      const float ob = __shfl_xor_sync(0xffffffffu, best, o);
      const int oi = __shfl_xor_sync(0xffffffffu, idx, o);
      if (argmax_ahead(ob, oi, best, idx)) { best = ob; idx = oi; }
    }
    if (lane == 0) tokens[row] = idx < V ? idx : 0;
  }
}
