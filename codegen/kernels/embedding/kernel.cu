#include "../common.cuh"

// out[t, :] = table[ids[t], :]; table [vocab, ${HIDDEN}]. An id outside [0, vocab) gives a zero row
// (the numpy reference raises; the runtime validates ids before a step).
extern "C" __global__ void __launch_bounds__(${BLOCK}) ${KERNEL}(
    const ${DT}* __restrict__ table, const long long* __restrict__ ids, ${DT}* __restrict__ out,
    long long num_tokens, long long vocab) {
  const i64 t = blockIdx.x;
  if (t >= num_tokens) return;
  const i64 id = ids[t];
  const bool valid = id >= 0 && id < vocab;
  const ${DT}* row = table + (valid ? id : 0) * (i64)${HIDDEN};
  ${DT}* dst = out + t * (i64)${HIDDEN};
  for (int h = threadIdx.x; h < ${HIDDEN}; h += ${BLOCK}) dst[h] = valid ? row[h] : from_f32<${DT}>(0.0f);
}
