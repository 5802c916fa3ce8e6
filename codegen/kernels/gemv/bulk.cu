#include "../common.cuh"
#include "splitk.cuh"
#include "e4m3.cuh"

// Decode GEMV with bulk async copies: out[M, N] = x[M, K] @ w[N, K]^T (+ bias[N]) (+ residual[M, N]), bf16 in and
// out, f32 accumulate, M <= ${MB} tokens (one variant per token bucket, codegen/kernels/gemv/bulk_rule.py).
// Same maths and epilogue as kernel.cu; what differs is how the weights travel:
//
// - weights go global -> shared memory with 1-D bulk copies (cp.async.bulk ... mbarrier::complete_tx::bytes,
//   async proxy, no registers held), never through registers. Each warp owns 16 x ${MT} rows of the CTA's tile
//   and its own ring of ${S} stages of ${SC} columns: lane r copies row r's piece of a stage (rows are contiguous
//   in w) into a shared row padded by 16 bytes, so that ldmatrix's 8 row addresses of one 8x8 matrix fall in 8
//   different 16-byte bank groups (SC is a multiple of 64: rows start 16 bytes apart modulo 128); lane 0 arms the
//   stage's mbarrier with the bytes to expect. After computing from a stage, the warp refills it with the piece
//   ${S} stages ahead. No __syncthreads in the loop: every warp is its own producer and consumer.
// - programmatic dependent launch: the weights never depend on the kernel before this one, so every warp fills its
//   whole ring *before* griddepcontrol.wait: launched early (PDL), this kernel streams up to ${S} x ${SC} columns of
//   its rows (all of them when the tile fits) while the previous kernel finishes. The copies are async-proxy
//   instructions (SASS UBLKCP) issued in program order before the wait (ACQBULK); tests/codegen/test_gemv_bulk.py
//   checks that ptxas keeps them there. launch_dependents comes first of all, so that the *next* kernel may be
//   scheduled (and fill its own ring) as soon as every CTA of this one runs; the shared memory (bulk_rule's
//   SMEM_BUDGET) is kept small enough for two CTAs, this one's and the next kernel's, to share an SM.
// - after the wait, x's K slice of the M tokens (the previous kernel's output) is bulk-copied too, one copy per
//   token, into [MB][KS + 8] (the same 16-byte padding); tokens >= M are never copied: their shared rows hold
//   whatever was there and only feed accumulator columns that are never stored.
// - tensor cores: mma.sync m16n8k16, w as the A operand (ldmatrix.x4: 16 rows x 16 k), x as B (ldmatrix.x4:
//   8 tokens x 32 k, the fragments of two k16 steps), natural K order (no permutation needed: ldmatrix shuffles).
// - split-K over CTAs (grid.y = ${SPLITK}): as kernel.cu (splitk.cuh), each CTA stores its partial tile in a
//   module-scope f32 workspace and the last CTA of a row block (atomic counter, reset by that CTA) sums the partials
//   in slice order (deterministic) and runs the epilogue. One launch at a time per module may use the workspace.
// - K tail: the last slice may be shorter than ${KS}; its last stage copies and computes only its multiple of 32
//   columns. Rows >= N copy row N - 1 (never stored).
// - prologue (${PROLOGUE}; codegen/decode_fusion.py, the same semantics and parameters as kernel.cu's): x is computed
//   from the skipped producer's input while it is staged. After the wait the raw slices are bulk-copied as above,
//   then the CTA's threads turn them into x in place (16 bytes a thread per token, once per CTA, a __syncthreads
//   after it); the weights' ring is still filled before the wait.
//   1: rms_norm, y = x * rsqrt(mean(x^2) + eps) * g: x is the norm's input, g its weight (extra parameter
//   norm_weight, its slice bulk-copied beside x's); the CTA stages bf16(x * g) and sums x^2 over its slice (per
//   warp, 9 shuffles per 8 tokens as kernel.cu), and the epilogue multiplies the f32 accumulators by each token's
//   1 / rms (with split-K the slices' sums go through a workspace, added by the last CTA in slice order).
//   2: packed swiglu: x is the [M, 2K] gate_up buffer; up's slice is copied into a second [MB][KS + 8] region after
//   gate's, and x = bf16(silu(gate) * up) with ex2.approx and rcp.approx, written over gate's.
//   Not bit-identical to the producer's kernel followed by the plain variant (the norm factor multiplies the f32
//   sums; the approximate sigmoid), within the GEMV's tolerance of the numpy reference.
// - FP8 weights (${WB} == 1; quantized_linear weight-only, codegen/kernels/gemv/quant.cu's parameters): w is e4m3
//   [N, K] with an f32 scale per output channel (weight_scale[N]), x bf16. The ring holds 1 byte a weight (rows
//   padded by 16 bytes as above: SC is a multiple of 128). ldmatrix.x4 reads the e4m3 bytes as b16 pairs: lane
//   (g, q) gets 4 consecutive columns 4q..4q+3 of rows g and g + 8 in each 16-column half of a 32-column step,
//   converted to bf16 in registers exactly (e4m3.cuh's qg_e4m3x4_bf16); each half is one k16 MMA whose logical k
//   (2q, 2q+1 | 2q+8, 2q+9) are physical columns (4q, 4q+1 | 4q+2, 4q+3). x's fragments follow that permutation:
//   8 bytes (columns 4q..4q+3) of token g by a plain ld.shared per half, x rows padded by 32 bytes (rows 32 bytes
//   apart modulo 128: each half-warp's 8-byte loads hit 32 different banks). The channel scale multiplies the f32
//   sums in the epilogue (after the split-K reduction), before bias and residual. No prologue with FP8 weights.

namespace {
constexpr int N = ${N}, K = ${K}, MB = ${MB}, NT = MB / 8, WARPS = ${WARPS}, MT = ${MT}, ROWS = 16 * MT;
constexpr int BN = ROWS * WARPS, KS = ${KS}, SPLITK = ${SPLITK}, SC = ${SC}, S = ${S};
constexpr int PROLOGUE = ${PROLOGUE}, WB = ${WB};  // WB: bytes per weight (2: bf16, 1: e4m3 + channel scales)
constexpr int GX = (N + BN - 1) / BN;
constexpr int RSB = WB * SC + 16;                // bytes per shared weight row of a stage (16 bytes of padding)
constexpr int XSB = 2 * KS + (WB == 1 ? 32 : 16);  // bytes per shared x row (fp8: plain 8-byte fragment loads)
constexpr int STAGE_BYTES = ROWS * RSB;   // one warp's stage
constexpr int XR = PROLOGUE == 2 ? 2 : 1;              // x regions: swiglu copies up's slice after gate's
constexpr int G_OFF = XR * MB * XSB;                   // rms_norm: the norm weight's slice after x's
constexpr int X_BYTES = G_OFF + (PROLOGUE == 1 ? 2 * KS : 0);  // x's slice(s) first, then the warps' rings
constexpr float SWIGLU_K = -(${ALPHA}) * 1.4426950408889634f;  // silu's exponent in log2 units
using SK = GemvSplitK<MT, NT, MB, BN, GX, SPLITK>;
static_assert(MB % 8 == 0 && MB <= 64, "MB: 8..64 tokens");
static_assert(SC % 64 == 0 && KS % SC == 0 && K % 32 == 0, "stages of 64-column multiples; K a multiple of 32");
static_assert(SPLITK * KS >= K && (SPLITK - 1) * KS < K, "SPLITK slices cover K");
static_assert(ROWS <= 32 && S >= 1 && X_BYTES % 128 == 0, "a lane per row of a warp's tile");
static_assert(PROLOGUE >= 0 && PROLOGUE <= 2, "prologue: none, rms_norm or swiglu");
static_assert((WB == 2 || WB == 1) && (WB == 2 || PROLOGUE == 0) && (WB * SC) % 128 == 0, "bf16, or fp8 w/o prologue");

struct bk_u32x4 { unsigned x, y, z, w; };

__device__ __forceinline__ unsigned bk_smem(const void* p) {
  unsigned r;
  asm("{ .reg .u64 a; cvta.to.shared.u64 a, %1; cvt.u32.u64 %0, a; }" : "=r"(r) : "l"(p));
  return r;
}
__device__ __forceinline__ void bk_expect(unsigned bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
// bytes (a multiple of 16) global -> shared, completing as transaction bytes on mbarrier bar
__device__ __forceinline__ void bk_copy(unsigned dst, const void* src, unsigned bytes, unsigned bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
               ::"r"(dst), "l"(src), "r"(bytes), "r"(bar) : "memory");
}
__device__ __forceinline__ void bk_wait(unsigned bar, unsigned parity) {
  asm volatile(
      "{\n .reg .pred p;\n BK_WAIT:\n mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n @!p bra BK_WAIT;\n}"
      ::"r"(bar), "r"(parity) : "memory");
}
__device__ __forceinline__ void bk_ldsm4(unsigned* r, unsigned addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
// element e (0..7) of 8 packed bf16, as f32
__device__ __forceinline__ float bk_bf16_at(const bk_u32x4& v, int e) {
  const unsigned u = e < 2 ? v.x : e < 4 ? v.y : e < 6 ? v.z : v.w;
  return __uint_as_float(e & 1 ? u & 0xffff0000u : u << 16);
}
// two f32 -> bf16x2 (nearest even; lo in the low half)
__device__ __forceinline__ unsigned bk_pack(float lo, float hi) {
  unsigned r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
// a * sigmoid(alpha a) * b = a * b / (1 + 2^(SWIGLU_K a)); 2^+inf = inf gives 0 (kernel.cu's gemv_swiglu)
__device__ __forceinline__ float bk_swiglu(float a, float b) {
  float e, r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(e) : "f"(SWIGLU_K * a));
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(1.0f + e));
  return a * r * b;
}
// 8 bytes of shared memory (two bf16x2: an mma B fragment); volatile: kept after the mbarrier waits
__device__ __forceinline__ void bk_lds64(unsigned* r, unsigned addr) {
  asm volatile("ld.shared.v2.u32 {%0,%1}, [%2];" : "=r"(r[0]), "=r"(r[1]) : "r"(addr));
}
__device__ __forceinline__ void bk_mma(float* d, const unsigned* a, unsigned b0, unsigned b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
}  // namespace

__device__ float ${KERNEL}_ws[SPLITK > 1 ? SPLITK * GX * BN * MB : 1];
__device__ unsigned ${KERNEL}_cnt[GX];
__device__ float ${KERNEL}_ss[PROLOGUE == 1 && SPLITK > 1 ? SPLITK * GX * MB : 1];  // [split][row block][token]

extern "C" __global__ void __launch_bounds__(WARPS * 32) ${KERNEL}(
#if ${WB} == 1
    const bf16* __restrict__ x, const unsigned char* __restrict__ w, const float* __restrict__ w_scale,
    const float* __restrict__ weight_scale_2, const float* __restrict__ input_scale, const bf16* __restrict__ bias,
#else
    const bf16* __restrict__ x, const bf16* __restrict__ w, const float* __restrict__ w_scale,
    const bf16* __restrict__ bias,
#endif
    const bf16* __restrict__ residual, bf16* __restrict__ out, long long M
#if ${PROLOGUE} == 1
    , const bf16* __restrict__ norm_weight
#endif
    ) {
  // x [MB][XSB] (swiglu: then up [MB][XSB]; rms_norm: then g [KS]), then [WARPS][S] stages [ROWS][RSB]
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ __align__(8) unsigned long long full[WARPS * S + 1];  // the warps' stages, then x's
  __shared__ unsigned is_last;
  __shared__ float ssq[PROLOGUE == 1 ? MB * WARPS : 1];  // rms_norm: [token][warp] sums of x^2 over the slice
  if (M > MB) __trap();  // the executor launches this variant only for M <= MB
  const int rows = (int)M;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, q = lane & 3;
  const int kb = blockIdx.y * KS, kvalid = K - kb < KS ? K - kb : KS;  // this slice's columns
  const int nst = (kvalid + SC - 1) / SC;                               // its stages
  const int wrow0 = blockIdx.x * BN + warp * ROWS;                      // the warp's first row
  const unsigned xs = bk_smem(smem), ring = xs + X_BYTES + warp * S * STAGE_BYTES;
  const unsigned bar0 = bk_smem(&full[warp * S]), xbar = bk_smem(&full[WARPS * S]);

  if (lane == 0) {
    for (int s = 0; s < S; ++s) asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(bar0 + 8 * s));
    if (warp == 0) asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(xbar));
  }
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  __syncthreads();
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");  // the next kernel may fill its ring now
#endif

  // stage i of this warp's rows -> ring slot i % S (lane r copies row r; rows >= N copy row N - 1)
  const int grow = wrow0 + lane < N ? wrow0 + lane : N - 1;
  const unsigned char* wrow = reinterpret_cast<const unsigned char*>(w) + ((long long)grow * K + kb) * WB;
  auto issue = [&](int i) {
    const int cols = kvalid - i * SC < SC ? kvalid - i * SC : SC;
    const unsigned bar = bar0 + 8 * (i % S);
    if (lane == 0) bk_expect(bar, (unsigned)(ROWS * cols * WB));
    __syncwarp();
    if (lane < ROWS)
      bk_copy(ring + (i % S) * STAGE_BYTES + lane * RSB, wrow + i * SC * WB, (unsigned)(cols * WB), bar);
  };
  // the whole ring before the grid-dependency wait: weights never depend on the previous kernel
  for (int i = 0; i < S && i < nst; ++i) issue(i);

  // the previous kernel's outputs (x, residual) are read only from here on
${PDL_WAIT}
  if (warp == 0) {
    // x's slice per token (swiglu: gate's and up's; rms_norm: and the norm weight's), all on one mbarrier
    if (lane == 0) bk_expect(xbar, (unsigned)((XR * rows + (PROLOGUE == 1)) * kvalid * 2));
    __syncwarp();
    const unsigned short* xbits = reinterpret_cast<const unsigned short*>(x) + kb;
    constexpr long long XROW = PROLOGUE == 2 ? 2LL * K : (long long)K;  // swiglu: gate_up rows, gate then up
    for (int t = lane; t < rows; t += 32) {
      bk_copy(xs + t * XSB, xbits + t * XROW, kvalid * 2, xbar);
      if (PROLOGUE == 2) bk_copy(xs + (MB + t) * XSB, xbits + t * XROW + K, kvalid * 2, xbar);
    }
#if ${PROLOGUE} == 1
    if (lane == 31) bk_copy(xs + G_OFF, reinterpret_cast<const unsigned short*>(norm_weight) + kb, kvalid * 2, xbar);
#endif
  }

  float acc[MT][NT][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int j = 0; j < NT; ++j) acc[mt][j][0] = acc[mt][j][1] = acc[mt][j][2] = acc[mt][j][3] = 0.0f;

  // ldmatrix lane addresses: w matrices (rows 0-7 | 8-15) x (k 0-7 | 8-15) = a0..a3; x matrices: 8 tokens x k 8m..
  const unsigned a_lane = ((lane & 7) + 8 * ((lane >> 3) & 1)) * RSB + 16 * (lane >> 4);
  const unsigned b_lane = xs + (lane & 7) * XSB + 16 * (lane >> 3);
  bk_wait(xbar, 0);
  if (PROLOGUE != 0) {
    // the prologue's x, in place (see the header): thread i takes the 16-byte vectors i, i + 32 WARPS, ... of each
    // token's slice; tokens >= M and columns past the slice are never read
    const bk_u32x4 zero = {0u, 0u, 0u, 0u};
    const int nvec = kvalid / 8;
#pragma unroll 1
    for (int t0 = 0; t0 < rows; t0 += 8) {
      float ss[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};  // rms_norm: this lane's sums of x^2
#pragma unroll 1
      for (int v = threadIdx.x; v < nvec; v += WARPS * 32) {
        const bk_u32x4 gv = PROLOGUE == 1 ? *reinterpret_cast<const bk_u32x4*>(smem + G_OFF + 16 * v) : zero;
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          if (t0 + e < rows) {
            bk_u32x4* const p = reinterpret_cast<bk_u32x4*>(smem + (t0 + e) * XSB + 16 * v);
            const bk_u32x4 a = *p;
            const bk_u32x4 b = PROLOGUE == 2 ? *reinterpret_cast<const bk_u32x4*>(smem + (MB + t0 + e) * XSB + 16 * v)
                                             : zero;
            float y[8];
#pragma unroll
            for (int i = 0; i < 8; ++i) {
              const float av = bk_bf16_at(a, i);
              if (PROLOGUE == 1) {
                ss[e] += av * av;
                y[i] = av * bk_bf16_at(gv, i);
              } else {
                y[i] = bk_swiglu(av, bk_bf16_at(b, i));
              }
            }
            *p = {bk_pack(y[0], y[1]), bk_pack(y[2], y[3]), bk_pack(y[4], y[5]), bk_pack(y[6], y[7])};
          }
        }
      }
      if (PROLOGUE == 1) {  // the warp's sums of the 8 tokens (splitk.cuh): lane L holds token (L >> 2) & 7's
        const float sum = gemv_warp_sum8(ss, lane);
        const int t = t0 + ((lane >> 2) & 7);
        if ((lane & 3) == 0 && t < rows) ssq[t * WARPS + warp] = sum;
      }
    }
    __syncthreads();  // every thread's x (and sums of squares) are in shared memory
  }
#pragma unroll 1
  for (int i = 0; i < nst; ++i) {
    const int cols = kvalid - i * SC < SC ? kvalid - i * SC : SC;
    bk_wait(bar0 + 8 * (i % S), (unsigned)(i / S) & 1u);
    const unsigned stage = ring + (i % S) * STAGE_BYTES + a_lane;
    if (WB == 1) {  // e4m3: one ldmatrix.x4 per 16 rows and 32 columns, x by 8-byte loads (see the header)
#pragma unroll
      for (int st = 0; st < SC / 32; ++st) {
        if (32 * st < cols) {  // the same for the whole warp
          unsigned a[MT][2][4];  // [mt][half: columns 0-15 | 16-31][mma A fragment]
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            unsigned r[4];  // rows g | g+8 (columns 4q..4q+3), then the same of columns 16..31
            bk_ldsm4(r, stage + mt * 16 * RSB + 32 * st);
#pragma unroll
            for (int h = 0; h < 2; ++h) {
              qg_e4m3x4_bf16(r[2 * h], a[mt][h][0], a[mt][h][2]);
              qg_e4m3x4_bf16(r[2 * h + 1], a[mt][h][1], a[mt][h][3]);
            }
          }
#pragma unroll
          for (int j = 0; j < NT; ++j) {
            if (8 * j < rows) {  // token tiles past M: nothing to compute
              unsigned b[2][2];
              const unsigned xa = xs + (8 * j + g) * XSB + 2 * (i * SC + 32 * st + 4 * q);
              bk_lds64(b[0], xa);
              bk_lds64(b[1], xa + 32);
#pragma unroll
              for (int mt = 0; mt < MT; ++mt) {
                bk_mma(acc[mt][j], a[mt][0], b[0][0], b[0][1]);
                bk_mma(acc[mt][j], a[mt][1], b[1][0], b[1][1]);
              }
            }
          }
        }
      }
    } else {
#pragma unroll
      for (int st = 0; st < SC / 32; ++st) {
        if (32 * st < cols) {  // the same for the whole warp
          unsigned a[MT][2][4];
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            bk_ldsm4(a[mt][0], stage + mt * 16 * RSB + 64 * st);
            bk_ldsm4(a[mt][1], stage + mt * 16 * RSB + 64 * st + 32);
          }
#pragma unroll
          for (int j = 0; j < NT; ++j) {
            if (8 * j < rows) {  // token tiles past M: nothing to compute
              unsigned b[4];
              bk_ldsm4(b, b_lane + 8 * j * XSB + 2 * (i * SC + 32 * st));
#pragma unroll
              for (int mt = 0; mt < MT; ++mt) {
                bk_mma(acc[mt][j], a[mt][0], b[0], b[1]);
                bk_mma(acc[mt][j], a[mt][1], b[2], b[3]);
              }
            }
          }
        }
      }
    }
    __syncwarp();  // every lane's ldmatrix of this slot is done: refill it
    if (i + S < nst) issue(i + S);
  }

  const int row0 = wrow0 + g;  // tile mt: rows row0 + 16 mt (+ 8)
  if (SPLITK > 1) {  // the partial tile -> workspace; the row block's last CTA sums them (splitk.cuh)
    float* ws = SK::slot(${KERNEL}_ws, warp, lane);
    SK::store(ws, acc, q, rows);
    if (PROLOGUE == 1) SK::store_ss<WARPS>(${KERNEL}_ss, ssq, rows, threadIdx.x);  // this slice's sums of x^2
    if (!SK::last(${KERNEL}_cnt, is_last, threadIdx.x)) return;
    SK::reduce(ws, acc, q, rows, ${KERNEL}_cnt, threadIdx.x);
  }

  float inv[NT][2];  // rms_norm: 1 / rms of tokens 8 j + 2 q + h < M (splitk.cuh)
  if (PROLOGUE == 1) SK::inv_rms<WARPS, K, false>(inv, ${KERNEL}_ss, ssq, q, ${EPS}, rows);

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
          if (PROLOGUE == 1) y *= inv[j][r & 1];
          if (WB == 1) y *= w_scale[n];  // the output channel's scale
          if (${HAS_BIAS}) y += to_f32(bias[n]);
          if (${HAS_RESIDUAL}) y += gemv_ld_bf16_after_wait(residual + (long long)t * N + n);
          out[(long long)t * N + n] = from_f32<bf16>(y);
        }
      }
}
