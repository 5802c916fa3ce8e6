#include "../common.cuh"
#include "mma.cuh"
#include "wgmma.cuh"

// Paged prefill attention on Hopper's warpgroup MMA (wgmma), FlashAttention-3 style, sm_90a only: the same
// parameters and semantics as prefill_flash.cu (a ragged token batch, each token attending causally to its
// sequence's cached positions through block_tables, GQA, softcap, sliding window; tokens outside
// [query_start_loc[0], query_start_loc[num_seqs]) get zeros), bf16 queries and cache. See
// codegen/kernels/attention/prefill_wgmma_rule.py for when it runs.
//
// Rows and grid: as prefill_flash.cu with ROWS = 64 x WGS. Row r is (token r / G, query head kvh * G + r % G), so
// the G query heads of KV head kvh share the CTA and each K/V tile is loaded once for the group; a CTA covers
// TPT = ROWS / G tokens of the flat token range, split into the sub-tiles of the sequences it overlaps. Consumer
// warpgroup w (threads 128w ..) owns rows [64w, 64w + 64): wgmma's M is 64, and its accumulator layout puts row
// 16 * (warp % 4) + lane / 4 (+ 8) of the warpgroup in a thread -- the rows prefill_flash.cu gives warp `warp`.
//
// Per sub-tile: Q rows -> shared (cp.async, zero rows past its tokens); K/V tiles of BN positions through STAGES
// shared stages (cp.async by all threads, zero-filled outside [lo, hi] so block-table entries past a context are
// never read; tiles past hi never visited). Per tile and warpgroup:
//   S = Q K^T  wgmma m64nBNk16, A = Q and B = K from shared memory (descriptors, both K-major: head_dim
//              contiguous), D / 16 instructions;
//   softmax    online, f32, ex2.approx with the scale x log2 e folded in, on S in the accumulator layout
//              (thread: rows g8, g8 + 8; columns 8 i + 2 t4 (+1));
//   O += P V   wgmma m64nDk16 with A = P from registers (bf16 pairs of S's accumulator layout are exactly the
//              A fragment of a 16-position k-step) and B = V from shared memory, MN-major (head_dim contiguous
//              is wgmma's N), i.e. the transpose bit set; BN / 16 instructions.
// By default each wgmma group is waited for (wait_group 0) before the softmax or the next tile: the two warpgroups
// overlap each other's MMAs and softmax only loosely (a CTA barrier per tile). OVERLAP (opt-in, 3 stages) is
// FlashAttention-3's intra-warpgroup pipelining: tile it's S and tile it - 1's O += P V are issued together, the
// softmax of S runs after wait_group 1 while O += P V is still in flight (ptxas would sink the exp2s past the
// wait_group 0; a store of the row sums to a scratch word per thread, after the stages, keeps them before it).
// PRODUCER (opt-in) is FlashAttention-3's warp specialization: warpgroup 0 only loads K/V (cp.async, each thread's
// copies arriving on the stage's full mbarrier), warpgroups 1 .. WGS only compute (each waits on full, releases the
// stage on its empty mbarrier after its O += P V, loads its own Q rows behind a named barrier); no CTA barrier in
// the tile loop, so the consumer warpgroups drift apart. With two consumers, setmaxnreg moves registers from the
// producer (40) to the consumers (232). With OVERLAP too, a stage is released an iteration later, after the
// O += P V that reads its V. Opt-in knobs (off: the code above, SASS unchanged): HEAVY_FIRST maps the launch order
// to CTAs longest first over all KV heads (the grid's tail wave holds the short causal CTAs); LEAN_MASK compiles the
// softmax with and without the mask and takes the unmasked one on tiles wholly inside every row's causal / window
// range (a CTA-uniform branch), folding the scale into the exponent's FFMA; PINGPONG (PRODUCER, two consumers) is
// FlashAttention-3's inter-warpgroup scheduling: named barriers 3 and 4 pass a turn between the consumers, a turn
// being the issue of the MMAs that come between two of a consumer's softmaxes (O += P V of tile it and S of it + 1;
// with OVERLAP, S of it and O += P V of it - 1), so one consumer's softmax runs under the other's MMAs. TMA
// (PRODUCER; the default with HEAVY_FIRST and LEAN_MASK, and PINGPONG at head_dim 128: prefill_wgmma_rule.py) has the
// producer's first warp load K/V by TMA through the KV cache's tensor map instead of 128 threads' cp.async (the
// head_dim-128 kernel was load-bound: docs/PERF.md, "K/V by TMA"); its registers 56, the consumers' 224.
//
// Shared memory: every operand tile is stored as 128-byte-swizzle panels: a panel holds 64 head_dim elements
// (128 bytes) of each row, rows 128 bytes apart, the 16-byte chunk c of row r at chunk c ^ (r & 7) (wgmma's
// SWIZZLE_128B: address bits [4, 7) ^= bits [7, 10), so every panel starts 1024-aligned). A head_dim-128 tile is
// two panels, [0, 64) then [64, 128). Descriptors: start address >> 4 (bits 0-13), leading byte offset >> 4
// (16-29), stride byte offset >> 4 (32-45), base offset 0 (49-51), layout 1 = SWIZZLE_128B (62-63).
//   K-major (Q, K): SBO = 1024 (8-row groups); LBO unused with a swizzle (16); the k-step ks of a panel starts
//                   32 * ks bytes in (the unswizzled offset: the hardware swizzles the computed address).
//   MN-major (V):   SBO = 1024 (8-position groups), LBO = BN * 128 (the next 64-wide head_dim panel); the
//                   16-position k-step kk starts kk * 2048 bytes in.
// cp.async writes are generic-proxy writes and wgmma reads through the async proxy: a fence.proxy.async after each
// thread's cp.async.wait_group, before the barrier that publishes the stage (PRODUCER: by each consumer thread
// after its wait on the stage's full mbarrier; TMA writes through the async proxy itself: none).
namespace {
constexpr int D = ${HEAD_DIM}, KV = ${KV_HEADS}, G = ${GROUP}, H = KV * G, BS = ${BLOCK_SIZE};
constexpr int WGS = ${WGS}, ROWS = 64 * WGS, TPT = ROWS / G, BN = ${BLOCK_N}, STAGES = ${STAGES};
// PRODUCER: warp specialization -- one more warpgroup (the first) only loads K/V into the stages, full / empty
// mbarriers per stage instead of CTA barriers, so the consumer warpgroups drift apart (one's softmax under the
// other's MMAs) and no consumer thread spends issue slots on loads
constexpr bool PRODUCER = ${PRODUCER};
constexpr int NT = (WGS + (PRODUCER ? 1 : 0)) * 128, LOADERS = PRODUCER ? 128 : NT;
constexpr int WINDOW = ${SLIDING_WINDOW}, QS = ${Q_STRIDE}, CH = D / 8;
// OVERLAP: O += P V of a tile runs during the next tile's softmax, so a V tile is read one iteration longer and
// (without a producer) the loads run AHEAD = STAGES - 2 tiles ahead instead of STAGES - 1
constexpr bool OVERLAP = ${OVERLAP};
constexpr int AHEAD = STAGES - 1 - (OVERLAP ? 1 : 0);
// HEAVY_FIRST: the CTA order of the grid is longest (most K/V tiles) first over all KV heads, against the tail of
// causal CTAs of unequal length (the last wave of the grid holds its shortest CTAs, not a head's longest)
constexpr bool HEAVY_FIRST = ${HEAVY_FIRST};
// LEAN_MASK: the mask only on tiles it can change and, without softcap, the scale folded into the exponent's FFMA
constexpr bool LEAN_MASK = ${LEAN_MASK};
// PINGPONG: the two consumer warpgroups issue their MMAs in turn (FlashAttention-3's scheduling barriers)
constexpr bool PINGPONG = ${PINGPONG};
// TMA (with PRODUCER): the producer's first warp loads K/V by TMA through the KV cache's tensor map (ingot_kv_tma,
// below), a copy per (cache block, 64-wide head_dim panel, K or V) of R rows, instead of 128 threads' cp.async
constexpr bool TMA = ${TMA};
// VZ (with TMA): the producer's second warp zeroes the V rows past the context in the tile that holds its last
// position, once the tile's copies landed, and only then lets the consumers at that tile (a third mbarrier per stage)
constexpr bool VZ = ${VZ};
constexpr int R = BS < BN ? BS : BN, PANELS = D / 64, COPIES = 2 * PANELS * (BN / R);
static_assert(!TMA || PRODUCER, "TMA loads are the producer warpgroup's");
static_assert(!VZ || TMA, "VZ zeroes what the TMA copies brought");
static_assert(!TMA || (R % 8 == 0 && BN % R == 0 && BS % R == 0), "TMA: blocks of 8k rows dividing or divided by BN");
constexpr unsigned TILE = BN * D * 2;  // one K or V tile
constexpr float SCALE = ${SCALE}, SOFTCAP = ${SOFTCAP}, LOG2E = 1.4426950408889634f;
static_assert(D == 64 || D == 128, "head_dim 64 or 128");
static_assert(BN == 64 || BN == 128, "64 or 128 positions per K/V tile");
static_assert(WGS == 1 || WGS == 2, "one or two consumer warpgroups");
static_assert(STAGES >= 2 && STAGES <= 3, "two or three K/V stages");
static_assert(AHEAD >= 1, "OVERLAP needs three stages");
static_assert(G <= ROWS, "a CTA holds at least one whole query-head group (rows past TPT * G stay idle)");
// K/V rows of positions [p0, p0 + BN) into one stage; positions outside [lo, hi] are zero-filled, not read
__device__ __forceinline__ void pw_load_kv(const bf16* kv_cache, const int* table, int kvh, int p0, int lo, int hi,
                                           unsigned sk, unsigned sv, int tid) {
#pragma unroll 4
  for (int i = tid; i < BN * CH; i += LOADERS) {
    const int j = i / CH, c = i % CH, p = p0 + j;
    const bool ok = p >= lo && p <= hi;
    const i64 blk = ok ? table[p / BS] : 0;
    const bf16* kp = kv_cache + ((blk * 2 + 0) * BS + p % BS) * (KV * D) + kvh * D + c * 8;
    att_cp16(sk + pw_off(j, c, BN), ok ? kp : kv_cache, ok);
    att_cp16(sv + pw_off(j, c, BN), ok ? kp + BS * (KV * D) : kv_cache, ok);
  }
}
// TMA: the K and V tiles of positions [p0, p0 + BN) into one stage, lane `lane`'s share of its COPIES copies (each
// R cache rows of one block, one head_dim panel, K or V: a box of 64 x 1 x R at {64 panel, kvh, row}, which lands as
// R rows of 128 bytes with the panel's 128-byte swizzle, at 1024-aligned offsets). Copies wholly outside [lo, hi]
// read no block-table entry and go to row -R, out of the tensor: zeros, as cp.async's zero fill. Copies crossing hi
// (the context's last block) also bring its rows past hi, cache rows of this sequence's own block: whatever K/V were
// last written there (zeros from allocation otherwise). The mask replaces those positions' scores, so P is 0 there;
// a V row that is finite then adds nothing, but a non-finite one (left by an earlier request whose K/V overflowed)
// would make the row NaN. VZ (config flag vz, on in the default wherever K/V come by TMA: docs/PERF.md, "The TMA
// attention's V rows past the context") has the producer's second warp zero those V rows once the copies landed
// (pw_zero_v_tail) and the consumers wait for it on that tile (loading them by the warp's cp.async instead hung).
__device__ __forceinline__ void pw_tma_kv(unsigned long long map, i64 row0, const int* table, int kvh, int p0, int lo,
                                          int hi, unsigned sk, unsigned sv, unsigned bar, int lane) {
#pragma unroll
  for (int c = lane; c < COPIES; c += 32) {
    const int kv = c & 1, panel = (c >> 1) % PANELS, j = (c >> 1) / PANELS, pb = p0 + j * R;
    const bool ok = pb + R - 1 >= lo && pb <= hi;
    const i64 row = ok ? row0 + ((i64)table[pb / BS] * 2 + kv) * BS + pb % BS : -(i64)R;
    pw_tma_3d((kv ? sv : sk) + panel * (BN * 128) + j * (R * 128), map, 64 * panel, kvh, (int)row, bar);
  }
}
// VZ: whether the tile at p0 holds the context's last position hi inside a copy (hi's cache rows past it came with
// the copy: stale V rows, zeroed by pw_zero_v_tail before the consumers read the tile)
__device__ __forceinline__ bool pw_v_tail(int p0, int hi) {
  return VZ && hi >= p0 && hi < p0 + BN && hi % R != R - 1;
}
// the mbarrier a consumer waits on for the tile at p0 in the stage at offset 8 x stage: its full barrier (at bars),
// or with VZ, where the tile has stale V rows (pw_v_tail), the second producer warp's ready barrier (at ready)
__device__ __forceinline__ unsigned pw_tile_bar(unsigned bars, unsigned ready, int p0, int hi) {
  return pw_v_tail(p0, hi) ? ready : bars;
}
// VZ: zero the V rows of positions (hi, end of hi's copy) in the stage's V tile at sv (generic stores, then the
// fence that orders them before the async proxy's reads: the consumers' wgmma)
__device__ __forceinline__ void pw_zero_v_tail(unsigned sv, int p0, int hi, int lane) {
  const int r0 = hi - p0 + 1, r1 = hi / R * R + R - p0;  // rows [r0, r1) of the tile
#pragma unroll 1
  for (int i = lane; i < (r1 - r0) * CH; i += 32) {
    const unsigned at = sv + pw_off(r0 + i / CH, i % CH, BN);
    asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};" ::"r"(at), "r"(0u) : "memory");
  }
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}
// S = Q K^T for this warpgroup's 64 rows and the BN positions of the K tile at sk: D / 16 k-steps (K-major A and
// B, SWIZZLE_128B; within a panel a k-step is 32 bytes on), one group
__device__ __forceinline__ void pw_qk(float* sc, unsigned qa, unsigned sk) {
  pw_pin<BN / 2>(sc);
  pw_fence();
#pragma unroll
  for (int ks = 0; ks < D / 16; ++ks)
    pw_ss<BN>(sc, pw_desc(qa + (ks >> 2) * (ROWS * 128) + (ks & 3) * 32, 16, 1024),
              pw_desc(sk + (ks >> 2) * (BN * 128) + (ks & 3) * 32, 16, 1024), ks > 0);
  pw_commit();
}
// O += P V for the V tile at sv: BN / 16 k-steps of 16 positions (2048 bytes each; V MN-major, the next head_dim
// panel BN * 128 bytes on), one group
__device__ __forceinline__ void pw_pv(float* o, unsigned (*pa)[4], unsigned sv) {
  pw_pin<D / 2>(o);
  pw_pin<BN / 4>(&pa[0][0]);
  pw_fence();
#pragma unroll
  for (int kk = 0; kk < BN / 16; ++kk) pw_rs<D>(o, pa[kk], pw_desc(sv + kk * 2048, BN * 128, 1024));
  pw_commit();
}
// a thread's two rows (g8, g8 + 8): positions of their tokens (-1: none), window starts, running max and sum
struct PwRows {
  int qpos[2], first[2];
  float m[2], l[2];
};
// S (accumulator layout: sc[4 i + e] is row g8 + 8 (e >> 1), position p0 + 8 i + 2 t4 + (e & 1)) -> scaled, capped,
// masked log2-domain scores -> exp2(score - new row max) in place; corr: the factor O's rows are to be scaled by
__device__ __forceinline__ void pw_softmax(float* sc, PwRows& rows, float* corr, int p0, bool masked, int t4) {
  const float NEG_INF = __int_as_float(0xff800000u);
#pragma unroll
  for (int i = 0; i < BN / 8; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      float x = sc[4 * i + e];
      if (SOFTCAP > 0.0f) x = SOFTCAP * tanhf(x * (SCALE / (SOFTCAP > 0.0f ? SOFTCAP : 1.0f))) * LOG2E;
      else x *= SCALE * LOG2E;
      if (masked) {
        const int p = p0 + i * 8 + 2 * t4 + (e & 1), hf = e >> 1;
        if (rows.qpos[hf] >= 0 && (p > rows.qpos[hf] || (WINDOW > 0 && p < rows.first[hf]))) x = NEG_INF;
      }
      sc[4 * i + e] = x;
    }
  // rows g8 (e = 0, 1) and g8 + 8 (e = 2, 3); a row's 4 lanes share its max
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    float mx = rows.m[hf];
#pragma unroll
    for (int i = 0; i < BN / 8; ++i) mx = fmaxf(mx, fmaxf(sc[4 * i + 2 * hf], sc[4 * i + 2 * hf + 1]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float mu = mx == NEG_INF ? 0.0f : mx;  // a row with nothing seen yet: exp2(-inf - 0) = 0
    corr[hf] = att_exp2(rows.m[hf] - mu);
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < BN / 8; ++i) {
      sc[4 * i + 2 * hf] = att_exp2(sc[4 * i + 2 * hf] - mu);
      sc[4 * i + 2 * hf + 1] = att_exp2(sc[4 * i + 2 * hf + 1] - mu);
      sum += sc[4 * i + 2 * hf] + sc[4 * i + 2 * hf + 1];
    }
    rows.l[hf] = rows.l[hf] * corr[hf] + sum;  // this lane's partial; the row's 4 lanes are summed at the end
    rows.m[hf] = mx;
  }
}
// pw_softmax for LEAN_MASK: the mask compiled in only where MASK (a tile the causal diagonal, the window's start or
// the context's end crosses: pw_masked), and without softcap S kept unscaled: its row max scaled once (C > 0, so
// max(C s) = C max(s), the same running max as pw_softmax's) and exp2(C s - m) one FFMA per score
template <bool MASK>
__device__ __forceinline__ void pw_softmax_lean(float* sc, PwRows& rows, float* corr, int p0, int t4) {
  const float NEG_INF = __int_as_float(0xff800000u);
  constexpr float C = SOFTCAP > 0.0f ? 1.0f : SCALE * LOG2E;  // softcap: S is made log2-domain scores in place
#pragma unroll
  for (int i = 0; i < BN / 8; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      float x = sc[4 * i + e];
      if (SOFTCAP > 0.0f) x = SOFTCAP * tanhf(x * (SCALE / (SOFTCAP > 0.0f ? SOFTCAP : 1.0f))) * LOG2E;
      if (MASK) {
        const int p = p0 + i * 8 + 2 * t4 + (e & 1), hf = e >> 1;
        if (rows.qpos[hf] >= 0 && (p > rows.qpos[hf] || (WINDOW > 0 && p < rows.first[hf]))) x = NEG_INF;
      }
      sc[4 * i + e] = x;
    }
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    float mx = NEG_INF;
#pragma unroll
    for (int i = 0; i < BN / 8; ++i) mx = fmaxf(mx, fmaxf(sc[4 * i + 2 * hf], sc[4 * i + 2 * hf + 1]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    mx = fmaxf(rows.m[hf], mx * C);
    const float mu = mx == NEG_INF ? 0.0f : mx;  // a row with nothing seen yet: exp2(-inf - 0) = 0
    corr[hf] = att_exp2(rows.m[hf] - mu);
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < BN / 8; ++i) {
      sc[4 * i + 2 * hf] = att_exp2(fmaf(sc[4 * i + 2 * hf], C, -mu));
      sc[4 * i + 2 * hf + 1] = att_exp2(fmaf(sc[4 * i + 2 * hf + 1], C, -mu));
      sum += sc[4 * i + 2 * hf] + sc[4 * i + 2 * hf + 1];
    }
    rows.l[hf] = rows.l[hf] * corr[hf] + sum;
    rows.m[hf] = mx;
  }
}
// the softmax of a tile: pw_softmax, or with LEAN_MASK the variant compiled for whether the tile needs the mask (a
// CTA-uniform branch)
__device__ __forceinline__ void pw_softmax_tile(float* sc, PwRows& rows, float* corr, int p0, bool masked, int t4) {
  if constexpr (LEAN_MASK) {
    if (masked) pw_softmax_lean<true>(sc, rows, corr, p0, t4);
    else pw_softmax_lean<false>(sc, rows, corr, p0, t4);
  } else {
    pw_softmax(sc, rows, corr, p0, masked, t4);
  }
}
__device__ __forceinline__ void pw_rescale(float* o, const float* corr) {
#pragma unroll
  for (int i = 0; i < D / 8; ++i) {
    o[4 * i] *= corr[0];
    o[4 * i + 1] *= corr[0];
    o[4 * i + 2] *= corr[1];
    o[4 * i + 3] *= corr[1];
  }
}
// P as the A operand of O += P V: k-step kk is S's 8-position chunks 2 kk and 2 kk + 1, as bf16 pairs
__device__ __forceinline__ void pw_pack_p(const float* sc, unsigned (*pa)[4]) {
#pragma unroll
  for (int kk = 0; kk < BN / 16; ++kk) {
    pa[kk][0] = pw_pack(sc[8 * kk + 0], sc[8 * kk + 1]);
    pa[kk][1] = pw_pack(sc[8 * kk + 2], sc[8 * kk + 3]);
    pa[kk][2] = pw_pack(sc[8 * kk + 4], sc[8 * kk + 5]);
    pa[kk][3] = pw_pack(sc[8 * kk + 6], sc[8 * kk + 7]);
  }
}
// this thread's cp.async groups but the newest N done, their writes made visible to wgmma (async proxy), then
// the whole CTA's
template <int N> __device__ __forceinline__ void pw_publish() {
  att_wait<N>();
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  __syncthreads();
}
// one sequence's tokens in this CTA's range: [t0, t0 + ntok), the K/V tiles [kt0, kt0 + ntiles) they see
struct PwSub {
  int t0, ntok, base, qpos_lo, qpos_hi, lo, first_hi, kt0, ntiles;
  const int* table;
};
// sequence s's sub-tile of the token range [tstart, tend); ntok 0: none (ntok < 0: s starts past the range)
__device__ __forceinline__ PwSub pw_sub(int s, int tstart, int tend, const int* seq_lens, const int* query_start_loc,
                                        const int* block_tables, int max_blocks) {
  PwSub u;
  const int start = query_start_loc[s], end = query_start_loc[s + 1];
  u.t0 = max(start, tstart);
  u.ntok = start >= tend ? -1 : max(0, min(end, tend) - u.t0);
  u.base = seq_lens[s] - (end - start) - start;  // position of token t: base + t
  u.qpos_lo = u.base + u.t0;
  u.qpos_hi = u.base + u.t0 + max(u.ntok, 1) - 1;
  u.lo = WINDOW > 0 ? max(0, u.qpos_lo - WINDOW + 1) : 0;
  u.first_hi = WINDOW > 0 ? max(0, u.qpos_hi - WINDOW + 1) : 0;
  u.kt0 = u.lo / BN;
  u.ntiles = u.qpos_hi / BN - u.kt0 + 1;
  u.table = block_tables + (i64)s * max_blocks;
  return u;
}
// the producer's walk: the CTA's K/V tiles in order, each once its stage is free (the empty barriers at bars + 8 x
// (STAGES + stage)): load(sub-tile, first position, stage, the tile's number n in the CTA). A function template, not
// a generic lambda: NVRTC 13.0 takes a generic lambda in a kernel for a host function and rejects it (13.5 does not)
template <class Load>
__device__ __forceinline__ void pw_each_tile(int s_first, int num_seqs, int tstart, int tend, const int* seq_lens,
                                             const int* query_start_loc, const int* block_tables, int max_blocks,
                                             unsigned bars, Load&& load) {
  int n = 0;
  for (int s = s_first; s < num_seqs; ++s) {
    const PwSub u = pw_sub(s, tstart, tend, seq_lens, query_start_loc, block_tables, max_blocks);
    if (u.ntok < 0) break;
    if (u.ntok == 0) continue;
    for (int it = 0; it < u.ntiles; ++it, ++n) {
      const int st = n % STAGES;
      pw_mbar_wait(bars + 8 * (STAGES + st), ((n / STAGES) & 1) ^ 1);  // fresh barriers: passes at once
      load(u, (u.kt0 + it) * BN, st, n);
    }
  }
}
// rows g8 and g8 + 8 of warp `warp` (of the consumer warps): their positions (-1: not a token, never masked in or
// written), window starts, empty running max and sum
__device__ __forceinline__ PwRows pw_rows(const PwSub& u, int warp, int g8) {
  PwRows rows;
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const int tl = (warp * 16 + g8 + 8 * hf) / G;
    rows.qpos[hf] = tl < u.ntok ? u.base + u.t0 + tl : -1;
    rows.first[hf] = WINDOW > 0 ? rows.qpos[hf] - WINDOW + 1 : 0;
    rows.m[hf] = __int_as_float(0xff800000u);
    rows.l[hf] = 0.0f;
  }
  return rows;
}
// O / l -> out for the rows that are tokens of the sub-tile
__device__ __forceinline__ void pw_store(bf16* out, const float* o, const PwRows& rows, const PwSub& u, int kvh,
                                         int warp, int g8, int t4) {
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    float sum = rows.l[hf];
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
    const int r = warp * 16 + g8 + 8 * hf, tl = r / G;
    if (tl >= u.ntok) continue;
    bf16* dst = out + (i64)(u.t0 + tl) * (H * D) + (kvh * G + r % G) * D + 2 * t4;
#pragma unroll
    for (int i = 0; i < D / 8; ++i)
      *reinterpret_cast<unsigned*>(dst + i * 8) = pw_pack(o[4 * i + 2 * hf] * inv, o[4 * i + 2 * hf + 1] * inv);
  }
}
}  // namespace

// TMA: the KV cache's tensor map (words 0-15: a CUtensorMap over the cache region as rows of KV x D bf16, dims
// {D, KV, rows}, box {64, 1, R}, 128-byte swizzle), the region's base address (16) and size in bytes (17). The
// loader fills it before the first launch (runtime/kv_tma.py: the executor over its whole KV region, every layer's
// cache inside it; the tests and benchmarks over their cache buffer).
extern "C" {
__device__ __align__(128) unsigned long long ingot_kv_tma[18];
}

extern "C" __global__ void __launch_bounds__(NT, 1) ${KERNEL}(
    const bf16* __restrict__ q, const bf16* __restrict__ kv_cache, const int* __restrict__ block_tables,
    const int* __restrict__ seq_lens, const int* __restrict__ query_start_loc, bf16* __restrict__ out,
    int num_tokens, int num_seqs, int max_blocks) {
  extern __shared__ __align__(1024) unsigned char pw_shared[];
  // SWIZZLE_128B needs 1024-aligned panels; the dynamic window's start is only promised 16 (the rule adds 1 KB)
  const unsigned sq = (att_smem(pw_shared) + 1023u) & ~1023u, sk0 = sq + ROWS * D * 2, sv0 = sk0 + STAGES * TILE;
  const int tid = threadIdx.x, lane = tid & 31, g8 = lane >> 2, t4 = lane & 3;
  // token range b from the last: causally the longest rows first. HEAVY_FIRST: over the launch order (x fastest,
  // then y; gridDim.y == KV), the KV heads vary fastest, so every head's longest range comes before any shorter one
  const int lin = HEAVY_FIRST ? blockIdx.y * gridDim.x + blockIdx.x : 0;
  const int kvh = HEAVY_FIRST ? lin % KV : blockIdx.y, b = gridDim.x - 1 - (HEAVY_FIRST ? lin / KV : blockIdx.x);
  const int tstart = b * TPT, tend = min(tstart + TPT, num_tokens);
  const int qsl0 = query_start_loc[0], qsl_end = query_start_loc[num_seqs];

  att_zero_padding<G, H, D, NT>(out, kvh, tid, tstart, tend, qsl0, qsl_end);
  const int s_first = att_first_seq(query_start_loc, num_seqs, tstart);

  if constexpr (!PRODUCER) {
    const int warp = tid >> 5, wg = tid >> 7;
    for (int s = s_first; s < num_seqs; ++s) {
      const PwSub u = pw_sub(s, tstart, tend, seq_lens, query_start_loc, block_tables, max_blocks);
      if (u.ntok < 0) break;
      if (u.ntok == 0) continue;
      // Q rows of this sub-tile (rows past its tokens are zeros)
      for (int i = tid; i < ROWS * CH; i += NT) {
        const int r = i / CH, c = i % CH, tl = r / G;
        const bool ok = tl < u.ntok;
        const bf16* src = q + (ok ? (i64)(u.t0 + tl) * QS + (kvh * G + r % G) * D + c * 8 : 0);
        att_cp16(sq + pw_off(r, c, ROWS), src, ok);
      }
      att_commit();
#pragma unroll
      for (int st = 0; st < AHEAD; ++st) {  // prologue: the first AHEAD tiles in flight
        if (st < u.ntiles) pw_load_kv(kv_cache, u.table, kvh, (u.kt0 + st) * BN, u.lo, u.qpos_hi, sk0 + st * TILE,
                                      sv0 + st * TILE, tid);
        att_commit();
      }
      PwRows rows = pw_rows(u, warp, g8);
      float o[D / 2], sc[BN / 2], corr[2];
      unsigned pa[BN / 16][4];
#pragma unroll
      for (int i = 0; i < D / 2; ++i) o[i] = 0.0f;
#pragma unroll
      for (int i = 0; i < BN / 2; ++i) sc[i] = 0.0f;
#pragma unroll
      for (int i = 0; i < BN / 4; ++i) pa[i / 4][i % 4] = 0u;
      const unsigned qa = sq + wg * 64 * 128;  // this warpgroup's 64 rows of each Q panel

      int stage = 0;
      for (int it = 0; it < u.ntiles; ++it) {
        const int prev = stage == 0 ? STAGES - 1 : stage - 1;
        {  // the tile AHEAD on goes to the stage AHEAD on, free since the barrier that closed iteration it - 1
          const int ahead = it + AHEAD, as = (stage + AHEAD) % STAGES;
          if (ahead < u.ntiles) pw_load_kv(kv_cache, u.table, kvh, (u.kt0 + ahead) * BN, u.lo, u.qpos_hi,
                                           sk0 + as * TILE, sv0 + as * TILE, tid);
          att_commit();
        }
        pw_publish<AHEAD>();
        const int p0 = (u.kt0 + it) * BN;
        const bool masked = p0 + BN - 1 > u.qpos_lo || (WINDOW > 0 && p0 < u.first_hi);
        pw_qk(sc, qa, sk0 + stage * TILE);
        if (OVERLAP) {
          // FlashAttention-3's intra-warpgroup pipelining: O += P V of tile it - 1 runs on the tensor cores while
          // this tile's softmax runs; O is rescaled and P replaced once it is done. At it = 0, P is zeros and the
          // V tile this tile's (finite: loaded or zero-filled), so it adds nothing: the same wgmma groups in
          // flight every iteration (a branch there makes ptxas wait for both groups before the softmax)
          pw_pv(o, pa, sv0 + (it > 0 ? prev : stage) * TILE);
          pw_wait<1>();
          pw_pin<BN / 2>(sc);
          pw_softmax_tile(sc, rows, corr, p0, masked, t4);
          // the softmax before the wait: its row sums stored (to this thread's scratch word) ahead of it, since
          // ptxas sinks the exp2s past a wait_group that nothing orders them before
          pw_keep_before_wait(sv0 + STAGES * TILE + 4 * tid, rows.l[0] + rows.l[1]);
          pw_wait<0>();
          pw_pin<D / 2>(o);
          pw_pin<BN / 4>(&pa[0][0]);
          pw_rescale(o, corr);
          pw_pack_p(sc, pa);
        } else {
          pw_wait<0>();
          pw_pin<BN / 2>(sc);
          pw_softmax_tile(sc, rows, corr, p0, masked, t4);
          pw_rescale(o, corr);
          pw_pack_p(sc, pa);
          pw_pv(o, pa, sv0 + stage * TILE);
          pw_wait<0>();
          pw_pin<D / 2>(o);
        }
        __syncthreads();  // the stages of tile it (it - 1 with OVERLAP) are free: loaded again next iteration
        stage = stage == STAGES - 1 ? 0 : stage + 1;
      }
      if (OVERLAP) {  // the last tile's O += P V (its stage is not overwritten before the next sub-tile's barrier)
        pw_pv(o, pa, sv0 + (stage == 0 ? STAGES - 1 : stage - 1) * TILE);
        pw_wait<0>();
        pw_pin<D / 2>(o);
        __syncthreads();
      }
      att_wait<0>();  // the (empty) groups of tiles past the last
      pw_store(out, o, rows, u, kvh, warp, g8, t4);
    }
  } else {
    // warpgroup 0 loads, warpgroups 1 .. WGS compute; tile n of the CTA (counted over its sub-tiles) is in stage
    // n % STAGES, phase (n / STAGES) & 1 of that stage's barriers
    const unsigned bars = sv0 + STAGES * TILE;  // full[STAGES], empty[STAGES], then OVERLAP's scratch words
    // VZ: ready[STAGES] after them (the second producer warp's 32 arrivals a tile)
    const unsigned ready = bars + 16 * STAGES + (OVERLAP ? 4 * WGS * 128 : 0);
    if (tid == 0) {
#pragma unroll
      for (int st = 0; st < STAGES; ++st) {
        pw_mbar_init(bars + 8 * st, TMA ? 1 : 128);
        pw_mbar_init(bars + 8 * (STAGES + st), WGS * 128);
        if (VZ) pw_mbar_init(ready + 8 * st, 32);
      }
      asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    if (tid < 128) {
      // with two consumers at 232 registers a thread the producer keeps 40; TMA's copy loop needs 56 without a spill
      // (the consumers then take 224: 128 x 56 + 256 x 224 is the SM's 64K)
      if (WGS == 2) asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(TMA ? 56 : 40) : "memory");
      if constexpr (TMA) {  // the first warp issues the copies, lane 0 the stage's expected bytes; the rest are done
        if (tid < 32) {
          const unsigned long long map = reinterpret_cast<unsigned long long>(ingot_kv_tma);
          const unsigned long long base = ingot_kv_tma[16], bytes = ingot_kv_tma[17];
          const unsigned long long at = reinterpret_cast<unsigned long long>(kv_cache);
          // a loader that did not fill the map for this cache (runtime/kv_tma.py): trap, never read another region
          if (at < base || at >= base + bytes) __trap();
          const i64 row0 = (i64)((at - base) / (KV * D * 2));
          if (tid == 0) asm volatile("prefetch.tensormap [%0];" ::"l"(map) : "memory");
          pw_each_tile(s_first, num_seqs, tstart, tend, seq_lens, query_start_loc, block_tables, max_blocks, bars,
                       [&](const PwSub& u, int p0, int st, int) {
            if (tid == 0) pw_mbar_expect_tx(bars + 8 * st, 2 * TILE);
            __syncwarp();
            pw_tma_kv(map, row0, u.table, kvh, p0, u.lo, u.qpos_hi, sk0 + st * TILE, sv0 + st * TILE, bars + 8 * st,
                      tid);
          });
        } else if (VZ && tid < 64) {  // every tile once it landed: its stale V rows zeroed where it has them
          pw_each_tile(s_first, num_seqs, tstart, tend, seq_lens, query_start_loc, block_tables, max_blocks, bars,
                       [&](const PwSub& u, int p0, int st, int n) {
            pw_mbar_wait(bars + 8 * st, (n / STAGES) & 1);
            if (pw_v_tail(p0, u.qpos_hi)) pw_zero_v_tail(sv0 + st * TILE, p0, u.qpos_hi, tid - 32);
            pw_mbar_arrive(ready + 8 * st);
          });
        }
      } else {
        pw_each_tile(s_first, num_seqs, tstart, tend, seq_lens, query_start_loc, block_tables, max_blocks, bars,
                     [&](const PwSub& u, int p0, int st, int) {
          pw_load_kv(kv_cache, u.table, kvh, p0, u.lo, u.qpos_hi, sk0 + st * TILE, sv0 + st * TILE, tid);
          pw_mbar_arrive_cp(bars + 8 * st);
        });
        asm volatile("cp.async.wait_all;" ::: "memory");
      }
    } else {
      if (WGS == 2) asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(TMA ? 224 : 232) : "memory");
      const int ct = tid - 128, warp = ct >> 5, wg = ct >> 7;  // consumer thread, warp, warpgroup
      const unsigned qa = sq + wg * 64 * 128, scratch = bars + 16 * STAGES + 4 * ct;
      // PINGPONG: consumer w's turn is named barrier 3 + w (256 threads: its own bar.sync, the other's bar.arrive).
      // A turn is sync(own) .. MMA issues .. arrive(other's): turns alternate 0, 1, 0, 1, .. and both consumers take
      // the same number (the same tiles). Consumer 1 gives consumer 0 its first turn (before the CTA's first
      // sub-tile) and gives none back after its own last turn (in the last sub-tile), so every phase of both barriers
      // completes and none is left half-arrived at exit (a bar.sync after the loop instead makes ptxas serialize the
      // wgmmas for want of registers)
      const int turn = 3 + wg, other_turn = 4 - wg;
      int n = 0;
      for (int s = s_first; s < num_seqs; ++s) {
        const PwSub u = pw_sub(s, tstart, tend, seq_lens, query_start_loc, block_tables, max_blocks);
        if (u.ntok < 0) break;
        if (u.ntok == 0) continue;
        // this warpgroup's 64 Q rows, once its MMAs of the previous sub-tile are done with them
        asm volatile("bar.sync %0, 128;" ::"r"(1 + wg) : "memory");
        for (int i = ct & 127; i < 64 * CH; i += 128) {
          const int r = 64 * wg + i / CH, c = i % CH, tl = r / G;
          const bool ok = tl < u.ntok;
          const bf16* src = q + (ok ? (i64)(u.t0 + tl) * QS + (kvh * G + r % G) * D + c * 8 : 0);
          att_cp16(sq + pw_off(r, c, ROWS), src, ok);
        }
        att_commit();
        att_wait<0>();
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
        asm volatile("bar.sync %0, 128;" ::"r"(1 + wg) : "memory");
        PwRows rows = pw_rows(u, warp, g8);
        float o[D / 2], sc[BN / 2], corr[2];
        unsigned pa[BN / 16][4];
#pragma unroll
        for (int i = 0; i < D / 2; ++i) o[i] = 0.0f;
#pragma unroll
        for (int i = 0; i < BN / 2; ++i) sc[i] = 0.0f;
#pragma unroll
        for (int i = 0; i < BN / 4; ++i) pa[i / 4][i % 4] = 0u;
        // PINGPONG: consumer 0's first turn (n == 0: the CTA's first sub-tile); whether this is the CTA's last
        // sub-tile (no tokens of a later sequence in the range), whose last turn consumer 1 does not give back
        if (PINGPONG && wg == 1 && n == 0) pw_bar_arrive<256>(3);
        const bool give_last = wg == 0 || u.t0 + u.ntok < min(tend, qsl_end);
        int prev = 0;  // the stage of the tile before (OVERLAP: its V is read, and it is released, an iteration late)
        if constexpr (PINGPONG && !OVERLAP) {
          // turns: S of the first tile; then per tile O += P V of it and S of the next (the MMAs between two of
          // this consumer's softmaxes), so one consumer's softmax runs while the other's MMAs are on the tensor cores
          pw_mbar_wait(pw_tile_bar(bars, ready, u.kt0 * BN, u.qpos_hi) + 8 * (n % STAGES), (n / STAGES) & 1);
          if (!TMA) asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
          pw_bar_sync<256>(turn);
          pw_qk(sc, qa, sk0 + (n % STAGES) * TILE);
          pw_bar_arrive<256>(other_turn);
          pw_wait<0>();
          pw_pin<BN / 2>(sc);
          for (int it = 0; it < u.ntiles; ++it, ++n) {
            const int st = n % STAGES, p0 = (u.kt0 + it) * BN;
            const bool masked = p0 + BN - 1 > u.qpos_lo || (WINDOW > 0 && p0 < u.first_hi), more = it + 1 < u.ntiles;
            pw_softmax_tile(sc, rows, corr, p0, masked, t4);
            pw_rescale(o, corr);
            pw_pack_p(sc, pa);
            if (more) {  // the next tile's K (and V) landed, before this consumer's turn is taken
              pw_mbar_wait(pw_tile_bar(bars, ready, p0 + BN, u.qpos_hi) + 8 * ((n + 1) % STAGES),
                           ((n + 1) / STAGES) & 1);
              if (!TMA) asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
            }
            pw_bar_sync<256>(turn);
            pw_pv(o, pa, sv0 + st * TILE);
            if (more) pw_qk(sc, qa, sk0 + ((n + 1) % STAGES) * TILE);
            if (more || give_last) pw_bar_arrive<256>(other_turn);
            pw_wait<0>();
            pw_pin<D / 2>(o);
            pw_pin<BN / 2>(sc);
            pw_mbar_arrive(bars + 8 * (STAGES + st));
          }
        } else {
          for (int it = 0; it < u.ntiles; ++it, ++n) {
            const int st = n % STAGES;
            pw_mbar_wait(pw_tile_bar(bars, ready, (u.kt0 + it) * BN, u.qpos_hi) + 8 * st, (n / STAGES) & 1);
            // cp.async's writes (generic proxy), then wgmma's reads (async proxy); TMA writes through the async proxy
            // (VZ's zeros: the writing warp fenced them)
            if (!TMA) asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
            const int p0 = (u.kt0 + it) * BN;
            const bool masked = p0 + BN - 1 > u.qpos_lo || (WINDOW > 0 && p0 < u.first_hi);
            if (PINGPONG) pw_bar_sync<256>(turn);  // OVERLAP: a turn issues S of tile it and O += P V of it - 1
            pw_qk(sc, qa, sk0 + st * TILE);
            if (OVERLAP) {  // as in the plain pipeline: tile it - 1's O += P V (zeros at it = 0) under this softmax
              pw_pv(o, pa, sv0 + (it > 0 ? prev : st) * TILE);
              if (PINGPONG) pw_bar_arrive<256>(other_turn);
              pw_wait<1>();
              pw_pin<BN / 2>(sc);
              pw_softmax_tile(sc, rows, corr, p0, masked, t4);
              pw_keep_before_wait(scratch, rows.l[0] + rows.l[1]);
              pw_wait<0>();
              pw_pin<D / 2>(o);
              pw_pin<BN / 4>(&pa[0][0]);
              if (it > 0) pw_mbar_arrive(bars + 8 * (STAGES + prev));
              pw_rescale(o, corr);
              pw_pack_p(sc, pa);
            } else {
              pw_wait<0>();
              pw_pin<BN / 2>(sc);
              pw_softmax_tile(sc, rows, corr, p0, masked, t4);
              pw_rescale(o, corr);
              pw_pack_p(sc, pa);
              pw_pv(o, pa, sv0 + st * TILE);
              pw_wait<0>();
              pw_pin<D / 2>(o);
              pw_mbar_arrive(bars + 8 * (STAGES + st));
            }
            prev = st;
          }
          if (OVERLAP) {  // the last tile's O += P V, then its stage is free
            if (PINGPONG) pw_bar_sync<256>(turn);
            pw_pv(o, pa, sv0 + prev * TILE);
            if (PINGPONG && give_last) pw_bar_arrive<256>(other_turn);
            pw_wait<0>();
            pw_pin<D / 2>(o);
            pw_mbar_arrive(bars + 8 * (STAGES + prev));
          }
        }
        pw_store(out, o, rows, u, kvh, warp, g8, t4);
      }
    }
  }
}
