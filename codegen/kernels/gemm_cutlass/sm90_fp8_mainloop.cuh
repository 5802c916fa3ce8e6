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
// its warpgroup's 64 (r and r + 8) and reads their scales and the block's for k-tile t once t's stage has arrived,
// before it issues t's wgmmas (k_tiles, issue); it multiplies and uses them one k-tile later, when t's batch is done.
// The epilogue then has no row or column scales (the bias and residual as before). Needs the tile ring (kPrefetch: the
// tile's coordinates). Measured on the H200 (docs/PERF.md, thirty-second session): 0.93-0.95x cuBLASLt's block-scaled
// kernels; the FFMA promotion is most of what separates it from the rowwise build (a plain add instead: 0.99-1.04x).
//
// !kXBlocks (ingot's fp8:block with per-token activations): x's scale is one per row, applied by the epilogue as the
// per-channel builds' row scale, and each k-tile's partial is promoted with the weight block's scale alone (one value a
// tile and k-tile); w_scale is then ingot's layout, [ceil(N / 128)][KB] (no padding of KB).
//
// Where the scales come from (block_scales_by_copy): when M % 4 == 0 and both scale arrays are 16-byte aligned (without
// x blocks: w_scale 16-byte aligned and KB a multiple of 4, so that every 16-byte chunk of its rows is aligned), the
// producer brings each k-tile's scales into a slot of its stage (BlockScaleShared) with two bulk copies on the stage's
// full barrier (its expected bytes raised before either copy or the stage's TMA loads are issued, so the phase cannot
// complete early): the tile's 128 x scales of K block kb (512 contiguous bytes of x_scale's row kb; a last, partial
// tile of M copies the row's last 128, so every copy is whole and inside the array) and the 16 bytes of w_scale that
// hold the block's kb. The consumers then read them from shared memory after the stage's wait (3-5% faster than
// loads from global memory, docs/PERF.md). Otherwise each consumer thread loads them from global memory itself (the
// same values and products); which of the two is chosen once a tile (k_tiles<kByCopy>: a branch in every k-tile cost
// 1.5%).
#include <cute/tensor.hpp>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include "sm90_direct_epilogue.cuh"

namespace ingot {
using namespace cute;

// a block-scaled mainloop's scales (kBlockScales; the layouts above)
struct BlockScaleArgs {
  float const* x_scale = nullptr;  // [ceil(K / 128)][M] (none without x blocks: the epilogue's row scale)
  float const* w_scale = nullptr;  // [ceil(N / 128)][KB4] ([ceil(N / 128)][KB] without x blocks)
};

// the producer's copies of the block scales, one slot per pipeline stage (static shared memory, a multiple of 1024
// bytes like DirectShared: the dynamic TMA buffers after it stay aligned; sm90.cu carves it out of the stages)
constexpr int kBlockScaleStages = 8;
struct alignas(1024) BlockScaleShared {
  float x[kBlockScaleStages][128];  // x_scale[kb][m_src .. m_src + 128)
  float w[kBlockScaleStages][4];    // w_scale[n_blk][kb & ~3 .. + 4)
};
constexpr int kBlockScaleSmem = int(sizeof(BlockScaleShared));
template <int kUnused = 0>  // a template: only the block-scaled builds instantiate (and allocate) it
CUTLASS_DEVICE BlockScaleShared& block_scale_shared() {
  __shared__ BlockScaleShared shared;
  return shared;
}

template <class Base, bool kPrefetch = false, class ElementBias = cutlass::bfloat16_t, bool kColScalar = false,
          bool kBlockScales = false, bool kXBlocks = true>
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
  static_assert(!kBlockScales || (kTileM == 128 && Base::DispatchPolicy::Stages <= kBlockScaleStages),
                "block scales by copy: a 512-byte slot of x scales and one of w scales per stage");

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

  // block scales: w_scale's row stride, cuBLASLt's KB4 = ceil(K / 128) rounded up to a multiple of 4 with x blocks,
  // else KB
  CUTLASS_DEVICE static int w_scale_stride(Params const& params) {
    int kb = (params.k + 127) / 128;
    return kXBlocks ? (kb + 3) / 4 * 4 : kb;
  }
  // block scales: whether the producer copies them (the header's comment), the same answer in every thread
  CUTLASS_DEVICE static bool block_scales_by_copy(Params const& params) {
    if constexpr (kBlockScales) {
      auto x = reinterpret_cast<uintptr_t>(params.blocks.x_scale);
      auto w = reinterpret_cast<uintptr_t>(params.blocks.w_scale);
      if constexpr (kXBlocks) {
        return params.m % 4 == 0 && ((x | w) % 16) == 0;
      } else {
        return w_scale_stride(params) % 4 == 0 && w % 16 == 0;
      }
    } else {
      return false;
    }
  }
  // the first row of M whose x scale a tile's copy brings (its tile's first, or for a last, partial tile of M the
  // last 128 rows': copies whole and inside the array)
  CUTLASS_DEVICE static int block_scale_row0(int m, int m_blk) {
    int m0 = m_blk * kTileM;
    return m0 + kTileM <= m ? m0 : cute::max(m - kTileM, 0);
  }

  // producer: the tile's coordinates into the ring (every lane the same value, the leader among them), then the
  // base collective's TMA loads (with block scales to copy: the same loads and the scales' copies, load_with_scales)
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
    if constexpr (kBlockScales) {
      if (block_scales_by_copy(params)) {
        load_with_scales(params, pipeline, smem_pipe_write, load_inputs, blk_coord, k_tile_iter, k_tile_count,
                         block_rank_in_cluster, shared_tensors);
        return;
      }
    }
    Base::load(params, pipeline, smem_pipe_write, load_inputs, blk_coord, k_tile_iter, k_tile_count, thread_idx,
               block_rank_in_cluster, shared_tensors);
  }

  // Base::load (CUTLASS 4.2's MainloopSm90TmaGmmaWarpSpecializedFP8: A and B by TMA, multicast across the cluster)
  // with each k-tile's block scales copied into its stage's slot on the same full barrier
  template <class LoadInputs, class BlockCoord, class KTileIterator>
  CUTLASS_DEVICE void load_with_scales(Params const& params, MainloopPipeline& pipeline, PipelineState smem_pipe_write,
                                       LoadInputs const& load_inputs, BlockCoord const& blk_coord,
                                       KTileIterator k_tile_iter, int k_tile_count, uint32_t block_rank_in_cluster,
                                       TensorStorage& shared_tensors) {
    if (!cute::elect_one_sync()) {
      return;
    }
    Tensor sA = make_tensor(make_smem_ptr(shared_tensors.smem_A.data()), SmemLayoutA{});  // (BLK_M,BLK_K,PIPE)
    Tensor sB = make_tensor(make_smem_ptr(shared_tensors.smem_B.data()), SmemLayoutB{});  // (BLK_N,BLK_K,PIPE)
    using ClusterShape = typename Base::DispatchPolicy::ClusterShape;
    constexpr uint32_t cluster_shape_x = get<0>(ClusterShape());
    uint2 cluster_local_block_id = {block_rank_in_cluster % cluster_shape_x, block_rank_in_cluster / cluster_shape_x};
    auto block_tma_a = params.tma_load_a.get_slice(cluster_local_block_id.y);
    auto block_tma_b = params.tma_load_b.get_slice(cluster_local_block_id.x);
    auto [m_coord, n_coord, k_coord, l_coord] = blk_coord;
    Tensor tAgA = block_tma_a.partition_S(get<0>(load_inputs)(_, _, m_coord, _, l_coord));  // (TMA,TMA_M,TMA_K,k)
    Tensor tAsA = block_tma_a.partition_D(sA);                                              // (TMA,TMA_M,TMA_K,PIPE)
    Tensor tBgB = block_tma_b.partition_S(get<1>(load_inputs)(_, _, n_coord, _, l_coord));  // (TMA,TMA_N,TMA_K,k)
    Tensor tBsB = block_tma_b.partition_D(sB);                                              // (TMA,TMA_N,TMA_K,PIPE)
    uint16_t mcast_mask_a = 0, mcast_mask_b = 0;
    auto block_layout = Layout<ClusterShape>{};  // (m,n) -> block_id
    if constexpr (cute::is_same_v<typename Base::GmemTiledCopyA, SM90_TMA_LOAD_MULTICAST>) {
      for (int ni = 0; ni < size<1>(block_layout); ++ni) {
        mcast_mask_a |= (uint16_t(1) << block_layout(cluster_local_block_id.x, ni, Int<0>{}));
      }
    }
    if constexpr (cute::is_same_v<typename Base::GmemTiledCopyB, SM90_TMA_LOAD_MULTICAST>) {
      for (int mi = 0; mi < size<0>(block_layout); ++mi) {
        mcast_mask_b |= (uint16_t(1) << block_layout(mi, cluster_local_block_id.y, Int<0>{}));
      }
    }
    int m = params.m;
    uint32_t x_bytes = kXBlocks ? uint32_t(m < kTileM ? m : kTileM) * 4 : 0;
    float const* xs = kXBlocks ? params.blocks.x_scale + block_scale_row0(m, int(m_coord)) : nullptr;
    float const* ws = params.blocks.w_scale + int64_t(n_coord) * w_scale_stride(params);
    BlockScaleShared& slots = block_scale_shared();
    CUTLASS_PRAGMA_NO_UNROLL
    for (int kb = 0; k_tile_count > 0; --k_tile_count, ++kb) {
      pipeline.producer_acquire(smem_pipe_write);
      auto* barrier = pipeline.producer_get_barrier(smem_pipe_write);
      int stage = smem_pipe_write.index();
      // the scales' bytes before any of the stage's copies is issued (the producer's arrive came with A's and B's)
      cutlass::arch::ClusterTransactionBarrier::expect_transaction(barrier, x_bytes + 16);
      if constexpr (kXBlocks) {
        SM90_BULK_COPY_G2S::copy(xs + int64_t(kb) * m, barrier, slots.x[stage], int32_t(x_bytes));
      }
      SM90_BULK_COPY_G2S::copy(ws + (kb & ~3), barrier, slots.w[stage], 16);
      copy(params.tma_load_a.with(*barrier, mcast_mask_a), tAgA(_, _, _, *k_tile_iter), tAsA(_, _, _, stage));
      copy(params.tma_load_b.with(*barrier, mcast_mask_b), tBgB(_, _, _, *k_tile_iter), tBsB(_, _, _, stage));
      ++k_tile_iter;
      ++smem_pipe_write;
    }
  }

  // a k-tile's block scales for a thread's two rows: x_scale[kb][row] * w_scale[n_blk][kb] (w_scale's alone without x
  // blocks), 1 without block scales
  struct KScales {
    float lo, hi;
  };
  // where a consumer thread's k-tile scales come from: its two rows' slots and the tile's w slot in each stage (the
  // producer's copies), or global memory (rows past M read row M - 1: their partials are zeros)
  struct ScaleSource {
    int slot_lo = 0, slot_hi = 0;
    float const* xs_lo = nullptr;
    float const* xs_hi = nullptr;
    float const* ws = nullptr;
    int64_t m = 0;
  };
  // a k-tile's scales as stored, before their product (KScales)
  struct RawScales {
    float x_lo = 1.0f, x_hi = 1.0f, w = 1.0f;
  };
  // k-tile kb's scales (in stage k_stage)
  template <bool kByCopy>
  CUTLASS_DEVICE static RawScales raw_scales(ScaleSource const& src, int k_stage, int kb) {
    if constexpr (kByCopy) {
      BlockScaleShared const& slots = block_scale_shared();
      float w = slots.w[k_stage][kb & 3];
      return kXBlocks ? RawScales{slots.x[k_stage][src.slot_lo], slots.x[k_stage][src.slot_hi], w}
                      : RawScales{1.0f, 1.0f, w};
    } else {
      float w = __ldg(src.ws + kb);
      return kXBlocks ? RawScales{__ldg(src.xs_lo + kb * src.m), __ldg(src.xs_hi + kb * src.m), w}
                      : RawScales{1.0f, 1.0f, w};
    }
  }
  CUTLASS_DEVICE static KScales product(RawScales r) {
    return kXBlocks ? KScales{r.x_lo * r.w, r.x_hi * r.w} : KScales{r.w, r.w};
  }

  // k-tile `read`'s wgmmas into `partial` (zeroed by the first), committed as one batch; returns its stage. With block
  // scales, k-tile kb's scales as stored (`raw`) are read once the stage has arrived and before its wgmmas are issued,
  // so that their latency has passed by the promotion a k-tile later, which forms their product (read after the
  // wgmmas, ptxas put the product before the batch's last wgmma: each k-tile's last wgmma waited for the read)
  template <bool kByCopy = false, class FragA, class FragB, class Partial>
  CUTLASS_DEVICE static int issue(TiledMma& tiled_mma, MainloopPipeline& pipeline, PipelineState& read,
                                  FragA const& tCrA, FragB const& tCrB, Partial& partial,
                                  ScaleSource const* src = nullptr, int kb = 0, RawScales* raw = nullptr) {
    auto barrier_token = pipeline.consumer_try_wait(read);
    pipeline.consumer_wait(read, barrier_token);
    int stage = read.index();
    if constexpr (kBlockScales) {
      if (raw != nullptr) {
        *raw = raw_scales<kByCopy>(*src, stage, kb);
      }
    }
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
    return stage;
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

  // the tile's k-tiles after the first (issued by mma): each k-tile's wgmmas issued into one partial set while the
  // other's batch finishes and is promoted (with its block scales, read from kByCopy's source)
  template <bool kByCopy, class FragA, class FragB, class Accum, class Partial, class RowHi>
  CUTLASS_DEVICE static void k_tiles(TiledMma& tiled_mma, MainloopPipeline& pipeline, PipelineState& read,
                                     PipelineState& release, FragA const& tCrA, FragB const& tCrB, Accum& accum,
                                     Partial& even, Partial& odd, int stage, int k_tile_count, ScaleSource const& src,
                                     RowHi const& row_hi) {
    int kb = 0;
    RawScales r_even, r_odd;
    if constexpr (kBlockScales) {  // the first k-tile's (its stage has arrived: mma issued it)
      r_even = raw_scales<kByCopy>(src, stage, kb);
    }
    ++kb;
    int remaining = k_tile_count - 1;
    CUTLASS_PRAGMA_NO_UNROLL
    for (; remaining >= 2; remaining -= 2) {
      issue<kByCopy>(tiled_mma, pipeline, read, tCrA, tCrB, odd, &src, kb++, &r_odd);
      warpgroup_wait<1>();
      promote_k(accum, even, product(r_even), row_hi);
      pipeline.consumer_release(release);
      ++release;
      issue<kByCopy>(tiled_mma, pipeline, read, tCrA, tCrB, even, &src, kb++, &r_even);
      warpgroup_wait<1>();
      promote_k(accum, odd, product(r_odd), row_hi);
      pipeline.consumer_release(release);
      ++release;
    }
    if (remaining == 1) {
      issue<kByCopy>(tiled_mma, pipeline, read, tCrA, tCrB, odd, &src, kb++, &r_odd);
      warpgroup_wait<1>();
      promote_k(accum, even, product(r_even), row_hi);
      pipeline.consumer_release(release);
      warpgroup_wait<0>();
      promote_k(accum, odd, product(r_odd), row_hi);
    } else {
      warpgroup_wait<0>();
      promote_k(accum, even, product(r_even), row_hi);
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
    int stage = issue(tiled_mma, pipeline, smem_pipe_read, tCrA, tCrB, even);
    // block scales: each k-tile's product of its two, read once its stage has arrived (k_tiles)
    bool const by_copy = block_scales_by_copy(mainloop_params);
    ScaleSource src;
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
        // rows past M: their slot clamped into the tile's (their results are not stored)
        int row0 = block_scale_row0(m, tile.x);
        src.slot_lo = cute::min(r - row0, kTileM - 1);
        src.slot_hi = cute::min(r + 8 - row0, kTileM - 1);
        src.xs_lo = mainloop_params.blocks.x_scale + cute::min(r, m - 1);
        src.xs_hi = mainloop_params.blocks.x_scale + cute::min(r + 8, m - 1);
        src.ws = mainloop_params.blocks.w_scale + int64_t(tile.y) * w_scale_stride(mainloop_params);
        src.m = m;
      }
    }
    if constexpr (kBlockScales) {  // the scales' source chosen once a tile, not in every k-tile
      if (by_copy) {
        k_tiles<true>(tiled_mma, pipeline, smem_pipe_read, smem_pipe_release, tCrA, tCrB, accum, even, odd, stage,
                      k_tile_count, src, row_hi);
      } else {
        k_tiles<false>(tiled_mma, pipeline, smem_pipe_read, smem_pipe_release, tCrA, tCrB, accum, even, odd, stage,
                       k_tile_count, src, row_hi);
      }
    } else {
      k_tiles<false>(tiled_mma, pipeline, smem_pipe_read, smem_pipe_release, tCrA, tCrB, accum, even, odd, stage,
                     k_tile_count, src, row_hi);
    }
    warpgroup_fence_operand(accum);
  }
};
}  // namespace ingot
