#include "../common.cuh"
#include "splitk.cuh"
#include "e4m3.cuh"
#include "../rope/rotate.cuh"

// Decode GEMV / skinny GEMM for ``quantized_linear`` (codegen/kernels/gemv/quant_rule.py):
// out[M, N] = quant(x)[M, K] @ dequant(w)[N, K]^T (+ bias[N]) (+ residual[M, N]), bf16 x and out, f32 accumulate.
//
//   WFMT 0: fp8 e4m3 weights w[N, K], f32 scale per output channel (weight_scale[N]);
//   WFMT 2: fp8 e4m3 weights w[N, K], f32 scale per 128 x 128 block (weight_scale[ceil(N / 128)][K / 128], K a
//           multiple of 128): each block's products summed apart (every warp's part of K is whole blocks), then added
//           to the accumulators times the block's scale, the rest as WFMT 0 with no scale in the epilogue;
//   WFMT 1: nvfp4 weights u8[N, K/2] (E2M1 pairs, element 2j in the low nibble), one e4m3 scale per 16 along K
//           (weight_scale u8[N, K/16], linear layout), f32 global scale weight_scale_2[1];
//   AFMT 0: bf16 activations (weight-only): the weights are dequantized to bf16 in registers (exactly: e4m3 and
//           e2m1 x e4m3 fit bf16) and multiplied on bf16 tensor cores (mma.sync m16n8k16);
//   AFMT 1: fp8 activations, per token: scale_t = amax_t / 448 (1 if zero), q = e4m3(x / scale_t), computed by
//           each CTA for its tokens (the row amax over all of K) exactly as ir/quant/formats.py does; fp8 x fp8
//           products on tensor cores (mma.sync m16n8k32 e4m3, exact), scales applied in the epilogue;
//   AFMT 2: fp8 activations with the static per-tensor scale input_scale[1].
//
// Memory-bound design as kernel.cu's: a warp owns 16 x ${MT} weight rows and one K slice; each lane loads 16 B of
// rows g and g+8 of each 16-row tile per step (ld.global.nc.L1::no_allocate; a step is 64 columns of fp8 or 128 of
// nvfp4), ${U} steps per stage, two stages in flight; the CTA's x slice sits in shared memory in the order the
// fragments read it (16-byte chunks transposed so that the 4 lanes of a row read 64 contiguous bytes); the K
// order inside a step is permuted identically for w and x, so both load as whole 16-byte vectors; split-K over
// CTAs (grid.y = ${SPLITK}) with the last CTA of a row block summing the partials in a fixed order.
// Row groups (${KW} warps a row group, as kernel.cu's): the warps of a row group own 16 x ${MT} rows together, each a
// ${KS} / ${KW}-column part of the CTA's K slice (whole steps, its own NVFP4 block scales), and add their partial
// tiles through shared memory (x's region, free once the products are done) in warp order; the group's first warp
// alone runs the split-K tail and the epilogue. Small matrices then fill the GPU without the split-K tail over CTAs.
// ANY_M: grid.z = ceil(M / ${MB}) token chunks (no split-K): the launch for any M (prefill), weights re-read per chunk.
// Rope epilogue (${ROPE}; rope_epilogue.cuh, as kernel.cu's): the qkv projection's variant rotates q and k and writes q
// and the KV cache as rope/qkv_cache.cu does (out is not written); the row scales are the streamed rows'.
// rms_norm prologue (PROLOGUE = ${PROLOGUE}, FP8 activations only; codegen/decode_fusion.py): x is the norm's input and
// norm_weight its weight. Each warp computes its tokens' 1 / rms over all of K (rsqrtf(mean(x^2) + ${EPS})), then
// quantizes y = bf16(x * inv_rms * g), the norm's output as the reference rounds it once, instead of x: the amax and
// the e4m3 codes are y's. Not bit-identical to the norm kernel then this GEMV (the sum's order, rsqrtf): within an
// e4m3 step of the reference.
struct u32x4 { unsigned x, y, z, w; };

__device__ __forceinline__ u32x4 qg_ld_stream(const void* p) {
  u32x4 v;
  asm("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}
__device__ __forceinline__ unsigned short qg_ld_u16(const void* p) {
  unsigned short v;
  asm("ld.global.nc.L1::no_allocate.u16 %0, [%1];" : "=h"(v) : "l"(p));
  return v;
}
__device__ __forceinline__ u32x4 qg_ld_x(const void* p) {
  u32x4 v;
  asm("ld.global.nc.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}
__device__ __forceinline__ void qg_mma_bf16(float* d, unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned b0,
                                            unsigned b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void qg_mma_e4m3(float* d, unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned b0,
                                            unsigned b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
// 8 e2m1 codes (nibbles n0..n7 of v) -> bf16x2 (n0, n4), (n1, n5), (n2, n6), (n3, n7) times 2^-126 each (exact,
// subnormal for n = 0.5), then times c = {sf * 2^118, sf * 2^118}: the products e2m1 * sf * 2^-8 are exact bf16.
__device__ __forceinline__ void qg_e2m1x8_bf16(unsigned v, unsigned c, unsigned* p) {
  p[0] = qg_bmul(((v << 6) & 0x01C001C0u) | ((v << 12) & 0x80008000u), c);
  p[1] = qg_bmul(((v << 2) & 0x01C001C0u) | ((v << 8) & 0x80008000u), c);
  p[2] = qg_bmul(((v >> 2) & 0x01C001C0u) | ((v << 4) & 0x80008000u), c);
  p[3] = qg_bmul(((v >> 6) & 0x01C001C0u) | (v & 0x80008000u), c);
}
__device__ __forceinline__ unsigned qg_sf_bf16x2(unsigned char code) {  // e4m3 code -> {sf * 2^118} x 2 (exact)
  const unsigned h = __float_as_uint(to_f32(fp8e4m3{code}) * __int_as_float((118 + 127) << 23)) >> 16;
  return h | (h << 16);
}
__device__ __forceinline__ float qg_div(float a, float b) { return __fdiv_rn(a, b); }
// rms_norm prologue: 8 bf16 values of x (v) -> bf16(x * inv * g) with g the norm weight's (gw), as the reference
// rounds the norm's output once
__device__ __forceinline__ unsigned qg_norm2(unsigned v, unsigned g, float inv) {
  const float lo = __uint_as_float(v << 16) * inv * __uint_as_float(g << 16);
  const float hi = __uint_as_float(v & 0xffff0000u) * inv * __uint_as_float(g & 0xffff0000u);
  return (unsigned)from_f32<bf16>(lo).bits | ((unsigned)from_f32<bf16>(hi).bits << 16);
}
__device__ __forceinline__ u32x4 qg_norm8(u32x4 v, u32x4 g, float inv) {
  return {qg_norm2(v.x, g.x, inv), qg_norm2(v.y, g.y, inv), qg_norm2(v.z, g.z, inv), qg_norm2(v.w, g.w, inv)};
}
__device__ __forceinline__ unsigned short qg_e4m3x2(float lo, float hi) {
  unsigned short pair;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(pair) : "f"(hi), "f"(lo));
  return pair;
}

namespace {
constexpr int N = ${N}, K = ${K}, MB = ${MB}, NT = MB / 8, WARPS = ${WARPS}, MT = ${MT}, KW = ${KW};
constexpr int BN = 16 * MT * (WARPS / KW);          // rows of a CTA: WARPS / KW row groups of 16 MT rows
constexpr int WFMT = ${WFMT}, AFMT = ${AFMT}, PROLOGUE = ${PROLOGUE};
constexpr bool WF8 = WFMT != 1, WBLK = WFMT == 2;   // e4m3 codes; their scales per 128 x 128 block
constexpr int KS = ${KS}, SPLITK = ${SPLITK}, U = ${U};
constexpr bool ANY_M = ${ANY_M};
constexpr int SW = WF8 ? 64 : 128;                  // K columns per step (16 B of weights per lane)
constexpr int STEPS = KS / SW / KW, NS = STEPS / U;  // STEPS: a warp's part of the K slice
constexpr int WROW = WF8 ? K : K / 2;               // weight row stride (bytes)
constexpr int KBLK = (K + 127) / 128;               // block scales a row of blocks
constexpr int XB = AFMT == 0 ? 2 : 1;               // bytes per x element in shared memory
constexpr int LDX = KS * XB + 64;                   // x row stride in shared memory (bytes)
constexpr int GX = (N + BN - 1) / BN;
static_assert(MB % 8 == 0 && MB <= 64, "MB: 8..64 tokens");
static_assert(KS % (SW * U * KW) == 0 && K % SW == 0, "a warp's part of the K slice is whole stages of whole steps");
static_assert(WARPS % KW == 0, "KW divides the warps");
static_assert(!ANY_M || KW == 1, "the any-M launch has no row groups");
// the in-CTA reduction's partial tiles ([KW - 1][row group][mt][j][reg][lane] f32) fit x's region
static_assert(KW == 1 || (KW - 1) * (WARPS / KW) * MT * NT * 4 * 32 * 4 <= MB * LDX, "KW partials fit x's region");
static_assert(ANY_M || (SPLITK * KS >= K && (SPLITK - 1) * KS < K), "SPLITK slices cover K");
static_assert(!ANY_M || SPLITK == 1, "the any-M launch walks its K slices in one CTA");
static_assert(WF8 || AFMT == 0, "nvfp4 weights take bf16 activations");
static_assert(!WBLK || (K % 128 == 0 && KS % 128 == 0 && STEPS % 2 == 0),
              "block scales: every warp's part of K is whole 128-column blocks (two steps each)");
static_assert(PROLOGUE == 0 || (PROLOGUE == 1 && AFMT != 0 && !ANY_M), "the rms_norm prologue: FP8 activations, decode");
using SK = GemvSplitK<MT, NT, MB, BN, GX, SPLITK>;
}  // namespace
#include "rope_epilogue.cuh"
static_assert(!ROPE || !ANY_M, "the rope epilogue is a decode variant's");

__device__ float ${KERNEL}_ws[SPLITK > 1 ? SPLITK * GX * BN * MB : 1];
__device__ unsigned ${KERNEL}_cnt[GX];

// row groups (about one CTA an SM by the rule) give ptxas no occupancy target: with none, sm_100a's ptxas held the
// NVFP4 4-warp row group (4 steps a stage) at 64 registers and spilled one; KW 1 keeps the bounds it was measured with
#if ${KW} > 1
#define QG_LAUNCH_BOUNDS __launch_bounds__(WARPS * 32, 1)
#else
#define QG_LAUNCH_BOUNDS __launch_bounds__(WARPS * 32)
#endif
extern "C" __global__ void QG_LAUNCH_BOUNDS ${KERNEL}(
    const bf16* __restrict__ x, const unsigned char* __restrict__ w, const void* __restrict__ weight_scale,
    const float* __restrict__ weight_scale_2, const float* __restrict__ input_scale, const bf16* __restrict__ bias,
    const bf16* __restrict__ residual, bf16* __restrict__ out, long long M
#if ${PROLOGUE} == 1
    , const bf16* __restrict__ norm_weight
#endif
#if ${ROPE}
    , const long long* __restrict__ positions, const ${ROPE_CT}* __restrict__ cos_table,
    const ${ROPE_CT}* __restrict__ sin_table, bf16* __restrict__ q_out, ${ROPE_KT}* __restrict__ kv_cache,
    const long long* __restrict__ slot_mapping, const float* __restrict__ kv_scale
#endif
    ) {
  extern __shared__ __align__(16) unsigned char xs[];  // [MB][LDX] in fragment order
  __shared__ float tok_scale[MB];
  __shared__ float tok_inv[PROLOGUE == 1 ? MB : 1];  // rms_norm: each token's 1 / rms
#if ${PROLOGUE} != 1
  const bf16* const norm_weight = nullptr;
#endif
  __shared__ unsigned is_last;
  if (M > (long long)MB * gridDim.z) __trap();  // the executor launches this variant only for M <= MB
  const int tok0 = blockIdx.z * MB;
  const int rows = (int)min((long long)MB, M - tok0);
  if (rows <= 0) return;
  x += (i64)tok0 * K;
  out += (i64)tok0 * N;
  if (${HAS_RESIDUAL}) residual += (i64)tok0 * N;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, q = lane & 3;
  const int rg = warp / KW, kw = warp % KW;  // the warp's row group and its part of the K slice
  const int row0 = blockIdx.x * BN + rg * 16 * MT + g;  // tile mt: rows row0 + 16 mt (+ 8)
  const int kc = kw * STEPS * SW;  // the warp's part's first column, in the slice (whole steps)
  // activation scales (fp8 activations): per token over all of K, or the static one
  if (PROLOGUE == 1) {  // 1 / rms per token over all of K
    for (int t = warp; t < rows; t += WARPS) {
      float ss = 0.0f;
      for (int c = lane * 8; c < K; c += 256) {
        const u32x4 v = qg_ld_x(x + (i64)t * K + c);
        const unsigned vv[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const float lo = __uint_as_float(vv[i] << 16), hi = __uint_as_float(vv[i] & 0xffff0000u);
          ss += lo * lo + hi * hi;
        }
      }
      ss = warp_sum(ss);
      if (lane == 0) tok_inv[t] = rsqrtf(ss * (1.0f / K) + ${EPS});
    }
    __syncwarp();
  }
  if (AFMT == 1) {
    for (int t = warp; t < rows; t += WARPS) {
      float amax = 0.0f;
      const float inv = PROLOGUE == 1 ? tok_inv[t] : 1.0f;  // written by this warp's lane 0 above
      for (int c = lane * 8; c < K; c += 256) {
        u32x4 v = qg_ld_x(x + (i64)t * K + c);
        if (PROLOGUE == 1) v = qg_norm8(v, qg_ld_x(norm_weight + c), inv);
        const unsigned vv[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int i = 0; i < 4; ++i)
          amax = fmaxf(amax, fmaxf(fabsf(__uint_as_float(vv[i] << 16)), fabsf(__uint_as_float(vv[i] & 0xffff0000u))));
      }
      amax = warp_max(amax);
      const float s = qg_div(amax, 448.0f);
      if (lane == 0) tok_scale[t] = s > 0.0f ? s : 1.0f;
    }
  } else if (AFMT == 2) {
    if (threadIdx.x < MB) tok_scale[threadIdx.x] = input_scale[0];
  }
  if (AFMT != 0) __syncthreads();

  float acc[MT][NT][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int j = 0; j < NT; ++j) acc[mt][j][0] = acc[mt][j][1] = acc[mt][j][2] = acc[mt][j][3] = 0.0f;

  // ANY_M: the CTA walks all K slices itself (x restaged per slice); otherwise its one slice blockIdx.y
  for (int slice = 0; slice < (ANY_M ? (K + KS - 1) / KS : 1); ++slice) {
    if (slice > 0) __syncthreads();  // every warp is done with the previous x slice
    const int kb = ANY_M ? slice * KS : blockIdx.y * KS;
    const unsigned char* p[MT][2];
    const unsigned char* ps[MT][2];  // nvfp4: the row's scale bytes for this lane (2 per step)
    const unsigned char* sfb = reinterpret_cast<const unsigned char*>(weight_scale);
    const float* sbr[MT][2];  // fp8 block scales: the row's row of blocks
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = row0 + 16 * mt + 8 * h, rr = r < N ? gemv_rope_row(r) : N - 1;
        p[mt][h] = w + (i64)rr * WROW + (WF8 ? kb + kc : (kb + kc) / 2) + 16 * q;
        ps[mt][h] = sfb + (i64)rr * (K / 16) + (kb + kc) / 16 + 2 * q;
        sbr[mt][h] = reinterpret_cast<const float*>(weight_scale) + (i64)(rr / 128) * KBLK;
      }
    // WBLK: the current 128-column block's products (acc gets them times the block's scale after its second step)
    float part[MT][NT][4];
    float bsc[MT][2];

    u32x4 buf[2][U][MT][2];
    unsigned short sbuf[2][U][MT][2];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const bool ok = (K % KS == 0) || kb + kc + SW * u < K;
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          buf[0][u][mt][h] = ok ? qg_ld_stream(p[mt][h] + 64 * u) : u32x4{0, 0, 0, 0};
          if (WFMT == 1) sbuf[0][u][mt][h] = ok ? qg_ld_u16(ps[mt][h] + 8 * u) : (unsigned short)0;
        }
    }

    // x[tokens, kb:kb+KS] -> shared memory (tokens >= rows and columns >= K are zeros), chunk by 16-byte chunk
    if (AFMT == 0) {
      constexpr int CPS = SW / 8;  // 8-column chunks per step
      for (int i = threadIdx.x; i < MB * (KS / 8); i += WARPS * 32) {
        const int t = i / (KS / 8), c = i % (KS / 8), s = c / CPS, j = c % CPS;
        u32x4 v = {0, 0, 0, 0};
        if (t < rows && kb + 8 * c < K) v = qg_ld_x(x + (i64)t * K + kb + 8 * c);
        int slot;
        if (WF8) {
          slot = (j & 1) * 4 + (j >> 1);  // lane q's chunks 2q, 2q+1 -> slots q, 4 + q
        } else {
          slot = (j & 3) * 4 + (j >> 2);  // lane q's chunks 4q + w -> slot 4w + q; columns (c0,c4,c1,c5,..)
          const u32x4 o = {__byte_perm(v.x, v.z, 0x5410), __byte_perm(v.x, v.z, 0x7632), __byte_perm(v.y, v.w, 0x5410),
                           __byte_perm(v.y, v.w, 0x7632)};
          v = o;
        }
        *reinterpret_cast<u32x4*>(&xs[t * LDX + (s * CPS + slot) * 16]) = v;
      }
    } else {
      for (int i = threadIdx.x; i < MB * (KS / 8); i += WARPS * 32) {  // 8 columns -> 8 e4m3 codes
        const int t = i / (KS / 8), c = i % (KS / 8);
        unsigned o0 = 0u, o1 = 0u;
        if (t < rows && kb + 8 * c < K) {
          const float sc = tok_scale[t];
          u32x4 a = qg_ld_x(x + (i64)t * K + kb + 8 * c);
          if (PROLOGUE == 1) a = qg_norm8(a, qg_ld_x(norm_weight + kb + 8 * c), tok_inv[t]);
          o0 = (unsigned)qg_e4m3x2(qg_div(__uint_as_float(a.x << 16), sc), qg_div(__uint_as_float(a.x & 0xffff0000u), sc))
             | ((unsigned)qg_e4m3x2(qg_div(__uint_as_float(a.y << 16), sc),
                                    qg_div(__uint_as_float(a.y & 0xffff0000u), sc)) << 16);
          o1 = (unsigned)qg_e4m3x2(qg_div(__uint_as_float(a.z << 16), sc), qg_div(__uint_as_float(a.z & 0xffff0000u), sc))
             | ((unsigned)qg_e4m3x2(qg_div(__uint_as_float(a.w << 16), sc),
                                    qg_div(__uint_as_float(a.w & 0xffff0000u), sc)) << 16);
        }
        unsigned* dst = reinterpret_cast<unsigned*>(&xs[t * LDX + 8 * c]);
        dst[0] = o0;
        dst[1] = o1;
      }
    }
    __syncthreads();

#pragma unroll
    for (int s = 0; s < NS; ++s) {
      if (s + 1 < NS) {
#pragma unroll
        for (int u = 0; u < U; ++u) {
          const int step = (s + 1) * U + u;
          const bool ok = (K % KS == 0) || kb + kc + SW * step < K;
#pragma unroll
          for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
              buf[(s + 1) & 1][u][mt][h] = ok ? qg_ld_stream(p[mt][h] + 64 * step) : u32x4{0, 0, 0, 0};
              if (WFMT == 1) sbuf[(s + 1) & 1][u][mt][h] = ok ? qg_ld_u16(ps[mt][h] + 8 * step) : (unsigned short)0;
            }
        }
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int step = s * U + u;
        // WBLK: a block's first step zeroes its partial and loads its scales (used after its second step)
        float (&dst)[MT][NT][4] = WBLK ? part : acc;
        if (WBLK && (step & 1) == 0) {
          const int kblk = min((kb + kc + SW * step) / 128, KBLK - 1);  // past K (zero weights): any block's
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            bsc[mt][0] = __ldg(sbr[mt][0] + kblk);
            bsc[mt][1] = __ldg(sbr[mt][1] + kblk);
#pragma unroll
            for (int j = 0; j < NT; ++j) part[mt][j][0] = part[mt][j][1] = part[mt][j][2] = part[mt][j][3] = 0.0f;
          }
        }
        if (AFMT != 0) {  // fp8 x fp8: 2 x k32 per step; lane q holds columns 16q..16q+15 of rows g, g+8
#pragma unroll
          for (int j = 0; j < NT; ++j) {
            const u32x4 xv = *reinterpret_cast<const u32x4*>(&xs[(8 * j + g) * LDX + XB * kc + step * 64 + 16 * q]);
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
              const u32x4 a = buf[s & 1][u][mt][0], b = buf[s & 1][u][mt][1];
              qg_mma_e4m3(dst[mt][j], a.x, b.x, a.y, b.y, xv.x, xv.y);
              qg_mma_e4m3(dst[mt][j], a.z, b.z, a.w, b.w, xv.z, xv.w);
            }
          }
        } else if (WF8) {  // fp8 -> bf16: 4 x k16 per step, one 4-column word of rows g, g+8 each
          unsigned wa[MT][4][2], wb[MT][4][2];
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            const u32x4 a = buf[s & 1][u][mt][0], b = buf[s & 1][u][mt][1];
            const unsigned av[4] = {a.x, a.y, a.z, a.w}, bv[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              qg_e4m3x4_bf16(av[e], wa[mt][e][0], wa[mt][e][1]);
              qg_e4m3x4_bf16(bv[e], wb[mt][e][0], wb[mt][e][1]);
            }
          }
#pragma unroll
          for (int j = 0; j < NT; ++j) {
            const unsigned char* xr = &xs[(8 * j + g) * LDX + XB * kc + step * 128];
            const u32x4 x0 = *reinterpret_cast<const u32x4*>(xr + 16 * q);
            const u32x4 x1 = *reinterpret_cast<const u32x4*>(xr + 64 + 16 * q);
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
              qg_mma_bf16(dst[mt][j], wa[mt][0][0], wb[mt][0][0], wa[mt][0][1], wb[mt][0][1], x0.x, x0.y);
              qg_mma_bf16(dst[mt][j], wa[mt][1][0], wb[mt][1][0], wa[mt][1][1], wb[mt][1][1], x0.z, x0.w);
              qg_mma_bf16(dst[mt][j], wa[mt][2][0], wb[mt][2][0], wa[mt][2][1], wb[mt][2][1], x1.x, x1.y);
              qg_mma_bf16(dst[mt][j], wa[mt][3][0], wb[mt][3][0], wa[mt][3][1], wb[mt][3][1], x1.z, x1.w);
            }
          }
        } else {  // nvfp4 -> bf16: per 8-column word 2 x k16; words 0,1 share scale byte 0, words 2,3 byte 1
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            unsigned wa[MT][4], wb[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
              const u32x4 a = buf[s & 1][u][mt][0], b = buf[s & 1][u][mt][1];
              const unsigned av = e == 0 ? a.x : e == 1 ? a.y : e == 2 ? a.z : a.w;
              const unsigned bv = e == 0 ? b.x : e == 1 ? b.y : e == 2 ? b.z : b.w;
              const unsigned short sa = sbuf[s & 1][u][mt][0], sb = sbuf[s & 1][u][mt][1];
              qg_e2m1x8_bf16(av, qg_sf_bf16x2((unsigned char)(e < 2 ? sa & 0xff : sa >> 8)), wa[mt]);
              qg_e2m1x8_bf16(bv, qg_sf_bf16x2((unsigned char)(e < 2 ? sb & 0xff : sb >> 8)), wb[mt]);
            }
#pragma unroll
            for (int j = 0; j < NT; ++j) {
              const u32x4 xv =
                  *reinterpret_cast<const u32x4*>(&xs[(8 * j + g) * LDX + XB * kc + step * 256 + (4 * e + q) * 16]);
#pragma unroll
              for (int mt = 0; mt < MT; ++mt) {
                qg_mma_bf16(acc[mt][j], wa[mt][0], wb[mt][0], wa[mt][1], wb[mt][1], xv.x, xv.y);
                qg_mma_bf16(acc[mt][j], wa[mt][2], wb[mt][2], wa[mt][3], wb[mt][3], xv.z, xv.w);
              }
            }
          }
        }
        if (WBLK && (step & 1) == 1) {  // the block's second step: acc += its products times its scale (rows g, g+8)
#pragma unroll
          for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int j = 0; j < NT; ++j) {
              acc[mt][j][0] = fmaf(part[mt][j][0], bsc[mt][0], acc[mt][j][0]);
              acc[mt][j][1] = fmaf(part[mt][j][1], bsc[mt][0], acc[mt][j][1]);
              acc[mt][j][2] = fmaf(part[mt][j][2], bsc[mt][1], acc[mt][j][2]);
              acc[mt][j][3] = fmaf(part[mt][j][3], bsc[mt][1], acc[mt][j][3]);
            }
        }
      }
    }

  }

  if (KW > 1)  // the row group's partial tiles -> its first warp, in warp order (splitk.cuh)
    SK::template row_group_sum<KW, WARPS / KW>(reinterpret_cast<float*>(xs), acc, kw, rg, lane);

  if (SPLITK > 1) {  // the partial tile -> workspace; the row block's last CTA sums them (splitk.cuh)
    float* ws = SK::slot(${KERNEL}_ws, rg, lane);
    if (!kw) SK::store(ws, acc, q, rows);
    if (!SK::last(${KERNEL}_cnt, is_last, threadIdx.x)) return;
    if (kw) return;
    SK::reduce(ws, acc, q, rows, ${KERNEL}_cnt, threadIdx.x);
  }
  if (kw) return;  // the row group's first warp stores its tile

  // epilogue: acc * (row scale) * (token scale) (+ bias) (+ residual); c0, c1 = (row g, tokens 2q, 2q+1), c2, c3 = row g+8
  const float gscale = WFMT == 1 ? weight_scale_2[0] * 256.0f : 1.0f;  // e2m1 * sf * 2^-8 above
#if ${ROPE}
  // the rope epilogue: the pair (lo, hi) = tile rows (g, g + 8), each value as the plain epilogue computes it
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    const int nlo = row0 + 16 * mt;
    if (nlo >= N) continue;
    const int lo = gemv_rope_row(nlo), hi = gemv_rope_row(nlo + 8);
    const float* ws = reinterpret_cast<const float*>(weight_scale);
    const float sl = WFMT == 0 ? ws[lo] : WBLK ? 1.0f : gscale, sh = WFMT == 0 ? ws[hi] : WBLK ? 1.0f : gscale;
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int t = 8 * j + 2 * q + e;
        if (t >= rows) continue;
        float a = acc[mt][j][e] * sl, b = acc[mt][j][2 + e] * sh;
        if (AFMT != 0) a *= tok_scale[t], b *= tok_scale[t];
        if (${HAS_BIAS}) a += to_f32(bias[lo]), b += to_f32(bias[hi]);
        gemv_rope_store(t, lo, hi, gemv_round(a), gemv_round(b), positions, cos_table, sin_table, q_out, kv_cache,
                        slot_mapping, kv_scale);
      }
  }
  return;
#endif
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int r2 = 0; r2 < 2; ++r2) {
      const int n = row0 + 16 * mt + 8 * r2;
      if (n >= N) continue;
      const float rs = WFMT == 0 ? reinterpret_cast<const float*>(weight_scale)[n] : WBLK ? 1.0f : gscale;
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int r1 = 0; r1 < 2; ++r1) {
          const int t = 8 * j + 2 * q + r1;
          if (t < rows) {
            float y = acc[mt][j][2 * r2 + r1] * rs;
            if (AFMT != 0) y *= tok_scale[t];
            if (${HAS_BIAS}) y += to_f32(bias[n]);
            if (${HAS_RESIDUAL}) y += to_f32(residual[(i64)t * N + n]);
            out[(i64)t * N + n] = from_f32<bf16>(y);
          }
        }
    }
}
