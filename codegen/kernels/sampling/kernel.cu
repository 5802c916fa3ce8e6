#include "../common.cuh"

// Greedy sampling: token[s] = argmax(logits[s, :]) over ${VOCAB} entries, the first index on ties
// (numpy's argmax). NaN entries are skipped. One block per row.
extern "C" __global__ void __launch_bounds__(${BLOCK}) ${KERNEL}(
    const ${DT}* __restrict__ logits, long long* __restrict__ tokens, long long num_rows) {
  constexpr int V = ${VOCAB};
  const i64 row = blockIdx.x;
  if (row >= num_rows) return;
  const ${DT}* lr = logits + row * V;
  float best = -__int_as_float(0x7f800000);
  int idx = V;  // V: nothing seen yet
  for (int i = threadIdx.x; i < V; i += ${BLOCK}) {
    const float x = to_f32(lr[i]);
    if (x > best || (idx == V && x == best)) { best = x; idx = i; }
  }
  for (int o = 16; o > 0; o >>= 1) {
    const float ob = __shfl_xor_sync(0xffffffffu, best, o);
    const int oi = __shfl_xor_sync(0xffffffffu, idx, o);
    if (ob > best || (ob == best && oi < idx)) { best = ob; idx = oi; }
  }
  __shared__ float sb[32];
  __shared__ int si[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) { sb[warp] = best; si[warp] = idx; }
  __syncthreads();
  if (warp == 0) {
    best = lane < ${BLOCK} / 32 ? sb[lane] : -__int_as_float(0x7f800000);
    idx = lane < ${BLOCK} / 32 ? si[lane] : V;
    for (int o = 16; o > 0; o >>= 1) {
      const float ob = __shfl_xor_sync(0xffffffffu, best, o);
      const int oi = __shfl_xor_sync(0xffffffffu, idx, o);
      if (ob > best || (ob == best && oi < idx)) { best = ob; idx = oi; }
    }
    if (lane == 0) tokens[row] = idx < V ? idx : 0;
  }
}
