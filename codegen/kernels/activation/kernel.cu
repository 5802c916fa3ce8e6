#include "../common.cuh"

// Gated activations, out[t, i] = act(a[t, i]) * b[t, i] for i < ${WIDTH}; rows of a and b are
// ${A_STRIDE} and ${B_STRIDE} elements apart and b's start ${B_OFFSET} elements in (so both may be halves of one
// fused gate/up buffer: a packed swiglu passes that buffer as both a and b, with B_OFFSET = WIDTH).
//   ACT 0: swiglu  act(a) = a * sigmoid(${ALPHA} * a)
//   ACT 1: geglu   act(a) = gelu_tanh(a)
extern "C" __global__ void __launch_bounds__(${BLOCK}) ${KERNEL}(
    const ${DT}* __restrict__ a, const ${DT}* __restrict__ b, ${DT}* __restrict__ out, long long num_tokens) {
  constexpr int ACT = ${ACT};
  const i64 t = blockIdx.y;
  const int i = blockIdx.x * ${BLOCK} + threadIdx.x;
  if (t >= num_tokens || i >= ${WIDTH}) return;
  const float av = to_f32(a[t * ${A_STRIDE} + i]), bv = to_f32(b[t * ${B_STRIDE} + ${B_OFFSET} + i]);
  float g;
  if (ACT == 0) {
    g = av / (1.0f + expf(-(${ALPHA}) * av));
  } else {
    const float k0 = 0.7978845608028654f, k1 = 0.044715f;
    g = 0.5f * av * (1.0f + tanhf(k0 * (av + k1 * av * av * av)));
  }
  out[t * ${WIDTH} + i] = from_f32<${DT}>(g * bv);
}
