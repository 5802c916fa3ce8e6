#include "../common.cuh"

// Activations for the sm_100 block-scaled GEMM (gemm_cutlass/sm100_blockscaled.cu, its A operand):
// x bf16[M, ${K}] -> x_fp4 u8[M, ${K} / 2] (E2M1 pairs, element 2j in the low nibble) and one scale factor per
// ${VEC} elements along K, stored in CUTLASS's Sm1xxBlkScaledConfig layout (ir/quant/packing.py: 128x4 atoms,
// rows padded to 128 and scale columns to ${KV_PAD}; padding scales are zero), and x_scale f32[M]: what the
// GEMM's epilogue multiplies row m by.
//   FMT 0, nvfp4: E4M3 block scales under the global scale gs (STATIC: input_scale[0], the calibrated one; else
//                 per row, amax / (448 * 6)); x_scale[m] = gs * weight_scale_2[0] (the product of the global
//                 scales, CUTLASS's alpha)
//   FMT 1, mxfp4: E8M0 block scales (OCP MX), no global scale; x_scale is not written
// Every rounding is the reference's (ir/quant/formats.py quantize_nvfp4 / quantize_mxfp4): single IEEE float32
// operations in its order, RNE, saturating casts. One block of ${BLOCK} threads per row of the padded grid
// (blockIdx.y * 128 + blockIdx.x), a thread per scale block at a time.
namespace {
constexpr int K = ${K};
constexpr int VEC = ${VEC};
constexpr int KV = K / VEC;           // scale columns
constexpr int KV_PAD = ${KV_PAD};     // ... padded to the atom's 4
constexpr int FMT = ${FMT};
constexpr bool STATIC = ${STATIC};

// float32 -> E2M1 code (sign << 3 | magnitude), round to nearest even, saturating at 6: the midpoints between
// 0, 0.5, 1, 1.5, 2, 3, 4, 6 go to the even code (0.25 -> 0, 0.75 -> 1, 1.25 -> 1, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4,
// 5 -> 4), as ml_dtypes' cast of the clipped value does; the sign of zero is kept
__device__ __forceinline__ unsigned e2m1_code(float v) {
  const unsigned s = (__float_as_uint(v) >> 28) & 8u;
  const float a = fabsf(v);
  const unsigned c = a <= 0.25f ? 0u : a < 0.75f ? 1u : a <= 1.25f ? 2u : a < 1.75f ? 3u
                   : a <= 2.5f ? 4u : a < 3.5f ? 5u : a <= 5.0f ? 6u : 7u;
  return s | c;
}

// byte offset of scale (row, col) in the swizzled layout (ir/quant/packing.py sm100_scale_offset)
__device__ __forceinline__ i64 sf_offset(i64 row, int col) {
  return ((row >> 7) * (KV_PAD / 4) + (col >> 2)) * 512 + (row & 31) * 16 + ((row & 127) >> 5) * 4 + (col & 3);
}

__device__ __forceinline__ void load_block(const bf16* __restrict__ p, float* v) {
#pragma unroll
  for (int h = 0; h < VEC / 8; ++h) {
    const uint4 u = reinterpret_cast<const uint4*>(p)[h];
    const unsigned w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      v[h * 8 + 2 * j] = __uint_as_float(w[j] << 16);
      v[h * 8 + 2 * j + 1] = __uint_as_float(w[j] & 0xffff0000u);
    }
  }
}

// VEC codes -> VEC / 2 bytes, stored with 8-byte (nvfp4) or 16-byte (mxfp4) writes
__device__ __forceinline__ void store_codes(unsigned char* __restrict__ dst, const float* v, float mul) {
  unsigned words[VEC / 8];
#pragma unroll
  for (int w = 0; w < VEC / 8; ++w) {
    unsigned word = 0;
#pragma unroll
    for (int j = 0; j < 8; ++j) word |= e2m1_code(__fmul_rn(v[w * 8 + j], mul)) << (4 * j);
    words[w] = word;
  }
  if (VEC == 16) {
    *reinterpret_cast<uint2*>(dst) = make_uint2(words[0], words[1]);
  } else {
    *reinterpret_cast<uint4*>(dst) = make_uint4(words[0], words[1], words[VEC / 8 > 2 ? 2 : 0],
                                                words[VEC / 8 > 3 ? 3 : 0]);
  }
}
}  // namespace

extern "C" __global__ void __launch_bounds__(${BLOCK}) ${KERNEL}(
    const bf16* __restrict__ x, const float* __restrict__ input_scale, const float* __restrict__ weight_scale_2,
    unsigned char* __restrict__ x_fp4, unsigned char* __restrict__ x_block_scale, float* __restrict__ x_scale,
    long long M) {
  const i64 row = (i64)blockIdx.y * 128 + blockIdx.x;
  if (row >= M) {  // a padding row of the last 128-row atom: zero scales
    for (int c = threadIdx.x; c < KV_PAD; c += ${BLOCK}) x_block_scale[sf_offset(row, c)] = 0;
    return;
  }
  const bf16* xr = x + row * K;
  unsigned char* qr = x_fp4 + row * (K / 2);
  for (int c = KV + threadIdx.x; c < KV_PAD; c += ${BLOCK}) x_block_scale[sf_offset(row, c)] = 0;
  if (FMT == 0) {
    float gs;
    if (STATIC) {
      gs = input_scale[0];
    } else {  // per row: nvfp4_global_scale(amax) = amax / 2688, 1 for an all-zero row
      float amax = 0.0f;
      for (int c = threadIdx.x; c < KV; c += ${BLOCK}) {
        float v[VEC];
        load_block(xr + c * VEC, v);
#pragma unroll
        for (int j = 0; j < VEC; ++j) amax = fmaxf(amax, fabsf(v[j]));
      }
      amax = block_max(amax);
      gs = __fdiv_rn(amax, 2688.0f);
      gs = gs > 0.0f ? gs : 1.0f;
    }
    const float enc = __fdiv_rn(1.0f, gs), inv_enc = __fdiv_rn(1.0f, enc);
    if (threadIdx.x == 0 && x_scale) x_scale[row] = __fmul_rn(gs, weight_scale_2 ? weight_scale_2[0] : 1.0f);
    for (int c = threadIdx.x; c < KV; c += ${BLOCK}) {
      float v[VEC];
      load_block(xr + c * VEC, v);
      float vmax = 0.0f;
#pragma unroll
      for (int j = 0; j < VEC; ++j) vmax = fmaxf(vmax, fabsf(v[j]));
      const fp8e4m3 sf = from_f32<fp8e4m3>(__fmul_rn(enc, __fmul_rn(vmax, 0.16666667f)));  // f32(1) / f32(6)
      const float denom = __fmul_rn(to_f32(sf), inv_enc);
      store_codes(qr + c * (VEC / 2), v, denom != 0.0f ? __fdiv_rn(1.0f, denom) : 0.0f);
      x_block_scale[sf_offset(row, c)] = sf.bits;
    }
  } else {
    for (int c = threadIdx.x; c < KV; c += ${BLOCK}) {
      float v[VEC];
      load_block(xr + c * VEC, v);
      float amax = 0.0f;
      bool finite = true;
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        amax = fmaxf(amax, fabsf(v[j]));
        finite = finite && isfinite(v[j]);
      }
      // shared_exp = floor(log2(amax)) - 2, clamped to [-127, 127]; -127 for an all-zero block; NaN scale (0xFF)
      // and zero codes for a block holding NaN or infinity
      int e = 0;
      frexpf(amax, &e);
      int shared = amax > 0.0f ? min(max(e - 1 - 2, -127), 127) : -127;
      if (!finite) shared = 0;
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        const float s = ldexpf(v[j], -shared);
        v[j] = finite && isfinite(s) ? s : 0.0f;
      }
      store_codes(qr + c * (VEC / 2), v, 1.0f);
      x_block_scale[sf_offset(row, c)] = finite ? (unsigned char)(shared + 127) : 0xffu;
    }
  }
}
