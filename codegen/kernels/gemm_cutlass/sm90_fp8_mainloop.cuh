// CUTLASS GEMM family, sm_90a FP8: a mainloop that overlaps the f32 promotion with the next k-tile's MMAs.
//
// CUTLASS's FP8 mainloop (MainloopSm90TmaGmmaWarpSpecializedFP8, GmmaFP8Accumulation) accumulates each
// promotion interval's wgmmas into a temporary accumulator set, then waits for *all* of them
// (warpgroup_wait<0>) and adds the set into the f32 accumulators. With the default interval (4 wgmmas of
// K = 32) and a 128-deep k-tile that is one drain per k-tile: the warpgroup's tensor-core work stops while
// its last wgmmas finish and while the FADDs run.
//
// Here two temporary sets alternate: k-tile t+1's wgmmas are issued into one set before k-tile t's set is
// added (warpgroup_wait<1>: only t's batch has to be done), so every warpgroup keeps a batch in flight
// through its promotions. The sums and their order are CUTLASS's with the default interval when a k-tile is
// 4 wgmmas deep (TILE_K = 128): a fresh partial per k-tile, added to the f32 accumulators in k order; the
// numerics are the same. The price is a third accumulator set in registers: 64x128 per warpgroup
// (cooperative 128x128, ping-pong 64x128) is 3 x 64 floats a thread, within the consumers' 232.
//
// Same interface and pipeline contract as the base collective (the kernel calls mma then mma_tail): mma
// releases every stage but the last k-tile's, which mma_tail releases after its warpgroup_wait<0>.
//
// kPrefetch (the direct epilogue, sm90_direct_epilogue.cuh): the producer warp writes each tile's coordinates into
// a ring in shared memory before it loads the tile, and the consumers, once the tile's first k-tile has arrived
// (its full barrier orders the producer's write before their read, and they read before they release that stage,
// which the producer needs again only `Stages` k-tiles later: a ring of Stages + 1 tiles is never overwritten
// unread), prefetch the tile's row and column scales and bias for the epilogue while the k-tiles run (kColScalar: no
// column scales, the epilogue reads the weight's scalar). The Arguments and Params then carry those vectors' pointers
// and M and N.
//
// kBlockScales (DeepSeek-V3's recipe, as cuBLASLt's and torch._scaled_mm's 1x128 x 128x128 block scaling): x has one
// f32 scale per row and 128 columns of K, w one per 128 x 128 block, and each k-tile's partial is promoted as
// accum += partial * (x_scale[row, kb] * w_scale[n_blk, kb]) (a 128-deep k-tile is one K block, a 128-column tile
// one weight block). Layouts as cuBLASLt's (the docstring of rule.linear_cutlass_spec): x_scale[kb * M + row], w_scale
// [n_blk * KB4 + kb] with KB4 = ceil(K / 128) rounded up to a multiple of 4. Each consumer thread holds two rows of
// its warpgroup's 64 (r and r + 8) and loads their scales and the block's for k-tile t when it issues t's wgmmas; it
// uses them one k-tile later, when t's batch is done. The epilogue then has no row or column scales (the bias and
// residual as before). Needs the tile ring (kPrefetch: the tile's coordinates).
#include <cute/tensor.hpp>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include "sm90_direct_epilogue.cuh"

namespace ingot {
using namespace cute;

// a block-scaled mainloop's scales (kBlockScales; the layouts above)
struct BlockScaleArgs {
  float const* x_scale = nullptr;  // [ceil(K / 128)][M]
  float const* w_scale = nullptr;  // [ceil(N / 128)][KB4]
};

template <class Base, bool kPrefetch = false, class ElementBias = cutlass::bfloat16_t, bool kColScalar = false,
          bool kBlockScales = false>
struct Sm90Fp8OverlapMainloop : Base {
  using typename Base::MainloopPipeline;
  using typename Base::PipelineState;
  using typename Base::SmemLayoutA;
  using typename Base::SmemLayoutB;
  using typename Base::TensorStorage;
  using typename Base::TiledMma;
  using typename Base::TileShape;
  static_assert(Base::K_PIPE_MMAS == 1, "mma_tail releases exactly one stage (the last k-tile's)");
  static constexpr int kTileM = cute::size<0>(TileShape{});
  static constexpr int kTileN = cute::size<1>(TileShape{});
  static constexpr int kRing = Base::DispatchPolicy::Stages + 1;
  static_assert(!kPrefetch || kRing <= kRingCapacity, "the tile ring holds kRingCapacity tiles");
  static_assert(!kBlockScales || (kPrefetch && kTileN == 128 && cute::size<2>(TileShape{}) == 128),
                "block scales: one 128 x 128 weight block a tile and k-tile, the tile's coordinates from the ring");

  struct PrefetchArguments : Base::Arguments {
    EpiVectorArgs vectors;
    BlockScaleArgs blocks;
  };
  struct PrefetchParams : Base::Params {
    EpiVectorArgs vectors;
    BlockScaleArgs blocks;
    int m, n, k;  // (K: the Params layout names it, cutlass_params.py; KB4 follows from it)
  };
  // without the prefetch: the base collective's own (the same Params blob as before it existed)
  using Arguments = cute::conditional_t<kPrefetch, PrefetchArguments, typename Base::Arguments>;
  using Params = cute::conditional_t<kPrefetch, PrefetchParams, typename Base::Params>;

  template <class ProblemShape>
  static constexpr Params to_underlying_arguments(ProblemShape const& problem_shape, Arguments const& args,
                                                  void* workspace) {
    if constexpr (kPrefetch) {
      auto shape = append<4>(problem_shape, 1);
      return {Base::to_underlying_arguments(problem_shape, args, workspace), args.vectors, args.blocks,
              int(get<0>(shape)), int(get<1>(shape)), int(get<2>(shape))};
    } else {
      return Base::to_underlying_arguments(problem_shape, args, workspace);
    }
  }

  // producer: the tile's coordinates into the ring (every lane the same value, the leader among them), then the
  // base collective's TMA loads
  int ring_tiles_ = 0;
  template <class LoadInputs, class BlockCoord, class KTileIterator>
  CUTLASS_DEVICE void load(Params const& params, MainloopPipeline pipeline, PipelineState smem_pipe_write,
                           LoadInputs const& load_inputs, BlockCoord const& blk_coord, KTileIterator k_tile_iter,
                           int k_tile_count, int thread_idx, uint32_t block_rank_in_cluster,
                           TensorStorage& shared_tensors) {
    if constexpr (kPrefetch) {
      direct_shared<kTileM, kTileN>().ring[ring_tiles_ % kRing] = make_int2(int(get<0>(blk_coord)),
                                                                            int(get<1>(blk_coord)));
      ++ring_tiles_;
    }
    Base::load(params, pipeline, smem_pipe_write, load_inputs, blk_coord, k_tile_iter, k_tile_count, thread_idx,
               block_rank_in_cluster, shared_tensors);
  }

  // k-tile `read`'s wgmmas into `partial` (zeroed by the first), committed as one batch
  template <class FragA, class FragB, class Partial>
  CUTLASS_DEVICE static void issue(TiledMma& tiled_mma, MainloopPipeline& pipeline, PipelineState& read,
                                   FragA const& tCrA, FragB const& tCrB, Partial& partial) {
    auto barrier_token = pipeline.consumer_try_wait(read);
    pipeline.consumer_wait(read, barrier_token);
    int stage = read.index();
    warpgroup_fence_operand(partial);
    warpgroup_arrive();
    tiled_mma.accumulate_ = GMMA::ScaleOut::Zero;
    CUTLASS_PRAGMA_UNROLL
    for (int k_block = 0; k_block < size<2>(tCrA); ++k_block) {
      cute::gemm(tiled_mma, tCrA(_, _, k_block, stage), tCrB(_, _, k_block, stage), partial);
      tiled_mma.accumulate_ = GMMA::ScaleOut::One;
    }
    warpgroup_commit_batch();
    warpgroup_fence_operand(partial);
    ++read;
  }

  // accum += partial (its batch complete: the caller waited)
  template <class Accum, class Partial>
  CUTLASS_DEVICE static void promote(Accum& accum, Partial& partial) {
    warpgroup_fence_operand(partial);
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < size(accum); ++i) {
      accum(i) += partial(i);
    }
    warpgroup_fence_operand(partial);
  }

  // a k-tile's block scales for a thread's two rows: x_scale[kb][row] * w_scale[n_blk][kb], loaded and multiplied as
  // the k-tile's wgmmas are issued (deferring the products to the promotion measured 8-20% slower on the H200,
  // 2026-12-03, docs/PERF.md "FP8 GEMMs with per-tensor and block weight scales")
  struct KScales {
    float lo, hi;
  };
  // accum += partial * the scale of each accumulator's row (rows: `row_hi` true where an accumulator is the thread's
  // second row)
  template <class Accum, class Partial, class RowHi>
  CUTLASS_DEVICE static void promote(Accum& accum, Partial& partial, KScales s, RowHi const& row_hi) {
    warpgroup_fence_operand(partial);
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < size(accum); ++i) {
      accum(i) = fmaf(partial(i), row_hi(i) ? s.hi : s.lo, accum(i));
    }
    warpgroup_fence_operand(partial);
  }

  // a k-tile's promotion: with its block scales (kBlockScales), else the plain one (a member template, not a generic
  // lambda: NVRTC 13.0 rejects those in device code, tests/codegen/test_compile.py)
  template <class Accum, class Partial, class RowHi>
  CUTLASS_DEVICE static void promote_k(Accum& accum, Partial& partial, KScales s, RowHi const& row_hi) {
    if constexpr (kBlockScales) {
      promote(accum, partial, s, row_hi);
    } else {
      promote(accum, partial);
    }
  }

  template <class FrgTensorC>
  CUTLASS_DEVICE void mma(MainloopPipeline pipeline, PipelineState smem_pipe_read, FrgTensorC& accum,
                          int k_tile_count, int thread_idx, TensorStorage& shared_tensors,
                          Params const& mainloop_params) {
    static_assert(is_rmem<FrgTensorC>::value, "C tensor must be rmem resident.");
    Tensor sA = make_tensor(make_smem_ptr(shared_tensors.smem_A.data()), SmemLayoutA{});  // (BLK_M,BLK_K,PIPE)
    Tensor sB = make_tensor(make_smem_ptr(shared_tensors.smem_B.data()), SmemLayoutB{});  // (BLK_N,BLK_K,PIPE)
    constexpr int kMmaWarpGroups = size(TiledMma{}) / cutlass::NumThreadsPerWarpGroup;
    Layout warp_group_thread_layout = make_layout(Int<kMmaWarpGroups>{}, Int<cutlass::NumThreadsPerWarpGroup>{});
    int warp_group_idx = __shfl_sync(0xFFFFFFFF, thread_idx / cutlass::NumThreadsPerWarpGroup, 0);
    TiledMma tiled_mma;
    auto thread_mma = tiled_mma.get_slice(warp_group_thread_layout(warp_group_idx));
    Tensor tCrA = thread_mma.make_fragment_A(thread_mma.partition_A(sA));  // (MMA,MMA_M,MMA_K,PIPE)
    Tensor tCrB = thread_mma.make_fragment_B(thread_mma.partition_B(sB));  // (MMA,MMA_N,MMA_K,PIPE)
    CUTE_STATIC_ASSERT_V(size<1>(tCrA) == size<1>(accum));
    CUTE_STATIC_ASSERT_V(size<1>(tCrB) == size<2>(accum));

    clear(accum);
    if (k_tile_count <= 0) {
      return;
    }
    Tensor even = make_fragment_like(accum);  // partials of k-tiles 0, 2, 4, ...
    Tensor odd = make_fragment_like(accum);   // and of 1, 3, 5, ...
    PipelineState smem_pipe_release = smem_pipe_read;
    issue(tiled_mma, pipeline, smem_pipe_read, tCrA, tCrB, even);
    // block scales: the thread's two rows' scale pointers (rows past M read row M - 1: their partials are zeros) and
    // the block's, then each k-tile's product of the two, loaded as its wgmmas are issued
    float const* xs_lo = nullptr;
    float const* xs_hi = nullptr;
    float const* ws = nullptr;
    int kb = 0;
    auto k_scales = [&]() -> KScales {
      if constexpr (kBlockScales) {
        int64_t row = int64_t(kb) * mainloop_params.m;
        float w = __ldg(ws + kb);
        KScales s{__ldg(xs_lo + row) * w, __ldg(xs_hi + row) * w};
        ++kb;
        return s;
      } else {
        return KScales{1.0f, 1.0f};
      }
    };
    // the accumulators' rows in the tile (as the epilogue's: the consumer thread's slice of the tiled MMA)
    Tensor coord = tiled_mma.get_thread_slice(thread_idx).partition_C(make_identity_tensor(take<0, 2>(TileShape{})));
    auto row_hi = [&](int i) { return get<0>(coord(i)) != get<0>(coord(0)); };
    if constexpr (kPrefetch) {  // the first k-tile has arrived, hence the tile's coordinates
      int2 tile = direct_shared<kTileM, kTileN>().ring[ring_tiles_ % kRing];
      ++ring_tiles_;
      prefetch_vectors<kTileM, kTileN, ElementBias, kColScalar>(mainloop_params.vectors, mainloop_params.m,
                                                                mainloop_params.n, tile.x, tile.y, thread_idx);
      if constexpr (kBlockScales) {
        int m = mainloop_params.m, r = tile.x * kTileM + get<0>(coord(0));
        xs_lo = mainloop_params.blocks.x_scale + cute::min(r, m - 1);
        xs_hi = mainloop_params.blocks.x_scale + cute::min(r + 8, m - 1);
        int kb4 = ((mainloop_params.k + 127) / 128 + 3) / 4 * 4;  // w_scale's row stride (cuBLASLt's layout)
        ws = mainloop_params.blocks.w_scale + int64_t(tile.y) * kb4;
      }
    }
    KScales s_even = k_scales(), s_odd{};
    int remaining = k_tile_count - 1;
    CUTLASS_PRAGMA_NO_UNROLL
    for (; remaining >= 2; remaining -= 2) {
      issue(tiled_mma, pipeline, smem_pipe_read, tCrA, tCrB, odd);
      s_odd = k_scales();
      warpgroup_wait<1>();
      promote_k(accum, even, s_even, row_hi);
      pipeline.consumer_release(smem_pipe_release);
      ++smem_pipe_release;
      issue(tiled_mma, pipeline, smem_pipe_read, tCrA, tCrB, even);
      s_even = k_scales();
      warpgroup_wait<1>();
      promote_k(accum, odd, s_odd, row_hi);
      pipeline.consumer_release(smem_pipe_release);
      ++smem_pipe_release;
    }
    if (remaining == 1) {
      issue(tiled_mma, pipeline, smem_pipe_read, tCrA, tCrB, odd);
      s_odd = k_scales();
      warpgroup_wait<1>();
      promote_k(accum, even, s_even, row_hi);
      pipeline.consumer_release(smem_pipe_release);
      warpgroup_wait<0>();
      promote_k(accum, odd, s_odd, row_hi);
    } else {
      warpgroup_wait<0>();
      promote_k(accum, even, s_even, row_hi);
    }
    warpgroup_fence_operand(accum);
  }
};
}  // namespace ingot
