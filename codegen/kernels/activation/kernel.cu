#include "../common.cuh"

// Gated activations, out[t, i] = act(a[t, i]) * b[t, i] for i < ${WIDTH}; rows of a and b are
// ${A_STRIDE} and ${B_STRIDE} elements apart and b's start ${B_OFFSET} elements in (so both may be halves of one
// fused gate/up buffer: a packed swiglu passes that buffer as both a and b, with B_OFFSET = WIDTH).
//   ACT 0: swiglu  act(a) = a * sigmoid(${ALPHA} * a)
//   ACT 1: geglu   act(a) = gelu_tanh(a)
// A thread does ${VEC} consecutive elements with one 16-byte load of each input and one store (VEC 1 when the
// widths, strides or offset are not whole 16-byte vectors): memory-bound, so the bytes in flight decide the speed.
namespace {
constexpr int VEC = ${VEC};
struct alignas(sizeof(${DT}) * VEC) Pack { ${DT} v[VEC]; };

__device__ __forceinline__ float gated(float av, float bv) {
  if (${ACT} == 0) return av / (1.0f + expf(-(${ALPHA}) * av)) * bv;
  const float k0 = 0.7978845608028654f, k1 = 0.044715f;
  return 0.5f * av * (1.0f + tanhf(k0 * (av + k1 * av * av * av))) * bv;
}
}  // namespace

extern "C" __global__ void __launch_bounds__(${BLOCK}) ${KERNEL}(
    const ${DT}* __restrict__ a, const ${DT}* __restrict__ b, ${DT}* __restrict__ out, long long num_tokens) {
  const i64 t = blockIdx.y;
  const int i = (blockIdx.x * ${BLOCK} + threadIdx.x) * VEC;
  if (t >= num_tokens || i >= ${WIDTH}) return;
  const Pack av = *reinterpret_cast<const Pack*>(a + t * ${A_STRIDE} + i);
  const Pack bv = *reinterpret_cast<const Pack*>(b + t * ${B_STRIDE} + ${B_OFFSET} + i);
  Pack o;
#pragma unroll
  for (int j = 0; j < VEC; ++j) o.v[j] = from_f32<${DT}>(gated(to_f32(av.v[j]), to_f32(bv.v[j])));
  *reinterpret_cast<Pack*>(out + t * ${WIDTH} + i) = o;
}
