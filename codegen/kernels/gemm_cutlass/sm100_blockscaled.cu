#include "common.cuh"

// out[M, N] = (x[M, K] * x_block_scale) @ (w[N, K] * w_block_scale)^T with the epilogue in
// common.cuh, on sm_100a block-scaled tcgen05 MMA: ${A_TYPE} x ${B_TYPE} (packed e2m1, one scale
// factor per ${SF_VECTOR} elements along K) -> f32 accumulators -> ${OUT_TYPE}; MMA tile
// ${TILE_M}x${TILE_N}x${TILE_K}, cluster ${CLUSTER_M}x${CLUSTER_N}, 2-SM MMA: ${TWO_SM}. x and w
// are K-major; the scale factors are pre-swizzled into CUTLASS's Sm1xxBlkScaledConfig layout
// (128x4 atoms, padded) by the packing pass. The per-row/per-column epilogue scales carry the
// per-tensor (global) scales.
using namespace cute;
using ElementPairA = ${A_TYPE};  // the value type with its scale factor type (nv_float4_t / mx_float4_t)
using ElementPairB = ${B_TYPE};
using ElementOut = ${OUT_TYPE};
constexpr bool kTwoSm = ${TWO_SM};
using MmaTile = Shape<Int<${TILE_M}>, Int<${TILE_N}>, Int<${TILE_K}>>;
using ClusterShape = Shape<Int<${CLUSTER_M}>, Int<${CLUSTER_N}>, _1>;
using CtaTile = Shape<Int<${TILE_M} / (kTwoSm ? 2 : 1)>, Int<${TILE_N}>, Int<${TILE_K}>>;
using Epi = ingot::Epilogue<CtaTile, ElementOut, ElementOut, ${HAS_RESIDUAL}>;
constexpr int kAlignOut = 128 / cutlass::sizeof_bits<ElementOut>::value;

using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
    cutlass::arch::Sm100, cutlass::arch::OpClassBlockScaledTensorOp, MmaTile, ClusterShape,
    cutlass::epilogue::collective::EpilogueTileAuto, float, float,
    typename Epi::ElementC, cutlass::layout::RowMajor, kAlignOut,
    ElementOut, cutlass::layout::RowMajor, kAlignOut,
    cute::conditional_t<kTwoSm, cutlass::epilogue::TmaWarpSpecialized2Sm, cutlass::epilogue::TmaWarpSpecialized1Sm>,
    typename Epi::Tree>::CollectiveOp;

using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
    cutlass::arch::Sm100, cutlass::arch::OpClassBlockScaledTensorOp,
    ElementPairA, cutlass::layout::RowMajor, 32,
    ElementPairB, cutlass::layout::ColumnMajor, 32,
    float, MmaTile, ClusterShape,
    cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
        sizeof(typename CollectiveEpilogue::SharedStorage))>,
    cutlass::gemm::collective::KernelScheduleAuto>::CollectiveOp;

using GemmKernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, CollectiveMainloop,
                                                        CollectiveEpilogue, void>;
using ElementA = typename CollectiveMainloop::ElementA;  // the stored values (e2m1), as the probe names them
using ElementB = typename CollectiveMainloop::ElementB;

#if defined(INGOT_HOST_SHIM)
static typename GemmKernel::Arguments make_arguments(const void* x, const void* w, const void* x_block_scale,
                                                     const void* w_block_scale, const void* x_scale,
                                                     const void* w_scale, const void* bias, const void* residual,
                                                     void* out, int M, int N, int K, cutlass::KernelHardwareInfo hw) {
  using K_ = GemmKernel;
  using Mainloop = typename K_::CollectiveMainloop;
  using Config = typename Mainloop::Sm1xxBlkScaledConfig;
  using ElementSF = typename Mainloop::ElementSF;
  auto sa = cutlass::make_cute_packed_stride(typename K_::StrideA{}, cute::make_shape(M, K, 1));
  auto sb = cutlass::make_cute_packed_stride(typename K_::StrideB{}, cute::make_shape(N, K, 1));
  auto sc = cutlass::make_cute_packed_stride(typename K_::StrideC{}, cute::make_shape(M, N, 1));
  auto sd = cutlass::make_cute_packed_stride(typename K_::StrideD{}, cute::make_shape(M, N, 1));
  auto layout_sfa = Config::tile_atom_to_shape_SFA(cute::make_shape(M, N, K, 1));
  auto layout_sfb = Config::tile_atom_to_shape_SFB(cute::make_shape(M, N, K, 1));
  using DataA = typename Mainloop::ElementA;
  using DataB = typename Mainloop::ElementB;
  return typename K_::Arguments{
      cutlass::gemm::GemmUniversalMode::kGemm, {M, N, K, 1},
      {static_cast<const DataA*>(x), sa, static_cast<const DataB*>(w), sb,
       static_cast<const ElementSF*>(x_block_scale), layout_sfa,
       static_cast<const ElementSF*>(w_block_scale), layout_sfb},
      {Epi::arguments(x_scale, w_scale, bias), static_cast<const ElementOut*>(residual), sc,
       static_cast<ElementOut*>(out), sd},
      hw};
}

#endif

#include "entry.cuh"
