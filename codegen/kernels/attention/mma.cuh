// Tensor-core attention helpers shared by prefill_flash.cu, prefill_wgmma.cu and decode_split.cu: PTX wrappers for
// cp.async, ldmatrix and ex2 (the fragment layouts that use them are described in each kernel), and the prefill
// kernels' walk over the flat token range. Inlined by the renderer.

__device__ __forceinline__ float att_exp2(float x) {  // ex2.approx: exp2(-inf) = 0
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}
__device__ __forceinline__ unsigned att_smem(const void* p) {
  unsigned r;
  asm("{ .reg .u64 a; cvta.to.shared.u64 a, %1; cvt.u32.u64 %0, a; }" : "=r"(r) : "l"(p));
  return r;
}
// 16 bytes global -> shared, through L2 only (each K/V byte is read once per CTA); zero-filled (nothing read) when
// !pred
__device__ __forceinline__ void att_cp16(unsigned dst, const void* src, bool pred) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(pred ? 16 : 0));
}
__device__ __forceinline__ void att_commit() { asm volatile("cp.async.commit_group;"); }
template <int N> __device__ __forceinline__ void att_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N)); }
__device__ __forceinline__ void att_ldsm4(unsigned addr, unsigned* r) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
__device__ __forceinline__ void att_ldsm4_t(unsigned addr, unsigned* r) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}

// -- the prefill kernels' flat token range [tstart, tend) (prefill_flash.cu, prefill_wgmma.cu) ------------------------
struct __align__(16) att_u32x4 { unsigned x, y, z, w; };
// tokens of the range that belong to no sequence (padding, outside [qsl0, qsl_end)) get zeros in their G heads of KV
// head kvh, like paged_attention.cu; out is [tokens, H * D], written 16 bytes at a time by NT threads
template <int G, int H, int D, int NT>
__device__ __forceinline__ void att_zero_padding(bf16* out, int kvh, int tid, int tstart, int tend, int qsl0,
                                                 int qsl_end) {
  constexpr int CH = D / 8;
  for (int i = tid; i < (tend - tstart) * G * CH; i += NT) {
    const int t = tstart + i / (G * CH), h = kvh * G + (i / CH) % G, c = i % CH;
    if (t < qsl0 || t >= qsl_end)
      *reinterpret_cast<att_u32x4*>(out + (i64)t * (H * D) + h * D + c * 8) = att_u32x4{0u, 0u, 0u, 0u};
  }
}
// the last s with query_start_loc[s] <= tstart (empty sequences share a start with the next one)
__device__ __forceinline__ int att_first_seq(const int* query_start_loc, int num_seqs, int tstart) {
  int s = 0, hi_s = num_seqs;
  while (s < hi_s) {
    const int mid = (s + hi_s + 1) >> 1;
    if (query_start_loc[mid] <= tstart) s = mid; else hi_s = mid - 1;
  }
  return s;
}
