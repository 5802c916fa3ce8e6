#include "../common.cuh"
#include "rotate.cuh"

// Rotary embedding of q and k straight from a fused qkv row [tokens, (${NQ} + 2 * ${NKV}) * ${HEAD_DIM}]
// (q heads, then k heads, then v heads) at positions[t]; cos/sin [max_pos, ${ROT} / 2]. Writes the rotated
// q [tokens, ${NQ} * ${HEAD_DIM}], the rotated k and v (copied) [tokens, ${NKV} * ${HEAD_DIM}]. Each thread
// owns one rotating pair, one pass-through feature of q/k, or one feature of v; the arithmetic per element
// is the rope kernel's (kernel.cu), so the results are the same. INTERLEAVED pairs (2i, 2i+1), otherwise
// (i, i + ${ROT} / 2).
extern "C" __global__ void __launch_bounds__(${BLOCK}) ${KERNEL}(
    const ${DT}* __restrict__ qkv, const long long* __restrict__ positions, const ${CT}* __restrict__ cos_table,
    const ${CT}* __restrict__ sin_table, ${DT}* __restrict__ q_out, ${DT}* __restrict__ k_out,
    ${DT}* __restrict__ v_out, long long num_tokens) {
  constexpr int D = ${HEAD_DIM}, R = ${ROT}, HALF = R / 2, NQ = ${NQ}, NKV = ${NKV}, NH = NQ + NKV;
  constexpr int ROW = (NQ + 2 * NKV) * D, QW = NQ * D, KW = NKV * D;
  constexpr bool INTERLEAVED = ${INTERLEAVED};
  constexpr int PAIRS = NH * HALF, PASS = NH * (D - R), PD = D > R ? D - R : 1, VW = KW;
  const i64 t = blockIdx.x;
  if (t >= num_tokens) return;
  const i64 pos = positions[t];
  const ${DT}* xr = qkv + t * ROW;
  ${DT}* qr = q_out + t * QW;
  ${DT}* kr = k_out + t * KW;
  ${DT}* vr = v_out + t * KW;
  for (int i = threadIdx.x; i < PAIRS + PASS + VW; i += ${BLOCK}) {
    if (i < PAIRS) {
      const int head = i / HALF, j = i % HALF;
      const int ia = (head < NQ ? head : head - NQ) * D + (INTERLEAVED ? 2 * j : j);
      const int ib = ia + (INTERLEAVED ? 1 : HALF);
      const ${DT}* src = head < NQ ? xr : xr + QW;
      ${DT}* dst = head < NQ ? qr : kr;
      const float c = to_f32(cos_table[pos * HALF + j]), s = to_f32(sin_table[pos * HALF + j]);
      const float a = to_f32(src[ia]), b = to_f32(src[ib]);
      float ya, yb;
      rotate_pair(a, b, c, s, ya, yb);
      dst[ia] = from_f32<${DT}>(ya);
      dst[ib] = from_f32<${DT}>(yb);
    } else if (i < PAIRS + PASS) {
      const int k = i - PAIRS, head = k / PD, j = R + k % PD;
      if (head < NQ) {
        qr[head * D + j] = xr[head * D + j];
      } else {
        kr[(head - NQ) * D + j] = xr[QW + (head - NQ) * D + j];
      }
    } else {
      const int k = i - PAIRS - PASS;
      vr[k] = xr[QW + KW + k];
    }
  }
}
