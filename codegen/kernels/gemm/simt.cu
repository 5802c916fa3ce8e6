#include "../common.cuh"
#include "epilogue.cuh"

// out[M, N] = x[M, K] @ w[N, K]^T, fp32 FMA on ${BM}x${BN} tiles (256 threads, 4x4 outputs each).
// Any storage types: x ${XT}, w ${WT} (fp8 weights with a per-output-channel float scale).
extern "C" __global__ void __launch_bounds__(256) ${KERNEL}(
    const ${XT}* __restrict__ x, const ${WT}* __restrict__ w, const float* __restrict__ w_scale,
    const ${XT}* __restrict__ bias, const ${XT}* __restrict__ residual, ${XT}* __restrict__ out, long long M) {
  constexpr int N = ${N}, K = ${K}, BM = ${BM}, BN = ${BN}, BK = ${BK};
  static_assert(BM == 64 && BN == 64, "thread layout assumes 64x64 tiles");
  __shared__ float As[BK][BM + 4];
  __shared__ float Ws[BK][BN + 4];
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  const i64 m0 = (i64)blockIdx.y * BM;
  const int n0 = blockIdx.x * BN;
  float acc[4][4] = {};
  for (int k0 = 0; k0 < K; k0 += BK) {
    for (int idx = threadIdx.x; idx < BM * BK; idx += 256) {
      const int r = idx / BK, c = idx % BK;
      const i64 m = m0 + r;
      const int k = k0 + c;
      As[c][r] = (m < M && k < K) ? to_f32(x[m * K + k]) : 0.0f;
    }
    for (int idx = threadIdx.x; idx < BN * BK; idx += 256) {
      const int r = idx / BK, c = idx % BK;
      const int n = n0 + r, k = k0 + c;
      Ws[c][r] = (n < N && k < K) ? to_f32(w[(i64)n * K + k]) : 0.0f;
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < BK; ++kk) {
      float a[4], b[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        a[i] = As[kk][ty * 4 + i];
        b[i] = Ws[kk][tx * 4 + i];
      }
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const i64 m = m0 + ty * 4 + i;
      const int n = n0 + tx * 4 + j;
      if (m < M && n < N)
        store_linear<${XT}, ${XT}, ${HAS_SCALE}, ${HAS_BIAS}, ${HAS_RESIDUAL}>(out, w_scale, bias, residual, m, n, N,
                                                                             acc[i][j]);
    }
}
