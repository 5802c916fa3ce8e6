#include "../common.cuh"

// A K-step decode graph's inputs for step `step` (runtime/cuda_backend.py, "Decode steps"), put in place by a kernel
// inside the graph instead of stream copies between the steps:
//   step < steps:  io[0, nbytes) = staged[step * stride, step * stride + nbytes), but from the second step on the
//                  bytes of input_ids, io[ids_offset, ids_offset + rows * 8), are the previous step's argmax ids
//                  (tokens); and from the second step on, out_ids[step - 1, :rows] = tokens;
//   step == steps: out_ids[steps - 1, :rows] = tokens only.
// Every byte written has one writer, so no thread waits for another (the host emulation runs the threads one after
// another). 16-byte units where the staged slice and io are 16-byte aligned and ids_offset is a multiple of 8, single
// bytes otherwise and for the tail; nothing at or past nbytes is written. Grid-stride loops: any grid is right.

struct alignas(16) ${KERNEL}_unit { unsigned long long w[2]; };

extern "C" __global__ void __launch_bounds__(${BLOCK}) ${KERNEL}(
    const unsigned char* __restrict__ staged, unsigned char* __restrict__ io, long long nbytes, long long stride,
    long long step, long long steps, const long long* __restrict__ tokens, long long ids_offset,
    long long* __restrict__ out_ids, long long rows) {
  const i64 tid = (i64)blockIdx.x * ${BLOCK} + threadIdx.x, nthreads = (i64)gridDim.x * ${BLOCK};
  if (step < 0 || step > steps) return;
  if (step > 0) {
#pragma unroll 1
    for (i64 i = tid; i < rows; i += nthreads) out_ids[(step - 1) * rows + i] = tokens[i];
  }
  if (step == steps) return;
  const unsigned char* src = staged + step * stride;
  const bool fed = step > 0;  // input_ids are the previous step's tokens, not the staged placeholders
  const i64 ids_bytes = rows * 8;
  i64 done = 0;
  if ((((unsigned long long)src | (unsigned long long)io) & 15ull) == 0 && (ids_offset & 7) == 0) {
    const i64 units = nbytes >> 4;
    const ${KERNEL}_unit* s = reinterpret_cast<const ${KERNEL}_unit*>(src);
    ${KERNEL}_unit* d = reinterpret_cast<${KERNEL}_unit*>(io);
#pragma unroll 1
    for (i64 u = tid; u < units; u += nthreads) {
      ${KERNEL}_unit v = s[u];
      if (fed) {
#pragma unroll
        for (int w = 0; w < 2; ++w) {
          const i64 rel = u * 16 + w * 8 - ids_offset;
          if (rel >= 0 && rel < ids_bytes) v.w[w] = (unsigned long long)tokens[rel >> 3];
        }
      }
      d[u] = v;
    }
    done = units << 4;
  }
  const unsigned char* token_bytes = reinterpret_cast<const unsigned char*>(tokens);
#pragma unroll 1
  for (i64 b = done + tid; b < nbytes; b += nthreads) {
    const i64 rel = b - ids_offset;
    io[b] = fed && rel >= 0 && rel < ids_bytes ? token_bytes[rel] : src[b];
  }
}
