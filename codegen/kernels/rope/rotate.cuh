// One rotating pair (a, b) by the angle with cosine c and sine s: (a c - b s, b c + a s), every rounding spelled
// out so that no kernel leaves the multiply-add contraction to the compiler: the rope kernels (kernel.cu, qkv.cu,
// qkv_cache.cu) then agree bit for bit on every architecture and compiler, whatever else their code around it does.
// The order is the one NVRTC 13 chose for the plain expressions on sm_90a (the products b s and b c rounded, the
// others fused), so the results there are those of the kernels before this was spelled out.
__device__ __forceinline__ void rotate_pair(float a, float b, float c, float s, float& ya, float& yb) {
  ya = __fmaf_rn(a, c, -__fmul_rn(b, s));
  yb = __fmaf_rn(a, s, __fmul_rn(b, c));
}
