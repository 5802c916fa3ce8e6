#include "../common.cuh"

// e4m3 -> bf16 in registers, exactly: shared by the FP8-weight GEMVs (quant.cu, bulk.cu, kernel.cu)

// d = a * b + (-0) per bf16 half (subnormal inputs are kept: fma.bf16x2 does not flush)
__device__ __forceinline__ unsigned qg_bmul(unsigned a, unsigned b) {
  unsigned d;
  asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(0x80008000u));
  return d;
}
// 4 e4m3 codes (bytes of v) -> bf16x2 (b0, b1) and (b2, b3), exactly. The code's 7 magnitude bits shifted into a
// bf16's exponent/mantissa give the value times 2^-120 (subnormals included), then one exact multiply by 2^120.
__device__ __forceinline__ void qg_e4m3x4_bf16(unsigned v, unsigned& lo, unsigned& hi) {
  const unsigned a = __byte_perm(v, 0u, 0x1404u), b = __byte_perm(v, 0u, 0x3424u);  // (0, b0, 0, b1), (0, b2, 0, b3)
  lo = qg_bmul((a & 0x80008000u) | ((a >> 4) & 0x07F007F0u), 0x7B807B80u);
  hi = qg_bmul((b & 0x80008000u) | ((b >> 4) & 0x07F007F0u), 0x7B807B80u);
}
// 4 e4m3 codes (bytes of v) -> f16x2 (b0, b1) and (b2, b3), exactly (every e4m3 value, subnormals included, is an
// f16), by the hardware's conversion (sm_89+): two instructions where the bf16 path above takes about ten. The f16
// MMA then needs x in f16 too (kernel.cu stages it scaled, see its header).
__device__ __forceinline__ void qg_e4m3x4_f16(unsigned v, unsigned& lo, unsigned& hi) {
  asm("{ .reg .b16 l, h; mov.b32 {l, h}, %2; cvt.rn.f16x2.e4m3x2 %0, l; cvt.rn.f16x2.e4m3x2 %1, h; }"
      : "=r"(lo), "=r"(hi) : "r"(v));
}
