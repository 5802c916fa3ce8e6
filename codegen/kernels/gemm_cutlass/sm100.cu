#include "common.cuh"

// out[M, N] = x[M, K] @ w[N, K]^T with the epilogue in common.cuh, on sm_100a tcgen05 (UMMA):
// ${A_TYPE} x ${B_TYPE} -> f32 accumulators -> ${OUT_TYPE}; MMA tile ${TILE_M}x${TILE_N}x${TILE_K},
// cluster ${CLUSTER_M}x${CLUSTER_N}, 2-SM MMA: ${TWO_SM}. x and w are K-major (row-major x, w as
// stored by linear), out and residual row-major. Persistent, CLC tile scheduler. Weight scales ${WEIGHT_SCALES} (0:
// one per output channel, [N]; 1: one per tensor, read as a scalar).
using namespace cute;
using ElementA = ${A_TYPE};
using ElementB = ${B_TYPE};
using ElementOut = ${OUT_TYPE};
constexpr bool kTwoSm = ${TWO_SM};
using MmaTile = Shape<Int<${TILE_M}>, Int<${TILE_N}>, Int<${TILE_K}>>;
using ClusterShape = Shape<Int<${CLUSTER_M}>, Int<${CLUSTER_N}>, _1>;
using CtaTile = Shape<Int<${TILE_M} / (kTwoSm ? 2 : 1)>, Int<${TILE_N}>, Int<${TILE_K}>>;
using Epi = ingot::Epilogue<CtaTile, ElementOut, ElementOut, ${HAS_RESIDUAL}, ${WEIGHT_SCALES} == 1>;
constexpr int kAlignOut = 128 / cutlass::sizeof_bits<ElementOut>::value;

using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
    cutlass::arch::Sm100, cutlass::arch::OpClassTensorOp, MmaTile, ClusterShape,
    cutlass::epilogue::collective::EpilogueTileAuto, float, float,
    typename Epi::ElementC, cutlass::layout::RowMajor, kAlignOut,
    ElementOut, cutlass::layout::RowMajor, kAlignOut,
    cute::conditional_t<kTwoSm, cutlass::epilogue::TmaWarpSpecialized2Sm, cutlass::epilogue::TmaWarpSpecialized1Sm>,
    typename Epi::Tree>::CollectiveOp;

using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
    cutlass::arch::Sm100, cutlass::arch::OpClassTensorOp,
    ElementA, cutlass::layout::RowMajor, 128 / cutlass::sizeof_bits<ElementA>::value,
    ElementB, cutlass::layout::ColumnMajor, 128 / cutlass::sizeof_bits<ElementB>::value,
    float, MmaTile, ClusterShape,
    cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
        sizeof(typename CollectiveEpilogue::SharedStorage))>,
    cute::conditional_t<kTwoSm, cutlass::gemm::KernelTmaWarpSpecialized2SmSm100,
                        cutlass::gemm::KernelTmaWarpSpecialized1SmSm100>>::CollectiveOp;

using GemmKernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, CollectiveMainloop,
                                                        CollectiveEpilogue, void>;

#if defined(INGOT_HOST_SHIM)
static typename GemmKernel::Arguments make_arguments(const void* x, const void* w, const void*, const void*,
                                                     const void* x_scale, const void* w_scale, const void* bias,
                                                     const void* residual, void* out, int M, int N, int K,
                                                     cutlass::KernelHardwareInfo hw) {
  using K_ = GemmKernel;
  auto sa = cutlass::make_cute_packed_stride(typename K_::StrideA{}, cute::make_shape(M, K, 1));
  auto sb = cutlass::make_cute_packed_stride(typename K_::StrideB{}, cute::make_shape(N, K, 1));
  auto sc = cutlass::make_cute_packed_stride(typename K_::StrideC{}, cute::make_shape(M, N, 1));
  auto sd = cutlass::make_cute_packed_stride(typename K_::StrideD{}, cute::make_shape(M, N, 1));
  return typename K_::Arguments{
      cutlass::gemm::GemmUniversalMode::kGemm, {M, N, K, 1},
      {static_cast<const ElementA*>(x), sa, static_cast<const ElementB*>(w), sb},
      {Epi::arguments(x_scale, w_scale, bias), static_cast<const ElementOut*>(residual), sc,
       static_cast<ElementOut*>(out), sd},
      hw};
}
#endif

#include "entry.cuh"
