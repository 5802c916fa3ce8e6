#include "../common.cuh"

// e4m3 -> bf16 / f16 and e2m1 (NVFP4) -> f16 in registers, exactly: shared by the quantized-weight GEMVs (quant.cu,
// bulk.cu, kernel.cu, skinny.cu)

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
// d = a * b per f16 half (exact where qg_e2m1x8_f16 uses it)
__device__ __forceinline__ unsigned qg_hmul2(unsigned a, unsigned b) {
  unsigned d;
  asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}
// 8 e2m1 codes (nibbles n0..n7 of v: byte k holds n2k low, n2k+1 high) -> f16x2 (n0, n2), (n4, n6), (n1, n3),
// (n5, n7) times the block scale sc (f16x2 {sf, sf}) times 2^-14. A code's f16 (its value times 2^-14, exactly; 0.5 an
// f16 subnormal) is all in its high byte: the sign at bit 7, exponent and mantissa at bits 3..1 (f16 bits 11..9).
// Those bytes are made for the even codes (e) and the odd ones (d) four at a time, spread into f16 halves by PRMT
// (low bytes zero), then one multiply each, exact (e2m1 * sf * 2^-14 is a multiple of 2^-24 below 65504; f16
// arithmetic keeps subnormals)
__device__ __forceinline__ void qg_e2m1x8_f16(unsigned v, unsigned sc, unsigned (&o)[4]) {
  const unsigned e = ((v << 1) & 0x0E0E0E0Eu) | ((v << 4) & 0x80808080u);  // n0 n2 n4 n6
  const unsigned d = ((v >> 3) & 0x0E0E0E0Eu) | (v & 0x80808080u);         // n1 n3 n5 n7
  o[0] = qg_hmul2(__byte_perm(e, 0u, 0x1404), sc);
  o[1] = qg_hmul2(__byte_perm(e, 0u, 0x3424), sc);
  o[2] = qg_hmul2(__byte_perm(d, 0u, 0x1404), sc);
  o[3] = qg_hmul2(__byte_perm(d, 0u, 0x3424), sc);
}
// two e4m3 block scales (bytes of s) -> {sf0, sf0} and {sf1, sf1} in f16 (exact)
__device__ __forceinline__ void qg_sf_f16(unsigned short s, unsigned& s0, unsigned& s1) {
  unsigned h;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h) : "h"(s));
  s0 = __byte_perm(h, 0u, 0x1010), s1 = __byte_perm(h, 0u, 0x3232);
}
