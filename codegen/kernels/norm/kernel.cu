#include "../common.cuh"

// One block per row of x [rows, ${HIDDEN}]; each thread keeps its ${PER_THREAD} elements in registers.
//   KIND 0: rms_norm    y = x / sqrt(mean(x^2) + eps) * w
//   KIND 1: layer_norm  y = (x - mean) / sqrt(var + eps) * w (+ b)
// RESIDUAL: x is first replaced by h = x + residual, rounded to ${DT} and stored to residual_out
// (the fused add + norm of a pre-norm block); the norm then reads the rounded h.
extern "C" __global__ void __launch_bounds__(${BLOCK}) ${KERNEL}(
    const ${DT}* __restrict__ x, const ${WT}* __restrict__ w, const ${WT}* __restrict__ b,
    const ${DT}* __restrict__ residual, ${DT}* __restrict__ residual_out, ${DT}* __restrict__ out,
    long long rows) {
  constexpr int H = ${HIDDEN}, P = ${PER_THREAD}, KIND = ${KIND};
  constexpr bool HAS_RESIDUAL = ${RESIDUAL}, HAS_BIAS = ${BIAS};
  const i64 row = blockIdx.x;
  if (row >= rows) return;
  const ${DT}* xr = x + row * H;
  float v[P];
  float s = 0.0f;
#pragma unroll
  for (int i = 0; i < P; ++i) {
    const int h = threadIdx.x + i * ${BLOCK};
    float a = 0.0f;
    if (h < H) {
      a = to_f32(xr[h]);
      if (HAS_RESIDUAL) {
        const ${DT} r = from_f32<${DT}>(a + to_f32(residual[row * H + h]));
        residual_out[row * H + h] = r;
        a = to_f32(r);
      }
    }
    v[i] = a;
    s += KIND == 0 ? a * a : a;
  }
  s = block_sum(s);
  float mean = 0.0f, inv;
  if (KIND == 0) {
    inv = 1.0f / sqrtf(s / H + ${EPS});
  } else {
    mean = s / H;
    float d2 = 0.0f;
#pragma unroll
    for (int i = 0; i < P; ++i) {
      const int h = threadIdx.x + i * ${BLOCK};
      const float d = v[i] - mean;
      if (h < H) d2 += d * d;
    }
    inv = 1.0f / sqrtf(block_sum(d2) / H + ${EPS});
  }
#pragma unroll
  for (int i = 0; i < P; ++i) {
    const int h = threadIdx.x + i * ${BLOCK};
    if (h < H) {
      float y = (v[i] - mean) * inv * to_f32(w[h]);
      if (HAS_BIAS) y += to_f32(b[h]);
      out[row * H + h] = from_f32<${DT}>(y);
    }
  }
}
