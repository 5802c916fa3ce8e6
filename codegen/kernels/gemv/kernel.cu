#include "../common.cuh"

// Skinny GEMM / GEMV for decode steps: out[M, N] = x[M, K] @ w[N, K]^T (+ bias[N]) (+ residual[M, N]),
// bf16 in and out, f32 accumulate, for M <= ${MB} tokens (one variant per token bucket; the executor picks
// the variant by the step's M, see codegen/kernels/gemv/rule.py). Memory-bound design:
//
// - the weight matrix streams through registers once: a warp owns 16 x ${MT} rows of w and one K slice of
//   ${KS}; each lane loads 16 B (8 bf16) of rows g and g+8 of each 16-row tile per 32-column step
//   (ld.global.nc, no L1 allocation), ${U} steps per stage, two stages in flight (register double buffering);
// - the CTA's K slice of x (M x ${KS}, zero-padded to ${MB} tokens) sits in shared memory, shared by
//   the CTA's ${WARPS} warps (16 x ${MT} rows each; each x fragment read from shared memory serves ${MT} MMAs);
// - tensor cores do the products: mma.sync m16n8k16 with w as the A operand (16 rows) and x as B
//   (8 tokens per n-tile). The K order inside each 32-column step is permuted identically for w and x
//   (lane q holds physical columns 8q..8q+7 = logical k {2q, 2q+1, 2q+8, 2q+9} of two k16 MMAs), so
//   both operands load as whole 16-byte vectors straight into fragment registers;
// - split-K over CTAs (grid.y = ${SPLITK}): each CTA stores its partial tile in a module-scope f32
//   workspace, and the last CTA of a row block (atomic counter, reset by that CTA for the next launch)
//   sums the partials in a fixed order (deterministic) and runs the epilogue. One launch at a time per
//   module (stream order) may use the workspace.
// - programmatic dependent launch: the weights do not depend on the kernel before this one, so the CTA loads its
//   first stage of weights into registers *before* waiting for that kernel's grid; only x (its output) is read
//   after the wait. Launched early (PDL), the weight stream so starts during the previous kernel's tail. (Asking
//   L2 for the whole K slice there as well was measured slower on the H200: docs/PERF.md, "Decode GEMV ... PDL".)
// - prologue (${PROLOGUE}; codegen/decode_fusion.py): x may be computed while it is staged, so that the per-token op
//   that would have produced it needs no launch of its own in decode steps. 1: rms_norm: x is the norm's input, each
//   CTA sums its tokens' whole rows (in the order of the norm kernel's ${NORM_BLOCK}-thread block, so the result is
//   bit-identical to codegen/kernels/norm/kernel.cu's) and stages x * inv_rms * norm_weight rounded to bf16; extra
//   parameter norm_weight. 2: packed swiglu: x is the [M, 2K] gate_up buffer, staged as silu(gate) * up rounded to
//   bf16 as codegen/kernels/activation/kernel.cu rounds it. Both read only the previous kernels' outputs, after the
//   grid-dependency wait.
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
__device__ __forceinline__ void gemv_mma(float* d, unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned b0,
                                         unsigned b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
// element e (0..7) of 8 packed bf16, as f32
__device__ __forceinline__ float gemv_bf16_at(const u32x4& v, int e) {
  const unsigned u = e < 2 ? v.x : e < 4 ? v.y : e < 6 ? v.z : v.w;
  return __uint_as_float(e & 1 ? u & 0xffff0000u : u << 16);
}
__device__ __forceinline__ unsigned gemv_pack(float lo, float hi) {
  return (unsigned)from_f32<bf16>(lo).bits | ((unsigned)from_f32<bf16>(hi).bits << 16);
}

namespace {
constexpr int N = ${N}, K = ${K}, MB = ${MB}, NT = MB / 8, WARPS = ${WARPS}, MT = ${MT}, BN = 16 * MT * WARPS;
constexpr int KS = ${KS}, SPLITK = ${SPLITK}, U = ${U}, STEPS = KS / 32, NS = STEPS / U;
constexpr int LDX = KS + 32;  // x row stride in shared memory (bf16): +64 B keeps the 16-B fragment loads conflict-free
constexpr int GX = (N + BN - 1) / BN;
static_assert(MB % 8 == 0 && MB <= 64, "MB: 8..64 tokens");
static_assert(KS % (32 * U) == 0 && K % 32 == 0, "K slices are whole stages of 32-column steps");
static_assert(SPLITK * KS >= K && (SPLITK - 1) * KS < K, "SPLITK slices cover K");
// prologue 1 (rms_norm): the norm kernel's block (NB threads, NP elements each: thread j holds x[j + i NB]); a lane
// here plays 8 of its threads (one 16-byte load), a warp 256 of them per pass
constexpr int PROLOGUE = ${PROLOGUE}, NB = ${NORM_BLOCK}, NP = ${NORM_P}, NVW = NB / 32, NPASS = (NB + 255) / 256;
static_assert(PROLOGUE != 1 || (NB % 32 == 0 && NB <= 1024 && NB * NP >= K), "rms_norm prologue: the norm's block");
}  // namespace

__device__ float ${KERNEL}_ws[SPLITK > 1 ? SPLITK * GX * BN * MB : 1];
__device__ unsigned ${KERNEL}_cnt[GX];

extern "C" __global__ void __launch_bounds__(WARPS * 32) ${KERNEL}(
    const bf16* __restrict__ x, const bf16* __restrict__ w, const float* __restrict__ w_scale,
    const bf16* __restrict__ bias, const bf16* __restrict__ residual, bf16* __restrict__ out, long long M
#if ${PROLOGUE} == 1
    , const bf16* __restrict__ norm_weight
#endif
    ) {
#if ${PROLOGUE} != 1
  const bf16* const norm_weight = nullptr;  // only the rms_norm prologue has this parameter
#endif
  extern __shared__ __align__(16) unsigned short xs[];  // [MB][LDX]
  __shared__ unsigned is_last;
  __shared__ float inv_rms[PROLOGUE == 1 ? MB : 1];
  if (M > MB) __trap();  // the executor launches this variant only for M <= MB
  const int rows = (int)M;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, q = lane & 3;
  const int row0 = blockIdx.x * BN + warp * 16 * MT + g;  // tile mt: rows row0 + 16 mt (+ 8)
  const int kb = blockIdx.y * KS;
  const unsigned short* wbits = reinterpret_cast<const unsigned short*>(w);
  const unsigned short* p[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = row0 + 16 * mt + 8 * h;
      p[mt][h] = wbits + (i64)(r < N ? r : N - 1) * K + kb + 8 * q;
    }

  u32x4 buf[2][U][MT][2];
  // stage 0 of w first, so the weight stream starts before x is staged
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const bool ok = (K % KS == 0) || kb + 32 * u < K;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) buf[0][u][mt][h] = ok ? gemv_ld_stream(p[mt][h] + 32 * u) : u32x4{0, 0, 0, 0};
  }
  // the previous kernel's outputs (x, residual) are read only from here on
${PDL_WAIT}
  const unsigned short* xbits = reinterpret_cast<const unsigned short*>(x);
  if (PROLOGUE == 1) {
    // 1 / rms of each token's row, one warp per token, summed exactly as the norm kernel sums: its thread j adds
    // x[j + i NB]^2 for i = 0, 1, ... in turn; block_sum then runs a butterfly (xor 16, 8, 4, 2, 1) in each of its
    // warps and one more over the warps' sums (zeros past NVW). Lane L holds norm threads 256 p + 8 L + e (e < 8)
    // in pass p: norm lane 8 (L & 3) + e of norm warp 8 p + L / 4, so xor 16 and 8 are shuffles with lanes L ^ 2
    // and L ^ 1, and xor 4, 2, 1 stay in the lane. f32 additions are commutative, so every pair sums alike.
    for (int t = warp; t < rows; t += WARPS) {
      const unsigned short* xr = xbits + (i64)t * K;
      float part[NPASS];
#pragma unroll
      for (int p = 0; p < NPASS; ++p) {
        const int j0 = 256 * p + 8 * lane;
        float s[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
        if (j0 < NB) {
#pragma unroll 4
          for (int i = 0; i < NP; ++i) {
            const int h = j0 + i * NB;  // K and NB are multiples of 8: all 8 columns are in the row or none
            if (h < K) {
              const u32x4 v = gemv_ld_x(xr + h);
#pragma unroll
              for (int e = 0; e < 8; ++e) {
                const float a = gemv_bf16_at(v, e);
                s[e] += a * a;
              }
            }
          }
        }
#pragma unroll
        for (int e = 0; e < 8; ++e) s[e] += __shfl_xor_sync(0xffffffffu, s[e], 2);
#pragma unroll
        for (int e = 0; e < 8; ++e) s[e] += __shfl_xor_sync(0xffffffffu, s[e], 1);
#pragma unroll
        for (int o = 4; o > 0; o >>= 1) {
          float n[8];
#pragma unroll
          for (int e = 0; e < 8; ++e) n[e] = s[e] + s[e ^ o];
#pragma unroll
          for (int e = 0; e < 8; ++e) s[e] = n[e];
        }
        part[p] = s[0];
      }
      float v = 0.0f;  // block_sum's second stage: lane l holds norm warp l's sum
#pragma unroll
      for (int p = 0; p < NPASS; ++p) {
        const float o = __shfl_sync(0xffffffffu, part[p], 4 * (lane & 7));
        if (lane < NVW && lane / 8 == p) v = o;
      }
      v = warp_sum(v);
      if (lane == 0) inv_rms[t] = 1.0f / sqrtf(v / K + ${EPS});
    }
    __syncthreads();
  }
  // x[0:M, kb:kb+KS] -> shared memory (tokens >= M and columns >= K are zeros), through the prologue
  for (int i = threadIdx.x; i < MB * (KS / 8); i += WARPS * 32) {
    const int t = i / (KS / 8), c = (i % (KS / 8)) * 8;
    u32x4 v = {0, 0, 0, 0};
    if (t < rows && kb + c < K) {
      if (PROLOGUE == 1) {  // the norm kernel's y = x * inv * w, rounded to bf16
        const u32x4 a = gemv_ld_x(xbits + (i64)t * K + kb + c);
        const u32x4 nw = gemv_ld_x(norm_weight + kb + c);
        const float inv = inv_rms[t];
        float y[8];
#pragma unroll
        for (int e = 0; e < 8; ++e) y[e] = gemv_bf16_at(a, e) * inv * gemv_bf16_at(nw, e);
        v = {gemv_pack(y[0], y[1]), gemv_pack(y[2], y[3]), gemv_pack(y[4], y[5]), gemv_pack(y[6], y[7])};
      } else if (PROLOGUE == 2) {  // the activation kernel's silu(gate) * up, rounded to bf16
        const u32x4 ga = gemv_ld_x(xbits + (i64)t * 2 * K + kb + c);
        const u32x4 up = gemv_ld_x(xbits + (i64)t * 2 * K + K + kb + c);
        float y[8];
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          const float av = gemv_bf16_at(ga, e), bv = gemv_bf16_at(up, e);
          const float g = av / (1.0f + expf(-(${ALPHA}) * av));
          y[e] = g * bv;
        }
        v = {gemv_pack(y[0], y[1]), gemv_pack(y[2], y[3]), gemv_pack(y[4], y[5]), gemv_pack(y[6], y[7])};
      } else {
        v = gemv_ld_x(xbits + (i64)t * K + kb + c);
      }
    }
    *reinterpret_cast<u32x4*>(&xs[t * LDX + c]) = v;
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
        const bool ok = (K % KS == 0) || kb + 32 * step < K;
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
          for (int h = 0; h < 2; ++h)
            buf[(s + 1) & 1][u][mt][h] = ok ? gemv_ld_stream(p[mt][h] + 32 * step) : u32x4{0, 0, 0, 0};
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int col = 32 * (s * U + u) + 8 * q;
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        const u32x4 xv = *reinterpret_cast<const u32x4*>(&xs[(8 * j + g) * LDX + col]);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          const u32x4 a = buf[s & 1][u][mt][0], b = buf[s & 1][u][mt][1];
          gemv_mma(acc[mt][j], a.x, b.x, a.y, b.y, xv.x, xv.y);
          gemv_mma(acc[mt][j], a.z, b.z, a.w, b.w, xv.z, xv.w);
        }
      }
    }
  }

  if (SPLITK > 1) {
    // partial tile -> workspace [split][row block][warp][mt][j][reg][lane]; the row block's last CTA sums them
    float* ws = ${KERNEL}_ws + (i64)blockIdx.x * BN * MB + warp * (MT * NT * 4 * 32) + lane;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int r = 0; r < 4; ++r)
          if (8 * j + 2 * q + (r & 1) < rows) {
            float* pw = ws + (i64)blockIdx.y * GX * BN * MB + ((mt * NT + j) * 4 + r) * 32;
            asm volatile("st.global.cg.f32 [%0], %1;" ::"l"(pw), "f"(acc[mt][j][r]) : "memory");
          }
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
      unsigned prev;
      asm volatile("atom.global.add.u32 %0, [%1], 1;" : "=r"(prev) : "l"(&${KERNEL}_cnt[blockIdx.x]) : "memory");
      is_last = prev == SPLITK - 1;
    }
    __syncthreads();
    if (!is_last) return;
    __threadfence();
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int r = 0; r < 4; ++r)
          if (8 * j + 2 * q + (r & 1) < rows) {
            float sum = 0.0f;
            for (int sk = 0; sk < SPLITK; ++sk) {
              const float* pw = ws + (i64)sk * GX * BN * MB + ((mt * NT + j) * 4 + r) * 32;
              float v;
              asm volatile("ld.global.cg.f32 %0, [%1];" : "=f"(v) : "l"(pw) : "memory");
              sum += v;
            }
            acc[mt][j][r] = sum;
          }
    if (threadIdx.x == 0) ${KERNEL}_cnt[blockIdx.x] = 0u;  // ready for the next launch
  }

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
          if (${HAS_BIAS}) y += to_f32(bias[n]);
          if (${HAS_RESIDUAL}) y += to_f32(residual[(i64)t * N + n]);
          out[(i64)t * N + n] = from_f32<bf16>(y);
        }
      }
}
