// ingot device helpers shared by every kernel family: storage types, conversions, reductions.
// No CUDA headers are included, so NVRTC from a pip wheel compiles every kernel without a toolkit.
// Conversions round to nearest even and saturate like the numpy references (ir/ops/core.py cast_array).

typedef long long i64;

struct bf16 { unsigned short bits; };
struct f16 { unsigned short bits; };
struct fp8e4m3 { unsigned char bits; };

__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(bf16 x) { return __uint_as_float(((unsigned)x.bits) << 16); }
__device__ __forceinline__ float to_f32(f16 x) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(x.bits));
  return f;
}
// e4m3fn: 1 sign, 4 exponent (bias 7), 3 mantissa bits; S.1111.111 is NaN, there is no infinity
__device__ __forceinline__ float to_f32(fp8e4m3 x) {
  unsigned b = x.bits, s = (b & 0x80u) << 24, e = (b >> 3) & 0xFu, m = b & 7u;
  if (e == 15u && m == 7u) return __uint_as_float(0x7fc00000u | s);
  if (e == 0u) { float v = (float)m * 0.001953125f; return s ? -v : v; }  // subnormal: m * 2^-9
  return __uint_as_float(s | ((e + 120u) << 23) | (m << 20));
}

template <typename T> __device__ __forceinline__ T from_f32(float x);
template <> __device__ __forceinline__ float from_f32<float>(float x) { return x; }
template <> __device__ __forceinline__ bf16 from_f32<bf16>(float x) {
  unsigned u = __float_as_uint(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{(unsigned short)((u >> 16) | 0x40u)};
  u += 0x7fffu + ((u >> 16) & 1u);
  return bf16{(unsigned short)(u >> 16)};
}
template <> __device__ __forceinline__ f16 from_f32<f16>(float x) {
  unsigned short h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(x));
  return f16{h};
}
template <> __device__ __forceinline__ fp8e4m3 from_f32<fp8e4m3>(float x) {
  unsigned short pair;  // the second source goes to the low byte
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(pair) : "f"(0.0f), "f"(x));
  return fp8e4m3{(unsigned char)(pair & 0xffu)};
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Reduce over the whole block (blockDim.x a multiple of 32) with WarpOp (warp_sum, warp_max), 0 for the missing
// warps' partials; every thread gets the result.
template <float (*WarpOp)(float)>
__device__ __forceinline__ float block_reduce(float v) {
  __shared__ float partial[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = WarpOp(v);
  __syncthreads();  // partial[] may still be read by a previous call
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  v = lane < warps ? partial[lane] : 0.0f;
  return WarpOp(v);
}
__device__ __forceinline__ float block_sum(float v) { return block_reduce<warp_sum>(v); }
// (0 where every value is below it)
__device__ __forceinline__ float block_max(float v) { return block_reduce<warp_max>(v); }
