#include "../common.cuh"
#include "../attention/mma.cuh"
#include "../attention/wgmma.cuh"
#include "cluster.cuh"
#include "e4m3.cuh"
#include "splitk.cuh"

// Skinny GEMM on Hopper's warpgroup MMA for decode steps of up to ${MB} tokens (sm_90a; the decode variant of buckets
// 16-64, persistent on wide matrices and with split-K on narrow ones: gemv/skinny_rule.py):
// out[M, N] = x[M, K] @ w[N, K]^T (+ bias[N]) (+ residual[M, N]), bf16 in and out, f32 accumulate.
// kernel.cu's mma.sync GEMV falls short of cuBLAS on large matrices from 8 tokens on (gate_up at 32 tokens: 66% of
// the bandwidth against cuBLAS's 86%): this is the tensor-memory-accelerator + wgmma design cuBLAS uses there.
//
// - w streams through shared memory by TMA: a producer warp copies tiles of ROWS = 64 x ${WGS} weight rows x 64
//   columns (one 128-byte-swizzled panel, 16 KB at 128 rows) into ${STAGES} stages, full / empty mbarriers per stage
//   (as prefill_wgmma.cu's PRODUCER). The tensor map (ingot_w_tma, below) views a region of device memory holding the
//   weight as rows of K bf16; the loader fills it (runtime/kv_tma.py fill_w_tma), the kernel addresses its weight's
//   rows from the region's base (and traps if the weight lies outside). Rows past N arrive as zeros.
// - x, all K columns of the MB token rows (zero rows past M), is staged once per CTA into shared memory as K / 64
//   swizzled panels of MB rows (cp.async by the consumer threads), MB x K x 2 bytes (128 KB at 32 tokens and K 2048).
//   Streamed instead (XS = ${XS}: where it does not fit, 64 tokens): a ring of STAGES panels, the consumers' cp.async
//   of the panel of weight stage n + XD issued at stage n (XD = STAGES - 3: the slot it overwrites was last read by
//   stage n - 3's wgmma, done in both warpgroups, which may be one stage apart), then waited for, fenced to the async
//   proxy and a consumer barrier before stage n's wgmma; x is read once per row tile then (from L2), no prologue.
// - consumer warpgroup w computes weight rows [64 w, 64 w + 64) of each tile: per 64-column stage four wgmma
//   m64n${MB}k16 with A = the weight rows (K-major, from the stage) and B = x's panel (K-major: tokens are wgmma's N),
//   one commit group per stage; a stage is released (empty barrier) once the group after it was issued and the one
//   reading it is done (wait_group 1).
// - persistent: CTA b takes row tiles b, b + gridDim.x, ...; the producer runs up to STAGES stages ahead across tiles.
// - epilogue: the accumulators of row (16 (warp % 4) + g8 (+ 8)) and tokens 8 i + 2 t4 (+ 1), plus bias[row]
//   (HAS_BIAS = ${HAS_BIAS}) and residual[token, row] (HAS_RESIDUAL = ${HAS_RESIDUAL}: read after the grid-dependency
//   wait by a coherent load, as kernel.cu's) in f32, rounded once -> bf16 out[token, row].
// - FP8 weights (WB = ${WB} bytes a weight; 1: a weight-only ``quantized_linear``, e4m3 w[N, K] and an f32 scale per
//   row, weight_scale[N]; skinny_rule.rule_spec's wb = 1): a stage is ROWS x 64 codes (64-byte rows, the TMA
//   copy's 64-byte swizzle: 16-byte chunk c of row r at r * 64 + (c ^ (r / 2 % 4)) * 16), half a bf16 stage, so twice
//   as many fit. The weights are wgmma's A from registers (no write back to shared memory, no consumer barrier), f16:
//   lane (g8, t4) of a warp reads word t4 (codes 4 t4 .. 4 t4 + 3) of each 16-code group of its rows g8 and g8 + 8
//   (conflict-free with the swizzle), releases the stage at once, and converts each word's halves by the hardware
//   (cvt e4m3x2 -> f16x2, exact) into the fragment pairs of columns 2 t4 (+ 1) and 2 t4 + 8 (+ 9): so column slot
//   2 t4 + e of a 16-column group holds code 4 t4 + e and slot 2 t4 + 8 + e code 4 t4 + 2 + e, and x is staged in that
//   order (4-byte pair t + 4 h of the group holds x's pair 2 t + h) and in f16 times 2^-4 (exact for 2^-13 <= |x| <
//   ~1e6, kernel.cu's F16 route): each consumer thread copies 32-byte blocks of x's rows by cp.async and, once they
//   landed, rewrites its own blocks so, before the barrier that publishes x. The fragments of two stages live in two
//   register sets (the wgmma of stage n reads its registers until the wait after stage n + 1 is issued). The epilogue
//   multiplies by 16 times the row's scale before bias and residual (as kernel.cu's FP8 variants).
// - NVFP4 weights (WB = 0: e2m1 codes u8[N, K/2], element 2j in the low nibble, an e4m3 scale per 16 columns
//   sf u8[N, K/16], the f32 global scale weight_scale_2[1]; skinny_rule's INGOT_GEMV_SKINNY_NVFP4, opt-in; x staged
//   whole, K slices of whole 256 columns): a stage is ROWS x 32 bytes (no swizzle: a half warp's 8-byte reads of 4
//   rows are 128 contiguous bytes). Lane (g8, t4) reads bytes 8 t4 .. 8 t4 + 7 of rows g8 and g8 + 8: codes
//   16 t4 .. 16 t4 + 15, one scale block, so one scale byte a row a stage; e4m3.cuh's qg_e2m1x8_f16 turns each word
//   (8 codes) times the block scale into f16 pairs (n0, n2), (n4, n6), (n1, n3), (n5, n7) (exact; value * 2^-14),
//   pair q of a row (word q / 4, pair q % 4) the fragment of k16 step q / 2, half q % 2 (columns 2 t4 + 8 (q % 2)),
//   and x is staged in that order: column slot 16 j + 8 h + 2 t4 + e of a 64-column panel holds x's column
//   16 t4 + 8 (j / 2) + {0, 4, 1, 5}[2 (j % 2) + h] + 2 e (each consumer thread rewrites whole panel rows of x in f16
//   times 2^-4, element by element). The scale bytes of 4 stages are one 16-byte load a row (bytes 4 u + t4: stage u),
//   loaded a group ahead (the next row tile's first group at a tile's last). Epilogue: times the global scale, 2^14
//   and 16 (kernel.cu's NVFP4 order).
// - any M (CHUNKS = ${CHUNKS}; skinny_rule.any_m_spec): grid.z walks the step's tokens in chunks of MB, each z a
//   launch of this kernel on its MB rows of x, the residual and out (rows past M: zeros, not written). The weights
//   are read once per chunk, mostly from L2 (the chunks' CTAs run side by side): for narrow matrices, whose row tiles
//   leave most SMs idle in a 128-row-tile GEMM, a decode step of 65-256 tokens.
// - programmatic dependent launch: only the consumers wait for the grid before (the wait is placed in their code);
//   the producer's weight copies start at once.
// - prologue (${PROLOGUE}; codegen/decode_fusion.py, as kernel.cu's): 1: rms_norm, x is the norm's input and
//   norm_weight its weight: once x has landed, the consumers turn each staged chunk into bf16(x * g) in place and sum
//   x^2 per token (a fixed order: per thread over its chunks, a warp's shuffle tree, then the warps in order), and the
//   epilogue multiplies each token's f32 sums by its 1 / rms = rsqrt(mean(x^2) + eps). The CTA holds all K columns,
//   so no partial sums leave it. Not bit-identical to the norm kernel then the plain GEMM (the factor multiplies the
//   f32 sums instead of being rounded into x), within the GEMV's tolerance of the reference.
// - split-K in a cluster (SPLITK = ${SPLITK} > 1; skinny_rule.choice, 4 on narrow matrices): for matrices with fewer
//   row tiles than SMs (or x too large for one CTA: 64 tokens), the SPLITK CTAs of a cluster (1 x SPLITK) take one
//   row tile each (no persistence: the grid is TILES x SPLITK) and a K slice of K / SPLITK columns each (x staged for
//   their slice only); each writes its f32 partial tile to shared memory, and after a cluster barrier CTA r adds row
//   slice r of every CTA's partial tile through distributed shared memory, in rank order, and writes it; a second
//   barrier keeps every CTA's shared memory alive until its peers have read it. The producer warpgroup takes part in
//   both barriers (barrier.cluster counts every thread of the cluster).
namespace {
constexpr int N = ${N}, K = ${K}, MB = ${MB}, WGS = ${WGS}, STAGES = ${STAGES}, PROLOGUE = ${PROLOGUE};
constexpr int SPLITK = ${SPLITK}, KS = K / SPLITK;  // a CTA's K slice
constexpr bool HAS_BIAS = ${HAS_BIAS}, HAS_RESIDUAL = ${HAS_RESIDUAL}, XS = ${XS};
constexpr int WB = ${WB};  // bytes a weight: 2 (bf16), 1 (e4m3 codes) or 0 (NVFP4: half a byte), those two
                           // converted to f16 in registers
constexpr bool W4 = WB == 0;
constexpr int CODEB = W4 ? 32 : 64 * WB;          // bytes of a weight row a stage (64 columns)
constexpr long long RB = W4 ? K / 2 : (long long)K * WB;  // bytes of a weight row (the tensor map's pitch)
constexpr int ROWS = 64 * WGS, KSTEPS = KS / 64, TILES = (N + ROWS - 1) / ROWS, NT = 128 * (WGS + 1);
// a stage (ROWS x 64 weights); x's slice, or with XS its ring of STAGES panels (MB x 64 bf16 each)
constexpr unsigned WTILE = ROWS * CODEB, XPANEL = MB * 128, XBYTES = XS ? STAGES * XPANEL : MB * KS * 2;
constexpr int XD = STAGES - 3;  // XS: panels in flight ahead of the stage being multiplied
static_assert(PROLOGUE == 0 || PROLOGUE == 1, "no prologue or rms_norm");
static_assert(SPLITK == 1 || SPLITK == 2 || SPLITK == 4 || SPLITK == 8, "split-K over 1, 2, 4 or 8 CTAs");
static_assert(SPLITK == 1 || PROLOGUE == 0, "the rms_norm prologue needs all of K in the CTA");
static_assert(KS % 64 == 0 && KS * SPLITK == K, "K slices a multiple of 64 (one swizzled panel a stage)");
static_assert(MB == 8 || MB == 16 || MB == 32 || MB == 64, "8, 16, 32 or 64 tokens (wgmma's N)");
static_assert(WGS == 1 || WGS == 2, "one or two consumer warpgroups");
static_assert(XBYTES % 1024 == 0, "x's panels keep the stages 1024-aligned");
static_assert(!XS || (PROLOGUE == 0 && STAGES >= 4), "streamed x: no prologue, at least 4 stages");
static_assert(WB == 2 || ((WB == 1 || WB == 0) && PROLOGUE == 0), "bf16 weights, or quantized ones without a prologue");
static_assert(!W4 || (!XS && KS % 256 == 0), "NVFP4: x staged whole, K slices of whole 16-byte scale groups");
#if ${WB} != 2
typedef unsigned char sk_weight_t;  // e4m3 codes, or two e2m1 codes a byte
#else
typedef bf16 sk_weight_t;
#endif
#if ${WB} == 0
typedef unsigned char sk_scale_t;  // NVFP4: e4m3 block scales sf[N, K/16]
#else
typedef float sk_scale_t;  // FP8: the row's scale (bf16 weights: unused)
#endif
}  // namespace

// the weight region's tensor map (words 0-15: a CUtensorMap, dims {K, rows}, box {64, ROWS}, 128-byte swizzle), the
// region's base address (16) and size in bytes (17); filled by the loader before the first launch
extern "C" {
__device__ __align__(128) unsigned long long ingot_w_tma[18];
}

// XS: the consumers' cp.async of x's 64-column panel at column col into the ring slot at dst (zero rows past M)
__device__ __forceinline__ void sk_load_x_panel(unsigned dst, const bf16* __restrict__ x, int M, int col, int ct) {
  for (int i = ct; i < MB * 8; i += 128 * WGS) {
    const int r = i >> 3, c = i & 7;
    const bool ok = r < M;
    att_cp16(dst + pw_off(r, c, MB), ok ? x + (i64)r * K + col + c * 8 : x, ok);
  }
}

// WB 0 / 1: two bf16 values of x (a bf16x2 word) -> f16x2 times 2^-4, as x is staged for the f16 fragments (exact for
// 2^-13 <= |x| < ~1e6; the epilogue multiplies by 16)
__device__ __forceinline__ unsigned sk_x_f16(unsigned w) {
  const float lo = __uint_as_float(w << 16) * 0.0625f, hi = __uint_as_float(w & 0xFFFF0000u) * 0.0625f;
  unsigned f;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(f) : "f"(hi), "f"(lo));
  return f;
}
// WB 1: two landed 16-byte chunks of a token row's 16-column block at a0, a1 -> f16 times 2^-4 (exact for 2^-13 <=
// |x| < ~1e6; the epilogue multiplies by 16), the block's 4-byte pairs reordered to the weights' fragment order
// (slot t + 4 h holds pair 2 t + h: the header)
__device__ __forceinline__ void sk_x_block_to_f16(unsigned a0, unsigned a1) {
  unsigned w[8], f[8];
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(w[0]), "=r"(w[1]), "=r"(w[2]), "=r"(w[3]) : "r"(a0)
               : "memory");
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(w[4]), "=r"(w[5]), "=r"(w[6]), "=r"(w[7]) : "r"(a1)
               : "memory");
#pragma unroll
  for (int i = 0; i < 8; ++i) f[i] = sk_x_f16(w[i]);
  asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};" ::"r"(a0), "r"(f[0]), "r"(f[2]), "r"(f[4]), "r"(f[6])
               : "memory");
  asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};" ::"r"(a1), "r"(f[1]), "r"(f[3]), "r"(f[5]), "r"(f[7])
               : "memory");
}
// WB 1: this thread's 16-column blocks of x's columns [col, col + COLS) (MB rows, zeros past M) in the swizzled
// panels from base: copied (LOAD, cp.async), or once landed rewritten in f16 and the fragment order
template <int COLS, bool LOAD>
__device__ __forceinline__ void sk_x_blocks(unsigned base, const bf16* __restrict__ x, int M, int col, int ct) {
  constexpr int BLOCKS = COLS / 16;  // a row's
  for (int i = ct; i < MB * BLOCKS; i += 128 * WGS) {
    const int r = i / BLOCKS, c = 2 * (i % BLOCKS);  // chunks c, c + 1 (one panel)
    const unsigned panel = base + (c >> 3) * (MB * 128), a0 = panel + pw_off(r, c & 7, MB),
                   a1 = panel + pw_off(r, (c + 1) & 7, MB);
    if constexpr (LOAD) {
      const bool ok = r < M;
      const bf16* const src = x + (i64)r * K + col + c * 8;
      att_cp16(a0, ok ? src : x, ok);
      att_cp16(a1, ok ? src + 8 : x, ok);
    } else {
      sk_x_block_to_f16(a0, a1);
    }
  }
}

// XS: x's 64-column panel at column col into the ring slot at dst: copied (LOAD), or with WB 1 once landed rewritten
// in f16 and the fragment order (nothing to do for bf16 weights)
template <bool LOAD>
__device__ __forceinline__ void sk_x_panel(unsigned dst, const bf16* __restrict__ x, int M, int col, int ct) {
  if constexpr (WB == 1) sk_x_blocks<64, LOAD>(dst, x, M, col, ct);
  else if constexpr (LOAD) sk_load_x_panel(dst, x, M, col, ct);
}

// WB 0: token row r's 64 columns in the panel at base (landed) -> f16 times 2^-4 in the NVFP4 fragments' order (the
// header: slot pair s2 holds x's columns c and c + 2, c = 16 t4 + 8 (j / 2) + {0, 4, 1, 5}[2 (j % 2) + h])
__device__ __forceinline__ void sk_x_row_nvfp4(unsigned base, int r) {
  unsigned w[32], o[32];
#pragma unroll
  for (int c = 0; c < 8; ++c)
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(w[4 * c]), "=r"(w[4 * c + 1]), "=r"(w[4 * c + 2]), "=r"(w[4 * c + 3])
                 : "r"(base + pw_off(r, c, MB)) : "memory");
#pragma unroll
  for (int i = 0; i < 32; ++i) w[i] = sk_x_f16(w[i]);
#pragma unroll
  for (int s2 = 0; s2 < 32; ++s2) {
    const int j = s2 >> 3, h = (s2 >> 2) & 1, t4 = s2 & 3;
    const int c = 16 * t4 + 8 * (j >> 1) + (0x5140 >> (4 * (2 * (j & 1) + h)) & 15);  // and c + 2
    o[s2] = __byte_perm(w[c >> 1], w[(c >> 1) + 1], (c & 1) ? 0x7632 : 0x5410);
  }
#pragma unroll
  for (int c = 0; c < 8; ++c)
    asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};" ::"r"(base + pw_off(r, c, MB)), "r"(o[4 * c]),
                 "r"(o[4 * c + 1]), "r"(o[4 * c + 2]), "r"(o[4 * c + 3]) : "memory");
}
// WB 0: a lane's 8 code bytes of rows g8 (at rows) and g8 + 8 (256 bytes on) of a stage, as words c[0..1], c[2..3]
__device__ __forceinline__ void sk_nvfp4_codes(unsigned rows, unsigned (&c)[4]) {
  asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];" : "=r"(c[0]), "=r"(c[1]) : "r"(rows) : "memory");
  asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];" : "=r"(c[2]), "=r"(c[3]) : "r"(rows + 8 * 32) : "memory");
}
// WB 0: those codes times their block scales (byte t4 of the rows' scale words sc0, sc1: sel) -> the stage's A
// fragments (pair q of a row: k16 step q / 2, half q % 2; the header)
__device__ __forceinline__ void sk_nvfp4_frags(const unsigned (&c)[4], unsigned sc0, unsigned sc1, unsigned sel,
                                               unsigned (&a)[16]) {
  unsigned s0, s1, o[4];
  qg_sf_f16((unsigned short)__byte_perm(sc0, sc1, sel), s0, s1);
#pragma unroll
  for (int i = 0; i < 4; ++i) {  // word i: row g8 (+ 8 for i >= 2), pairs q = 4 (i % 2) .. + 3
    qg_e2m1x8_f16(c[i], i < 2 ? s0 : s1, o);
#pragma unroll
    for (int p = 0; p < 4; ++p) {
      const int q = 4 * (i & 1) + p;
      a[4 * (q >> 1) + 2 * (q & 1) + (i >> 1)] = o[p];
    }
  }
}

// the consumer warpgroups' barrier (named barrier 1, the producer warpgroup not in it)
__device__ __forceinline__ void sk_consumers_sync() { asm volatile("bar.sync 1, %0;" ::"n"(128 * WGS) : "memory"); }
// this thread's shared-memory writes made visible to the async proxy (wgmma), then the consumers' barrier: every
// consumer's writes readable by the next wgmma
__device__ __forceinline__ void sk_publish() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  sk_consumers_sync();
}

// WB 1: the A fragments of this lane's rows (g8, g8 + 8 of its warp's 16) for one stage's four k16 steps, from the
// stage's e4m3 codes at ``rows`` (row g8's first byte; the 64-byte swizzle) into a[4 j ..]: j's (row g8, 2 t4),
// (g8 + 8, 2 t4), (g8, 2 t4 + 8), (g8 + 8, 2 t4 + 8) f16 pairs (codes 4 t4 (+ 1) and 4 t4 + 2 (+ 3) of group j: x is
// staged in that order). The words are read before the caller releases the stage; the conversion is register work.
__device__ __forceinline__ void sk_load_codes(unsigned rows, int g8, int t4, unsigned (&w)[8]) {
  const int sw = (g8 >> 1) & 3;  // the swizzle of rows g8 and g8 + 8 (16 warp + g8: the same r / 2 % 4)
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const unsigned at = rows + (((unsigned)(j ^ sw)) << 4) + 4 * t4;
    asm volatile("ld.shared.u32 %0, [%1];" : "=r"(w[2 * j]) : "r"(at) : "memory");
    asm volatile("ld.shared.u32 %0, [%1];" : "=r"(w[2 * j + 1]) : "r"(at + 8 * 64) : "memory");
  }
}
__device__ __forceinline__ void sk_codes_to_frags(const unsigned (&w)[8], unsigned (&a)[16]) {
#pragma unroll
  for (int i = 0; i < 8; ++i)  // word i: group i / 2, row g8 (+ 8 for odd i); codes 4 t4 (+ 1), 4 t4 + 2 (+ 3)
    qg_e4m3x4_f16(w[i], a[4 * (i >> 1) + (i & 1)], a[4 * (i >> 1) + 2 + (i & 1)]);
}

// y (f32, token t, row r) times the row's scale (WB 1) or gs (WB 0: the global scale times 2^14 and 16), plus the
// bias and the residual where the variant has them
__device__ __forceinline__ float sk_epilogue(float y, const sk_scale_t* __restrict__ w_scale, float gs,
                                             const bf16* __restrict__ bias, const bf16* __restrict__ residual, int t,
                                             int r) {
  if constexpr (WB == 1) y *= 16.0f * w_scale[r];  // x was staged times 2^-4
  if constexpr (W4) y *= gs;
  if (HAS_BIAS) y += to_f32(bias[r]);
  if (HAS_RESIDUAL) y += gemv_ld_bf16_after_wait(residual + (i64)t * N + r);
  return y;
}

#if ${SPLITK} > 1
#define SKINNY_CLUSTER_DIMS __cluster_dims__(1, ${SPLITK}, 1)
#else
#define SKINNY_CLUSTER_DIMS
#endif
extern "C" __global__ void SKINNY_CLUSTER_DIMS __launch_bounds__(NT, 1)
    ${KERNEL}(const bf16* __restrict__ x, const sk_weight_t* __restrict__ weight,
              const sk_scale_t* __restrict__ weight_scale,
#if ${WB} != 2
              const float* __restrict__ weight_scale_2, const float* __restrict__ input_scale,  // (input_scale unused)
#endif
              const bf16* __restrict__ bias, const bf16* __restrict__ residual, bf16* __restrict__ out, i64 rows
#if ${PROLOGUE} == 1
              , const bf16* __restrict__ norm_weight
#endif
    ) {
#if ${WB} != 2
  (void)input_scale;  // a weight-only quantized_linear's input, unused (weight_scale_2: NVFP4's global scale)
#endif
#if ${WB} == 0
  const float gs = weight_scale_2[0] * (16384.0f * 16.0f);  // the epilogue's factor (2^14: the codes' f16 offset)
#else
  const float gs = 1.0f;
#endif
#if ${PROLOGUE} != 1
  const bf16* const norm_weight = nullptr;  // only the rms_norm prologue has this parameter
#endif
#if ${CHUNKS}
  {  // any M: token chunk blockIdx.z, rows [MB z, MB z + MB) of x, the residual and out
    const i64 z0 = (i64)blockIdx.z * MB;
    x += z0 * K;
    out += z0 * N;
    if (HAS_RESIDUAL) residual += z0 * N;
    rows = rows - z0 < MB ? rows - z0 : MB;
  }
#endif
  extern __shared__ __align__(1024) unsigned char sk_shared[];
  const unsigned sx = (att_smem(sk_shared) + 1023u) & ~1023u, sw = sx + XBYTES, bars = sw + STAGES * WTILE;
  // rms_norm: the warps' sums of x^2 per token ([token][consumer warp]), then each token's 1 / rms
  float* const ss_warp = reinterpret_cast<float*>(sk_shared + (bars + 16 * STAGES - att_smem(sk_shared)));
  float* const inv_rms = ss_warp + MB * 4 * WGS;
  // SPLITK: this CTA's f32 partial tile, [token][row] (16-byte aligned after the sums)
  const unsigned part = (bars + 16 * STAGES + MB * (4 * WGS + 1) * 4 + 15u) & ~15u;
  const int tid = threadIdx.x, M = (int)rows, kslice = SPLITK > 1 ? (int)gemv_cluster_rank() : 0;
  if (SPLITK > 1 && gridDim.x != TILES) __trap();  // one row tile a cluster (skinny_rule)
  if (tid == 0) {
#pragma unroll
    for (int st = 0; st < STAGES; ++st) {
      pw_mbar_init(bars + 8 * st, 1);                         // full: the producer's arrival with the TMA bytes
      pw_mbar_init(bars + 8 * (STAGES + st), WGS * 128);      // empty: every consumer thread
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  if (tid < 128) {  // producer warpgroup: its first warp's lane 0 issues the copies, the rest are done
    if (WGS == 2) asm volatile("setmaxnreg.dec.sync.aligned.u32 40;" ::: "memory");
    if (tid == 0) {
      const unsigned long long map = reinterpret_cast<unsigned long long>(ingot_w_tma);
      const unsigned long long base = ingot_w_tma[16], bytes = ingot_w_tma[17];
      const unsigned long long at = reinterpret_cast<unsigned long long>(weight);
      if (at < base || at + (unsigned long long)N * RB > base + bytes) __trap();  // the map was not filled for it
      const int row0 = (int)((at - base) / RB);
      asm volatile("prefetch.tensormap [%0];" ::"l"(map) : "memory");
      int n = 0;
      for (int tile = blockIdx.x; tile < TILES; tile += gridDim.x)
        for (int ks = 0; ks < KSTEPS; ++ks, ++n) {
          const int st = n % STAGES;
          pw_mbar_wait(bars + 8 * (STAGES + st), ((n / STAGES) & 1) ^ 1);  // fresh barriers: passes at once
          pw_mbar_expect_tx(bars + 8 * st, WTILE);
          pw_tma_2d(sw + st * WTILE, map, (kslice * KS + 64 * ks) / (W4 ? 2 : 1), row0 + tile * ROWS, bars + 8 * st);
        }
    }
    if (SPLITK > 1) {  // the cluster's two barriers (the consumers': partial tiles written; peers' read)
      gemv_cluster_sync();
      gemv_cluster_sync();
    }
    return;
  }
  if (WGS == 2) asm volatile("setmaxnreg.inc.sync.aligned.u32 232;" ::: "memory");
  const int ct = tid - 128, wg = ct >> 7, warp = (ct >> 5) & 3, lane = tid & 31, g8 = lane >> 2, t4 = lane & 3;
  // WB 0: the scale words of a 4-stage group of row tile tl from stage k0 (16 bytes a row: rows g8, g8 + 8; zeros
  // past N), loaded a group ahead; sel picks byte t4 of each (the lane's block)
  [[maybe_unused]] const unsigned sel = t4 | ((4 + t4) << 4);
  [[maybe_unused]] auto load_scales = [&](int tl, int k0, unsigned (&w)[2][4]) {
    if constexpr (W4) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = tl * ROWS + 64 * wg + 16 * warp + g8 + 8 * h;
        const unsigned char* const at =
            reinterpret_cast<const unsigned char*>(weight_scale) + (i64)r * (K / 16) + (kslice * KS) / 16 + 4 * k0;
        if (tl < TILES && r < N)
          asm volatile("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];"
                       : "=r"(w[h][0]), "=r"(w[h][1]), "=r"(w[h][2]), "=r"(w[h][3]) : "l"(at));
        else
          w[h][0] = w[h][1] = w[h][2] = w[h][3] = 0u;
      }
    }
  };
  unsigned scw[2][4];  // WB 0: the current group's scale words (weights: loaded before the grid-dependency wait)
  load_scales(blockIdx.x, 0, scw);
  // programmatic dependent launch: the producer streams the first stages of weights without waiting for the grid
  // before this one (they do not depend on it); the consumers wait here, before they read x (its output)
${PDL_WAIT}
  // x's K slice -> KS / 64 swizzled panels of MB rows (zeros past M), then visible to wgmma (async proxy) and every
  // consumer
  constexpr int CHUNKS = KS / 8;  // 16-byte chunks a token row
  // XS: this CTA's stages (its row tiles x KSTEPS; x's panel of stage j is column panel j % KSTEPS), the first XD
  // panels in flight (one commit group each, empty past the end, so that the waits below count uniformly)
  const int xsteps = XS ? (TILES - (int)blockIdx.x + (int)gridDim.x - 1) / (int)gridDim.x * KSTEPS : 0;
  if constexpr (XS) {
    for (int j = 0; j < XD; ++j) {
      if (j < xsteps) sk_x_panel<true>(sx + j * XPANEL, x, M, kslice * KS + 64 * (j % KSTEPS), ct);
      att_commit();
    }
  } else if constexpr (W4) {  // f16, in the NVFP4 fragments' order (whole panel rows, once everyone's copies landed)
    for (int p = 0; p < KSTEPS; ++p) sk_load_x_panel(sx + p * XPANEL, x, M, kslice * KS + 64 * p, ct);
    att_commit();
    att_wait<0>();
    sk_consumers_sync();
    for (int i = ct; i < MB * KSTEPS; i += 128 * WGS) sk_x_row_nvfp4(sx + (i % KSTEPS) * XPANEL, i / KSTEPS);
  } else if constexpr (WB == 1) {  // f16, in the fragment order (this thread's blocks, once landed)
    sk_x_blocks<KS, true>(sx, x, M, kslice * KS, ct);
    att_commit();
    att_wait<0>();
    sk_x_blocks<KS, false>(sx, x, M, 0, ct);
  } else {
    for (int i = ct; i < MB * CHUNKS; i += 128 * WGS) {
      const int r = i / CHUNKS, c = i % CHUNKS;
      const bool ok = r < M;
      att_cp16(sx + (c >> 3) * (MB * 128) + pw_off(r, c & 7, MB), ok ? x + (i64)r * K + kslice * KS + c * 8 : x,
               ok);
    }
    att_commit();
    att_wait<0>();
  }
  if constexpr (PROLOGUE == 1) {
    sk_consumers_sync();  // every thread's copies landed
    unsigned char* const xs = sk_shared + (sx - att_smem(sk_shared));
    float ss[MB];
#pragma unroll
    for (int t = 0; t < MB; ++t) ss[t] = 0.0f;
    for (int c = ct; c < CHUNKS; c += 128 * WGS) {  // this thread's 8-column chunks, every token's
      const uint4 g = *reinterpret_cast<const uint4*>(norm_weight + c * 8);
      const unsigned short* const gh = reinterpret_cast<const unsigned short*>(&g);
#pragma unroll
      for (int t = 0; t < MB; ++t) {
        uint4* const at = reinterpret_cast<uint4*>(xs + (c >> 3) * (MB * 128) + pw_off(t, c & 7, MB));
        uint4 v = *at;
        unsigned short* const vh = reinterpret_cast<unsigned short*>(&v);
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          const float a = to_f32(bf16{vh[e]});
          ss[t] += a * a;
          vh[e] = from_f32<bf16>(a * to_f32(bf16{gh[e]})).bits;
        }
        *at = v;
      }
    }
#pragma unroll
    for (int t = 0; t < MB; ++t) {
      float sum = ss[t];
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
      if (lane == 0) ss_warp[t * 4 * WGS + (ct >> 5)] = sum;
    }
    sk_consumers_sync();
    if (ct < MB) {
      float total = 0.0f;
#pragma unroll
      for (int w = 0; w < 4 * WGS; ++w) total += ss_warp[ct * 4 * WGS + w];
      inv_rms[ct] = rsqrtf(total * (1.0f / K) + ${EPS});
    }
  }
  sk_publish();

  int n = 0;
  for (int tile = blockIdx.x; tile < TILES; tile += gridDim.x) {
    float acc[MB / 2];
#pragma unroll
    for (int i = 0; i < MB / 2; ++i) acc[i] = 0.0f;
    // XS: x's panel XD stages ahead in flight; this stage's landed (own copies), then everyone's
    auto x_panel = [&](int st) {
      if constexpr (XS) {
        if (n + XD < xsteps)
          sk_x_panel<true>(sx + (n + XD) % STAGES * XPANEL, x, M, kslice * KS + 64 * ((n + XD) % KSTEPS), ct);
        att_commit();
        att_wait<XD>();
        sk_x_panel<false>(sx + st * XPANEL, x, M, 0, ct);  // WB 1: this thread's blocks -> f16 (else nothing)
        sk_publish();
      }
      return sx + (XS ? st * XPANEL : 0);
    };
    // WB 0 / 1: a stage's four wgmma from its register fragments a (x's panel at xb), then the wait that completes
    // the stage before's, whose fragments prev are kept live until then
    [[maybe_unused]] auto rs_mma = [&](unsigned (&a)[16], unsigned (&prev)[16], unsigned xb, int ks) {
      pw_pin<MB / 2>(acc);
      pw_fence();
#pragma unroll
      for (int kk = 0; kk < 4; ++kk)
        pw_rsk<MB, true>(acc, a + 4 * kk, pw_desc(xb + kk * 32, 16, 1024), ks > 0 || kk > 0);
      pw_commit();
      pw_wait<1>();
      pw_pin<MB / 2>(acc);
      pw_pin<16>(prev);
      ++n;
    };
    if constexpr (W4) {
      // one stage (u of its 4-stage group): its codes -> registers (the stage released), fragments a with the
      // group's scales, the four wgmma; prev kept live until the wait that completes its wgmma (as WB 1's)
      auto stage = [&](unsigned (&a)[16], unsigned (&prev)[16], int ks, int u) {
        const int st = n % STAGES;
        const unsigned xb = sx + ks * XPANEL;
        pw_mbar_wait(bars + 8 * st, (n / STAGES) & 1);
        unsigned c[4];
        sk_nvfp4_codes(sw + st * WTILE + (64 * wg + 16 * warp + g8) * 32 + 8 * t4, c);
        pw_mbar_arrive(bars + 8 * (STAGES + st));
        sk_nvfp4_frags(c, scw[0][u], scw[1][u], sel, a);
        rs_mma(a, prev, xb, ks);
      };
      unsigned fa[16], fb[16];
      for (int ks = 0; ks < KSTEPS; ks += 4) {  // KSTEPS a multiple of 4 (static_assert)
        unsigned nxt[2][4];  // the next group's scales: this tile's, or the CTA's next tile's first
        if (ks + 4 < KSTEPS) load_scales(tile, ks + 4, nxt);
        else load_scales(tile + (int)gridDim.x, 0, nxt);
        stage(fa, fb, ks, 0);
        stage(fb, fa, ks + 1, 1);
        stage(fa, fb, ks + 2, 2);
        stage(fb, fa, ks + 3, 3);
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
          for (int u = 0; u < 4; ++u) scw[h][u] = nxt[h][u];
      }
      pw_wait<0>();
      pw_pin<16>(fa);
      pw_pin<16>(fb);
    } else if constexpr (WB == 1) {
      // one stage: its codes -> registers (the stage released), fragments a, the four wgmma; prev (the stage
      // before's fragments) kept live until the wait that completes its wgmma
      auto stage = [&](unsigned (&a)[16], unsigned (&prev)[16], int ks) {
        const int st = n % STAGES;
        const unsigned xb = x_panel(st) + (XS ? 0 : ks * XPANEL);
        pw_mbar_wait(bars + 8 * st, (n / STAGES) & 1);
        unsigned w[8];
        sk_load_codes(sw + st * WTILE + (64 * wg + 16 * warp + g8) * 64, g8, t4, w);
        pw_mbar_arrive(bars + 8 * (STAGES + st));
        sk_codes_to_frags(w, a);
        rs_mma(a, prev, xb, ks);
      };
      unsigned fa[16], fb[16];
      int ks = 0;
      for (; ks + 1 < KSTEPS; ks += 2) {
        stage(fa, fb, ks);
        stage(fb, fa, ks + 1);
      }
      if (KSTEPS % 2) stage(fa, fb, ks);
      pw_wait<0>();
      pw_pin<16>(fa);
      pw_pin<16>(fb);
    } else {
      for (int ks = 0; ks < KSTEPS; ++ks, ++n) {
        const int st = n % STAGES;
        const unsigned xb = x_panel(st) + (XS ? 0 : ks * XPANEL);
        pw_mbar_wait(bars + 8 * st, (n / STAGES) & 1);
        pw_pin<MB / 2>(acc);
        pw_fence();
        const unsigned wa = sw + st * WTILE + wg * (64 * 128);
#pragma unroll
        for (int kk = 0; kk < 4; ++kk)  // 16 columns a wgmma: 32 bytes on within the panel
          pw_ss<MB>(acc, pw_desc(wa + kk * 32, 16, 1024), pw_desc(xb + kk * 32, 16, 1024), ks > 0 || kk > 0);
        pw_commit();
        pw_wait<1>();  // the stage before is read: release it
        pw_pin<MB / 2>(acc);
        if (n > 0) pw_mbar_arrive(bars + 8 * (STAGES + (n + STAGES - 1) % STAGES));
      }
    }
    pw_wait<0>();
    pw_pin<MB / 2>(acc);
    // rows 16 warp + g8 (+ 8) of this warpgroup's 64, tokens 8 i + 2 t4 (+ 1)
    const int row = tile * ROWS + 64 * wg + 16 * warp + g8;
    if constexpr (SPLITK == 1) {
#pragma unroll
      for (int i = 0; i < MB / 8; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int t = 8 * i + 2 * t4 + (e & 1), r = row + 8 * (e >> 1);
          if (t < M && r < N)
            out[(i64)t * N + r] = from_f32<bf16>(sk_epilogue(acc[4 * i + e] * (PROLOGUE == 1 ? inv_rms[t] : 1.0f),
                                                             weight_scale, gs, bias, residual, t, r));
        }
    } else {  // the partial tile to shared memory; after the barrier, this CTA's row slice of the cluster's sum
      float* const pt = reinterpret_cast<float*>(sk_shared + (part - att_smem(sk_shared)));
#pragma unroll
      for (int i = 0; i < MB / 8; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          pt[(8 * i + 2 * t4 + (e & 1)) * ROWS + 64 * wg + 16 * warp + g8 + 8 * (e >> 1)] = acc[4 * i + e];
      gemv_cluster_sync();
      constexpr int RS = ROWS / SPLITK;  // rows a CTA adds up and writes
      for (int i = ct; i < RS * MB; i += 128 * WGS) {
        const int t = i / RS, r = kslice * RS + i % RS;
        if (t >= M || tile * ROWS + r >= N) continue;
        float sum = 0.0f;
#pragma unroll
        for (int k = 0; k < SPLITK; ++k) sum += gemv_ld_cluster(gemv_mapa(part + 4 * (t * ROWS + r), k));
        out[(i64)t * N + tile * ROWS + r] =
            from_f32<bf16>(sk_epilogue(sum, weight_scale, gs, bias, residual, t, tile * ROWS + r));
      }
      gemv_cluster_sync();
    }
  }
  // the last stage read: released for symmetry (the producer is done; every phase completes; WB 0 / 1 released each stage once read)
  if (WB == 2 && n > 0) pw_mbar_arrive(bars + 8 * (STAGES + (n + STAGES - 1) % STAGES));
}
