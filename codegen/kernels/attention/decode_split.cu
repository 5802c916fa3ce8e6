#include "../common.cuh"
#include "mma.cuh"

// Split-KV ("flash-decoding") paged attention, GQA-aware: the same semantics as paged_attention.cu (causal over
// the sequence's cached positions, softcap, sliding window, tokens past query_start_loc[num_seqs] get zeros),
// faster for long contexts and small batches. See codegen/kernels/attention/split_rule.py for the parameters.
//
// Grid (token, kv head, split). The CTA of (t, kvh, z) reads each K/V row of KV head kvh in its range of cache
// blocks once and scores it against all ${GROUP} query heads of the group. Two inner loops (MMA, chosen by the rule):
//
// Tensor cores (MMA: block size a multiple of 16). Warp w of the CTA takes the 16-position tiles
// w, w + WARPS, ... of the CTA's range and streams them through its own ring of STAGES shared-memory stages
// (cp.async, rows padded by 16 bytes so ldmatrix is conflict-free; STAGES - 1 tiles in flight
// while one is computed; no CTA-wide barrier in the loop). Positions outside the CTA's range [lo, hi] are
// zero-filled, never read. Per tile, with the group's query heads as the 8 columns (zero past G):
//   S^T[16 pos x 8 heads] = K[16 x D] . Q^T      mma.m16n8k16, A = K by ldmatrix, B = Q^T held in registers;
//   online softmax per head column (float32, ex2.approx, scores in log2 units), P rounded to bf16;
//   O^T[D x 8 heads] += V^T . P^T                A = V^T by ldmatrix.trans, B = P^T: the S^T accumulator
//                                                quarters transposed by movmatrix (the C layout of S^T is
//                                                the B layout of P^T once transposed);
// so each thread's accumulator columns are the heads of its own score columns (no exchange for the rescale).
// An FP8 cache streams e4m3 codes through the ring; each tile is converted (exactly) to f16 in a per-warp buffer
// that the same fragment code reads, the mma runs on f16 (Q scaled by a power of two into f16's range, P in f16).
// SIMT (other block sizes): a warp takes one tile of TP positions at a time (PPW positions per
// 16-byte-per-lane load row: lane = position pp x 8 features dc), loads the tile's K and V rows before using them,
// keeps a running (max, sum, acc) per query head and lane group (online softmax, float32, natural log units).
// Either way the warps' states are merged through shared memory (the MMA path reuses its ring for that).
//
// Splits per token (the same in every CTA of a token, so no host decision is needed): the token's cache blocks
// nblk, wanted = min(ceil(nblk / MIN_CHUNK_BLOCKS), room, MAX_SPLITS) with room = TARGET_CTAS / (num_tokens * KV)
// rounded down for MMA (at least 1: the splits that keep the grid within one wave of the CTAs resident at once;
// on the H200 two waves of 1 MB CTAs ran 10% slower than one of 2 MB), up for SIMT (1 for t >= TOKEN_CAP),
// per = ceil(nblk / wanted) blocks per split, nsplit = ceil(nblk / per); CTAs with
// z >= nsplit exit at once. With nsplit > 1 each CTA writes its partial (max, sum, acc[D]) per query head to a
// module-scope workspace, and the last CTA of (t, kvh) (atomic counter, reset by it for the next launch) merges
// the nsplit partials in split order (deterministic) and writes the output: the reduce step runs in the same
// launch. One launch at a time per module (stream order) may use the workspace.
// FP8 cache (e4m3 codes): K = code * kv_scale[0][kvh], V = code * kv_scale[1][kvh] (1 without kv_scale).
//
// Before the wait (programmatic dependent launch, codegen/kernel.py): the kernel finds its sequence, its split and its
// cache blocks from the step's inputs (query_start_loc, seq_lens, block_tables), then asks L2 for the K and V rows
// of the first PREFETCH_ROWS = ${PREFETCH_ROWS} positions of its range, and only then waits for the grid before it,
// whose outputs (q, this step's new K/V rows) it reads after. Launched early, that chain of dependent loads (3 round
// trips) and the first tiles' DRAM latency overlap the previous kernel (at batch 1 the whole short context). The
// step's inputs are written before the kernel two launches back has finished (the copy or the step-inputs kernel at
// the step's start), which a kernel waiting first has awaited before letting this one start; with the early trigger
// (INGOT_PDL_TRIGGER=early) that no longer holds, and the wait moves to the top of the kernel.
// A prefetched line this step's qkv kernel then writes is updated in L2 like any other: the reads after the wait
// see the new row.
struct pa_u32x4 { unsigned x, y, z, w; };

namespace {
constexpr int D = ${HEAD_DIM}, KV = ${KV_HEADS}, G = ${GROUP}, H = KV * G, BS = ${BLOCK_SIZE};
constexpr int WARPS = ${WARPS}, MAX_SPLITS = ${MAX_SPLITS}, MIN_CHUNK_BLOCKS = ${MIN_CHUNK_BLOCKS};
constexpr int TARGET_CTAS = ${TARGET_CTAS}, TOKEN_CAP = ${TOKEN_CAP}, WINDOW = ${SLIDING_WINDOW};
constexpr bool FP8 = ${FP8};
constexpr int PREFETCH_ROWS = ${PREFETCH_ROWS};
constexpr float SCALE = ${SCALE}, SOFTCAP = ${SOFTCAP};
constexpr int LPP = D / 8, PPW = 32 / LPP, ITERS = ${ITERS}, TP = PPW * ITERS, TILES = BS / TP;
static_assert(D % 8 == 0 && 32 % LPP == 0 && LPP <= 32, "head_dim: 8 features per lane, a power of two up to 256");
static_assert(BS % TP == 0, "a cache block is whole tiles");
// the tensor-core path
constexpr bool MMA = ${MMA};
constexpr int STAGES = ${STAGES}, TQ = 16, ESZ = FP8 ? 1 : 2;  // ESZ: bytes per cached element
// ring rows: D cached elements plus 16 bytes of padding; CHC 16-byte chunks per row, RPI rows per cp.async of the
// warp. The rows mma reads (bf16 cache: the ring itself; FP8: a per-warp f16 copy of the tile) are D 16-bit values
// plus 16 bytes (RS), so the 8 rows an ldmatrix reads start 4 banks apart (conflict-free) and every fragment
// address is a per-lane base plus a constant.
constexpr int CHC = D * ESZ / 16, RPI = 32 / CHC;
constexpr unsigned RSC = D * ESZ + 16, KV_TILE_B = TQ * RSC, STAGE_B = 2 * KV_TILE_B, RS = D * 2 + 16;
constexpr unsigned CONV_B = FP8 ? 2 * TQ * RS : 0;  // FP8: the warp's f16 K and V tiles after the ring
constexpr unsigned WARP_RING_B = STAGES * STAGE_B + CONV_B;
constexpr float LOG2E = 1.4426950408889634f;
// floats between two warps' accumulators in shared memory (the MMA path keeps them in the warp's own ring)
constexpr int ACC_WSTRIDE = MMA ? (int)(WARP_RING_B / 4) : G * D;
static_assert(!MMA || (BS % TQ == 0 && G <= 8 && STAGES >= 2 && 32 % CHC == 0), "tensor-core path: whole tiles");
static_assert(!MMA || G * D * 4 <= (int)WARP_RING_B, "a warp's accumulators fit its ring");
}  // namespace

__device__ float ${KERNEL}_acc[TOKEN_CAP * KV * MAX_SPLITS * G * D];
__device__ float ${KERNEL}_ml[TOKEN_CAP * KV * MAX_SPLITS * G * 2];
__device__ unsigned ${KERNEL}_cnt[TOKEN_CAP * KV];

// Reads of what the grid before this one writes (q, this step's K/V rows), all after the wait: coherent loads, and
// volatile so that neither the compiler nor ptxas moves them above it (ptxas moves ld.global.nc across
// griddepcontrol.wait, see gemv/kernel.cu's header).
__device__ __forceinline__ pa_u32x4 pa_ld(const bf16* p) {
  pa_u32x4 v;
  asm volatile("ld.global.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}
__device__ __forceinline__ pa_u32x4 pa_ld(const fp8e4m3* p) {
  pa_u32x4 v;
  asm volatile("ld.global.v2.u32 {%0,%1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
  v.z = v.w = 0u;
  return v;
}
__device__ __forceinline__ unsigned pa_ld_u32(const unsigned* p) {
  unsigned v;
  asm volatile("ld.global.u32 %0, [%1];" : "=r"(v) : "l"(p));
  return v;
}
__device__ __forceinline__ void pa_e4m3x2(unsigned short b, float& lo, float& hi) {
  unsigned h2;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h2) : "h"(b));
  asm("{.reg .f16 l, h;\n mov.b32 {l, h}, %2;\n cvt.f32.f16 %0, l;\n cvt.f32.f16 %1, h;}" : "=f"(lo), "=f"(hi) : "r"(h2));
}
// 8 features (16 B of bf16 or 8 B of e4m3) -> float
__device__ __forceinline__ void pa_cvt(const pa_u32x4& r, float* f) {
  if (FP8) {
    pa_e4m3x2((unsigned short)(r.x & 0xffffu), f[0], f[1]);
    pa_e4m3x2((unsigned short)(r.x >> 16), f[2], f[3]);
    pa_e4m3x2((unsigned short)(r.y & 0xffffu), f[4], f[5]);
    pa_e4m3x2((unsigned short)(r.y >> 16), f[6], f[7]);
  } else {
    const unsigned v[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      f[2 * i] = __uint_as_float(v[i] << 16);
      f[2 * i + 1] = __uint_as_float(v[i] & 0xffff0000u);
    }
  }
}
// merge (mo, lo, ao) into (m, l, a): the online-softmax combine; -inf maxima carry nothing
__device__ __forceinline__ void pa_merge(float& m, float& l, float* a, float mo, float lo, const float* ao) {
  const float mn = fmaxf(m, mo);
  if (mn == __int_as_float(0xff800000u)) return;
  const float ca = expf(m - mn), cb = expf(mo - mn);
  l = l * ca + lo * cb;
#pragma unroll
  for (int e = 0; e < 8; ++e) a[e] = a[e] * ca + ao[e] * cb;
  m = mn;
}

// merge weight of a state with max mo against the merged max mn: the loops' score units (MMA: log2, SIMT: natural)
__device__ __forceinline__ float pa_unit_exp(float x) { return MMA ? exp2f(x) : expf(x); }

// ---- tensor-core path helpers (see prefill_flash.cu for the same fragments in the standard orientation) ----
// D += A B on bf16 pairs (bf16 cache) or f16 pairs (FP8 cache: e4m3 -> f16 is exact)
__device__ __forceinline__ void pa_mma(float* d, const unsigned* a, unsigned b0, unsigned b1) {
  if constexpr (FP8)
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  else
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// an 8x8 b16 matrix in fragment layout (lane holds row lane / 4, columns 2 (lane % 4) + {0, 1}) -> its transpose
__device__ __forceinline__ unsigned pa_movt(unsigned x) {
  unsigned r;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(r) : "r"(x));
  return r;
}
// two floats -> the mma's 16-bit pair (bf16, or f16 for the FP8 cache; lo in the low half), round to nearest even
__device__ __forceinline__ unsigned pa_pack(float lo, float hi) {
  unsigned r;
  if constexpr (FP8) asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  else asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
// the pair back to floats (exact)
__device__ __forceinline__ void pa_unpack(unsigned x, float& lo, float& hi) {
  if constexpr (FP8) {
    asm("{.reg .f16 l, h;\n mov.b32 {l, h}, %2;\n cvt.f32.f16 %0, l;\n cvt.f32.f16 %1, h;}" : "=f"(lo), "=f"(hi) : "r"(x));
  } else {
    lo = __uint_as_float(x << 16);
    hi = __uint_as_float(x & 0xffff0000u);
  }
}
// 4 e4m3 codes (byte i = element i) -> 2 f16 pairs, exact
__device__ __forceinline__ void pa_e4m3x4_f16(unsigned x, unsigned& lo, unsigned& hi) {
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(lo) : "h"((unsigned short)(x & 0xffffu)));
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(hi) : "h"((unsigned short)(x >> 16)));
}
// byte offset of (row, 16-byte chunk c) in a padded [TQ][D] tile of 16-bit values, and in a ring tile
__device__ __forceinline__ unsigned pa_off(int row, int c) { return (unsigned)(row * RS + c * 16); }
__device__ __forceinline__ unsigned pa_offc(int row, int c) { return (unsigned)(row * RSC + c * 16); }

// MMA: min. 1 CTA per SM (shared memory allows 1-2): without it ptxas caps the tensor-core loop at 64 registers and
// spills; the CUDA-core loop keeps ptxas's own choice (3 CTAs per SM for the common shapes)
extern "C" __global__ void __launch_bounds__(WARPS * 32${MIN_CTAS}) ${KERNEL}(
    const ${DT}* __restrict__ q, const ${CT}* __restrict__ kv_cache, const int* __restrict__ block_tables,
    const int* __restrict__ seq_lens, const int* __restrict__ query_start_loc, ${DT}* __restrict__ out,
    int num_tokens, int num_seqs, int max_blocks${KV_SCALE_PARAM}) {
  __shared__ float sm_m[WARPS][G], sm_l[WARPS][G];
  __shared__ __align__(16) float sm_acc_simt[MMA ? 1 : WARPS * G * D];
  extern __shared__ __align__(128) unsigned char pa_ring[];  // MMA: WARPS rings of STAGES K/V tiles (spec.smem)
  __shared__ unsigned is_last;
  float* const sm_acc = MMA ? reinterpret_cast<float*>(pa_ring) : sm_acc_simt;  // warp w at w * ACC_WSTRIDE
  const float NEG_INF = __int_as_float(0xff800000u);
${PDL_WAIT_EARLY}
  const int t = blockIdx.x, kvh = blockIdx.y, z = blockIdx.z;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (t >= num_tokens) return;
  // the grid has MAX_SPLITS CTAs per (token, kv head); most of them have no split when the batch alone fills the
  // GPU. They exit here, before any memory read: the bound below needs only num_tokens (the exact nsplit needs the
  // sequence's length, a chain of dependent loads that thousands of idle CTAs would otherwise wait through).
  const int room = MMA ? TARGET_CTAS / (num_tokens * KV) : (TARGET_CTAS + num_tokens * KV - 1) / (num_tokens * KV);
  if (z > 0 && (z >= room || z >= MAX_SPLITS || t >= TOKEN_CAP)) return;
  // the last s with query_start_loc[s] <= t (empty sequences share a start with the next one): a 32-way search,
  // each warp for itself, one load per lane and round (one round up to 32 sequences, two up to 1024; a binary
  // search is a chain of log2(num_seqs) dependent loads at the start of every CTA)
  int lo_s = 0, hi_s = num_seqs;  // the answer is in [lo_s, hi_s]
  while (lo_s < hi_s) {
    const int step = (hi_s - lo_s + 31) / 32;
    const bool le = __ldg(query_start_loc + min(lo_s + step * (lane + 1), hi_s)) <= t;
    const int cnt = __popc(__ballot_sync(0xffffffffu, le));  // query_start_loc ascends: the probes <= t lead
    hi_s = min(lo_s + step * (cnt + 1) - 1, hi_s);
    lo_s = min(lo_s + step * cnt, hi_s);
  }
  const int s = lo_s;
  const bool owned = s < num_seqs && t >= query_start_loc[0];
  const int start = owned ? query_start_loc[s] : 0;
  const int n = owned ? query_start_loc[s + 1] - start : 0;
  const int qpos = owned ? seq_lens[s] - n + (t - start) : -1;
  const int first = WINDOW > 0 ? max(0, qpos - WINDOW + 1) : 0;
  const int* table = block_tables + (i64)(owned ? s : 0) * max_blocks;

  int nsplit = 1, per = 1, b_first = 0, nblk = 0;
  if (owned) {
    b_first = first / BS;
    nblk = qpos / BS - b_first + 1;
    int want = min(min((nblk + MIN_CHUNK_BLOCKS - 1) / MIN_CHUNK_BLOCKS, room), MAX_SPLITS);
    if (t >= TOKEN_CAP) want = 1;
    want = max(want, 1);
    per = (nblk + want - 1) / want;
    nsplit = (nblk + per - 1) / per;
  }
  if (z >= nsplit) return;
  const float* kvs = ${KV_SCALE_PTR};
  const float ksc = kvs != nullptr ? kvs[kvh] : 1.0f, vsc = kvs != nullptr ? kvs[KV + kvh] : 1.0f;
  // the CTA's cache blocks [b0, b1) and the positions it attends to, [lo, hi] (empty when !owned)
  const int b0 = b_first + z * per, b1 = min(b0 + per, b_first + nblk);
  const int lo = max(b0 * BS, first), hi = min(b1 * BS - 1, qpos);
  // the first PREFETCH_ROWS positions of the range, K and V rows, asked of L2 (the step's inputs are read as above)
  if (PREFETCH_ROWS > 0 && owned) {
    constexpr int LINES = (D * ESZ + 127) / 128;  // 128-byte lines a row
    const int rows = min(hi - lo + 1, PREFETCH_ROWS);
    for (int i = threadIdx.x; i < 2 * LINES * rows; i += WARPS * 32) {
      const int p = lo + i / (2 * LINES), kv = (i / LINES) & 1;
      const i64 blk = __ldg(table + p / BS);
      const ${CT}* row = kv_cache + ((blk * 2 + kv) * BS + p % BS) * (KV * D) + kvh * D;
      asm volatile("prefetch.global.L2 [%0];" ::"l"(reinterpret_cast<const char*>(row) + 128 * (i % LINES)));
    }
  }
  // the grid before this one (the qkv projection, rope, the cache write) writes q and this step's K/V rows: read from
  // here on. Everything above reads only the step's inputs and the model's constants (header: "Before the wait").
${PDL_WAIT}

  if constexpr (MMA) {
    const int g8 = lane >> 2, t4 = lane & 3;
    // B fragments of Q^T (k = features, n = query head g8 of the group; zero columns past G), bf16 pairs
    unsigned qb[D / 16][2];
    // the scores' factor to log2 units: SCALE (and kv_scale, and 1 / qs for the FP8 cache's scaled f16 query)
    float qk = SCALE * LOG2E * ksc;
    {
      const bool live = owned && g8 < G;
      const unsigned* qw = reinterpret_cast<const unsigned*>(q + (i64)t * ${Q_STRIDE} + (kvh * G + (live ? g8 : 0)) * D);
#pragma unroll
      for (int ks = 0; ks < D / 16; ++ks) {
        qb[ks][0] = live ? pa_ld_u32(qw + 8 * ks + t4) : 0u;
        qb[ks][1] = live ? pa_ld_u32(qw + 8 * ks + 4 + t4) : 0u;
      }
      if constexpr (FP8) {
        // the f16 mma takes q as f16: scaled by a power of two qs that puts the group's largest |q| in
        // [2^14, 2^15) (exact; entries below 2^-24 of the largest, too small to move a float32 score, flush),
        // divided back out of the scores. The warp's lanes hold the whole group, so the amax is the warp's.
        float amax = 0.0f;
#pragma unroll
        for (int ks = 0; ks < D / 16; ++ks)
#pragma unroll
          for (int j = 0; j < 2; ++j)
            amax = fmaxf(amax, fmaxf(fabsf(__uint_as_float(qb[ks][j] << 16)),
                                     fabsf(__uint_as_float(qb[ks][j] & 0xffff0000u))));
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
        const int ex = (int)((__float_as_uint(amax) >> 23) & 0xffu);  // amax in [2^(ex-127), 2^(ex-126))
        const float qs = __uint_as_float((unsigned)min(268 - ex, 254) << 23);  // 2^(141 - ex), at most 2^127
#pragma unroll
        for (int ks = 0; ks < D / 16; ++ks)
#pragma unroll
          for (int j = 0; j < 2; ++j)
            qb[ks][j] = pa_pack(__uint_as_float(qb[ks][j] << 16) * qs, __uint_as_float(qb[ks][j] & 0xffff0000u) * qs);
        qk /= qs;
      }
    }
    // O^T accumulators: o[mt] = rows (features) 16 mt + g8 (+ 8), columns (heads) 2 t4 + {0, 1}; running max (log2
    // units) and this lane's share of the sum for heads 2 t4 + hh
    float o[D / 16][4], m2[2] = {NEG_INF, NEG_INF}, l2[2] = {0.0f, 0.0f};
#pragma unroll
    for (int mt = 0; mt < D / 16; ++mt) o[mt][0] = o[mt][1] = o[mt][2] = o[mt][3] = 0.0f;
    // this warp's tiles: j0 + warp + WARPS * i, i < nt (tile j = positions [16 j, 16 j + 15], inside one block)
    const int j0 = lo / TQ, ntile = owned ? hi / TQ - j0 + 1 : 0;
    const int nt = ntile > warp ? (ntile - warp + WARPS - 1) / WARPS : 0;
    const unsigned ring = att_smem(pa_ring) + warp * WARP_RING_B;
    // block_tables entries of the warp's tiles lane + 32 k, a window of 32 in registers (the next window is loaded
    // 32 tiles before it is needed, so no table read stalls the loads)
    auto entry = [&](int i) { return i < nt ? __ldg(table + (j0 + warp + WARPS * i) * TQ / BS) : 0; };
    int win = entry(lane), win_next = entry(lane + 32);
    // cp.async K and V of the warp's tile i into stage st (called once per tile, in order)
    auto issue = [&](int i, int st) {
      if (i > 0 && (i & 31) == 0) {
        win = win_next;
        win_next = entry(i + 32 + lane);
      }
      const i64 blk = __shfl_sync(0xffffffffu, win, i & 31);
      const int p0 = (j0 + warp + WARPS * i) * TQ;
      const ${CT}* kt = kv_cache + ((blk * 2) * BS + p0 % BS) * (KV * D) + kvh * D + (lane % CHC) * (16 / ESZ);
      const unsigned sk = ring + st * STAGE_B;
      if (p0 >= lo && p0 + TQ - 1 <= hi) {  // a whole tile (all but a range's first and last): no predicates
#pragma unroll
        for (int r0 = 0; r0 < TQ; r0 += RPI) {
          const int row = r0 + lane / CHC;
          att_cp16(sk + pa_offc(row, lane % CHC), kt + row * (KV * D), true);
          att_cp16(sk + KV_TILE_B + pa_offc(row, lane % CHC), kt + (row + BS) * (KV * D), true);
        }
      } else {
#pragma unroll
        for (int r0 = 0; r0 < TQ; r0 += RPI) {
          const int row = r0 + lane / CHC, p = p0 + row;
          const bool ok = p >= lo && p <= hi;
          const ${CT}* src = kt + row * (KV * D);
          att_cp16(sk + pa_offc(row, lane % CHC), ok ? src : kv_cache, ok);
          att_cp16(sk + KV_TILE_B + pa_offc(row, lane % CHC), ok ? src + BS * (KV * D) : kv_cache, ok);
        }
      }
    };
    // FP8: the warp's f16 copy of the tile in stage st (ring chunk c of 16 codes -> 2 chunks of 8 f16), exact
    const unsigned conv = ring + STAGES * STAGE_B;
    auto convert = [&](int st) {
#pragma unroll
      for (int k = 0; k < 2 * TQ * CHC / 32; ++k) {
        const int row = (32 * k + lane) / CHC, c = lane % CHC;  // row: the K rows, then the V rows
        unsigned w[4], h[8];
        asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(w[0]), "=r"(w[1]), "=r"(w[2]), "=r"(w[3])
                     : "r"(ring + st * STAGE_B + pa_offc(row, c)));
#pragma unroll
        for (int j = 0; j < 4; ++j) pa_e4m3x4_f16(w[j], h[2 * j], h[2 * j + 1]);
        asm volatile("st.shared.v4.u32 [%0], {%1,%2,%3,%4};" ::"r"(conv + pa_off(row, 2 * c)), "r"(h[0]), "r"(h[1]),
                     "r"(h[2]), "r"(h[3]) : "memory");
        asm volatile("st.shared.v4.u32 [%0], {%1,%2,%3,%4};" ::"r"(conv + pa_off(row, 2 * c + 1)), "r"(h[4]),
                     "r"(h[5]), "r"(h[6]), "r"(h[7]) : "memory");
      }
    };
#pragma unroll
    for (int i = 0; i < STAGES - 1; ++i) {
      if (i < nt) issue(i, i);
      att_commit();
    }
    int st = 0, st_next = STAGES - 1;  // the stage of tile i, and of tile i + STAGES - 1 (the one computed last)
    for (int i = 0; i < nt; ++i) {
      __syncwarp();  // every lane is done with stage st_next (tile i - 1), which tile i + STAGES - 1 overwrites
      if (i + STAGES - 1 < nt) issue(i + STAGES - 1, st_next);
      att_commit();
      att_wait<STAGES - 1>();  // this lane's copies of tile i have landed
      __syncwarp();           // ... and every lane's
      if constexpr (FP8) {
        convert(st);
        __syncwarp();
      }
      const unsigned sk = FP8 ? conv : ring + st * STAGE_B, sv = sk + (FP8 ? TQ * RS : KV_TILE_B);
      const int p0 = (j0 + warp + WARPS * i) * TQ;
      // S^T = K Q^T: rows = positions p0 + g8 (+ 8), columns = heads 2 t4 + {0, 1}; two chains of D / 32 mma
      float sa[4] = {0.0f, 0.0f, 0.0f, 0.0f}, sb[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
      for (int ks = 0; ks < D / 16; ++ks) {
        unsigned a[4];
        att_ldsm4(sk + pa_off((lane & 7) + 8 * ((lane >> 3) & 1), 2 * ks + (lane >> 4)), a);
        pa_mma((ks & 1) ? sb : sa, a, qb[ks][0], qb[ks][1]);
      }
      float x[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float v = (sa[e] + sb[e]) * qk;  // log2 units
        if (SOFTCAP > 0.0f) v = SOFTCAP * LOG2E * tanhf(v * (1.0f / (LOG2E * (SOFTCAP > 0.0f ? SOFTCAP : 1.0f))));
        const int p = p0 + g8 + 8 * (e >> 1);
        x[e] = p >= lo && p <= hi ? v : NEG_INF;
      }
      // online softmax per head column hh (x[hh], x[hh + 2]); the 8 lanes of a column (same t4) share its max
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        float mx = fmaxf(x[hh], x[hh + 2]);
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 8));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 16));
        const float mn = fmaxf(m2[hh], mx);
        const float mu = mn == NEG_INF ? 0.0f : mn;  // nothing seen yet: exp2(-inf - 0) = 0
        const float corr = att_exp2(m2[hh] - mu);
        x[hh] = att_exp2(x[hh] - mu);
        x[hh + 2] = att_exp2(x[hh + 2] - mu);
        m2[hh] = mn;
        l2[hh] *= corr;
#pragma unroll
        for (int mt = 0; mt < D / 16; ++mt) {
          o[mt][hh] *= corr;
          o[mt][hh + 2] *= corr;
        }
      }
      // P in bf16 (f16 for the FP8 cache); the sums take the rounded weights, so the output is their exact convex
      // combination
      const unsigned plo = pa_pack(x[0], x[1]), phi = pa_pack(x[2], x[3]);
      {
        float a0, a1, b0, b1;
        pa_unpack(plo, a0, a1);
        pa_unpack(phi, b0, b1);
        l2[0] += a0 + b0;
        l2[1] += a1 + b1;
      }
      // B fragment of P^T (k = position, n = head): the (position, head) quarters of S^T's layout, transposed
      const unsigned pb0 = pa_movt(plo), pb1 = pa_movt(phi);
      // O^T += V^T P^T: A = V^T (rows = features 16 mt .., k = positions) by ldmatrix.trans of the V rows
#pragma unroll
      for (int mt = 0; mt < D / 16; ++mt) {
        unsigned a[4];
        att_ldsm4_t(sv + pa_off((lane & 7) + 8 * (lane >> 4), 2 * mt + ((lane >> 3) & 1)), a);
        pa_mma(o[mt], a, pb0, pb1);
      }
      st = st + 1 == STAGES ? 0 : st + 1;
      st_next = st_next + 1 == STAGES ? 0 : st_next + 1;
    }
    att_wait<0>();
    __syncwarp();  // the ring is free: it takes this warp's state
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      l2[hh] += __shfl_xor_sync(0xffffffffu, l2[hh], 4);
      l2[hh] += __shfl_xor_sync(0xffffffffu, l2[hh], 8);
      l2[hh] += __shfl_xor_sync(0xffffffffu, l2[hh], 16);
      const int h = 2 * t4 + hh;
      if (h < G) {
        if (g8 == 0) {
          sm_m[warp][h] = m2[hh];
          sm_l[warp][h] = l2[hh];
        }
        float* a = sm_acc + warp * ACC_WSTRIDE + h * D + g8;
#pragma unroll
        for (int mt = 0; mt < D / 16; ++mt) {
          a[16 * mt] = o[mt][hh];
          a[16 * mt + 8] = o[mt][hh + 2];
        }
      }
    }
  } else {
    const int dc = lane % LPP, pp = lane / LPP;
    float qv[G][8], m[G], l[G], acc[G][8];
#pragma unroll
    for (int g = 0; g < G; ++g) {
      float f[8];
      if (owned) {
        const pa_u32x4 r = pa_ld(reinterpret_cast<const bf16*>(q) + (i64)t * ${Q_STRIDE} + (kvh * G + g) * D + 8 * dc);
        const unsigned v[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          f[2 * i] = __uint_as_float(v[i] << 16);
          f[2 * i + 1] = __uint_as_float(v[i] & 0xffff0000u);
        }
      }
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        qv[g][e] = owned ? f[e] : 0.0f;
        acc[g][e] = 0.0f;
      }
      m[g] = NEG_INF;
      l[g] = 0.0f;
    }

    if (owned) {
      for (int item = warp; item < (b1 - b0) * TILES; item += WARPS) {
        const int b = b0 + item / TILES, tile = item % TILES;
        const i64 blk = table[b];
        const int p0 = b * BS + tile * TP;  // the tile's first position
        const ${CT}* kb = kv_cache + ((blk * 2 + 0) * BS + tile * TP + pp) * (KV * D) + kvh * D + 8 * dc;
        const ${CT}* vb = kv_cache + ((blk * 2 + 1) * BS + tile * TP + pp) * (KV * D) + kvh * D + 8 * dc;
        pa_u32x4 kr[ITERS], vr[ITERS];
#pragma unroll
        for (int i = 0; i < ITERS; ++i) kr[i] = pa_ld(kb + (i64)i * PPW * (KV * D));
#pragma unroll
        for (int i = 0; i < ITERS; ++i) vr[i] = pa_ld(vb + (i64)i * PPW * (KV * D));
        float sc[ITERS][G];
#pragma unroll
        for (int i = 0; i < ITERS; ++i) {
          float kf[8];
          pa_cvt(kr[i], kf);
          const int pos = p0 + i * PPW + pp;
          const bool live = pos >= first && pos <= qpos;
#pragma unroll
          for (int g = 0; g < G; ++g) {
            float d = 0.0f;
#pragma unroll
            for (int e = 0; e < 8; ++e) d += qv[g][e] * kf[e];
#pragma unroll
            for (int o = LPP / 2; o > 0; o >>= 1) d += __shfl_xor_sync(0xffffffffu, d, o);
            float score = d * ksc * SCALE;
            if (SOFTCAP > 0.0f) score = SOFTCAP * tanhf(score / (SOFTCAP > 0.0f ? SOFTCAP : 1.0f));
            sc[i][g] = live ? score : NEG_INF;
          }
        }
        float mn[G];
#pragma unroll
        for (int g = 0; g < G; ++g) {
          float mb = sc[0][g];
#pragma unroll
          for (int i = 1; i < ITERS; ++i) mb = fmaxf(mb, sc[i][g]);
          mn[g] = fmaxf(m[g], mb);
          const float corr = mn[g] == NEG_INF ? 1.0f : expf(m[g] - mn[g]);
          l[g] *= corr;
#pragma unroll
          for (int e = 0; e < 8; ++e) acc[g][e] *= corr;
          m[g] = mn[g];
        }
#pragma unroll
        for (int i = 0; i < ITERS; ++i) {
          float vf[8];
          pa_cvt(vr[i], vf);
#pragma unroll
          for (int g = 0; g < G; ++g) {
            const float p = sc[i][g] == NEG_INF ? 0.0f : expf(sc[i][g] - mn[g]);
            l[g] += p;
#pragma unroll
            for (int e = 0; e < 8; ++e) acc[g][e] += p * vf[e];
          }
        }
      }
    }
    // lane groups (positions pp) of the warp -> one state per feature chunk dc
#pragma unroll
    for (int o = LPP; o < 32; o <<= 1)
#pragma unroll
      for (int g = 0; g < G; ++g) {
        float ao[8];
        const float mo = __shfl_xor_sync(0xffffffffu, m[g], o), lo = __shfl_xor_sync(0xffffffffu, l[g], o);
#pragma unroll
        for (int e = 0; e < 8; ++e) ao[e] = __shfl_xor_sync(0xffffffffu, acc[g][e], o);
        pa_merge(m[g], l[g], acc[g], mo, lo, ao);
      }
    if (pp == 0) {
#pragma unroll
      for (int g = 0; g < G; ++g) {
        if (dc == 0) {
          sm_m[warp][g] = m[g];
          sm_l[warp][g] = l[g];
        }
#pragma unroll
        for (int e = 0; e < 8; ++e) sm_acc[warp * ACC_WSTRIDE + g * D + 8 * dc + e] = acc[g][e];
      }
    }
  }
  __syncthreads();

  // warps -> the CTA's state for each (query head g, feature d); one split: normalize and write
  const i64 slot = ((i64)t * KV + kvh) * MAX_SPLITS;
  for (int idx = threadIdx.x; idx < G * D; idx += WARPS * 32) {
    const int g = idx / D, d = idx % D;
    float M = NEG_INF;
#pragma unroll
    for (int w = 0; w < WARPS; ++w) M = fmaxf(M, sm_m[w][g]);
    float L = 0.0f, A = 0.0f;
    if (M != NEG_INF) {
#pragma unroll
      for (int w = 0; w < WARPS; ++w) {
        const float c = pa_unit_exp(sm_m[w][g] - M);
        L += sm_l[w][g] * c;
        A += sm_acc[w * ACC_WSTRIDE + idx] * c;
      }
    }
    if (nsplit == 1) {
      out[(i64)t * (H * D) + (kvh * G + g) * D + d] = from_f32<${DT}>(owned ? A / L * vsc : 0.0f);
    } else {
      asm volatile("st.global.cg.f32 [%0], %1;" ::"l"(${KERNEL}_acc + (slot + z) * (G * D) + idx), "f"(A) : "memory");
      if (d == 0) {
        asm volatile("st.global.cg.f32 [%0], %1;" ::"l"(${KERNEL}_ml + ((slot + z) * G + g) * 2), "f"(M) : "memory");
        asm volatile("st.global.cg.f32 [%0], %1;" ::"l"(${KERNEL}_ml + ((slot + z) * G + g) * 2 + 1), "f"(L)
                     : "memory");
      }
    }
  }
  if (nsplit == 1) return;

  // the reduce: the last CTA of (t, kvh) merges the nsplit partials in split order
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned prev;
    asm volatile("atom.global.add.u32 %0, [%1], 1;" : "=r"(prev) : "l"(&${KERNEL}_cnt[t * KV + kvh]) : "memory");
    is_last = prev == (unsigned)nsplit - 1u;
  }
  __syncthreads();
  if (!is_last) return;
  __threadfence();
  // every partial's (max, sum) at once, then per head the merged max, each split's weight (0 for a partial that saw
  // nothing) and the merged sum; then the accumulators, all splits' loads in flight together (a loop that used
  // each load before issuing the next was a chain of 3 x nsplit round trips: most of a small batch's time)
  __shared__ float sm_pm[MAX_SPLITS * G], sm_pl[MAX_SPLITS * G], sm_L[G];
  for (int i = threadIdx.x; i < nsplit * G; i += WARPS * 32) {
    sm_pm[i] = __ldcg(${KERNEL}_ml + (slot * G + i) * 2);
    sm_pl[i] = __ldcg(${KERNEL}_ml + (slot * G + i) * 2 + 1);
  }
  __syncthreads();
  if (threadIdx.x < G) {
    const int g = threadIdx.x;
    float M = NEG_INF, L = 0.0f;
    for (int sp = 0; sp < nsplit; ++sp) M = fmaxf(M, sm_pm[sp * G + g]);
    for (int sp = 0; sp < nsplit; ++sp) {
      const float ms = sm_pm[sp * G + g], c = ms == NEG_INF ? 0.0f : pa_unit_exp(ms - M);
      sm_pm[sp * G + g] = c;
      L += sm_pl[sp * G + g] * c;
    }
    sm_L[g] = L;
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < G * D; idx += WARPS * 32) {
    const int g = idx / D, d = idx % D;
    float part[MAX_SPLITS];
#pragma unroll
    for (int sp = 0; sp < MAX_SPLITS; ++sp)
      part[sp] = sp < nsplit ? __ldcg(${KERNEL}_acc + (slot + sp) * (G * D) + idx) : 0.0f;
    float A = 0.0f;
#pragma unroll
    for (int sp = 0; sp < MAX_SPLITS; ++sp)
      if (sp < nsplit) A += part[sp] * sm_pm[sp * G + g];  // in split order: deterministic
    out[(i64)t * (H * D) + (kvh * G + g) * D + d] = from_f32<${DT}>(A / sm_L[g] * vsc);
  }
  if (threadIdx.x == 0) ${KERNEL}_cnt[t * KV + kvh] = 0u;  // ready for the next launch
}
