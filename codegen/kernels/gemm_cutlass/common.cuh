// CUTLASS GEMM family, shared part: headers and the epilogue visitor tree.
// CUTLASS headers come from the nvidia-cutlass wheel (include paths from ingot.codegen.compile);
// they are included with <...> so the template renderer leaves them alone.
#include <cutlass/cutlass.h>
#include <cute/tensor.hpp>
#include <cutlass/numeric_types.h>
#include <cutlass/gemm/dispatch_policy.hpp>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/epilogue/fusion/operations.hpp>
#include <cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp>
#include <cutlass/gemm/kernel/gemm_universal.hpp>
#include <cutlass/gemm/kernel/tile_scheduler_params.h>
#include <cutlass/util/packed_stride.hpp>
#include <cutlass/kernel_hardware_info.h>

namespace ingot {
using namespace cute;
namespace fusion = cutlass::epilogue::fusion;
constexpr auto kRound = cutlass::FloatRoundStyle::round_to_nearest;

// out[m, n] = col_scale[n] * (acc[m, n] * row_scale[m]) + bias[n]  (+ residual[m, n])
// Every vector is optional at run time: a null pointer reads as 1 (scales) or 0 (bias), so one
// build serves plain, scaled (FP8: per-token x per-channel), biased and unbiased linears.
// The residual is a compile-time choice: it is the GEMM's C operand (loaded by TMA).
// kColScalar (compile time): col_scale points at one f32, the weight's per-tensor scale, read once (the same
// products as the vector holding it N times, so the same bits).
template <class CtaTile, class ElementOut, class ElementBias, bool kResidual, bool kColScalar = false>
struct Epilogue {
  using RowScale = fusion::Sm90ColBroadcast<0, CtaTile, float, float, Stride<_1, _0, int64_t>>;  // [M]
  using ColScale = cute::conditional_t<kColScalar, fusion::Sm90ScalarBroadcast<float, Stride<_0, _0, int64_t>>,
                                       fusion::Sm90RowBroadcast<0, CtaTile, float, float, Stride<_0, _1, int64_t>>>;
  using Bias = fusion::Sm90RowBroadcast<0, CtaTile, ElementBias, float, Stride<_0, _1, int64_t>>;  // [N]
  using RowScaled = fusion::Sm90EVT<fusion::Sm90Compute<cutlass::multiplies, float, float, kRound>,
                                    fusion::Sm90AccFetch, RowScale>;
  using Affine = fusion::Sm90EVT<
      fusion::Sm90Compute<cutlass::homogeneous_multiply_add, cute::conditional_t<kResidual, float, ElementOut>,
                          float, kRound>,
      ColScale, RowScaled, Bias>;
  using WithResidual = fusion::Sm90EVT<fusion::Sm90Compute<cutlass::plus, ElementOut, float, kRound>, Affine,
                                       fusion::Sm90SrcFetch<ElementOut>>;
  using Tree = cute::conditional_t<kResidual, WithResidual, Affine>;
  using ElementC = cute::conditional_t<kResidual, ElementOut, void>;

  static typename Tree::Arguments arguments(const void* row_scale, const void* col_scale, const void* bias) {
    typename ColScale::Arguments col{};
    if constexpr (kColScalar) {  // {scalars, scalar_ptrs, dScalar}: the pointer's value, 1 where it is null
      col.scalars[0] = 1.0f;
      col.scalar_ptrs[0] = static_cast<const float*>(col_scale);
    } else {  // {ptr_row, null_default, dRow}
      col.ptr_row = static_cast<const float*>(col_scale);
      col.null_default = 1.0f;
    }
    typename Affine::Arguments affine{
        col,
        {{}, {static_cast<const float*>(row_scale), 1.0f, {}}, {}},
        {static_cast<const ElementBias*>(bias), ElementBias(0), {}},
        {}};
    if constexpr (kResidual) {
      return typename Tree::Arguments{affine, {}, {}};
    } else {
      return affine;
    }
  }
};
}  // namespace ingot
