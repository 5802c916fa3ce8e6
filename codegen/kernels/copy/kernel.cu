#include "../common.cuh"

// Row copy with conversion: dst[r, c] = convert(src[row * ${SRC_STRIDE} + ${SRC_OFFSET} + c]) for
// c < ${WIDTH}, where row = r, or index[r] when INDEXED (a negative index counts from src_rows; one
// outside [0, src_rows) gives a zero row). Implements split (a column slice), gather on axis 0 and
// cast; the values round like ir/ops/core.py cast_array (nearest even, saturating for fp8).
extern "C" __global__ void __launch_bounds__(${BLOCK}) ${KERNEL}(
    const ${ST}* __restrict__ src, const long long* __restrict__ index, ${DT}* __restrict__ dst,
    long long rows, long long src_rows) {
  constexpr bool INDEXED = ${INDEXED};
  const i64 r = blockIdx.x;
  if (r >= rows) return;
  i64 row = r;
  bool valid = true;
  if (INDEXED) {
    row = index[r];
    if (row < 0) row += src_rows;
    valid = row >= 0 && row < src_rows;
    if (!valid) row = 0;
  }
  const ${ST}* s = src + row * (i64)${SRC_STRIDE} + ${SRC_OFFSET};
  ${DT}* d = dst + r * (i64)${WIDTH};
  for (i64 c = threadIdx.x; c < ${WIDTH}; c += ${BLOCK})
    d[c] = from_f32<${DT}>(valid ? to_f32(s[c]) : 0.0f);
}
