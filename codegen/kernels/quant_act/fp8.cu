#include "../common.cuh"

// FP8 activations for the FP8 GEMM (gemm_cutlass/sm90.cu, sm100.cu; W8A8 prefill steps, codegen/quant_prefill.py):
// x bf16[M, ${K}] -> x_fp8 e4m3[M, ${K}] and x_scale f32[M], the GEMM epilogue's row scale. What
// ir/ops/quantized.py quantize_activation("fp8") computes, bit for bit: per row scale = amax / 448 (1 for an all-zero
// row; ir/quant/formats.py quantize_fp8_per_token), or STATIC the calibrated input_scale[0] for every row
// (quantize_fp8_static); code = e4m3(x / scale), one IEEE f32 division each, RNE, saturating at +-448.
// One block of ${BLOCK} threads per row: each thread holds its CHUNKS 16-byte chunks of the row (8 values each) in
// registers between the row's max and its conversion, so x is read once; codes are stored 8 bytes a chunk.
namespace {
constexpr int K = ${K};
constexpr int BLOCK = ${BLOCK};
constexpr bool STATIC = ${STATIC};
constexpr int ROW_CHUNKS = K / 8;
constexpr int CHUNKS = (ROW_CHUNKS + BLOCK - 1) / BLOCK;
static_assert(K % 16 == 0, "the FP8 GEMM's rows are 16-byte multiples");

// two f32 -> their e4m3 codes, lo in the low byte (cvt.rn.satfinite: RNE, +-448 at most, NaN stays NaN)
__device__ __forceinline__ unsigned e4m3x2(float lo, float hi) {
  unsigned short pair;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(pair) : "f"(hi), "f"(lo));
  return pair;
}

__device__ __forceinline__ unsigned codes4(unsigned a, unsigned b, float scale) {  // two bf16 pairs -> 4 codes
  return e4m3x2(__fdiv_rn(__uint_as_float(a << 16), scale), __fdiv_rn(__uint_as_float(a & 0xffff0000u), scale)) |
         e4m3x2(__fdiv_rn(__uint_as_float(b << 16), scale), __fdiv_rn(__uint_as_float(b & 0xffff0000u), scale)) << 16;
}
}  // namespace

extern "C" __global__ void __launch_bounds__(BLOCK) ${KERNEL}(
    const bf16* __restrict__ x, const float* __restrict__ input_scale, unsigned char* __restrict__ x_fp8,
    float* __restrict__ x_scale, long long M) {
  const i64 row = blockIdx.x;
  if (row >= M) return;
  const uint4* xr = reinterpret_cast<const uint4*>(x + row * K);
  uint4 v[CHUNKS];
  float amax = 0.0f;
#pragma unroll
  for (int c = 0; c < CHUNKS; ++c) {
    const int i = threadIdx.x + c * BLOCK;
    v[c] = i < ROW_CHUNKS ? xr[i] : make_uint4(0, 0, 0, 0);
    const unsigned w[4] = {v[c].x, v[c].y, v[c].z, v[c].w};
#pragma unroll
    for (int j = 0; j < 4; ++j)
      amax = fmaxf(amax, fmaxf(fabsf(__uint_as_float(w[j] << 16)), fabsf(__uint_as_float(w[j] & 0xffff0000u))));
  }
  float scale;
  if (STATIC) {
    scale = input_scale[0];
  } else {
    scale = __fdiv_rn(block_max(amax), 448.0f);
    scale = scale > 0.0f ? scale : 1.0f;
  }
  if (threadIdx.x == 0) x_scale[row] = scale;
  uint2* qr = reinterpret_cast<uint2*>(x_fp8 + row * K);
#pragma unroll
  for (int c = 0; c < CHUNKS; ++c) {
    const int i = threadIdx.x + c * BLOCK;
    if (i < ROW_CHUNKS) qr[i] = make_uint2(codes4(v[c].x, v[c].y, scale), codes4(v[c].z, v[c].w, scale));
  }
}
