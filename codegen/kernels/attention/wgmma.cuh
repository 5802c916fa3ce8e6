// Warpgroup MMA (wgmma, sm_90a) helpers for prefill_wgmma.cu (and gemv/skinny.cu): PTX wrappers for
// wgmma.mma_async (m64n64k16 and m64n128k16, SS also m64n8/16/32k16; f32 += bf16 x bf16, also f16 x f16 for RS with
// B K-major; SS: both operands through shared-memory descriptors, RS: A from registers), its fence / commit / wait,
// shared-memory matrix descriptors (SWIZZLE_128B), operand pinning and mbarriers. The layouts they assume are
// described in prefill_wgmma.cu. Inlined by the renderer.

__device__ __forceinline__ unsigned pw_pack(float lo, float hi) {  // bf16x2, lo in the low half, nearest even
  unsigned r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
// byte offset of (row, 16-byte chunk c) in a swizzled tile of `rows` rows (head_dim / 64 panels of rows x 128 B)
__device__ __forceinline__ unsigned pw_off(int row, int c, int rows) {
  return (unsigned)((c >> 3) * rows * 128 + row * 128 + (((c & 7) ^ (row & 7)) << 4));
}
__device__ __forceinline__ unsigned long long pw_desc(unsigned addr, unsigned lbo, unsigned sbo) {
  return (unsigned long long)((addr & 0x3FFFFu) >> 4) | ((unsigned long long)(lbo >> 4) << 16) |
         ((unsigned long long)(sbo >> 4) << 32) | (1ull << 62);
}
__device__ __forceinline__ void pw_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void pw_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
// register operands pinned in place: no write of them moves past a wgmma.fence, no read before a wait_group
template <int N> __device__ __forceinline__ void pw_pin(float* d) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
template <int N> __device__ __forceinline__ void pw_pin(unsigned* d) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+r"(d[i])::"memory");
}
// a shared-memory store of x (to a scratch word nobody reads) that ptxas keeps ahead of a following wgmma.wait_group:
// so is everything x depends on (register-only work like a softmax is otherwise free to sink past the wait)
__device__ __forceinline__ void pw_keep_before_wait(unsigned scratch, float x) {
  asm volatile("st.shared.f32 [%0], %1;" ::"r"(scratch), "f"(x) : "memory");
}
// this warpgroup's wgmma groups but the newest N complete
template <int N> __device__ __forceinline__ void pw_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}
// S (+)= A B, both from shared memory (descriptors), K-major; m64n64k16
__device__ __forceinline__ void pw_ss_n64(float* d, unsigned long long da, unsigned long long db, int acc) {
  asm volatile(
      "{ .reg .pred p; setp.ne.b32 p, %34, 0; wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, "
      "%21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
      "%32, %33, p, 1, 1, 0, 0; }"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),
        "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]),
        "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]),
        "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(da), "l"(db), "r"(acc));
}
// D += A B, A (bf16 pairs of the m64nNk16 accumulator layout) from registers, B an MN-major (transposed)
// shared-memory tile; m64n64k16
__device__ __forceinline__ void pw_rs_n64(float* d, const unsigned* a, unsigned long long db, int acc) {
  asm volatile(
      "{ .reg .pred p; setp.ne.b32 p, %37, 0; wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, "
      "%21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
      "{%32, %33, %34, %35}, %36, p, 1, 1, 1; }"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),
        "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]),
        "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]),
        "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(acc));
}
// S (+)= A B, both from shared memory (descriptors), K-major; m64n128k16
__device__ __forceinline__ void pw_ss_n128(float* d, unsigned long long da, unsigned long long db, int acc) {
  asm volatile(
      "{ .reg .pred p; setp.ne.b32 p, %66, 0; wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, "
      "%21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, "
      "%40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, "
      "%59, %60, %61, %62, %63}, "
      "%64, %65, p, 1, 1, 0, 0; }"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),
        "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]),
        "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]),
        "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]),
        "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]),
        "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]),
        "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]),
        "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(da), "l"(db), "r"(acc));
}
// D += A B, A (bf16 pairs of the m64nNk16 accumulator layout) from registers, B an MN-major (transposed)
// shared-memory tile; m64n128k16
__device__ __forceinline__ void pw_rs_n128(float* d, const unsigned* a, unsigned long long db, int acc) {
  asm volatile(
      "{ .reg .pred p; setp.ne.b32 p, %69, 0; wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, "
      "%21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, "
      "%40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, "
      "%59, %60, %61, %62, %63}, "
      "{%64, %65, %66, %67}, %68, p, 1, 1, 1; }"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),
        "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]),
        "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]),
        "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]),
        "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]),
        "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]),
        "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]),
        "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(acc));
}
// S (+)= A B, both from shared memory (descriptors), K-major; m64n8k16 (gemv/skinny.cu: N = its tokens)
__device__ __forceinline__ void pw_ss_n8(float* d, unsigned long long da, unsigned long long db, int acc) {
  asm volatile(
      "{ .reg .pred p; setp.ne.b32 p, %6, 0; wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3}, "
      "%4, %5, p, 1, 1, 0, 0; }"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "l"(da), "l"(db), "r"(acc));
}
// S (+)= A B, both from shared memory (descriptors), K-major; m64n16k16 (gemv/skinny.cu: N = its tokens)
__device__ __forceinline__ void pw_ss_n16(float* d, unsigned long long da, unsigned long long db, int acc) {
  asm volatile(
      "{ .reg .pred p; setp.ne.b32 p, %10, 0; wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7}, "
      "%8, %9, p, 1, 1, 0, 0; }"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
      : "l"(da), "l"(db), "r"(acc));
}
// S (+)= A B, both from shared memory (descriptors), K-major; m64n32k16 (gemv/skinny.cu: N = its tokens)
__device__ __forceinline__ void pw_ss_n32(float* d, unsigned long long da, unsigned long long db, int acc) {
  asm volatile(
      "{ .reg .pred p; setp.ne.b32 p, %18, 0; wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
      "%16, %17, p, 1, 1, 0, 0; }"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "l"(da), "l"(db), "r"(acc));
}
template <int N>
__device__ __forceinline__ void pw_ss(float* d, unsigned long long da, unsigned long long db, int acc) {
  static_assert(N == 8 || N == 16 || N == 32 || N == 64 || N == 128, "wgmma SS: N of 8, 16, 32, 64 or 128");
  if constexpr (N == 8) pw_ss_n8(d, da, db, acc);
  else if constexpr (N == 16) pw_ss_n16(d, da, db, acc);
  else if constexpr (N == 32) pw_ss_n32(d, da, db, acc);
  else if constexpr (N == 64) pw_ss_n64(d, da, db, acc);
  else pw_ss_n128(d, da, db, acc);
}
template <int N> __device__ __forceinline__ void pw_rs(float* d, const unsigned* a, unsigned long long db) {
  if constexpr (N == 64) pw_rs_n64(d, a, db, 1);
  else pw_rs_n128(d, a, db, 1);
}
// D (+)= A B, A (bf16 or f16 pairs in the mma.sync m16n8k16 A layout per warp: rows g8 / g8 + 8, columns 2 t4
// (+ 8)) from registers, B K-major from shared memory (a descriptor), the same type; m64nNk16 for N of 8 .. 64
// (gemv/skinny.cu with e4m3 weights: the converted weights as A, N = its tokens)
template <bool F16>
__device__ __forceinline__ void pw_rsk_n8(float* d, const unsigned* a, unsigned long long db, int acc) {
#define PW_RSK(T) \
  asm volatile( \
      "{ .reg .pred p; setp.ne.b32 p, %9, 0; wgmma.mma_async.sync.aligned.m64n8k16.f32." T "." T " {" \
      "%0, %1, %2, %3}, " \
      "{%4, %5, %6, %7}, %8, p, 1, 1, 0; }" \
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]) \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(acc))
  if constexpr (F16) PW_RSK("f16");
  else PW_RSK("bf16");
#undef PW_RSK
}
template <bool F16>
__device__ __forceinline__ void pw_rsk_n16(float* d, const unsigned* a, unsigned long long db, int acc) {
#define PW_RSK(T) \
  asm volatile( \
      "{ .reg .pred p; setp.ne.b32 p, %13, 0; wgmma.mma_async.sync.aligned.m64n16k16.f32." T "." T " {" \
      "%0, %1, %2, %3, %4, %5, %6, %7}, " \
      "{%8, %9, %10, %11}, %12, p, 1, 1, 0; }" \
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]) \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(acc))
  if constexpr (F16) PW_RSK("f16");
  else PW_RSK("bf16");
#undef PW_RSK
}
template <bool F16>
__device__ __forceinline__ void pw_rsk_n32(float* d, const unsigned* a, unsigned long long db, int acc) {
#define PW_RSK(T) \
  asm volatile( \
      "{ .reg .pred p; setp.ne.b32 p, %21, 0; wgmma.mma_async.sync.aligned.m64n32k16.f32." T "." T " {" \
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, " \
      "{%16, %17, %18, %19}, %20, p, 1, 1, 0; }" \
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]) \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(acc))
  if constexpr (F16) PW_RSK("f16");
  else PW_RSK("bf16");
#undef PW_RSK
}
template <bool F16>
__device__ __forceinline__ void pw_rsk_n64(float* d, const unsigned* a, unsigned long long db, int acc) {
#define PW_RSK(T) \
  asm volatile( \
      "{ .reg .pred p; setp.ne.b32 p, %37, 0; wgmma.mma_async.sync.aligned.m64n64k16.f32." T "." T " {" \
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, " \
      "{%32, %33, %34, %35}, %36, p, 1, 1, 0; }" \
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]) \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(acc))
  if constexpr (F16) PW_RSK("f16");
  else PW_RSK("bf16");
#undef PW_RSK
}
template <int N, bool F16 = false>
__device__ __forceinline__ void pw_rsk(float* d, const unsigned* a, unsigned long long db, int acc) {
  static_assert(N == 8 || N == 16 || N == 32 || N == 64, "wgmma RS, B K-major: N of 8, 16, 32 or 64");
  if constexpr (N == 8) pw_rsk_n8<F16>(d, a, db, acc);
  else if constexpr (N == 16) pw_rsk_n16<F16>(d, a, db, acc);
  else if constexpr (N == 32) pw_rsk_n32<F16>(d, a, db, acc);
  else pw_rsk_n64<F16>(d, a, db, acc);
}
// named barrier `id` (1 .. 15; 0 is __syncthreads) of `threads` threads: wait for all of them, or only count this
// warp's arrival (prefill_wgmma.cu's PINGPONG turns: a consumer waits for its turn, gives the other theirs)
template <int THREADS> __device__ __forceinline__ void pw_bar_sync(int id) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "n"(THREADS) : "memory");
}
template <int THREADS> __device__ __forceinline__ void pw_bar_arrive(int id) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "n"(THREADS) : "memory");
}
// mbarriers (prefill_wgmma.cu's PRODUCER pipeline: full[stage] completes when the producer's cp.asyncs (or TMA
// copies) into it have landed, empty[stage] when every consumer thread is done with it)
__device__ __forceinline__ void pw_mbar_init(unsigned bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void pw_mbar_arrive(unsigned bar) {
  asm volatile("{ .reg .b64 st; mbarrier.arrive.shared::cta.b64 st, [%0]; }" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void pw_mbar_arrive_cp(unsigned bar) {  // once this thread's earlier cp.asyncs land
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(bar) : "memory");
}
// the producer's arrival with the bytes its TMA copies into the stage will complete (prefill_wgmma.cu's TMA)
__device__ __forceinline__ void pw_mbar_expect_tx(unsigned bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
// a 3-d TMA tile copy (tensor map at the generic address `map`, box at coordinates {c0, c1, c2}) into shared memory
// at `dst`, completing `bytes` of the mbarrier `bar`'s transaction count (elements out of bounds arrive as zeros)
__device__ __forceinline__ void pw_tma_3d(unsigned dst, unsigned long long map, int c0, int c1, int c2, unsigned bar) {
  asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, "
               "%4}], [%5];" ::"r"(dst), "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(bar) : "memory");
}
// a 2-d TMA tile copy (gemv/skinny.cu's weight tiles), as pw_tma_3d
__device__ __forceinline__ void pw_tma_2d(unsigned dst, unsigned long long map, int c0, int c1, unsigned bar) {
  asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], "
               "[%4];" ::"r"(dst), "l"(map), "r"(c0), "r"(c1), "r"(bar) : "memory");
}
// wait for the phase of parity `parity` to complete; a wait that never ends (a protocol bug) traps instead of
// hanging the GPU
__device__ __forceinline__ void pw_mbar_wait(unsigned bar, unsigned parity) {
  unsigned done = 0, spins = 0;
  while (true) {
    asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                 : "=r"(done) : "r"(bar), "r"(parity) : "memory");
    if (done) break;
    if (++spins == (1u << 24)) __trap();
  }
}
