#include "../common.cuh"
#include "rotate.cuh"

// Rotary embedding of x [tokens, ${HEADS} * ${HEAD_DIM}] at positions[t]; cos/sin [max_pos, ${ROT} / 2].
// Each thread owns one rotating pair (and writes both of its elements, so out may alias x) or one
// pass-through feature. INTERLEAVED pairs (2i, 2i+1), otherwise (i, i + ${ROT} / 2).
extern "C" __global__ void __launch_bounds__(${BLOCK}) ${KERNEL}(
    const ${DT}* __restrict__ x, const long long* __restrict__ positions, const ${CT}* __restrict__ cos_table,
    const ${CT}* __restrict__ sin_table, ${DT}* out, long long num_tokens) {
  constexpr int D = ${HEAD_DIM}, R = ${ROT}, HALF = R / 2, NH = ${HEADS}, ROW = NH * D;
  constexpr bool INTERLEAVED = ${INTERLEAVED};
  constexpr int PAIRS = NH * HALF, PASS = NH * (D - R), PD = D > R ? D - R : 1;
  const i64 t = blockIdx.x;
  if (t >= num_tokens) return;
  const i64 pos = positions[t];
  const ${DT}* xr = x + t * ROW;
  ${DT}* yr = out + t * ROW;
  for (int i = threadIdx.x; i < PAIRS + PASS; i += ${BLOCK}) {
    if (i < PAIRS) {
      const int head = i / HALF, j = i % HALF;
      const int ia = head * D + (INTERLEAVED ? 2 * j : j);
      const int ib = ia + (INTERLEAVED ? 1 : HALF);
      const float c = to_f32(cos_table[pos * HALF + j]), s = to_f32(sin_table[pos * HALF + j]);
      const float a = to_f32(xr[ia]), b = to_f32(xr[ib]);
      float ya, yb;
      rotate_pair(a, b, c, s, ya, yb);
      yr[ia] = from_f32<${DT}>(ya);
      yr[ib] = from_f32<${DT}>(yb);
    } else {
      const int k = i - PAIRS, head = k / PD, j = R + k % PD;
      yr[head * D + j] = xr[head * D + j];
    }
  }
}
