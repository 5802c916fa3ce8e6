// The linear epilogue shared by the GEMM templates: y = acc * w_scale[n] + bias[n] + residual[m, n],
// rounded once to the output type (the reference computes in float32 and rounds at the end).
template <typename OT, typename BT, bool HAS_SCALE, bool HAS_BIAS, bool HAS_RESIDUAL>
__device__ __forceinline__ void store_linear(OT* out, const float* w_scale, const BT* bias, const OT* residual,
                                             i64 m, int n, int N, float acc) {
  if (HAS_SCALE) acc *= w_scale[n];
  if (HAS_BIAS) acc += to_f32(bias[n]);
  if (HAS_RESIDUAL) acc += to_f32(residual[m * N + n]);
  out[m * N + n] = from_f32<OT>(acc);
}
