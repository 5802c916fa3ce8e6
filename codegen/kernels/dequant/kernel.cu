#include "../common.cuh"

// A quantized_linear's weight dequantized to a bf16 [N, K] scratch for the prefill GEMM (codegen/kernels/dequant/
// rule.py, codegen/quant_prefill.py). Every value written is exact (the bf16 of an exact product), so the GEMM that
// reads it, with the per-channel scale in its epilogue, computes what the quantized GEMV computes:
//
//   WFMT 0: fp8 e4m3 weight[N, K] -> out = the code's value (every e4m3 value fits bf16); the f32 per-channel
//           weight_scale[N] is the GEMM's epilogue column scale, read where it is; out_scale is not written.
//   WFMT 1: nvfp4 weight u8[N, K/2] (element 2j in the low nibble), one e4m3 scale per 16 along K (weight_scale
//           u8[N, K/16], linear layout), f32 global weight_scale_2[1] -> out = e2m1 * scale (2 + 4 significant
//           bits: exact in bf16), out_scale[n] = weight_scale_2 for n < N (the epilogue takes a per-channel vector).
//
// Memory-bound: a thread converts 16 bytes of codes per iteration (grid-stride; 16 fp8 or 32 nvfp4 values), 16-byte
// loads that skip L1 and 16-byte stores that stay in L2 for the GEMM right after. Scales are contiguous in the
// element order ([N, K/16] row-major), so element e's block scale is scale[e / 16]: no row arithmetic. M (the step's
// row count) is unused here: it is the argument the executor reads to skip this launch where the GEMV variants
// run instead (``"skip"`` in the kernel table). Codes conversions as quant.cu's (bit placement, then one exact
// bf16x2 multiply); an e4m3 NaN code (never written by the quantizer, which saturates) reads as 480 there and here.
struct dq_u32x4 { unsigned x, y, z, w; };

__device__ __forceinline__ dq_u32x4 dq_ld(const void* p) {
  dq_u32x4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}
__device__ __forceinline__ void dq_st(void* p, unsigned a, unsigned b, unsigned c, unsigned d) {
  asm volatile("st.global.v4.u32 [%0], {%1,%2,%3,%4};" :: "l"(p), "r"(a), "r"(b), "r"(c), "r"(d) : "memory");
}
// d = a * b + (-0) per bf16 half (exact where the product is representable; subnormal inputs are kept)
__device__ __forceinline__ unsigned dq_bmul(unsigned a, unsigned b) {
  unsigned d;
  asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(0x80008000u));
  return d;
}
// 4 e4m3 codes (bytes of v, in order) -> bf16x2 (b0, b1), (b2, b3): the 7 magnitude bits placed in a bf16's exponent
// and mantissa give the value times 2^-120 (subnormal codes included), then one exact multiply by 2^120
__device__ __forceinline__ void dq_e4m3x4(unsigned v, unsigned& lo, unsigned& hi) {
  const unsigned a = __byte_perm(v, 0u, 0x1404u), b = __byte_perm(v, 0u, 0x3424u);
  lo = dq_bmul((a & 0x80008000u) | ((a >> 4) & 0x07F007F0u), 0x7B807B80u);
  hi = dq_bmul((b & 0x80008000u) | ((b >> 4) & 0x07F007F0u), 0x7B807B80u);
}
// the 2 e2m1 codes of byte b (low nibble first) -> bf16x2 of their values times 2^-126 (0.5 is subnormal, exact)
__device__ __forceinline__ unsigned dq_e2m1x2(unsigned b) {
  return ((b & 7u) << 6) | ((b & 8u) << 12) | ((b & 0x70u) << 18) | ((b & 0x80u) << 24);
}
// an e4m3 block scale -> {sf * 2^118} x 2 (exact: 4 significant bits, at most 448 * 2^118 < the bf16 maximum)
__device__ __forceinline__ unsigned dq_sf(unsigned code) {
  const unsigned h = __float_as_uint(to_f32(fp8e4m3{(unsigned char)code}) * __int_as_float((118 + 127) << 23)) >> 16;
  return h | (h << 16);
}
// 16 bytes (32 e2m1 codes) of one 16-element block pair: e2m1 * 2^-126 * sf * 2^118 * 2^8, each product exact
__device__ __forceinline__ void dq_e2m1x8(unsigned v, unsigned c, unsigned* p) {
#pragma unroll
  for (int i = 0; i < 4; ++i) p[i] = dq_bmul(dq_bmul(dq_e2m1x2((v >> (8 * i)) & 0xFFu), c), 0x43804380u);
}

namespace {
constexpr int N = ${N}, K = ${K}, WFMT = ${WFMT};
constexpr long long CHUNKS = (long long)N * (WFMT == 0 ? K : K / 2) / 16;  // 16 bytes of codes each
static_assert(WFMT == 0 || WFMT == 1, "fp8 or nvfp4 weights");
static_assert(K % (WFMT == 0 ? 16 : 32) == 0, "a chunk is 16 fp8 or 32 nvfp4 codes of one row");
}  // namespace

extern "C" __global__ void __launch_bounds__(${THREADS}) ${KERNEL}(
    const unsigned char* __restrict__ weight, const unsigned char* __restrict__ weight_scale,
    const float* __restrict__ weight_scale_2, bf16* __restrict__ out, float* __restrict__ out_scale, long long M) {
  const long long stride = (long long)gridDim.x * blockDim.x;
  const long long first = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (WFMT == 1) {
    const float gs = weight_scale_2[0];
    for (long long n = first; n < N; n += stride) out_scale[n] = gs;
  }
  for (long long c = first; c < CHUNKS; c += stride) {
    const dq_u32x4 v = dq_ld(weight + c * 16);
    if (WFMT == 0) {
      unsigned p[8];
      dq_e4m3x4(v.x, p[0], p[1]);
      dq_e4m3x4(v.y, p[2], p[3]);
      dq_e4m3x4(v.z, p[4], p[5]);
      dq_e4m3x4(v.w, p[6], p[7]);
      bf16* o = out + c * 16;
      dq_st(o, p[0], p[1], p[2], p[3]);
      dq_st(o + 8, p[4], p[5], p[6], p[7]);
    } else {
      unsigned short sf;  // the two block scales of these 32 elements
      asm("ld.global.nc.L1::no_allocate.u16 %0, [%1];" : "=h"(sf) : "l"(weight_scale + c * 2));
      const unsigned c0 = dq_sf(sf & 0xFFu), c1 = dq_sf(sf >> 8);
      unsigned p[16];
      dq_e2m1x8(v.x, c0, p);
      dq_e2m1x8(v.y, c0, p + 4);
      dq_e2m1x8(v.z, c1, p + 8);
      dq_e2m1x8(v.w, c1, p + 12);
      bf16* o = out + c * 32;
#pragma unroll
      for (int i = 0; i < 4; ++i) dq_st(o + 8 * i, p[4 * i], p[4 * i + 1], p[4 * i + 2], p[4 * i + 3]);
    }
  }
}
