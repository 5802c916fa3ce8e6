// The decode GEMVs' rope epilogue (kernel.cu, quant.cu; ${ROPE}, codegen/qkv_rope_fusion.py): the qkv projection's
// variant does rope_qkv and the KV cache write (rope/qkv_cache.cu) itself. Tile row n streams weight row
// gemv_rope_row(n): in each q and k head, the 16-row tile i holds the rotating pairs (lo, hi) of 8 features in its
// rows (r, r + 8), so a lane's two rows of a tile are both halves of one pair (v rows stay in order). The template
// rounds each pair's two outputs to bf16 (what the variant without the epilogue stores and the rope kernel reads) and
// gemv_rope_store rotates q and k with rotate.cuh at positions[t] (cos / sin [max_pos, ${ROPE_D} / 2]) and stores q to
// q_out and k and v to the paged cache at slot_mapping[t] (none for a negative slot) as qkv_cache.cu does, bit for
// bit. Included after the template's constants (N).
namespace {
// ${ROPE_NQ} q heads, ${ROPE_NKV} k and v heads of RD features (all rotating), cache blocks of RBS positions
constexpr bool ROPE = ${ROPE}, RINTER = ${ROPE_INTERLEAVED}, RSCALED = ${ROPE_SCALED}, RPRE = ${ROPE_PRELOAD};
constexpr int RQ = ${ROPE_NQ}, RKV = ${ROPE_NKV}, RD = ${ROPE_D}, RHALF = RD / 2, RBS = ${ROPE_BS};
static_assert(!ROPE || (RD % 16 == 0 && N == (RQ + 2 * RKV) * RD), "rope epilogue: whole 16-row tiles a head");
}  // namespace

// the weight row of tile row n (the identity without the rope epilogue, and for v's rows)
__device__ __forceinline__ int gemv_rope_row(int n) {
  if (!ROPE || n >= (RQ + RKV) * RD) return n;
  const int m = n % RD, i = m / 16, r = m % 8;
  const int lo = RINTER ? 2 * (8 * i + r) : 8 * i + r;
  return n - m + (m % 16 < 8 ? lo : (RINTER ? lo + 1 : lo + RHALF));
}
// one value as the cache stores it (qkv_cache.cu's to_cache, from the bf16 value)
__device__ __forceinline__ ${ROPE_KT} gemv_to_cache(float x, float scale) {
  if (RSCALED) return from_f32<${ROPE_KT}>(__fdiv_rn(x, scale));
  return from_f32<${ROPE_KT}>(x);
}
__device__ __forceinline__ float gemv_round(float x) { return to_f32(from_f32<bf16>(x)); }

// What the epilogue reads for token t's pair besides the GEMV's values: t's cache slot and, for q and k rows, cos and
// sin at t's position. The template loads them where it stores (after its last MMA: a chain of two round trips,
// slot_mapping / positions then the tables, on the launch's critical path), or with RPRE (kernel.cu) right after its
// grid-dependency wait, before the weight stream, which hides them (the loads are coherent and volatile, so that
// neither the compiler nor ptxas moves them below the main loop or above the wait).
struct GemvRopeIn { i64 slot; float c, s; };
__device__ __forceinline__ i64 gemv_rope_ld(const long long* p) {
  i64 v;
  asm volatile("ld.global.s64 %0, [%1];" : "=l"(v) : "l"(p));
  return v;
}
__device__ __forceinline__ float gemv_rope_ld(const float* p) {
  float v;
  asm volatile("ld.global.f32 %0, [%1];" : "=f"(v) : "l"(p));
  return v;
}
__device__ __forceinline__ unsigned short gemv_rope_ld16(const void* p) {
  unsigned short v;
  asm volatile("ld.global.u16 %0, [%1];" : "=h"(v) : "l"(p));
  return v;
}
__device__ __forceinline__ float gemv_rope_ld(const bf16* p) { return to_f32(bf16{gemv_rope_ld16(p)}); }
__device__ __forceinline__ float gemv_rope_ld(const f16* p) { return to_f32(f16{gemv_rope_ld16(p)}); }
// cos and sin at token t's position for the pair whose first weight row is lo (q and k rows; v's keep c, s): EARLY
// by the volatile loads above (RPRE), else plain ones
template <bool EARLY>
__device__ __forceinline__ void gemv_rope_cs(int t, int lo, const long long* positions, const ${ROPE_CT}* cos_table,
                                             const ${ROPE_CT}* sin_table, float& c, float& s) {
  if (lo < (RQ + RKV) * RD) {
    const int d = lo % RD, jc = RINTER ? d / 2 : d;
    const i64 pos = EARLY ? gemv_rope_ld(positions + t) : positions[t];
    c = EARLY ? gemv_rope_ld(cos_table + pos * RHALF + jc) : to_f32(cos_table[pos * RHALF + jc]);
    s = EARLY ? gemv_rope_ld(sin_table + pos * RHALF + jc) : to_f32(sin_table[pos * RHALF + jc]);
  }
}
// token t's slot, and cos / sin for the pair whose first weight row is lo (0 for v's), by the volatile loads
__device__ __forceinline__ GemvRopeIn gemv_rope_in(int t, int lo, const long long* positions,
                                                   const ${ROPE_CT}* cos_table, const ${ROPE_CT}* sin_table,
                                                   const long long* slot_mapping) {
  GemvRopeIn in{gemv_rope_ld(slot_mapping + t), 0.0f, 0.0f};
  gemv_rope_cs<true>(t, lo, positions, cos_table, sin_table, in.c, in.s);
  return in;
}

// token t's pair (weight rows lo, hi = gemv_rope_row of a tile's rows g, g + 8) with its bf16-rounded values a, b, its
// slot, and cos / sin at its position (q and k rows)
__device__ __forceinline__ void gemv_rope_apply(int t, int lo, int hi, float a, float b, i64 slot, float c, float s,
                                                bf16* q_out, ${ROPE_KT}* kv_cache, const float* kv_scale) {
  if (lo >= RQ * RD && slot < 0) return;  // k and v of a token without a slot: nothing to write
  if (lo < (RQ + RKV) * RD) {  // q or k: rotate
    float ra, rb;
    rotate_pair(a, b, c, s, ra, rb);
    a = gemv_round(ra), b = gemv_round(rb);
  }
  if (lo < RQ * RD) {
    q_out[(i64)t * RQ * RD + lo] = from_f32<bf16>(a);
    q_out[(i64)t * RQ * RD + hi] = from_f32<bf16>(b);
    return;
  }
  const bool is_k = lo < (RQ + RKV) * RD;
  const int f = lo - (is_k ? RQ : RQ + RKV) * RD, fh = hi - (is_k ? RQ : RQ + RKV) * RD;  // in the k / v row
  const float sa = RSCALED ? kv_scale[(is_k ? 0 : RKV) + f / RD] : 1.0f;
  const float sb = RSCALED ? kv_scale[(is_k ? 0 : RKV) + fh / RD] : 1.0f;
  ${ROPE_KT}* row = kv_cache + ((slot / RBS * 2 + (is_k ? 0 : 1)) * RBS + slot % RBS) * (i64)(RKV * RD);
  row[f] = gemv_to_cache(a, sa);
  row[fh] = gemv_to_cache(b, sb);
}
// the same, reading the slot, the position and the tables where it stores (no slot: no position read for k and v)
__device__ __forceinline__ void gemv_rope_store(int t, int lo, int hi, float a, float b, const long long* positions,
                                                const ${ROPE_CT}* cos_table, const ${ROPE_CT}* sin_table, bf16* q_out,
                                                ${ROPE_KT}* kv_cache, const long long* slot_mapping,
                                                const float* kv_scale) {
  const i64 slot = slot_mapping[t];
  if (lo >= RQ * RD && slot < 0) return;
  float c = 0.0f, s = 0.0f;
  gemv_rope_cs<false>(t, lo, positions, cos_table, sin_table, c, s);
  gemv_rope_apply(t, lo, hi, a, b, slot, c, s, q_out, kv_cache, kv_scale);
}
