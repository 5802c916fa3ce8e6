// CUTLASS GEMM family, sm_90a: an epilogue whose consumer warpgroups store their own rows, with the tile's scale
// vectors prefetched during its mainloop.
//
// CUTLASS's TMA epilogue (the visitor tree of common.cuh under TmaWarpSpecialized[Cooperative]) stages every
// subtile in shared memory and synchronizes all consumer threads several times a subtile (before the stores into
// the staging buffer, before one thread issues its TMA store, after it); its row and column broadcasts load the
// tile's scales from global memory only once the epilogue has begun (the row broadcast through shared memory and
// one more barrier). With FP8's short mainloops (16 k-tiles at K = 2048) that epilogue took ~23% of the consumers'
// samples on the H200, where cuBLASLt's rowwise kernel spends ~10% (Nsight Compute warp-state sampling of both,
// 2026-12-02, docs/PERF.md "The FP8 GEMM's epilogue").
//
// Here (DIRECT_EPILOGUE) each thread scales its own accumulators and rounds pairs of adjacent columns; each consumer
// warpgroup stages its 64 rows by stmatrix in its own buffer, 64 columns a pass, and stores them as 16-byte rows,
// with warpgroup barriers only (no CTA-wide one, no TMA store). With the overlapped-promotion mainloop
// (sm90_fp8_mainloop.cuh) the tile's row and column scales and bias come in by cp.async while the tile's first
// k-tile runs: the mainloop's producer warp writes each tile's coordinates into a small ring in shared memory
// before it loads the tile (the consumers read them once they have waited for the tile's first k-tile, whose
// barrier orders the write), each consumer warpgroup prefetches the vectors of its tile into its own buffer, and
// the epilogue waits for its copies and one warpgroup barrier. Without that mainloop (bf16) the epilogue reads the
// vectors from global memory itself. The arithmetic is the visitor tree's, in its order (acc * row_scale, then
// fma(col_scale, ., bias), then + residual in f32 where there is one, one rounding to the output type), so both
// epilogues give the same bits. kColScalar: col_scale is the weight's one per-tensor scale, read once a tile into a
// register (no column vector to prefetch or to read from shared memory: fewer instructions a tile), the same
// products as a vector holding it.
#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/epilogue/collective/detail.hpp>
#include <cutlass/numeric_conversion.h>

namespace ingot {
using namespace cute;

// a consumer warpgroup's copy of its tile's vectors: row scales, column scales, bias (pairs of 16-bit values)
template <int kTileM, int kTileN>
struct alignas(16) EpiVectors {
  float row[kTileM];
  float col[kTileN];
  uint32_t bias[kTileN / 2];
};
//: the ring of tile coordinates the producer writes (the mainloop's Stages + 1 entries used, at most)
constexpr int kRingCapacity = 16;
//: columns a warpgroup stages per pass: 64 rows of 128 bytes (16-bit outputs)
constexpr int kPassN = 64;
// the direct epilogue's shared memory, static (beside the kernel's dynamic shared memory, whose TMA buffers need
// 1024-byte alignment: this struct's size is a multiple of 1024, so the dynamic part after it stays aligned): each
// consumer warpgroup's staging buffer of 64 rows x kPassN columns (16-byte chunks swizzled by row: the 8 rows of an
// stmatrix and a warp's 16-byte reads hit 8 different chunks), its vectors, the tile ring
template <int kTileM, int kTileN>
struct alignas(1024) DirectShared {
  uint4 stage[2][64 * kPassN * 2 / 16];
  EpiVectors<kTileM, kTileN> vectors[2];
  int2 ring[kRingCapacity];
};
template <int kTileM, int kTileN>
CUTLASS_DEVICE DirectShared<kTileM, kTileN>& direct_shared() {
  __shared__ DirectShared<kTileM, kTileN> shared;
  return shared;
}
//: static shared memory beside the dynamic: DirectShared and the 1 KB every build has besides (cuobjdump
//: -res-usage: SHARED:1024), a carveout from the mainloop's stages (static and dynamic together within 227 KB)
template <int kTileM, int kTileN>
constexpr int kDirectEpilogueSmem = int(sizeof(DirectShared<kTileM, kTileN>)) + 1024;

// 4 bytes global -> shared, asynchronously; zero-filled (nothing read) where `valid` is false
CUTLASS_DEVICE void cp_async4(void* smem, void const* gmem, bool valid) {
  uint32_t dst = cute::cast_smem_ptr_to_uint(smem);
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(gmem), "r"(valid ? 4 : 0));
}

// named barriers 8 and 9 (CUTLASS reserves 0-7): one per consumer warpgroup
CUTLASS_DEVICE void warpgroup_barrier(int warpgroup) {
  cutlass::arch::NamedBarrier(cutlass::NumThreadsPerWarpGroup, warpgroup).arrive_and_wait();
}

// The vectors the direct epilogue reads, as run-time pointers (null: 1 for scales, 0 for the bias)
struct EpiVectorArgs {
  float const* row_scale = nullptr;  // [M]
  float const* col_scale = nullptr;  // [N], or [1] where the epilogue reads it as a scalar (kColScalar)
  void const* bias = nullptr;        // [N], the output type
};

// A consumer thread's share of prefetching tile (m_blk, n_blk)'s vectors into its warpgroup's buffer (called by
// every thread of both consumer warpgroups, `thread_idx` 0..255): first a warpgroup barrier, so that the
// warpgroup's epilogue of the previous tile has read the buffer, then cp.async of the vectors (zeros past M and N)
// and a commit; the epilogue waits (`wait_vectors`). kColScalar: no column scales (the epilogue reads the scalar).
template <int kTileM, int kTileN, class ElementBias, bool kColScalar = false>
CUTLASS_DEVICE void prefetch_vectors(EpiVectorArgs const& v, int m, int n, int m_blk, int n_blk, int thread_idx) {
  static_assert(sizeof(ElementBias) == 2, "bias pairs are 32-bit copies");
  int wg = thread_idx / cutlass::NumThreadsPerWarpGroup, t = thread_idx % cutlass::NumThreadsPerWarpGroup;
  EpiVectors<kTileM, kTileN>& buf = direct_shared<kTileM, kTileN>().vectors[wg];
  warpgroup_barrier(wg);
  int m0 = m_blk * kTileM, n0 = n_blk * kTileN;
  // absent vectors read as 1 (scales) and 0 (bias): stored here, so that the epilogue does not branch
  CUTLASS_PRAGMA_UNROLL
  for (int i = t; i < kTileM; i += cutlass::NumThreadsPerWarpGroup) {
    if (v.row_scale) {
      cp_async4(&buf.row[i], v.row_scale + (m0 + i < m ? m0 + i : 0), m0 + i < m);
    } else {
      buf.row[i] = 1.0f;
    }
  }
  CUTLASS_PRAGMA_UNROLL
  for (int i = t; i < (kColScalar ? 0 : kTileN); i += cutlass::NumThreadsPerWarpGroup) {
    if (v.col_scale) {
      cp_async4(&buf.col[i], v.col_scale + (n0 + i < n ? n0 + i : 0), n0 + i < n);
    } else {
      buf.col[i] = 1.0f;
    }
  }
  auto const* bias = static_cast<ElementBias const*>(v.bias);
  CUTLASS_PRAGMA_UNROLL
  for (int i = t; i < kTileN / 2; i += cutlass::NumThreadsPerWarpGroup) {
    if (v.bias) {
      cp_async4(&buf.bias[i], bias + (n0 + 2 * i < n ? n0 + 2 * i : 0), n0 + 2 * i < n);
    } else {
      buf.bias[i] = 0u;
    }
  }
  asm volatile("cp.async.commit_group;\n" ::);
}

CUTLASS_DEVICE void wait_vectors(int thread_idx) {
  asm volatile("cp.async.wait_all;\n" ::: "memory");
  warpgroup_barrier(thread_idx / cutlass::NumThreadsPerWarpGroup);
}

// out[m, n] = col_scale[n] * (acc[m, n] * row_scale[m]) + bias[n]  (+ residual[m, n]), row-major out and residual
// of N columns, staged per warpgroup and stored as 16-byte rows. kPrefetched: the vectors are in the warpgroups'
// buffers (the overlapped mainloop put them there); else they are read from global memory here. kColScalar: col_scale
// is one f32 (the weight's per-tensor scale), read here once a tile.
template <class CtaTile, class ElementOut_, bool kResidual, bool kPrefetched, bool kColScalar = false>
class DirectEpilogue {
 public:
  using ElementOut = ElementOut_;
  using ElementC = cute::conditional_t<kResidual, ElementOut, void>;
  using ElementD = ElementOut;
  using ElementOutput = ElementOut;
  using ElementCompute = float;
  using ElementAccumulator = float;
  using ElementScalar = float;
  using StrideC = cute::Stride<int64_t, cute::Int<1>, int64_t>;
  using StrideD = cute::Stride<int64_t, cute::Int<1>, int64_t>;
  using ThreadEpilogueOp = void;
  using GmemTiledCopyC = void;
  using GmemTiledCopyD = void;
  static constexpr int kTileM = cute::size<0>(CtaTile{});
  static constexpr int kTileN = cute::size<1>(CtaTile{});
  static_assert(sizeof(ElementOut) == 2, "pairs of 16-bit outputs are 32-bit stores");

  struct SharedStorage {};
  struct Arguments {
    EpiVectorArgs vectors;
    ElementOut const* ptr_C = nullptr;
    StrideC dC{};
    ElementOut* ptr_D = nullptr;
    StrideD dD{};
  };
  struct Params {
    EpiVectorArgs vectors;
    ElementOut const* ptr_C;
    ElementOut* ptr_D;
  };

  template <class ProblemShape>
  static constexpr Params to_underlying_arguments(ProblemShape const&, Arguments const& args, void*) {
    return {args.vectors, args.ptr_C, args.ptr_D};
  }
  template <class ProblemShape>
  static size_t get_workspace_size(ProblemShape const&, Arguments const&) {
    return 0;
  }
  template <class ProblemShape>
  static cutlass::Status initialize_workspace(ProblemShape const&, Arguments const&, void*, cudaStream_t,
                                              cutlass::CudaHostAdapter* = nullptr) {
    return cutlass::Status::kSuccess;
  }
  // row-major out (and residual) with N a multiple of 8, 16-byte aligned: 16-byte row stores (4-byte residual loads)
  template <class ProblemShape>
  static bool can_implement(ProblemShape const& problem_shape, Arguments const& args) {
    auto shape = append<4>(problem_shape, 1);
    int n = get<1>(shape);
    auto aligned = [](void const* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
    return n % 8 == 0 && get<3>(shape) == 1 && aligned(args.ptr_D) && (!kResidual || aligned(args.ptr_C));
  }

  CUTLASS_HOST_DEVICE DirectEpilogue(Params const& params) : params_(params) {}
  CUTLASS_DEVICE bool is_source_needed() { return kResidual; }

  template <class ProblemShapeMNKL, class BlockShapeMNK, class BlockCoordMNKL, class FrgEngine, class FrgLayout,
            class TiledMma, class ResidueMNK>
  CUTLASS_DEVICE void operator()(ProblemShapeMNKL problem_shape_mnkl, BlockShapeMNK blk_shape_MNK,
                                 BlockCoordMNKL blk_coord_mnkl, cute::Tensor<FrgEngine, FrgLayout> const& acc,
                                 TiledMma tiled_mma, ResidueMNK, int thread_idx, char*) {
    static_assert(cute::is_same_v<typename FrgEngine::value_type, float>, "f32 accumulators");
    int m = get<0>(problem_shape_mnkl), n = get<1>(problem_shape_mnkl);
    int m0 = get<0>(blk_coord_mnkl) * kTileM, n0 = get<1>(blk_coord_mnkl) * kTileN;
    // each accumulator's (row, column) in the tile; a GMMA fragment holds pairs of adjacent columns
    Tensor coord = tiled_mma.get_thread_slice(thread_idx).partition_C(make_identity_tensor(take<0, 2>(blk_shape_MNK)));
    CUTE_STATIC_ASSERT_V(size(coord) == size(acc));
    constexpr int kPairs = decltype(size(acc))::value / 2;
    static_assert(kTileM == 2 * 64 && kPairs == kTileN / 4,
                  "each consumer warpgroup holds one 64 x TILE_N accumulator block (cooperative, TILE_M 128)");
    static_assert(kTileN % kPassN == 0, "whole passes of kPassN columns");
    int const wg = thread_idx / cutlass::NumThreadsPerWarpGroup, t = thread_idx % cutlass::NumThreadsPerWarpGroup;
    int const warp = t / 32, lane = t % 32;
    DirectShared<kTileM, kTileN>& shared = direct_shared<kTileM, kTileN>();
    EpiVectors<kTileM, kTileN> const& buf = shared.vectors[wg];
    if constexpr (kPrefetched) {
      wait_vectors(thread_idx);
    }
    EpiVectorArgs const& v = params_.vectors;
    bool const has_row = v.row_scale != nullptr, has_col = v.col_scale != nullptr, has_bias = v.bias != nullptr;
    auto const* bias = static_cast<ElementOut const*>(v.bias);
    float const col_scalar = kColScalar && has_col ? __ldg(v.col_scale) : 1.0f;
    cutlass::NumericConverter<ElementOut, float, cutlass::FloatRoundStyle::round_to_nearest> round;
    // pair p (accumulators 2p, 2p + 1: columns c, c + 1 of row r) -> the two outputs packed
    auto pair = [&](int p, uint32_t residual) -> uint32_t {
      int tr = get<0>(coord(2 * p)), tc = get<1>(coord(2 * p));
      int r = m0 + tr, c = n0 + tc;
      bool in = r < m && c < n;
      float rs, cs[2], b[2];
      if constexpr (kPrefetched) {  // the prefetch wrote 1 and 0 for absent vectors
        rs = buf.row[tr];
        cs[0] = kColScalar ? col_scalar : buf.col[tc], cs[1] = kColScalar ? col_scalar : buf.col[tc + 1];
        uint32_t bp = buf.bias[tc / 2];
        b[0] = float(reinterpret_cast<ElementOut const*>(&bp)[0]);
        b[1] = float(reinterpret_cast<ElementOut const*>(&bp)[1]);
      } else {
        rs = has_row && in ? __ldg(v.row_scale + r) : 1.0f;
        cs[0] = kColScalar ? col_scalar : has_col && in ? __ldg(v.col_scale + c) : 1.0f;
        cs[1] = kColScalar ? col_scalar : has_col && in ? __ldg(v.col_scale + c + 1) : 1.0f;
        b[0] = has_bias && in ? float(bias[c]) : 0.0f, b[1] = has_bias && in ? float(bias[c + 1]) : 0.0f;
      }
      ElementOut out[2];
      CUTLASS_PRAGMA_UNROLL
      for (int j = 0; j < 2; ++j) {
        float y = fmaf(cs[j], acc(2 * p + j) * rs, b[j]);
        if constexpr (kResidual) {
          y += float(reinterpret_cast<ElementOut const*>(&residual)[j]);
        }
        out[j] = round(y);
      }
      uint32_t packed;
      memcpy(&packed, out, sizeof(packed));
      return packed;
    };
    uint32_t residual[kResidual ? kPairs : 1] = {};
    if constexpr (kResidual) {  // all loads first: one round trip
      CUTLASS_PRAGMA_UNROLL
      for (int p = 0; p < kPairs; ++p) {
        int r = m0 + get<0>(coord(2 * p)), c = n0 + get<1>(coord(2 * p));
        if (r < m && c < n) residual[p] = *reinterpret_cast<uint32_t const*>(params_.ptr_C + int64_t(r) * n + c);
      }
    }
    // per pass of kPassN columns: the warpgroup's 64 rows into its staging buffer by stmatrix (a GMMA fragment's 8x8
    // blocks: pair p = v1 + 2 * j holds row 8 * v1 + lane / 4 of the warp's 16, columns 8 * j + 2 * (lane % 4)), a
    // warpgroup barrier, then 16-byte rows out to global memory (each warp two full 128-byte rows a store)
    uint4* stage = shared.stage[wg];
    constexpr int kChunks = kPassN * 2 / 16;  // 16-byte chunks a staged row
    CUTLASS_PRAGMA_UNROLL
    for (int pass = 0; pass < kTileN / kPassN; ++pass) {
      warpgroup_barrier(wg);  // the previous pass's (or tile's) reads of the buffer are done
      CUTLASS_PRAGMA_UNROLL
      for (int jq = 0; jq < kPassN / 16; ++jq) {  // four 8x8 blocks an stmatrix: (v1, j), (v1 + 1, j), (v1, j + 1), ...
        int const j0 = pass * (kPassN / 8) + 2 * jq;
        uint32_t r[4];
        CUTLASS_PRAGMA_UNROLL
        for (int q = 0; q < 4; ++q) {
          int p = (q % 2) + 2 * (j0 + q / 2);
          r[q] = pair(p, residual[kResidual ? p : 0]);
        }
        int q = lane / 8, row = 16 * warp + 8 * (q % 2) + lane % 8;
        int chunk = (2 * jq + q / 2) ^ (row % 8);
        uint32_t addr = cute::cast_smem_ptr_to_uint(stage + row * kChunks + chunk);
        asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n"
                     ::"r"(addr), "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3]) : "memory");
      }
      warpgroup_barrier(wg);
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < 64 * kChunks / cutlass::NumThreadsPerWarpGroup; ++i) {
        int idx = i * cutlass::NumThreadsPerWarpGroup + t, row = idx / kChunks, chunk = idx % kChunks;
        int r = m0 + 64 * wg + row, c = n0 + pass * kPassN + chunk * 8;
        uint4 data = stage[row * kChunks + (chunk ^ (row % 8))];
        if (r < m && c < n) {
          *reinterpret_cast<uint4*>(params_.ptr_D + int64_t(r) * n + c) = data;
        }
      }
    }
  }

 private:
  Params params_;
};

template <class CtaTile, class ElementOut, bool kResidual, bool kPrefetched, bool kColScalar = false>
using DirectCollectiveEpilogue = cutlass::epilogue::collective::detail::Sm90TmaWarpSpecializedAdapter<
    DirectEpilogue<CtaTile, ElementOut, kResidual, kPrefetched, kColScalar>>;
}  // namespace ingot
