#include "../common.cuh"
#include "epilogue.cuh"

// out[M, N] = x[M, K] @ w[N, K]^T on tensor cores: mma.sync m16n8k16 bf16 -> f32, ${BM}x${BN}x${BK}
// tiles, 4 warps in 2x2, each warp 32x32 (2 x 4 MMA tiles). x is bf16; w is bf16 or fp8 e4m3
// (every e4m3 value is exact in bf16, so fp8 weights widen losslessly in shared memory and their
// per-channel scale is applied in the epilogue). This is the straightforward, correct kernel: the
// wgmma (sm_90a) and tcgen05 (sm_100a) GEMMs replace it where speed matters.
__device__ __forceinline__ unsigned short bf16_bits(bf16 v) { return v.bits; }
__device__ __forceinline__ unsigned short bf16_bits(fp8e4m3 v) { return from_f32<bf16>(to_f32(v)).bits; }

extern "C" __global__ void __launch_bounds__(128) ${KERNEL}(
    const bf16* __restrict__ x, const ${WT}* __restrict__ w, const float* __restrict__ w_scale,
    const ${OT}* __restrict__ bias, const ${OT}* __restrict__ residual, ${OT}* __restrict__ out, long long M) {
  constexpr int N = ${N}, K = ${K}, BM = ${BM}, BN = ${BN}, BK = ${BK}, LDS = BK + 8;
  static_assert(BM == 64 && BN == 64 && BK % 16 == 0, "warp layout assumes 64x64 tiles");
  __shared__ __align__(16) unsigned short As[BM][LDS];
  __shared__ __align__(16) unsigned short Ws[BN][LDS];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int wm = (warp >> 1) * 32, wn = (warp & 1) * 32, g = lane >> 2, q = lane & 3;
  const i64 m0 = (i64)blockIdx.y * BM;
  const int n0 = blockIdx.x * BN;
  float acc[2][4][4] = {};
  for (int k0 = 0; k0 < K; k0 += BK) {
    for (int idx = threadIdx.x; idx < BM * BK; idx += 128) {
      const int r = idx / BK, c = idx % BK;
      const i64 m = m0 + r;
      const int k = k0 + c;
      As[r][c] = (m < M && k < K) ? x[m * K + k].bits : (unsigned short)0;
    }
    for (int idx = threadIdx.x; idx < BN * BK; idx += 128) {
      const int r = idx / BK, c = idx % BK;
      const int n = n0 + r, k = k0 + c;
      Ws[r][c] = (n < N && k < K) ? bf16_bits(w[(i64)n * K + k]) : (unsigned short)0;
    }
    __syncthreads();
#pragma unroll
    for (int ks = 0; ks < BK; ks += 16) {
      unsigned a[2][4], b[4][2];
#pragma unroll
      for (int mi = 0; mi < 2; ++mi) {
        const int r = wm + mi * 16 + g, c = ks + q * 2;
        a[mi][0] = *reinterpret_cast<const unsigned*>(&As[r][c]);
        a[mi][1] = *reinterpret_cast<const unsigned*>(&As[r + 8][c]);
        a[mi][2] = *reinterpret_cast<const unsigned*>(&As[r][c + 8]);
        a[mi][3] = *reinterpret_cast<const unsigned*>(&As[r + 8][c + 8]);
      }
#pragma unroll
      for (int ni = 0; ni < 4; ++ni) {
        const int r = wn + ni * 8 + g, c = ks + q * 2;
        b[ni][0] = *reinterpret_cast<const unsigned*>(&Ws[r][c]);
        b[ni][1] = *reinterpret_cast<const unsigned*>(&Ws[r][c + 8]);
      }
#pragma unroll
      for (int mi = 0; mi < 2; ++mi)
#pragma unroll
        for (int ni = 0; ni < 4; ++ni) {
          float* d = acc[mi][ni];
          asm volatile(
              "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
              "{%0,%1,%2,%3};"
              : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
              : "r"(a[mi][0]), "r"(a[mi][1]), "r"(a[mi][2]), "r"(a[mi][3]), "r"(b[ni][0]), "r"(b[ni][1]));
        }
    }
    __syncthreads();
  }
#pragma unroll
  for (int mi = 0; mi < 2; ++mi)
#pragma unroll
    for (int ni = 0; ni < 4; ++ni)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const i64 m = m0 + wm + mi * 16 + g + (e >= 2 ? 8 : 0);
        const int n = n0 + wn + ni * 8 + q * 2 + (e & 1);
        if (m < M && n < N)
          store_linear<${OT}, ${OT}, ${HAS_SCALE}, ${HAS_BIAS}, ${HAS_RESIDUAL}>(out, w_scale, bias, residual, m, n,
                                                                               N, acc[mi][ni][e]);
      }
}
