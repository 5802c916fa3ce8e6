#include "../common.cuh"
#include "splitk.cuh"
#include "cluster.cuh"
#include "e4m3.cuh"
#include "../rope/rotate.cuh"

// Skinny GEMM / GEMV for decode steps: out[M, N] = x[M, K] @ w[N, K]^T (+ bias[N]) (+ residual[M, N]),
// bf16 in and out, f32 accumulate, for M <= ${MB} tokens (one variant per token bucket; the executor picks
// the variant by the step's M, see codegen/kernels/gemv/rule.py). Memory-bound design:
//
// - the weight matrix streams through registers once: a warp owns 16 x ${MT} rows of w and one K slice of
//   ${KS}; each lane loads 16 B (8 bf16) of rows g and g+8 of each 16-row tile per 32-column step (16 e4m3 of a
//   64-column step with FP8 weights, below) (ld.global.nc, no L1 allocation), ${U} steps per stage, two stages in
//   flight (register double buffering);
// - the CTA's K slice of x (M x ${KS}, zero-padded to ${MB} tokens) sits in shared memory, shared by
//   the CTA's ${WARPS} warps (16 x ${MT} rows each; each x fragment read from shared memory serves ${MT} MMAs);
// - K split inside the CTA (${KW} warps a row group): the warps of a row group own 16 x ${MT} rows together, each
//   a ${KS} / ${KW}-column part of the CTA's slice, and add their partial tiles through shared memory (x's region,
//   free once the products are done) in warp order before the epilogue or the split-K tail. Small matrices (qkv,
//   o) then fill the GPU with 16-row CTAs without the split-K tail over CTAs (its fence, atomic and second pass
//   over the partials are latency on every launch's critical path);
// - tensor cores do the products: mma.sync m16n8k16 with w as the A operand (16 rows) and x as B
//   (8 tokens per n-tile). The K order inside each 32-column step is permuted identically for w and x
//   (lane q holds physical columns 8q..8q+7 = logical k {2q, 2q+1, 2q+8, 2q+9} of two k16 MMAs), so
//   both operands load as whole 16-byte vectors straight into fragment registers;
// - split-K over CTAs (grid.y = ${SPLITK}): each CTA stores its partial tile in a module-scope f32
//   workspace, and the last CTA of a row block (atomic counter, reset by that CTA for the next launch)
//   sums the partials in a fixed order (deterministic) and runs the epilogue. One launch at a time per
//   module (stream order) may use the workspace. (splitk.cuh, shared with quant.cu and bulk.cu)
//   With CLUSTER (${CLUSTER}) the SPLITK slices of a row block are one thread-block cluster instead (1 x SPLITK,
//   at most 8): each CTA stores its partial tile in its own shared memory (x's region, free once the products are
//   done) and a cluster barrier publishes them; CTA rank r reduces the row groups rg with rg mod SPLITK = r, every
//   thread of it some of their elements: all slices' values read through distributed shared memory at once, then added
//   in slice order. A second barrier (the peers are done reading this CTA's partials), the sums go to the CTA's own x
//   region and each row group's first warp takes its tile from there to the epilogue. No workspace, fence or atomic,
//   and the reduction is spread over the cluster instead of one CTA reading every slice's partials from L2 (at 32
//   tokens a 128-row block's partials are 16 KB a slice); the same additions in the same order, so bit for bit the
//   workspace's result.
// - programmatic dependent launch: the weights do not depend on the kernel before this one, so the CTA may load its
//   first stage of weights *before* waiting for that kernel's grid; only x (its output) and the residual must be read
//   after the wait. Launched early (PDL), the weight stream so starts during the previous kernel's tail. ptxas moves
//   ld.global.nc across the wait (SASS ACQBULK) in both directions: with .nc loads it puts the wait first (the
//   variants measured so far), and it hoisted a prologue's x loads above it. With weights first (${WEIGHTS_FIRST}),
//   the first stage and everything read after the wait use coherent ld.global, which ptxas keeps on its side.
//   (Asking L2 for the whole K slice before the wait was measured slower on the H200: docs/PERF.md, "Decode GEMV
//   ... PDL".)
// - prologue (${PROLOGUE}; codegen/decode_fusion.py): x may be computed while it is staged, so that the per-token op
//   that would have produced it needs no launch of its own in decode steps. Warp w stages the 256-column chunks w,
//   w + ${WARPS}, ... of each token's K slice: cp.async copies all of them to shared memory at once (one round trip
//   to L2, no registers held beside the first weight stage), then each lane turns its own vectors into x in place.
//   1: rms_norm, y = x * rsqrt(mean(x^2) + eps) * g: x is the norm's input and g its weight (extra parameter
//   norm_weight); the CTA stages bf16(x * g) and sums x^2 over its slice, and the epilogue multiplies the f32
//   accumulators by each token's 1 / rms (with split-K the slices' sums go through a workspace beside the partial
//   tiles; the last CTA adds them in slice order). No pass over the whole row, no wait for it before staging.
//   2: packed swiglu: x is the [M, 2K] gate_up buffer (up's slice is staged beside gate's), staged as
//   bf16(silu(gate) * up) with ex2.approx and rcp.approx. Neither is bit-identical to the norm / activation kernel
//   followed by the plain variant: the norm factor multiplies the f32 sums instead of being rounded into the bf16 x,
//   the sigmoid rounds as the approximate instructions do; both are within the GEMV's tolerance of the numpy
//   reference.
// - rope epilogue (${ROPE}; rope_epilogue.cuh): the qkv projection's GEMV rotates q and k and writes q and the KV
//   cache as rope/qkv_cache.cu does, so that the rope launch is skipped in decode steps; out is not written.
// - FP8 weights (WB = ${WB} bytes a weight; 1: ``quantized_linear`` with e4m3 weights and an f32 scale per output
//   channel, w_scale[N], bf16 activations; quant_rule.py routes them here): a lane's 16-byte load of a row covers 16
//   columns instead of 8, so a step is 64 columns, 64 bytes of a row as with bf16. Each load becomes two 16-bit
//   fragments in registers, those of two 32-column sub-steps: lane q's 16 codes are physical columns 16q..16q+15 of
//   the step, sub-step a its columns 16q+8a..16q+8a+7, and x is read at the same columns. The per-channel scale
//   multiplies the f32 sums in the epilogue, as the reference does (bf16 x times the exact e4m3 values, summed in f32,
//   times the scale). Two ways to the fragments (F16 = ${F16}, the rule's choice per token bucket):
//   0: bf16, by bit operations and one exact multiply by 2^120 (e4m3.cuh, ~20 instructions a load), bf16 MMAs;
//   1: f16, by the hardware's e4m3 -> f16 conversion (exact, 4 instructions a load), f16 MMAs, so x is staged in f16
//      times 2^-4 (XF16), which holds every bf16 x with 2^-13 <= |x| < 65504 * 16 (~1e6) exactly (smaller ones to
//      within 2^-21, far below the weights' own e4m3 rounding; larger ones, not met in activations, would become inf;
//      the rms_norm prologue stages x * g before the norm, the residual stream's scale: hence the margin on both
//      sides), and the epilogue multiplies the f32 sums by 16 (exact) before the scale. Measured on the H200: the
//      batch-1 GEMVs 2-11% faster and the FP8 batch-1 step 10% shorter, batch 64 6% slower (docs/PERF.md).
//   Everything else (prologues, row groups, split-K, the rope epilogue) is the bf16 variant's. x's rows are padded by
//   16 bytes instead of 64, so that the 32-byte lane stride of the fragment reads stays free of bank conflicts.
// - NVFP4 weights (WB = 0: ``quantized_linear`` with e2m1 codes u8[N, K/2], element 2j in the low nibble, an e4m3
//   scale per 16 columns, sf u8[N, K/16] in the linear layout, and the f32 global scale weight_scale_2[1]; bf16
//   activations): a lane's 16-byte load of a row covers 32 columns (two scale blocks; their two scale bytes are one
//   16-bit load beside it), so a step is 128 columns, 64 bytes of a row as above, and each load becomes four f16
//   fragments: word i of the load (columns 8i..8i+7 of the lane's 32) gives the pairs (c0, c2), (c4, c6), (c1, c3),
//   (c5, c7), the codes' f16 high bytes made four at a time by shifts and masks (sign to bit 7, exponent and mantissa
//   bits to 3..1: the code's value times 2^-14, exactly, 0.5 as a subnormal) and spread into f16 halves by PRMT, each
//   pair multiplied by its block's scale, converted by the hardware (e4m3 -> f16, exact): every product
//   e2m1 * sf * 2^-14 is a multiple of 2^-24 below 65504, an exact f16. f16 MMAs, x staged as with FP8's f16 route
//   (f16 times 2^-4) and in fragment order: in each 128-column step lane q's chunk i (8 columns) sits at slot 4 i + q,
//   so that the four lanes of a row read 64 contiguous bytes (rows padded by 64 bytes, as bf16's), its columns in the
//   pairs' order. The epilogue multiplies the f32 sums by
//   2^14 * 16 (exact) and the global scale (quant.cu's order: the reference's up to f32 rounding).
struct u32x4 { unsigned x, y, z, w; };

__device__ __forceinline__ u32x4 gemv_ld_stream(const void* p) {
  u32x4 v;
  asm("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}
__device__ __forceinline__ u32x4 gemv_ld_x(const void* p) {
  u32x4 v;
  asm("ld.global.nc.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}
// Loads on either side of the grid-dependency wait when the weights go first (see the header): coherent, and
// volatile so that the compiler keeps them in order with the wait too (to it a plain asm is a pure function); the
// residual's: splitk.cuh's gemv_ld_bf16_after_wait.
__device__ __forceinline__ u32x4 gemv_ld_before_wait(const void* p) {
  u32x4 v;
  asm volatile("ld.global.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}
__device__ __forceinline__ u32x4 gemv_ld_after_wait(const void* p) {
  u32x4 v;
  asm volatile("ld.global.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}
// NVFP4 weights: a lane's two block-scale bytes of a step, streamed as the codes are (before the wait: as above)
__device__ __forceinline__ unsigned short gemv_ld_sf(const void* p, bool before_wait) {
  unsigned short v;
  if (before_wait)
    asm volatile("ld.global.L1::no_allocate.u16 %0, [%1];" : "=h"(v) : "l"(p));
  else
    asm("ld.global.nc.L1::no_allocate.u16 %0, [%1];" : "=h"(v) : "l"(p));
  return v;
}
// d += a b (mma m16n8k16, f32 accumulate): bf16 operands, or f16 ones with F16
#define GEMV_MMA(T)                                                                                         \
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." T "." T ".f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, " \
               "{%0,%1,%2,%3};"                                                                           \
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])                                           \
               : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1))
template <bool F16>
__device__ __forceinline__ void gemv_mma(float* d, unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned b0,
                                         unsigned b1) {
  if (F16)
    GEMV_MMA("f16");
  else
    GEMV_MMA("bf16");
}
#undef GEMV_MMA
// element e (0..7) of 8 packed bf16, as f32
__device__ __forceinline__ float gemv_bf16_at(const u32x4& v, int e) {
  const unsigned u = e < 2 ? v.x : e < 4 ? v.y : e < 6 ? v.z : v.w;
  return __uint_as_float(e & 1 ? u & 0xffff0000u : u << 16);
}
__device__ __forceinline__ unsigned gemv_shared_addr(const void* p) {
  unsigned r;
  asm("{ .reg .u64 a; cvta.to.shared.u64 a, %1; cvt.u32.u64 %0, a; }" : "=r"(r) : "l"(p));
  return r;
}
// 16 bytes global -> shared (address in the shared window), asynchronously: cp.async.wait_all before reading them
__device__ __forceinline__ void gemv_cp16(unsigned dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src) : "memory");
}
// two f32 -> bf16x2 (nearest even; lo in the low half)
__device__ __forceinline__ unsigned gemv_pack(float lo, float hi) {
  unsigned r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

// two f32 -> f16x2 (nearest even; lo in the low half)
__device__ __forceinline__ unsigned gemv_pack_f16(float lo, float hi) {
  unsigned r;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}


namespace {
constexpr int N = ${N}, K = ${K}, MB = ${MB}, NT = MB / 8, WARPS = ${WARPS}, MT = ${MT}, KW = ${KW};
constexpr int BN = 16 * MT * (WARPS / KW);  // rows of a CTA: WARPS / KW row groups of 16 MT rows
// WB: bytes a weight (2 bf16, 1 e4m3, 0: NVFP4, half a byte); a step is 16 bytes a lane of each row: CW columns,
// SUB 16-bit fragments
constexpr int WB = ${WB};
constexpr bool W4 = WB == 0;
constexpr int SUB = W4 ? 4 : 2 / WB, CW = 32 * SUB;
// f16 fragments (XH): FP8 weights in the rule's buckets (e4m3 -> f16 by cvt, see the header), NVFP4 weights always;
// f16 MMAs, x staged in f16
constexpr bool XH = (WB == 1 && ${F16}) || W4;
constexpr int KS = ${KS}, SPLITK = ${SPLITK}, U = ${U}, STEPS = KS / CW / KW, NS = STEPS / U;  // STEPS: a warp's
// x row stride in shared memory (bf16): the padding keeps the 16-B fragment loads conflict-free (lanes of a row 16 B
// apart, or 64 contiguous bytes with NVFP4 weights: +64 B; 32 B apart with FP8 weights: +16 B)
constexpr int LDX = KS + (WB == 1 ? 8 : 32);
constexpr int GX = (N + BN - 1) / BN;
static_assert(MB % 8 == 0 && MB <= 64, "MB: 8..64 tokens");
static_assert(WB == 0 || WB == 1 || WB == 2, "WB: bf16, e4m3 or NVFP4 weights");
static_assert(WB == 1 || !${F16}, "F16: the FP8 weights' choice (NVFP4 weights are always f16)");
static_assert(KS % (CW * U * KW) == 0 && K % CW == 0, "a warp's part of the K slice is whole stages of CW columns");
static_assert(WARPS % KW == 0, "KW divides the warps");
// the in-CTA reduction's partial tiles ([KW - 1][row group][mt][j][reg][lane] f32) fit x's region
static_assert(KW == 1 || (KW - 1) * (WARPS / KW) * MT * NT * 4 * 32 * 4 <= MB * LDX * 2, "KW partials fit x's region");
static_assert(SPLITK * KS >= K && (SPLITK - 1) * KS < K, "SPLITK slices cover K");
// prologues: a token's K slice in chunks of 32 16-byte vectors (one a lane), CHW chunks a warp
constexpr int PROLOGUE = ${PROLOGUE}, VPT = KS / 8, CH = (VPT + 31) / 32, CHW = (CH + WARPS - 1) / WARPS;
constexpr bool WEIGHTS_FIRST = ${WEIGHTS_FIRST};
// CLUSTER: split-K over a thread-block cluster, reduced through distributed shared memory (see the header)
constexpr bool CSK = ${CLUSTER};
static_assert(!CSK || (SPLITK > 1 && SPLITK <= 8), "CLUSTER: 2..8 slices (a portable cluster)");
static_assert(!CSK || BN * MB * 4 <= MB * LDX * 2, "CLUSTER: the CTA's partial tile fits x's region");
constexpr float SWIGLU_K = -(${ALPHA}) * 1.4426950408889634f;  // silu's exponent in log2 units
using SK = GemvSplitK<MT, NT, MB, BN, GX, SPLITK>;
// XH: x is staged as f16 times XF16 (see the header); the epilogue undoes it
constexpr float XF16 = 1.0f / 16.0f, XF16_INV = 16.0f;

// two values of x as staged: bf16x2, or f16x2 times XF16 (XH)
__device__ __forceinline__ unsigned gemv_pack_x(float lo, float hi) {
  return XH ? gemv_pack_f16(lo * XF16, hi * XF16) : gemv_pack(lo, hi);
}
// 8 consecutive columns of x (y[0..7]) as staged: in order, or (NVFP4 weights) in the pairs' order c0 c2 c4 c6 c1 ...
__device__ __forceinline__ u32x4 gemv_pack8_x(const float (&y)[8]) {
  if (W4) return {gemv_pack_x(y[0], y[2]), gemv_pack_x(y[4], y[6]), gemv_pack_x(y[1], y[3]), gemv_pack_x(y[5], y[7])};
  return {gemv_pack_x(y[0], y[1]), gemv_pack_x(y[2], y[3]), gemv_pack_x(y[4], y[5]), gemv_pack_x(y[6], y[7])};
}
// 8 bf16 of x as staged
__device__ __forceinline__ u32x4 gemv_to_x(const u32x4& v) {
  if (!XH) return v;
  float y[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) y[i] = gemv_bf16_at(v, i);
  return gemv_pack8_x(y);
}
// where column c of the CTA's x slice (a multiple of 8) is staged: in place, or (NVFP4 weights) in fragment order,
// chunk i of lane q's 32 columns of a 128-column step at slot 4 i + q (see the header)
__device__ __forceinline__ int gemv_xcol(int c) {
  if (!W4) return c;
  const int chunk = (c >> 3) & 15;
  return (c & ~127) | (((chunk & 3) * 4 + (chunk >> 2)) << 3);
}
// the f32 sum's factor that NVFP4 weights leave to the epilogue: the global scale, 2^14 (the codes' f16 offset) and
// 16 (undoes XF16), exact powers of two first
__device__ __forceinline__ float gemv_global_scale(const float* __restrict__ weight_scale_2) {
  return W4 ? weight_scale_2[0] * (16384.0f * XF16_INV) : 1.0f;
}
// an output row's f32 sum, weight-scaled: with FP8 weights the channel's scale (XH: after 16, exact, undoes XF16),
// with NVFP4 ones gemv_global_scale's factor (gs)
__device__ __forceinline__ float gemv_wscale(float y, const float* __restrict__ w_scale, int n, float gs) {
  return WB == 2 ? y : W4 ? y * gs : (XH ? y * XF16_INV : y) * w_scale[n];
}
// 8 e2m1 codes -> four f16x2 fragments times the block scale (e4m3.cuh's qg_e2m1x8_f16: (n0, n2), (n4, n6), (n1, n3),
// (n5, n7))
__device__ __forceinline__ u32x4 gemv_e2m1x8_f16(unsigned v, unsigned sc) {
  unsigned o[4];
  qg_e2m1x8_f16(v, sc, o);
  return {o[0], o[1], o[2], o[3]};
}

// a * sigmoid(alpha a) * b = a * b / (1 + 2^(SWIGLU_K a)); 2^+inf = inf gives 0
__device__ __forceinline__ float gemv_swiglu(float a, float b) {
  float e, r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(e) : "f"(SWIGLU_K * a));
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(1.0f + e));
  return a * r * b;
}
}  // namespace
#include "rope_epilogue.cuh"

__device__ float ${KERNEL}_ws[SPLITK > 1 && !CSK ? SPLITK * GX * BN * MB : 1];
__device__ unsigned ${KERNEL}_cnt[GX];
__device__ float ${KERNEL}_ss[PROLOGUE == 1 && SPLITK > 1 && !CSK ? SPLITK * GX * MB : 1];  // [split][row block][token]

#if ${CLUSTER}
#define GEMV_CLUSTER_DIMS __cluster_dims__(1, ${SPLITK}, 1)
#else
#define GEMV_CLUSTER_DIMS
#endif
extern "C" __global__ void GEMV_CLUSTER_DIMS __launch_bounds__(WARPS * 32) ${KERNEL}(
    const bf16* __restrict__ x, const void* __restrict__ w, const float* __restrict__ w_scale,
#if ${WB} != 2
    // quantized_linear's; input_scale unused, weight_scale_2 NVFP4's global scale (w_scale then its block scales)
    const float* __restrict__ weight_scale_2, const float* __restrict__ input_scale,
#endif
    const bf16* __restrict__ bias, const bf16* __restrict__ residual, bf16* __restrict__ out, long long M
#if ${PROLOGUE} == 1
    , const bf16* __restrict__ norm_weight
#endif
#if ${ROPE}
    , const long long* __restrict__ positions, const ${ROPE_CT}* __restrict__ cos_table,
    const ${ROPE_CT}* __restrict__ sin_table, bf16* __restrict__ q_out, ${ROPE_KT}* __restrict__ kv_cache,
    const long long* __restrict__ slot_mapping, const float* __restrict__ kv_scale
#endif
    ) {
#if ${PROLOGUE} != 1
  const bf16* const norm_weight = nullptr;  // only the rms_norm prologue has this parameter
#endif
  extern __shared__ __align__(16) unsigned short xs[];  // [MB][LDX]
  __shared__ unsigned is_last;
  __shared__ float ssq[PROLOGUE == 1 ? MB * WARPS : 1];  // rms_norm: [token][warp] sums of x^2 over the warp's chunks
  // CLUSTER, rms_norm: each token's sum of x^2 over this slice (read by the cluster), then over all the slices
  __shared__ float ss_slice[PROLOGUE == 1 && CSK ? MB : 1], ss_total[PROLOGUE == 1 && CSK ? MB : 1];
  if (M > MB) __trap();  // the executor launches this variant only for M <= MB
  const int rows = (int)M;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, q = lane & 3;
  const int rg = warp / KW, kw = warp % KW;  // the warp's row group and its part of the K slice
  const int row0 = blockIdx.x * BN + rg * 16 * MT + g;  // tile mt: rows row0 + 16 mt (+ 8)
  const int kb = blockIdx.y * KS, kc = kw * STEPS * CW;  // the slice's first column; the warp's part's, in the slice
  const unsigned char* wbytes = static_cast<const unsigned char*>(w);
  const unsigned char* p[MT][2];  // lane q's 16 bytes of each row's first step; a step is 64 bytes further
  const unsigned char* ps[MT][2];  // NVFP4: lane q's 2 block-scale bytes of each row's first step; 8 bytes a step
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = row0 + 16 * mt + 8 * h;
      const i64 c0 = (i64)(r < N ? gemv_rope_row(r) : N - 1) * K + kb + kc;  // the row's first column, as an element
      p[mt][h] = wbytes + (W4 ? c0 / 2 : c0 * WB) + 16 * q;
      ps[mt][h] = reinterpret_cast<const unsigned char*>(w_scale) + c0 / 16 + 2 * q;
    }

  u32x4 buf[2][U][MT][2];
  unsigned short sbuf[2][U][MT][2];  // NVFP4: the loads' block-scale bytes
  // stage 0 of w first, so the weight stream starts before x is staged
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const bool ok = (K % KS == 0) || kb + kc + CW * u < K;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const unsigned char* a = p[mt][h] + 64 * u;
        buf[0][u][mt][h] = ok ? (WEIGHTS_FIRST ? gemv_ld_before_wait(a) : gemv_ld_stream(a)) : u32x4{0, 0, 0, 0};
        if (W4) sbuf[0][u][mt][h] = ok ? gemv_ld_sf(ps[mt][h] + 8 * u, WEIGHTS_FIRST) : (unsigned short)0;
      }
  }
  // the previous kernel's outputs (x, residual) are read only from here on
${PDL_WAIT}
#if ${ROPE} && ${ROPE_PRELOAD}
  // the rope epilogue's slots and cos / sin (rope_epilogue.cuh, RPRE), loaded now so that their round trips overlap
  // the weight stream instead of following the last MMA (the first warp of a row group stores them)
  GemvRopeIn rin[MT][NT][2] = {};
  if (kw == 0) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int t = 8 * j + 2 * q + e, nlo = row0 + 16 * mt;
          if (t < rows && nlo < N)
            rin[mt][j][e] = gemv_rope_in(t, gemv_rope_row(nlo), positions, cos_table, sin_table, slot_mapping);
        }
  }
#endif
  const unsigned short* xbits = reinterpret_cast<const unsigned short*>(x);
  if (PROLOGUE == 0) {
    // x[0:M, kb:kb+KS] -> shared memory (tokens >= M and columns >= K are zeros)
    for (int i = threadIdx.x; i < MB * (KS / 8); i += WARPS * 32) {
      const int t = i / (KS / 8), c = (i % (KS / 8)) * 8;
      u32x4 v = {0, 0, 0, 0};
      if (t < rows && kb + c < K)
        v = WEIGHTS_FIRST ? gemv_ld_after_wait(xbits + (i64)t * K + kb + c) : gemv_ld_x(xbits + (i64)t * K + kb + c);
      *reinterpret_cast<u32x4*>(&xs[t * LDX + gemv_xcol(c)]) = v;
    }
    // XH: each thread turns the vectors it stored into f16 in place, once all its loads are issued (doing it in the
    // loop above kept each load waiting for the previous vector's conversion)
    if (XH)
      for (int i = threadIdx.x; i < rows * (KS / 8); i += WARPS * 32) {
        u32x4* const v = reinterpret_cast<u32x4*>(&xs[(i / (KS / 8)) * LDX + (i % (KS / 8)) * 8]);
        *v = gemv_to_x(*v);
      }
  } else {
    // the prologue's x (see the header). Each lane copies its 16-byte vectors of x (gate and up for swiglu) into
    // shared memory with cp.async, all in flight at once and no registers held, then turns them into the staged x
    // in place; columns past K and tokens >= M stage zeros.
    constexpr int XS = PROLOGUE == 2 ? 2 * K : K;  // x's row stride: gate_up rows hold gate, then up
    constexpr int UP = MB * LDX;                   // swiglu: up's slice, [MB][LDX] after x's
    const unsigned xs_addr = gemv_shared_addr(xs);
    const u32x4 zero = {0, 0, 0, 0};
    u32x4 gw[CHW];  // rms_norm: the norm weight's 8 columns of each chunk
#pragma unroll
    for (int j = 0; j < CHW; ++j) {
      const int c = 8 * ((warp + j * WARPS) * 32 + lane);  // this lane's column in the slice
      if (c < KS) {
        const bool col = kb + c < K;
        if (PROLOGUE == 1) gw[j] = col ? gemv_ld_after_wait(norm_weight + kb + c) : zero;
        const unsigned short* const xc = xbits + kb + c;
        const unsigned sc = xs_addr + 2 * gemv_xcol(c);
#pragma unroll
        for (int t = 0; t < MB; ++t) {
          if (t < rows && col) {
            gemv_cp16(sc + 2 * t * LDX, xc + (i64)t * XS);
            if (PROLOGUE == 2) gemv_cp16(sc + 2 * (UP + t * LDX), xc + (i64)t * XS + K);
          } else {
            *reinterpret_cast<u32x4*>(&xs[t * LDX + gemv_xcol(c)]) = zero;
          }
        }
      }
    }
    asm volatile("cp.async.wait_all;" ::: "memory");
#pragma unroll 1
    for (int t0 = 0; t0 < rows; t0 += 8) {
      float ss[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};  // rms_norm: this lane's sums of x^2
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        if (t0 + e < rows) {  // the same for the whole warp
#pragma unroll
          for (int j = 0; j < CHW; ++j) {
            const int c = 8 * ((warp + j * WARPS) * 32 + lane), i0 = (t0 + e) * LDX + gemv_xcol(c);
            if (c < KS && kb + c < K) {
              const u32x4 a = *reinterpret_cast<const u32x4*>(&xs[i0]);
              u32x4 b = zero;
              if (PROLOGUE == 2) b = *reinterpret_cast<const u32x4*>(&xs[UP + i0]);
              float y[8];
#pragma unroll
              for (int i = 0; i < 8; ++i) {
                const float av = gemv_bf16_at(a, i);
                if (PROLOGUE == 1) {
                  ss[e] += av * av;
                  y[i] = av * gemv_bf16_at(gw[j], i);
                } else {
                  y[i] = gemv_swiglu(av, gemv_bf16_at(b, i));
                }
              }
              *reinterpret_cast<u32x4*>(&xs[i0]) = gemv_pack8_x(y);
            }
          }
        }
      }
      if (PROLOGUE == 1) {  // the warp's sums of the 8 tokens (splitk.cuh): lane L holds token (L >> 2) & 7's
        const float sum = gemv_warp_sum8(ss, lane);
        const int t = t0 + ((lane >> 2) & 7);
        if ((lane & 3) == 0 && t < rows) ssq[t * WARPS + warp] = sum;
      }
    }
  }
  __syncthreads();

  float acc[MT][NT][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int j = 0; j < NT; ++j) acc[mt][j][0] = acc[mt][j][1] = acc[mt][j][2] = acc[mt][j][3] = 0.0f;

#pragma unroll
  for (int s = 0; s < NS; ++s) {
    if (s + 1 < NS) {
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int step = (s + 1) * U + u;
        const bool ok = (K % KS == 0) || kb + kc + CW * step < K;
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            buf[(s + 1) & 1][u][mt][h] = ok ? gemv_ld_stream(p[mt][h] + 64 * step) : u32x4{0, 0, 0, 0};
            if (W4) sbuf[(s + 1) & 1][u][mt][h] = ok ? gemv_ld_sf(ps[mt][h] + 8 * step, false) : (unsigned short)0;
          }
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      u32x4 wf[MT][2][SUB];  // the step's fragments: the bf16 loads themselves, their e4m3 codes as bf16 / f16, or their
                             // e2m1 codes times block scales as f16
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const u32x4 v = buf[s & 1][u][mt][h];
          if (WB == 2) {
            wf[mt][h][0] = v;
          } else if (W4) {  // words 0, 1: the first scale block of the lane's 32 columns; 2, 3: the second
            unsigned s0, s1;
            qg_sf_f16(sbuf[s & 1][u][mt][h], s0, s1);
            const unsigned words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
            for (int i = 0; i < SUB; ++i) wf[mt][h][i] = gemv_e2m1x8_f16(words[i], i < 2 ? s0 : s1);
          } else {
            u32x4& lo = wf[mt][h][0];
            u32x4& hi = wf[mt][h][SUB - 1];
            if (XH) {
              qg_e4m3x4_f16(v.x, lo.x, lo.y);
              qg_e4m3x4_f16(v.y, lo.z, lo.w);
              qg_e4m3x4_f16(v.z, hi.x, hi.y);
              qg_e4m3x4_f16(v.w, hi.z, hi.w);
            } else {
              qg_e4m3x4_bf16(v.x, lo.x, lo.y);
              qg_e4m3x4_bf16(v.y, lo.z, lo.w);
              qg_e4m3x4_bf16(v.z, hi.x, hi.y);
              qg_e4m3x4_bf16(v.w, hi.z, hi.w);
            }
          }
        }
#pragma unroll
      for (int sub = 0; sub < SUB; ++sub) {
        // the fragment's 8 columns of x: lane q's sub-th 8 of the step (NVFP4: staged at slot 4 sub + q)
        const int col = kc + CW * (s * U + u) + (W4 ? 8 * (4 * sub + q) : 8 * SUB * q + 8 * sub);
#pragma unroll
        for (int j = 0; j < NT; ++j) {
          const u32x4 xv = *reinterpret_cast<const u32x4*>(&xs[(8 * j + g) * LDX + col]);
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            const u32x4 a = wf[mt][0][sub], b = wf[mt][1][sub];
            gemv_mma<XH>(acc[mt][j], a.x, b.x, a.y, b.y, xv.x, xv.y);
            gemv_mma<XH>(acc[mt][j], a.z, b.z, a.w, b.w, xv.z, xv.w);
          }
        }
      }
    }
  }

  if (KW > 1)  // the row group's partial tiles -> its first warp, in warp order (splitk.cuh)
    SK::template row_group_sum<KW, WARPS / KW>(reinterpret_cast<float*>(xs), acc, kw, rg, lane);

  float inv[NT][2];  // rms_norm: 1 / rms of tokens 8 j + 2 q + h, all MB of them (splitk.cuh)
  if (CSK) {  // split-K in a cluster (see the header)
    // Every thread of the CTA sums some of the elements of the row groups this CTA reduces (rg % SPLITK == rank) over
    // the cluster's partial tiles, in slice order from 0 (the workspace reduction's additions); once every CTA has read
    // what it needs, the sums go to this CTA's own x region, where the row groups' first warps pick up their tiles.
    constexpr int TILE = SK::TILE, GROUPS = WARPS / KW, THREADS = WARPS * 32;  // TILE: a row group's, f32
    constexpr int AMAX = (GROUPS + SPLITK - 1) / SPLITK, PER = (AMAX * TILE + THREADS - 1) / THREADS;
    float* const red = reinterpret_cast<float*>(xs);
    __syncthreads();  // every warp is done with x's region (MMAs, the row groups' partials)
    if (!kw) SK::put(red + rg * TILE + lane, acc);
    if (PROLOGUE == 1 && threadIdx.x < MB) ss_slice[threadIdx.x] = SK::template slice_ss<WARPS>(ssq, threadIdx.x);
    gemv_cluster_sync();  // every slice's partials (and sums of x^2) are visible to the cluster
    const int rank = (int)gemv_cluster_rank();
    const unsigned red_addr = gemv_shared_addr(red);
    float sum[PER];
    int at[PER];  // the element's offset in red (-1: none)
#pragma unroll
    for (int i = 0; i < PER; ++i) {
      const int e = threadIdx.x + i * THREADS, a = e / TILE, grp = rank + a * SPLITK;
      at[i] = a < AMAX && grp < GROUPS ? grp * TILE + e % TILE : -1;
      float v[SPLITK];  // all the slices' values first (their loads in flight together), then added in order
#pragma unroll
      for (int sk = 0; sk < SPLITK; ++sk)
        v[sk] = at[i] >= 0 ? gemv_ld_cluster(gemv_mapa(red_addr, sk) + 4 * at[i]) : 0.0f;
      sum[i] = 0.0f;
#pragma unroll
      for (int sk = 0; sk < SPLITK; ++sk) sum[i] += v[sk];
    }
    float ss_sum = 0.0f;  // rms_norm: token tid's sum of x^2 over the slices, in slice order (sum_ss's)
    if (PROLOGUE == 1 && threadIdx.x < MB) {
      const unsigned sq = gemv_shared_addr(ss_slice + threadIdx.x);
      float v[SPLITK];
#pragma unroll
      for (int sk = 0; sk < SPLITK; ++sk) v[sk] = gemv_ld_cluster(gemv_mapa(sq, sk));
#pragma unroll
      for (int sk = 0; sk < SPLITK; ++sk) ss_sum += v[sk];
    }
    // The sums overwrite this CTA's partials of its own row groups, which only this CTA reads (the peers read those
    // of theirs), so they need no second barrier first; what does is the rule that no CTA exits while the cluster may
    // still read its shared memory: each thread arrives once its reads are done (a release: they are performed
    // before it) and waits just before it exits, by when the peers have long arrived.
    gemv_cluster_arrive();
#pragma unroll
    for (int i = 0; i < PER; ++i)
      if (at[i] >= 0) red[at[i]] = sum[i];
    if (PROLOGUE == 1 && threadIdx.x < MB) ss_total[threadIdx.x] = ss_sum;
    __syncthreads();
    if (kw || rg % SPLITK != rank) {
      gemv_cluster_wait();
      return;
    }
    SK::get(red + rg * TILE + lane, acc);
    if (PROLOGUE == 1)
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int h = 0; h < 2; ++h) inv[j][h] = rsqrtf(ss_total[8 * j + 2 * q + h] * (1.0f / K) + ${EPS});
  } else if (SPLITK > 1) {  // the partial tile -> workspace; the row block's last CTA sums them (splitk.cuh)
    float* ws = SK::slot(${KERNEL}_ws, rg, lane);
    if (!kw) SK::store(ws, acc, q, rows);
    if (PROLOGUE == 1) SK::store_ss<WARPS>(${KERNEL}_ss, ssq, rows, threadIdx.x);  // this slice's sums of x^2
    if (!SK::last(${KERNEL}_cnt, is_last, threadIdx.x)) return;
    if (kw) return;
    SK::reduce(ws, acc, q, rows, ${KERNEL}_cnt, threadIdx.x);
  }
  if (kw) return;  // the row group's first warp stores its tile

#if ${WB} == 2
  const float gs = 1.0f;
#else
  const float gs = gemv_global_scale(weight_scale_2);  // NVFP4's epilogue factor (1 otherwise, unused)
#endif
  if (PROLOGUE == 1 && !CSK) SK::inv_rms<WARPS, K, true>(inv, ${KERNEL}_ss, ssq, q, ${EPS}, MB);

#if ${ROPE}
  // the rope epilogue (see the header): the pair (lo, hi) = tile rows (g, g + 8), tokens 2q, 2q+1 of each n-tile
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    const int nlo = row0 + 16 * mt;
    if (nlo >= N) continue;
    const int lo = gemv_rope_row(nlo), hi = gemv_rope_row(nlo + 8);
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int t = 8 * j + 2 * q + e;
        if (t >= rows) continue;
        float a = acc[mt][j][e], b = acc[mt][j][2 + e];
        a = gemv_wscale(a, w_scale, lo, gs), b = gemv_wscale(b, w_scale, hi, gs);
        if (PROLOGUE == 1) a *= inv[j][e], b *= inv[j][e];
        if (${HAS_BIAS}) a += to_f32(bias[lo]), b += to_f32(bias[hi]);
#if ${ROPE_PRELOAD}
        const GemvRopeIn& in = rin[mt][j][e];
        gemv_rope_apply(t, lo, hi, gemv_round(a), gemv_round(b), in.slot, in.c, in.s, q_out, kv_cache, kv_scale);
#else
        gemv_rope_store(t, lo, hi, gemv_round(a), gemv_round(b), positions, cos_table, sin_table, q_out, kv_cache,
                        slot_mapping, kv_scale);
#endif
      }
  }
  if (CSK) gemv_cluster_wait();  // (the second barrier's wait: see the cluster reduction)
  return;
#endif
  // epilogue: c0, c1 = (row g, tokens 2q, 2q+1), c2, c3 = (row g+8, same tokens) of each tile
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int t = 8 * j + 2 * q + (r & 1), n = row0 + 16 * mt + (r < 2 ? 0 : 8);
        if (t < rows && n < N) {
          float y = acc[mt][j][r];
          y = gemv_wscale(y, w_scale, n, gs);
          if (PROLOGUE == 1) y *= inv[j][r & 1];
          if (${HAS_BIAS}) y += to_f32(bias[n]);
          if (${HAS_RESIDUAL})
            y += WEIGHTS_FIRST ? gemv_ld_bf16_after_wait(residual + (i64)t * N + n) : to_f32(residual[(i64)t * N + n]);
          out[(i64)t * N + n] = from_f32<bf16>(y);
        }
      }
  if (CSK) gemv_cluster_wait();  // (the second barrier's wait: see the cluster reduction)
}
