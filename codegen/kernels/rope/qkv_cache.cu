#include "../common.cuh"
#include "rotate.cuh"

// rope_qkv and paged attention's cache write in one launch (codegen/rope_cache_fusion.py): from a fused qkv row
// [tokens, (${NQ} + 2 * ${NKV}) * ${HEAD_DIM}] (q heads, then k heads, then v heads) at positions[t] and cos/sin
// [max_pos, ${ROT} / 2], writes the rotated q [tokens, ${NQ} * ${HEAD_DIM}] to q_out and the rotated k and the v
// straight into the paged cache [blocks, 2, ${BLOCK_SIZE}, ${NKV}, ${HEAD_DIM}] at slot_mapping[t] = block *
// ${BLOCK_SIZE} + offset (a negative slot writes no K/V; q is written anyway).
//
// Bit for bit the two launches it replaces: each element is rotated with qkv.cu's arithmetic (rotate.cuh) and
// rounded to the activation type as qkv.cu stores it, then converted to the cache type as cache_write.cu converts
// it (from_f32(to_f32(x))) or, KV_SCALED, as cache_write_fp8.cu does (sat_rne(x / kv_scale[0 or 1][head]), an
// IEEE division). The work is split into units of ${VEC} consecutive elements (16-byte loads of bf16 rows): per
// q/k head the rotary units (${VEC} / 2 interleaved pairs (2i, 2i+1), or the ${VEC} pairs (i, i + ${ROT} / 2) at
// i..i+${VEC}-1) and the pass-through units past ${ROT}, then the v row's units. One block per token.
template <typename T, int N> struct alignas(sizeof(T) * N) Pack { T e[N]; };

template <typename T, int N> __device__ __forceinline__ Pack<T, N> load_pack(const T* p) {
  return *reinterpret_cast<const Pack<T, N>*>(p);
}

template <typename T, int N> __device__ __forceinline__ void store_pack(T* p, const Pack<T, N>& x) {
  *reinterpret_cast<Pack<T, N>*>(p) = x;
}

// One value as the cache stores it (the cache-write kernels' conversion).
__device__ __forceinline__ ${KT} to_cache(${DT} x, float scale) {
  if (${KV_SCALED}) return from_f32<${KT}>(__fdiv_rn(to_f32(x), scale));
  return from_f32<${KT}>(to_f32(x));
}

template <int N> __device__ __forceinline__ void store_cache(${KT}* dst, const Pack<${DT}, N>& x, float scale) {
  Pack<${KT}, N> y;
#pragma unroll
  for (int p = 0; p < N; ++p) y.e[p] = to_cache(x.e[p], scale);
  store_pack<${KT}, N>(dst, y);
}

extern "C" __global__ void __launch_bounds__(${BLOCK}) ${KERNEL}(
    const ${DT}* __restrict__ qkv, const long long* __restrict__ positions, const ${CT}* __restrict__ cos_table,
    const ${CT}* __restrict__ sin_table, ${DT}* __restrict__ q_out, ${KT}* __restrict__ kv_cache,
    const long long* __restrict__ slot_mapping, const float* __restrict__ kv_scale, long long num_tokens) {
  constexpr int D = ${HEAD_DIM}, R = ${ROT}, HALF = R / 2, NQ = ${NQ}, NKV = ${NKV}, NH = NQ + NKV;
  constexpr int ROW = (NQ + 2 * NKV) * D, QW = NQ * D, KW = NKV * D, BS = ${BLOCK_SIZE};
  constexpr int V = ${VEC}, VH = V / 2 > 0 ? V / 2 : 1;
  constexpr bool INTERLEAVED = ${INTERLEAVED}, SCALED = ${KV_SCALED};
  constexpr int RU = INTERLEAVED ? R / V : HALF / V, PU = (D - R) / V, RU1 = RU > 0 ? RU : 1, PU1 = PU > 0 ? PU : 1;
  constexpr int ROT_UNITS = NH * RU, PASS_UNITS = NH * PU, UNITS = ROT_UNITS + PASS_UNITS + KW / V;
  const i64 t = blockIdx.x;
  if (t >= num_tokens) return;
  const i64 pos = positions[t], slot = slot_mapping[t];
  const bool write = slot >= 0;
  const i64 blk = write ? slot / BS : 0, off = write ? slot % BS : 0;
  const ${DT}* xr = qkv + t * ROW;
  ${DT}* qr = q_out + t * QW;
  ${KT}* kc = kv_cache + ((blk * 2 + 0) * BS + off) * KW;
  ${KT}* vc = kv_cache + ((blk * 2 + 1) * BS + off) * KW;
  for (int i = threadIdx.x; i < UNITS; i += ${BLOCK}) {
    if (i < ROT_UNITS + PASS_UNITS) {
      const bool rot = i < ROT_UNITS;
      const int head = rot ? i / RU1 : (i - ROT_UNITS) / PU1;
      const bool is_q = head < NQ;
      if (!is_q && !write) continue;
      const int kh = head - NQ;
      const float scale = SCALED && !is_q ? kv_scale[kh] : 1.0f;
      const ${DT}* src = xr + head * D;  // the q heads and then the k heads, side by side
      ${DT}* qdst = qr + head * D;
      ${KT}* kdst = kc + kh * D;
      if (!rot) {
        const int e0 = R + ((i - ROT_UNITS) % PU1) * V;
        const Pack<${DT}, V> x = load_pack<${DT}, V>(src + e0);
        if (is_q) store_pack<${DT}, V>(qdst + e0, x);
        else store_cache<V>(kdst + e0, x, scale);
      } else if (INTERLEAVED) {
        const int e0 = (i % RU1) * V, j0 = e0 / 2;
        const Pack<${DT}, V> x = load_pack<${DT}, V>(src + e0);
        const Pack<${CT}, VH> cs = load_pack<${CT}, VH>(cos_table + pos * HALF + j0);
        const Pack<${CT}, VH> sn = load_pack<${CT}, VH>(sin_table + pos * HALF + j0);
        Pack<${DT}, V> y;
#pragma unroll
        for (int p = 0; p < VH; ++p) {
          const float c = to_f32(cs.e[p]), s = to_f32(sn.e[p]);
          const float a = to_f32(x.e[2 * p]), b = to_f32(x.e[2 * p + 1]);
          float ya, yb;
          rotate_pair(a, b, c, s, ya, yb);
          y.e[2 * p] = from_f32<${DT}>(ya);
          y.e[2 * p + 1] = from_f32<${DT}>(yb);
        }
        if (is_q) store_pack<${DT}, V>(qdst + e0, y);
        else store_cache<V>(kdst + e0, y, scale);
      } else {
        const int j0 = (i % RU1) * V;
        const Pack<${DT}, V> xa = load_pack<${DT}, V>(src + j0), xb = load_pack<${DT}, V>(src + HALF + j0);
        const Pack<${CT}, V> cs = load_pack<${CT}, V>(cos_table + pos * HALF + j0);
        const Pack<${CT}, V> sn = load_pack<${CT}, V>(sin_table + pos * HALF + j0);
        Pack<${DT}, V> ya, yb;
#pragma unroll
        for (int p = 0; p < V; ++p) {
          const float c = to_f32(cs.e[p]), s = to_f32(sn.e[p]);
          const float a = to_f32(xa.e[p]), b = to_f32(xb.e[p]);
          float ra, rb;
          rotate_pair(a, b, c, s, ra, rb);
          ya.e[p] = from_f32<${DT}>(ra);
          yb.e[p] = from_f32<${DT}>(rb);
        }
        if (is_q) {
          store_pack<${DT}, V>(qdst + j0, ya);
          store_pack<${DT}, V>(qdst + HALF + j0, yb);
        } else {
          store_cache<V>(kdst + j0, ya, scale);
          store_cache<V>(kdst + HALF + j0, yb, scale);
        }
      }
    } else if (write) {
      const int e0 = (i - ROT_UNITS - PASS_UNITS) * V;
      const float scale = SCALED ? kv_scale[NKV + e0 / D] : 1.0f;
      store_cache<V>(vc + e0, load_pack<${DT}, V>(xr + QW + KW + e0), scale);
    }
  }
}
