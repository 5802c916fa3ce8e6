// CUTLASS GEMM family, shared part: the launchable entry and its host shim.
//
// Built with -cubin (the default): ${KERNEL} is an extern "C" __global__ taking CUTLASS's
// GemmKernel::Params by value (the body of cutlass::device_kernel<GemmKernel>), launched through
// the driver API with the cluster shape as a launch attribute.
// Built with -DINGOT_HOST_SHIM -shared: no device code, only the host functions that turn
// pointers and M into that Params blob (TMA descriptors, tile scheduler) and the launch config.
#if !defined(INGOT_HOST_SHIM)
extern "C" __global__ void __launch_bounds__(GemmKernel::MaxThreadsPerBlock, GemmKernel::MinBlocksPerMultiprocessor)
${KERNEL}(CUTLASS_GRID_CONSTANT typename GemmKernel::Params const params) {
  extern __shared__ char smem[];
  GemmKernel op;
  op(params, smem);
}
#else
#include <cstring>

extern "C" unsigned long long ${KERNEL}_params_size() { return sizeof(typename GemmKernel::Params); }

// Fills `params` (at least _params_size() bytes) and launch[10] = {grid x, y, z, block x, y, z,
// cluster x, y, z, dynamic shared memory bytes}. Returns 0, or 1 when CUTLASS cannot run this
// problem, 2 when it would need a workspace, 3 when `capacity` is too small, 4 when building
// the params failed (a TMA descriptor the driver rejected).
// `_prepare_nk` is the same for a run-time N and K (a spec rendered with N = K = 0 is shape-generic: its
// device code never depended on them); `_prepare` uses the spec's own N and K.
extern "C" int ${KERNEL}_prepare_nk(const void* x, const void* w, const void* x_block_scale,
                                    const void* w_block_scale, const void* x_scale, const void* w_scale,
                                    const void* bias, const void* residual, void* out, long long M, long long N,
                                    long long K, int sm_count, void* params, unsigned long long capacity,
                                    int* launch) {
  cutlass::KernelHardwareInfo hw;
  hw.device_id = 0;
  hw.sm_count = sm_count;
  typename GemmKernel::Arguments args = make_arguments(x, w, x_block_scale, w_block_scale, x_scale, w_scale,
                                                       bias, residual, out, static_cast<int>(M),
                                                       static_cast<int>(N), static_cast<int>(K), hw);
  if (GemmKernel::can_implement(args) != true) return 1;
  if (GemmKernel::get_workspace_size(args) != 0) return 2;
  if (capacity < sizeof(typename GemmKernel::Params)) return 3;
  typename GemmKernel::Params p = GemmKernel::to_underlying_arguments(args, nullptr);
  if (cudaGetLastError() != cudaSuccess) return 4;
  std::memcpy(params, &p, sizeof(p));
  dim3 grid = GemmKernel::get_grid_shape(p), block = GemmKernel::get_block_shape();
  using Cluster = typename GemmKernel::DispatchPolicy::ClusterShape;
  int out_cfg[10] = {int(grid.x), int(grid.y), int(grid.z), int(block.x), int(block.y), int(block.z),
                     int(cute::size<0>(Cluster{})), int(cute::size<1>(Cluster{})), int(cute::size<2>(Cluster{})),
                     int(GemmKernel::SharedStorageSize)};
  std::memcpy(launch, out_cfg, sizeof(out_cfg));
  return 0;
}

extern "C" int ${KERNEL}_prepare(const void* x, const void* w, const void* x_block_scale,
                                 const void* w_block_scale, const void* x_scale, const void* w_scale,
                                 const void* bias, const void* residual, void* out, long long M, int sm_count,
                                 void* params, unsigned long long capacity, int* launch) {
  return ${KERNEL}_prepare_nk(x, w, x_block_scale, w_block_scale, x_scale, w_scale, bias, residual, out, M, ${N},
                              ${K}, sm_count, params, capacity, launch);
}
#endif
