#include "../common.cuh"

// Split-KV ("flash-decoding") paged attention, GQA-aware: the same semantics as paged_attention.cu (causal over
// the sequence's cached positions, softcap, sliding window, tokens past query_start_loc[num_seqs] get zeros),
// faster for long contexts and small batches. See codegen/kernels/attention/split_rule.py for the parameters.
//
// Grid (token, kv head, split). The CTA of (t, kvh, z) reads each K/V row of KV head kvh in its range of cache
// blocks once and scores it against all ${GROUP} query heads of the group (q held in registers). A warp takes
// one tile of TP positions at a time (PPW positions per 16-byte-per-lane load row: lane = position pp x 8 features
// dc), loads the tile's K and V rows before using them, keeps a running (max, sum, acc) per query head and lane
// group (online softmax, float32); the lane groups and then the warps are merged through shared memory.
//
// Splits per token (the same in every CTA of a token, so no host decision is needed): the token's cache blocks
// nblk, wanted = min(ceil(nblk / MIN_CHUNK_BLOCKS), ceil(TARGET_CTAS / (num_tokens * KV)), MAX_SPLITS)
// (1 for t >= TOKEN_CAP), per = ceil(nblk / wanted) blocks per split, nsplit = ceil(nblk / per); CTAs with
// z >= nsplit exit at once. With nsplit > 1 each CTA writes its partial (max, sum, acc[D]) per query head to a
// module-scope workspace, and the last CTA of (t, kvh) (atomic counter, reset by it for the next launch) merges
// the nsplit partials in split order (deterministic) and writes the output: the reduce step runs in the same
// launch. One launch at a time per module (stream order) may use the workspace.
// FP8 cache (e4m3 codes): K = code * kv_scale[0][kvh], V = code * kv_scale[1][kvh] (1 without kv_scale).
struct pa_u32x4 { unsigned x, y, z, w; };

namespace {
constexpr int D = ${HEAD_DIM}, KV = ${KV_HEADS}, G = ${GROUP}, H = KV * G, BS = ${BLOCK_SIZE};
constexpr int WARPS = ${WARPS}, MAX_SPLITS = ${MAX_SPLITS}, MIN_CHUNK_BLOCKS = ${MIN_CHUNK_BLOCKS};
constexpr int TARGET_CTAS = ${TARGET_CTAS}, TOKEN_CAP = ${TOKEN_CAP}, WINDOW = ${SLIDING_WINDOW};
constexpr bool FP8 = ${FP8};
constexpr float SCALE = ${SCALE}, SOFTCAP = ${SOFTCAP};
constexpr int LPP = D / 8, PPW = 32 / LPP, ITERS = ${ITERS}, TP = PPW * ITERS, TILES = BS / TP;
static_assert(D % 8 == 0 && 32 % LPP == 0 && LPP <= 32, "head_dim: 8 features per lane, a power of two up to 256");
static_assert(BS % TP == 0, "a cache block is whole tiles");
}  // namespace

__device__ float ${KERNEL}_acc[TOKEN_CAP * KV * MAX_SPLITS * G * D];
__device__ float ${KERNEL}_ml[TOKEN_CAP * KV * MAX_SPLITS * G * 2];
__device__ unsigned ${KERNEL}_cnt[TOKEN_CAP * KV];

__device__ __forceinline__ pa_u32x4 pa_ld(const bf16* p) {
  pa_u32x4 v;
  asm("ld.global.nc.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}
__device__ __forceinline__ pa_u32x4 pa_ld(const fp8e4m3* p) {
  pa_u32x4 v;
  asm("ld.global.nc.v2.u32 {%0,%1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
  v.z = v.w = 0u;
  return v;
}
__device__ __forceinline__ void pa_e4m3x2(unsigned short b, float& lo, float& hi) {
  unsigned h2;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h2) : "h"(b));
  asm("{.reg .f16 l, h;\n mov.b32 {l, h}, %2;\n cvt.f32.f16 %0, l;\n cvt.f32.f16 %1, h;}" : "=f"(lo), "=f"(hi) : "r"(h2));
}
// 8 features (16 B of bf16 or 8 B of e4m3) -> float
__device__ __forceinline__ void pa_cvt(const pa_u32x4& r, float* f) {
  if (FP8) {
    pa_e4m3x2((unsigned short)(r.x & 0xffffu), f[0], f[1]);
    pa_e4m3x2((unsigned short)(r.x >> 16), f[2], f[3]);
    pa_e4m3x2((unsigned short)(r.y & 0xffffu), f[4], f[5]);
    pa_e4m3x2((unsigned short)(r.y >> 16), f[6], f[7]);
  } else {
    const unsigned v[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      f[2 * i] = __uint_as_float(v[i] << 16);
      f[2 * i + 1] = __uint_as_float(v[i] & 0xffff0000u);
    }
  }
}
// merge (mo, lo, ao) into (m, l, a): the online-softmax combine; -inf maxima carry nothing
__device__ __forceinline__ void pa_merge(float& m, float& l, float* a, float mo, float lo, const float* ao) {
  const float mn = fmaxf(m, mo);
  if (mn == __int_as_float(0xff800000u)) return;
  const float ca = expf(m - mn), cb = expf(mo - mn);
  l = l * ca + lo * cb;
#pragma unroll
  for (int e = 0; e < 8; ++e) a[e] = a[e] * ca + ao[e] * cb;
  m = mn;
}

extern "C" __global__ void __launch_bounds__(WARPS * 32) ${KERNEL}(
    const ${DT}* __restrict__ q, const ${CT}* __restrict__ kv_cache, const int* __restrict__ block_tables,
    const int* __restrict__ seq_lens, const int* __restrict__ query_start_loc, ${DT}* __restrict__ out,
    int num_tokens, int num_seqs, int max_blocks${KV_SCALE_PARAM}) {
  __shared__ float sm_m[WARPS][G], sm_l[WARPS][G];
  __shared__ __align__(16) float sm_acc[WARPS][G][D];
  __shared__ unsigned is_last;
  const float NEG_INF = __int_as_float(0xff800000u);
  const int t = blockIdx.x, kvh = blockIdx.y, z = blockIdx.z;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, dc = lane % LPP, pp = lane / LPP;
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

  int nsplit = 1, per = 1, b_first = 0, nblk = 0;
  if (owned) {
    b_first = first / BS;
    nblk = qpos / BS - b_first + 1;
    const int room = (TARGET_CTAS + num_tokens * KV - 1) / (num_tokens * KV);
    int want = min(min((nblk + MIN_CHUNK_BLOCKS - 1) / MIN_CHUNK_BLOCKS, room), MAX_SPLITS);
    if (t >= TOKEN_CAP) want = 1;
    want = max(want, 1);
    per = (nblk + want - 1) / want;
    nsplit = (nblk + per - 1) / per;
  }
  if (z >= nsplit) return;

  float qv[G][8], m[G], l[G], acc[G][8];
#pragma unroll
  for (int g = 0; g < G; ++g) {
    float f[8];
    if (owned) {
      const pa_u32x4 r = pa_ld(reinterpret_cast<const bf16*>(q) + (i64)t * ${Q_STRIDE} + (kvh * G + g) * D + 8 * dc);
      const unsigned v[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        f[2 * i] = __uint_as_float(v[i] << 16);
        f[2 * i + 1] = __uint_as_float(v[i] & 0xffff0000u);
      }
    }
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      qv[g][e] = owned ? f[e] : 0.0f;
      acc[g][e] = 0.0f;
    }
    m[g] = NEG_INF;
    l[g] = 0.0f;
  }
  const float* kvs = ${KV_SCALE_PTR};
  const float ksc = kvs != nullptr ? kvs[kvh] : 1.0f, vsc = kvs != nullptr ? kvs[KV + kvh] : 1.0f;

  if (owned) {
    const int b0 = b_first + z * per, b1 = min(b0 + per, b_first + nblk);
    for (int item = warp; item < (b1 - b0) * TILES; item += WARPS) {
      const int b = b0 + item / TILES, tile = item % TILES;
      const i64 blk = table[b];
      const int p0 = b * BS + tile * TP;  // the tile's first position
      const ${CT}* kb = kv_cache + ((blk * 2 + 0) * BS + tile * TP + pp) * (KV * D) + kvh * D + 8 * dc;
      const ${CT}* vb = kv_cache + ((blk * 2 + 1) * BS + tile * TP + pp) * (KV * D) + kvh * D + 8 * dc;
      pa_u32x4 kr[ITERS], vr[ITERS];
#pragma unroll
      for (int i = 0; i < ITERS; ++i) kr[i] = pa_ld(kb + (i64)i * PPW * (KV * D));
#pragma unroll
      for (int i = 0; i < ITERS; ++i) vr[i] = pa_ld(vb + (i64)i * PPW * (KV * D));
      float sc[ITERS][G];
#pragma unroll
      for (int i = 0; i < ITERS; ++i) {
        float kf[8];
        pa_cvt(kr[i], kf);
        const int pos = p0 + i * PPW + pp;
        const bool live = pos >= first && pos <= qpos;
#pragma unroll
        for (int g = 0; g < G; ++g) {
          float d = 0.0f;
#pragma unroll
          for (int e = 0; e < 8; ++e) d += qv[g][e] * kf[e];
#pragma unroll
          for (int o = LPP / 2; o > 0; o >>= 1) d += __shfl_xor_sync(0xffffffffu, d, o);
          float score = d * ksc * SCALE;
          if (SOFTCAP > 0.0f) score = SOFTCAP * tanhf(score / (SOFTCAP > 0.0f ? SOFTCAP : 1.0f));
          sc[i][g] = live ? score : NEG_INF;
        }
      }
      float mn[G];
#pragma unroll
      for (int g = 0; g < G; ++g) {
        float mb = sc[0][g];
#pragma unroll
        for (int i = 1; i < ITERS; ++i) mb = fmaxf(mb, sc[i][g]);
        mn[g] = fmaxf(m[g], mb);
        const float corr = mn[g] == NEG_INF ? 1.0f : expf(m[g] - mn[g]);
        l[g] *= corr;
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[g][e] *= corr;
        m[g] = mn[g];
      }
#pragma unroll
      for (int i = 0; i < ITERS; ++i) {
        float vf[8];
        pa_cvt(vr[i], vf);
#pragma unroll
        for (int g = 0; g < G; ++g) {
          const float p = sc[i][g] == NEG_INF ? 0.0f : expf(sc[i][g] - mn[g]);
          l[g] += p;
#pragma unroll
          for (int e = 0; e < 8; ++e) acc[g][e] += p * vf[e];
        }
      }
    }
  }
  // lane groups (positions pp) of the warp -> one state per feature chunk dc
#pragma unroll
  for (int o = LPP; o < 32; o <<= 1)
#pragma unroll
    for (int g = 0; g < G; ++g) {
      float ao[8];
      const float mo = __shfl_xor_sync(0xffffffffu, m[g], o), lo = __shfl_xor_sync(0xffffffffu, l[g], o);
#pragma unroll
      for (int e = 0; e < 8; ++e) ao[e] = __shfl_xor_sync(0xffffffffu, acc[g][e], o);
      pa_merge(m[g], l[g], acc[g], mo, lo, ao);
    }
  if (pp == 0) {
#pragma unroll
    for (int g = 0; g < G; ++g) {
      if (dc == 0) {
        sm_m[warp][g] = m[g];
        sm_l[warp][g] = l[g];
      }
#pragma unroll
      for (int e = 0; e < 8; ++e) sm_acc[warp][g][8 * dc + e] = acc[g][e];
    }
  }
  __syncthreads();

  // warps -> the CTA's state for each (query head g, feature d); one split: normalize and write
  const i64 slot = ((i64)t * KV + kvh) * MAX_SPLITS;
  for (int idx = threadIdx.x; idx < G * D; idx += WARPS * 32) {
    const int g = idx / D, d = idx % D;
    float M = NEG_INF;
#pragma unroll
    for (int w = 0; w < WARPS; ++w) M = fmaxf(M, sm_m[w][g]);
    float L = 0.0f, A = 0.0f;
    if (M != NEG_INF) {
#pragma unroll
      for (int w = 0; w < WARPS; ++w) {
        const float c = expf(sm_m[w][g] - M);
        L += sm_l[w][g] * c;
        A += sm_acc[w][g][d] * c;
      }
    }
    if (nsplit == 1) {
      out[(i64)t * (H * D) + (kvh * G + g) * D + d] = from_f32<${DT}>(owned ? A / L * vsc : 0.0f);
    } else {
      asm volatile("st.global.cg.f32 [%0], %1;" ::"l"(${KERNEL}_acc + (slot + z) * (G * D) + idx), "f"(A) : "memory");
      if (d == 0) {
        asm volatile("st.global.cg.f32 [%0], %1;" ::"l"(${KERNEL}_ml + ((slot + z) * G + g) * 2), "f"(M) : "memory");
        asm volatile("st.global.cg.f32 [%0], %1;" ::"l"(${KERNEL}_ml + ((slot + z) * G + g) * 2 + 1), "f"(L)
                     : "memory");
      }
    }
  }
  if (nsplit == 1) return;

  // the reduce: the last CTA of (t, kvh) merges the nsplit partials in split order
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned prev;
    asm volatile("atom.global.add.u32 %0, [%1], 1;" : "=r"(prev) : "l"(&${KERNEL}_cnt[t * KV + kvh]) : "memory");
    is_last = prev == (unsigned)nsplit - 1u;
  }
  __syncthreads();
  if (!is_last) return;
  __threadfence();
  for (int idx = threadIdx.x; idx < G * D; idx += WARPS * 32) {
    const int g = idx / D, d = idx % D;
    float M = NEG_INF;
    for (int sp = 0; sp < nsplit; ++sp) M = fmaxf(M, __ldcg(${KERNEL}_ml + ((slot + sp) * G + g) * 2));
    float L = 0.0f, A = 0.0f;
    for (int sp = 0; sp < nsplit; ++sp) {
      const float ms = __ldcg(${KERNEL}_ml + ((slot + sp) * G + g) * 2);
      if (ms == NEG_INF) continue;
      const float c = expf(ms - M);
      L += __ldcg(${KERNEL}_ml + ((slot + sp) * G + g) * 2 + 1) * c;
      A += __ldcg(${KERNEL}_acc + (slot + sp) * (G * D) + idx) * c;
    }
    out[(i64)t * (H * D) + (kvh * G + g) * D + d] = from_f32<${DT}>(A / L * vsc);
  }
  if (threadIdx.x == 0) ${KERNEL}_cnt[t * KV + kvh] = 0u;  // ready for the next launch
}
