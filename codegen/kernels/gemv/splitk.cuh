#include "../common.cuh"

// The decode GEMV templates' split-K tail (kernel.cu, quant.cu, bulk.cu). With split-K over CTAs
// (grid.y = SPLITK slices of K), each CTA stores its partial tile in a module-scope f32 workspace
// [split][row block][warp][mt][j][reg][lane], the last CTA of a row block (an atomic counter per row block, reset by
// that CTA for the next launch) sums the partials in slice order (deterministic) and runs the epilogue. One launch
// at a time per module (stream order) may use the workspace.
//
// A thread's accumulators are acc[mt][j][r] of the mma.sync m16n8 tiles: r = 0, 1 are (row g, tokens 8 j + 2 q,
// 8 j + 2 q + 1) of 16-row tile mt, r = 2, 3 the same tokens of row g + 8. MB tokens (NT = MB / 8 n-tiles), BN rows
// a CTA, GX row blocks. tid: the kernel's threadIdx.x, read in the kernel, where the compiler knows its range from the
// launch bounds (read in here it gets the generic range, and the merged reads lose the kernel's: other code changes).
// The epilogue (bias, residual, store) stays in each template: in a function here its address arithmetic came out in
// another order and kernel.cu's and quant.cu's SASS (the variants measured on the H200) changed.
template <int MT, int NT, int MB, int BN, int GX, int SPLITK>
struct GemvSplitK {
  // this thread's slot of its row block in the workspace's first split
  static __device__ __forceinline__ float* slot(float* ws, int warp, int lane) {
    return ws + (i64)blockIdx.x * BN * MB + warp * (MT * NT * 4 * 32) + lane;
  }

  // the partial tile -> this CTA's split (tokens >= rows are not stored)
  static __device__ __forceinline__ void store(float* ws, const float (&acc)[MT][NT][4], int q, int rows) {
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
  }

  // after every thread's stores: true in the row block's last CTA (for every thread of it). is_last: a __shared__
  // word of the kernel's
  static __device__ __forceinline__ bool last(unsigned* cnt, unsigned& is_last, unsigned tid) {
    __threadfence();
    __syncthreads();
    if (tid == 0) {
      unsigned prev;
      asm volatile("atom.global.add.u32 %0, [%1], 1;" : "=r"(prev) : "l"(&cnt[blockIdx.x]) : "memory");
      is_last = prev == SPLITK - 1;
    }
    __syncthreads();
    return is_last;
  }

  // in the last CTA: acc = the sum of the splits' partials in slice order, then the counter reset for the next launch
  static __device__ __forceinline__ void reduce(const float* ws, float (&acc)[MT][NT][4], int q, int rows,
                                                unsigned* cnt, unsigned tid) {
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
    if (tid == 0) cnt[blockIdx.x] = 0u;  // ready for the next launch
  }

  // a warp's tile in memory, [mt][j][reg][lane] f32 (TILE floats; p: this lane's first element): stored, loaded
  static constexpr int TILE = MT * NT * 4 * 32;
  static __device__ __forceinline__ void put(float* p, const float (&acc)[MT][NT][4]) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int r = 0; r < 4; ++r) p[((mt * NT + j) * 4 + r) * 32] = acc[mt][j][r];
  }
  static __device__ __forceinline__ void get(const float* p, float (&acc)[MT][NT][4]) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int r = 0; r < 4; ++r) acc[mt][j][r] = p[((mt * NT + j) * 4 + r) * 32];
  }

  // row groups (kernel.cu, quant.cu: KW warps a group, GROUPS groups a CTA): warp kw of group rg holds a partial tile of
  // the group's rows over its part of the K slice; warps kw > 0 store theirs in red (x's shared-memory region, free
  // once the products are done: [KW - 1][GROUPS][mt][j][reg][lane] f32), the group's first warp adds them in warp
  // order (deterministic). Every thread of the CTA calls it (two __syncthreads).
  template <int KW, int GROUPS>
  static __device__ __forceinline__ void row_group_sum(float* red, float (&acc)[MT][NT][4], int kw, int rg, int lane) {
    __syncthreads();
    if (kw) put(red + ((kw - 1) * GROUPS + rg) * TILE + lane, acc);
    __syncthreads();
    if (!kw) {
#pragma unroll 1
      for (int o = 1; o < KW; ++o) {
        const float* theirs = red + ((o - 1) * GROUPS + rg) * TILE + lane;
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
          for (int j = 0; j < NT; ++j)
#pragma unroll
            for (int r = 0; r < 4; ++r) acc[mt][j][r] += theirs[((mt * NT + j) * 4 + r) * 32];
      }
    }
  }

  // rms_norm prologues: token t's sum of x^2 over this CTA's slice, from the warps' sums ssq [token][warp], in warp
  // order
  template <int WARPS>
  static __device__ __forceinline__ float slice_ss(const float* ssq, int t) {
    float v = 0.0f;
    for (int w = 0; w < WARPS; ++w) v += ssq[t * WARPS + w];
    return v;
  }

  // rms_norm prologues (workspace ss [split][row block][token]): this slice's sum of x^2 of token tid, from the
  // warps' sums ssq [token][warp] in warp order
  template <int WARPS>
  static __device__ __forceinline__ void store_ss(float* ss, const float* ssq, int rows, unsigned tid) {
    if (tid < rows) {
      const float v = slice_ss<WARPS>(ssq, tid);
      float* pw = ss + ((i64)blockIdx.y * GX + blockIdx.x) * MB + tid;
      asm volatile("st.global.cg.f32 [%0], %1;" ::"l"(pw), "f"(v) : "memory");
    }
  }

  // token t's sum of x^2 over the slices, in slice order
  static __device__ __forceinline__ float sum_ss(const float* ss, int t) {
    float v = 0.0f;
    for (int sk = 0; sk < SPLITK; ++sk) {
      const float* pw = ss + ((i64)sk * GX + blockIdx.x) * MB + t;
      float s;
      asm volatile("ld.global.cg.f32 %0, [%1];" : "=f"(s) : "l"(pw) : "memory");
      v += s;
    }
    return v;
  }

  // rms_norm prologues: inv[j][h] = 1 / rms of token t = 8 j + 2 q + h (the tokens of this thread's accumulator
  // columns), from the sums of x^2 over the slices (in slice order) or over the CTA's warps (ssq). ALL (kernel.cu,
  // whose sums are defined for every token): all MB tokens, so that all loads issue at once; else (bulk.cu, whose
  // sums of tokens >= M are never written) only t < rows, 1 for the others (their columns are never stored)
  template <int WARPS, int K, bool ALL>
  static __device__ __forceinline__ void inv_rms(float (&inv)[NT][2], const float* ss, const float* ssq, int q,
                                                 float eps, int rows) {
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int t = 8 * j + 2 * q + h;
        if (ALL || t < rows) {
          const float v = SPLITK > 1 ? sum_ss(ss, t) : slice_ss<WARPS>(ssq, t);
          inv[j][h] = rsqrtf(v * (1.0f / K) + eps);
        } else {
          inv[j][h] = 1.0f;
        }
      }
  }
};

// rms_norm prologues (kernel.cu, bulk.cu): a warp's per-lane partial sums of x^2 of 8 tokens -> the warp's sum of
// token (lane >> 2) & 7, in 9 shuffles: each xor step over 16, 8, 4 halves the values a lane keeps (lane bit 4, 3, 2
// picks the upper half); xor 2, 1 finish. ss is consumed.
__device__ __forceinline__ float gemv_warp_sum8(float (&ss)[8], int lane) {
#pragma unroll
  for (int o = 16, n = 4; o >= 4; o >>= 1, n >>= 1) {
    const bool upper = lane & o;
#pragma unroll
    for (int i = 0; i < n; ++i) {
      const float keep = upper ? ss[n + i] : ss[i], give = upper ? ss[i] : ss[n + i];
      ss[i] = keep + __shfl_xor_sync(0xffffffffu, give, o);
    }
  }
  ss[0] += __shfl_xor_sync(0xffffffffu, ss[0], 2);
  ss[0] += __shfl_xor_sync(0xffffffffu, ss[0], 1);
  return ss[0];
}

// bf16 at p, read after the grid-dependency wait with a coherent load that ptxas keeps on its side of it (volatile: to
// the compiler a plain asm is a pure function; see kernel.cu's header)
__device__ __forceinline__ float gemv_ld_bf16_after_wait(const bf16* p) {
  unsigned short u;
  asm volatile("ld.global.u16 %0, [%1];" : "=h"(u) : "l"(p));
  return to_f32(bf16{u});
}
