#include "../common.cuh"
#include "mma.cuh"

// Paged prefill attention on tensor cores, FlashAttention-2 style: the same semantics as paged_attention.cu
// (a ragged token batch, each token attending causally to its sequence's cached positions through block_tables,
// GQA, softcap, sliding window; tokens outside [query_start_loc[0], query_start_loc[num_seqs]) get zeros), bf16
// queries and cache. See codegen/kernels/attention/prefill_rule.py for when it runs.
//
// Rows. A CTA holds ROWS = 16 x WARPS query rows; row r is (token r / G, query head kvh * G + r % G): the G query
// heads sharing KV head kvh sit in the same CTA, so each K/V tile is loaded once for the whole group. A CTA so
// covers TPT = ROWS / G tokens.
// Grid (ceil(num_tokens / TPT), KV heads). CTA x takes the flat token range [b * TPT, (b + 1) * TPT) (b counted
// from the end of the batch, so the heavy last tiles of a long sequence start first) and, for each sequence
// overlapping that range (binary search for the first, as in paged_attention.cu), the sub-tile of its tokens in
// it: a prefill sequence's tokens cost whole tiles plus at most one partial tile at each end, decode tokens
// (n = 1) are one row group each, handled one after another.
// Per sub-tile: Q rows -> shared (cp.async) -> registers (ldmatrix, A fragments of mma.m16n8k16); K/V tiles of
// BN = 64 positions through two shared stages (cp.async double buffering: tile i + 1 loads while tile i
// computes); positions outside [lo, hi] (the sub-tile's window start .. last token's position) are zero-filled
// instead of read (their block_tables entries may be anything) and tiles past hi are never visited (causal skip).
// S = Q K^T and O += P V on mma.sync (bf16 in, f32 accumulate); online softmax in float32 with ex2.approx, the scale
// (and log2 e) folded into the scores; the causal/window mask is applied only to tiles that cross a row's bound.
// Shared rows are 16-byte chunks XOR-swizzled by (row & 7), so ldmatrix reads are bank-conflict free.
namespace {
constexpr int D = ${HEAD_DIM}, KV = ${KV_HEADS}, G = ${GROUP}, H = KV * G, BS = ${BLOCK_SIZE};
constexpr int WARPS = ${WARPS}, ROWS = 16 * WARPS, TPT = ROWS / G, BN = 64, NT = WARPS * 32;
constexpr int WINDOW = ${SLIDING_WINDOW}, QS = ${Q_STRIDE}, CH = D / 8;
constexpr unsigned STAGE = BN * D * 2;
constexpr float SCALE = ${SCALE}, SOFTCAP = ${SOFTCAP}, LOG2E = 1.4426950408889634f;
static_assert(D % 64 == 0 && D <= 128, "head_dim 64 or 128");
static_assert(G <= ROWS, "a CTA holds at least one whole query-head group (rows past TPT * G stay idle)");

__device__ __forceinline__ void pf_mma(float* d, const unsigned* a, unsigned b0, unsigned b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
               "{%0,%1,%2,%3};"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// two floats -> bf16x2 (lo in the low half), round to nearest even
__device__ __forceinline__ unsigned pf_pack(float lo, float hi) {
  unsigned r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
// byte offset of (row, 16-byte chunk c) in a swizzled [rows][D] bf16 tile
__device__ __forceinline__ unsigned pf_off(int row, int c) { return (unsigned)(row * D + ((c ^ (row & 7)) << 3)) * 2u; }
// K/V rows of positions [p0, p0 + BN) into one stage; positions outside [lo, hi] are zero-filled, not read
__device__ __forceinline__ void pf_load_kv(const bf16* kv_cache, const int* table, int kvh, int p0, int lo, int hi,
                                           unsigned sk, unsigned sv, int tid) {
#pragma unroll
  for (int i = tid; i < BN * CH; i += NT) {
    const int j = i / CH, c = i % CH, p = p0 + j;
    const bool ok = p >= lo && p <= hi;
    const i64 blk = ok ? table[p / BS] : 0;
    const bf16* kp = kv_cache + ((blk * 2 + 0) * BS + p % BS) * (KV * D) + kvh * D + c * 8;
    att_cp16(sk + pf_off(j, c), ok ? kp : kv_cache, ok);
    att_cp16(sv + pf_off(j, c), ok ? kp + BS * (KV * D) : kv_cache, ok);
  }
}
}  // namespace

extern "C" __global__ void __launch_bounds__(NT) ${KERNEL}(
    const bf16* __restrict__ q, const bf16* __restrict__ kv_cache, const int* __restrict__ block_tables,
    const int* __restrict__ seq_lens, const int* __restrict__ query_start_loc, bf16* __restrict__ out,
    int num_tokens, int num_seqs, int max_blocks) {
  extern __shared__ __align__(128) unsigned char pf_shared[];
  const unsigned sq = att_smem(pf_shared), sk0 = sq + ROWS * D * 2, sv0 = sk0 + 2 * BN * D * 2;
  const float NEG_INF = __int_as_float(0xff800000u);
  const int kvh = blockIdx.y, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g8 = lane >> 2, t4 = lane & 3;
  const int b = gridDim.x - 1 - blockIdx.x;
  const int tstart = b * TPT, tend = min(tstart + TPT, num_tokens);
  const int qsl0 = query_start_loc[0], qsl_end = query_start_loc[num_seqs];

  att_zero_padding<G, H, D, NT>(out, kvh, tid, tstart, tend, qsl0, qsl_end);
  for (int s = att_first_seq(query_start_loc, num_seqs, tstart); s < num_seqs; ++s) {
    const int start = query_start_loc[s], end = query_start_loc[s + 1];
    if (start >= tend) break;
    const int t0 = max(start, tstart), t1 = min(end, tend);
    if (t0 >= t1) continue;
    const int ntok = t1 - t0, n = end - start, base = seq_lens[s] - n - start;  // position of token t: base + t
    const int qpos_lo = base + t0, qpos_hi = base + t1 - 1;
    const int lo = WINDOW > 0 ? max(0, qpos_lo - WINDOW + 1) : 0;
    const int first_hi = WINDOW > 0 ? max(0, qpos_hi - WINDOW + 1) : 0;
    const int* table = block_tables + (i64)s * max_blocks;

    // Q rows of this sub-tile (rows past its tokens are zeros)
    for (int i = tid; i < ROWS * CH; i += NT) {
      const int r = i / CH, c = i % CH, tl = r / G;
      const bool ok = tl < ntok;
      const bf16* src = q + (ok ? (i64)(t0 + tl) * QS + (kvh * G + r % G) * D + c * 8 : 0);
      att_cp16(sq + pf_off(r, c), src, ok);
    }
    att_commit();
    const int kt0 = lo / BN, ntiles = qpos_hi / BN - kt0 + 1;
    pf_load_kv(kv_cache, table, kvh, kt0 * BN, lo, qpos_hi, sk0, sv0, tid);
    att_commit();
    att_wait<1>();
    __syncthreads();

    // this warp's 16 rows: Q fragments, and the positions of rows g8 and g8 + 8 (-1: not a token, never masked in
    // or written)
    unsigned qf[D / 16][4];
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks)
      att_ldsm4(sq + pf_off(warp * 16 + (lane & 7) + 8 * ((lane >> 3) & 1), 2 * ks + (lane >> 4)), qf[ks]);
    int qpos[2], first[2];
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int tl = (warp * 16 + g8 + 8 * hf) / G;
      qpos[hf] = tl < ntok ? base + t0 + tl : -1;
      first[hf] = WINDOW > 0 ? qpos[hf] - WINDOW + 1 : 0;
    }
    float o[D / 8][4], m[2] = {NEG_INF, NEG_INF}, l[2] = {0.0f, 0.0f};
#pragma unroll
    for (int i = 0; i < D / 8; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;

    for (int it = 0; it < ntiles; ++it) {
      if (it + 1 < ntiles)
        pf_load_kv(kv_cache, table, kvh, (kt0 + it + 1) * BN, lo, qpos_hi, sk0 + ((it + 1) & 1) * STAGE,
                   sv0 + ((it + 1) & 1) * STAGE, tid);
      att_commit();
      att_wait<1>();
      __syncthreads();
      const unsigned sk = sk0 + (it & 1) * STAGE, sv = sv0 + (it & 1) * STAGE;
      const int p0 = (kt0 + it) * BN;
      // S = Q K^T: 16 rows x 64 positions per warp
      float sc[BN / 8][4];
#pragma unroll
      for (int i = 0; i < BN / 8; ++i) sc[i][0] = sc[i][1] = sc[i][2] = sc[i][3] = 0.0f;
#pragma unroll
      for (int ks = 0; ks < D / 16; ++ks) {
#pragma unroll
        for (int np = 0; np < BN / 16; ++np) {
          unsigned kb[4];
          att_ldsm4(sk + pf_off(np * 16 + (lane & 7) + 8 * (lane >> 4), 2 * ks + ((lane >> 3) & 1)), kb);
          pf_mma(sc[2 * np], qf[ks], kb[0], kb[1]);
          pf_mma(sc[2 * np + 1], qf[ks], kb[2], kb[3]);
        }
      }
      const bool masked = p0 + BN - 1 > qpos_lo || (WINDOW > 0 && p0 < first_hi);
#pragma unroll
      for (int i = 0; i < BN / 8; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          float x = sc[i][e];
          if (SOFTCAP > 0.0f) x = SOFTCAP * tanhf(x * (SCALE / (SOFTCAP > 0.0f ? SOFTCAP : 1.0f))) * LOG2E;
          else x *= SCALE * LOG2E;
          if (masked) {
            const int p = p0 + i * 8 + 2 * t4 + (e & 1), hf = e >> 1;
            if (qpos[hf] >= 0 && (p > qpos[hf] || (WINDOW > 0 && p < first[hf]))) x = NEG_INF;
          }
          sc[i][e] = x;
        }
      // online softmax: rows g8 (e = 0, 1) and g8 + 8 (e = 2, 3); a row's 4 lanes share its max
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        float mx = m[hf];
#pragma unroll
        for (int i = 0; i < BN / 8; ++i) mx = fmaxf(mx, fmaxf(sc[i][2 * hf], sc[i][2 * hf + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float mu = mx == NEG_INF ? 0.0f : mx;  // a row with nothing seen yet: exp2(-inf - 0) = 0
        const float corr = att_exp2(m[hf] - mu);
        float sum = 0.0f;
#pragma unroll
        for (int i = 0; i < BN / 8; ++i) {
          sc[i][2 * hf] = att_exp2(sc[i][2 * hf] - mu);
          sc[i][2 * hf + 1] = att_exp2(sc[i][2 * hf + 1] - mu);
          sum += sc[i][2 * hf] + sc[i][2 * hf + 1];
        }
        l[hf] = l[hf] * corr + sum;  // this lane's partial; the row's 4 lanes are summed at the end
        m[hf] = mx;
#pragma unroll
        for (int i = 0; i < D / 8; ++i) {
          o[i][2 * hf] *= corr;
          o[i][2 * hf + 1] *= corr;
        }
      }
      // O += P V: P from the S accumulators (two 8-position tiles = one 16-position A fragment)
#pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk) {
        const unsigned pa[4] = {pf_pack(sc[2 * kk][0], sc[2 * kk][1]), pf_pack(sc[2 * kk][2], sc[2 * kk][3]),
                                pf_pack(sc[2 * kk + 1][0], sc[2 * kk + 1][1]),
                                pf_pack(sc[2 * kk + 1][2], sc[2 * kk + 1][3])};
#pragma unroll
        for (int dp = 0; dp < D / 16; ++dp) {
          unsigned vb[4];
          att_ldsm4_t(sv + pf_off(kk * 16 + (lane & 7) + 8 * ((lane >> 3) & 1), 2 * dp + (lane >> 4)), vb);
          pf_mma(o[2 * dp], pa, vb[0], vb[1]);
          pf_mma(o[2 * dp + 1], pa, vb[2], vb[3]);
        }
      }
      __syncthreads();  // this stage is loaded again two tiles later
    }

    // O / l -> out (rows that are tokens of this sub-tile)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      float sum = l[hf];
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
      const int r = warp * 16 + g8 + 8 * hf, tl = r / G;
      if (tl >= ntok) continue;
      bf16* dst = out + (i64)(t0 + tl) * (H * D) + (kvh * G + r % G) * D + 2 * t4;
#pragma unroll
      for (int i = 0; i < D / 8; ++i)
        *reinterpret_cast<unsigned*>(dst + i * 8) = pf_pack(o[i][2 * hf] * inv, o[i][2 * hf + 1] * inv);
    }
  }
}
