#include "common.cuh"
#include "sm90_fp8_mainloop.cuh"

// out[M, N] = x[M, K] @ w[N, K]^T with the epilogue in common.cuh, on sm_90a warp-specialized
// wgmma + TMA: ${A_TYPE} x ${B_TYPE} -> f32 accumulators -> ${OUT_TYPE}; CTA tile
// ${TILE_M}x${TILE_N}x${TILE_K}, cluster ${CLUSTER_M}x${CLUSTER_N}, schedule ${SCHEDULE}. x and w are
// K-major (row-major x, w as stored by linear), out and residual row-major. Persistent, with max swizzle
// ${MAX_SWIZZLE} (0: per problem) and raster order ${RASTER}; FP8 promotion overlapped with the next k-tile's MMAs
// (sm90_fp8_mainloop.cuh): ${OVERLAP_PROMOTION}. Weight scales ${WEIGHT_SCALES} (0: one per output channel, [N];
// 1: one per tensor, read as a scalar; 2: 1x128 x 128x128 block scales applied in the mainloop, x's scales per row
// and 128 columns of K; 3: 128x128 weight blocks applied in the mainloop, x's scale per row in the epilogue).
using namespace cute;
using ElementA = ${A_TYPE};
using ElementB = ${B_TYPE};
using ElementOut = ${OUT_TYPE};
using CtaTile = Shape<Int<${TILE_M}>, Int<${TILE_N}>, Int<${TILE_K}>>;
using ClusterShape = Shape<Int<${CLUSTER_M}>, Int<${CLUSTER_N}>, _1>;
constexpr int kWeightScales = ${WEIGHT_SCALES};
constexpr bool kWeightScalar = kWeightScales == 1, kBlockScales = kWeightScales >= 2;
constexpr bool kXBlocks = kWeightScales == 2;
using Epi = ingot::Epilogue<CtaTile, ElementOut, ElementOut, ${HAS_RESIDUAL}, kWeightScalar>;
constexpr int kAlignOut = 128 / cutlass::sizeof_bits<ElementOut>::value;
using MainloopSchedule = cutlass::gemm::KernelTmaWarpSpecialized${SCHEDULE};
using EpilogueSchedule = cutlass::epilogue::TmaWarpSpecialized${EPILOGUE_SCHEDULE};

// the epilogue's subtile: CUTLASS's choice (EPI_N 0: kEpiM x 32 for bf16 output) or kEpiM x EPI_N (fewer subtiles a
// tile: fewer shared-memory round trips and barriers, more shared memory taken from the mainloop's stages); kEpiM is
// CUTLASS's row count, a warpgroup's rows of the tile (128 cooperative, 64 ping-pong)
constexpr int kEpiM =
    cute::min(cute::is_same_v<EpilogueSchedule, cutlass::epilogue::TmaWarpSpecializedCooperative> ? 128 : 64,
              ${TILE_M});
using EpilogueTile = cute::conditional_t<${EPI_N} == 0, cutlass::epilogue::collective::EpilogueTileAuto,
                                         Shape<Int<kEpiM>, Int<(${EPI_N} == 0 ? 32 : ${EPI_N})>>>;
using TmaCollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, CtaTile, ClusterShape,
    EpilogueTile, float, float,
    typename Epi::ElementC, cutlass::layout::RowMajor, kAlignOut,
    ElementOut, cutlass::layout::RowMajor, kAlignOut,
    EpilogueSchedule, typename Epi::Tree>::CollectiveOp;
// ${DIRECT_EPILOGUE}: the same arithmetic stored straight from the accumulators (sm90_direct_epilogue.cuh), its
// vectors prefetched by the overlapped-promotion mainloop where that runs
constexpr bool kDirectEpilogue = ${DIRECT_EPILOGUE};
constexpr bool kOverlapPromotion = ${OVERLAP_PROMOTION};
using CollectiveEpilogue = cute::conditional_t<
    kDirectEpilogue,
    ingot::DirectCollectiveEpilogue<CtaTile, ElementOut, ${HAS_RESIDUAL}, kOverlapPromotion, kWeightScalar>,
    TmaCollectiveEpilogue>;
// the direct epilogue's static shared memory comes out of the mainloop's stages too (sm90_direct_epilogue.cuh), and
// the block scales' slots (sm90_fp8_mainloop.cuh)
constexpr int kEpilogueSmem = int(sizeof(typename CollectiveEpilogue::SharedStorage)) +
                              (kDirectEpilogue ? ingot::kDirectEpilogueSmem<${TILE_M}, ${TILE_N}> : 0) +
                              (kBlockScales ? ingot::kBlockScaleSmem : 0);

using CutlassMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp,
    ElementA, cutlass::layout::RowMajor, 128 / cutlass::sizeof_bits<ElementA>::value,
    ElementB, cutlass::layout::ColumnMajor, 128 / cutlass::sizeof_bits<ElementB>::value,
    float, CtaTile, ClusterShape,
    cutlass::gemm::collective::StageCountAutoCarveout<kEpilogueSmem>,
    MainloopSchedule>::CollectiveOp;
static_assert(!kOverlapPromotion || cute::is_same_v<typename CutlassMainloop::DispatchPolicy,
                                                    cutlass::gemm::MainloopSm90TmaGmmaWarpSpecializedFP8<
                                                        CutlassMainloop::DispatchPolicy::Stages, ClusterShape,
                                                        MainloopSchedule>>,
              "the overlapped promotion replaces CUTLASS's FP8 (promoting) mainloop only");
static_assert(!kOverlapPromotion || ${TILE_K} == 128,
              "one promotion per 128-deep k-tile: CUTLASS's default interval (4 wgmmas of K = 32)");
using CollectiveMainloop =
    cute::conditional_t<kOverlapPromotion,
                        ingot::Sm90Fp8OverlapMainloop<CutlassMainloop, kDirectEpilogue, ElementOut, kWeightScalar,
                                                      kBlockScales, kXBlocks>,
                        CutlassMainloop>;
static_assert(!kBlockScales || (kDirectEpilogue && kOverlapPromotion),
              "block scales are promoted by the overlapped mainloop, which takes the tile's coordinates from the direct "
              "epilogue's ring");
static_assert(!kDirectEpilogue || !kOverlapPromotion ||
                  cute::is_same_v<EpilogueSchedule, cutlass::epilogue::TmaWarpSpecializedCooperative>,
              "the prefetch reads every tile of the ring in order: both consumer warpgroups on one tile (cooperative)");

using GemmKernelBase = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, CollectiveMainloop,
                                                            CollectiveEpilogue, cutlass::gemm::PersistentScheduler>;

// The scheduler's run-time arguments as compile-time values: every caller of to_underlying_arguments (the host
// shim, the Params probe, hence the layout cutlass_params.py derives) gets the same raster order, and the swizzle
// ${MAX_SWIZZLE} (0: none) unless the host shim's caller sets another for its next Params (launch.py: the swizzle
// rule.auto_swizzle picks per problem, as cutlass_params.py does for the runtime's Params). The device code does not
// depend on either.
#if defined(INGOT_HOST_SHIM)
static int ingot_max_swizzle = ${MAX_SWIZZLE};
extern "C" void ${KERNEL}_set_max_swizzle(int max_swizzle) { ingot_max_swizzle = max_swizzle; }
#else
constexpr int ingot_max_swizzle = ${MAX_SWIZZLE};
#endif
struct GemmKernel : GemmKernelBase {
  static Params to_underlying_arguments(Arguments const& args, void* workspace) {
    Arguments with = args;
    with.scheduler.max_swizzle_size = ingot_max_swizzle;
    with.scheduler.raster_order = GemmKernelBase::TileScheduler::RasterOrderOptions::${RASTER};
    return GemmKernelBase::to_underlying_arguments(with, workspace);
  }
};

#if defined(INGOT_HOST_SHIM)
template <bool kDirect = kDirectEpilogue>  // a template, so that `if constexpr` drops the other epilogue's branch
static typename GemmKernel::Arguments make_arguments(const void* x, const void* w, const void*, const void*,
                                                     const void* x_scale, const void* w_scale, const void* bias,
                                                     const void* residual, void* out, int M, int N, int K,
                                                     cutlass::KernelHardwareInfo hw) {
  using K_ = cute::conditional_t<kDirect, GemmKernel, GemmKernel>;  // dependent: the discarded branch is not checked
  auto sa = cutlass::make_cute_packed_stride(typename K_::StrideA{}, cute::make_shape(M, K, 1));
  auto sb = cutlass::make_cute_packed_stride(typename K_::StrideB{}, cute::make_shape(N, K, 1));
  auto sc = cutlass::make_cute_packed_stride(typename K_::StrideC{}, cute::make_shape(M, N, 1));
  auto sd = cutlass::make_cute_packed_stride(typename K_::StrideD{}, cute::make_shape(M, N, 1));
  typename cute::conditional_t<kDirect, CollectiveMainloop, CollectiveMainloop>::Arguments mainloop{};  // dependent
  mainloop.ptr_A = static_cast<const ElementA*>(x), mainloop.dA = sa;
  mainloop.ptr_B = static_cast<const ElementB*>(w), mainloop.dB = sb;
  if constexpr (kDirect) {
    // block scales: the mainloop applies the weight's, and x's where they are per 128 columns (else the epilogue's row
    // scale)
    ingot::EpiVectorArgs vectors{kXBlocks ? nullptr : static_cast<const float*>(x_scale),
                                 kBlockScales ? nullptr : static_cast<const float*>(w_scale), bias};
    if constexpr (kOverlapPromotion) {
      mainloop.vectors = vectors;
      mainloop.blocks = {kXBlocks ? static_cast<const float*>(x_scale) : nullptr, static_cast<const float*>(w_scale)};
    }
    using EpilogueArgs = typename cute::conditional_t<kDirect, CollectiveEpilogue, CollectiveEpilogue>::Arguments;
    EpilogueArgs epilogue{vectors, static_cast<const ElementOut*>(residual), sc, static_cast<ElementOut*>(out), sd};
    return typename K_::Arguments{cutlass::gemm::GemmUniversalMode::kGemm, {M, N, K, 1}, mainloop, epilogue, hw};
  } else {
    return typename K_::Arguments{
        cutlass::gemm::GemmUniversalMode::kGemm, {M, N, K, 1}, mainloop,
        {Epi::arguments(x_scale, w_scale, bias), static_cast<const ElementOut*>(residual), sc,
         static_cast<ElementOut*>(out), sd},
        hw};
  }
}
#endif

#include "entry.cuh"
