"""Run a simple template kernel on the CPU: its rendered source compiled by the host C++ compiler, every thread of
every block called one after another. For testing a kernel's index arithmetic and rounding chain where no GPU is.

Only kernels whose threads never wait for each other (no ``__syncthreads``, no shuffles, no shared memory) run
correctly this way; ``HostKernel`` refuses sources that use those. ``common.cuh`` is replaced by a host version of
the same helpers (storage types, ``to_f32`` / ``from_f32`` for f32, bf16 and e4m3 with the same rounding: nearest
even, e4m3 saturating to +-448), and the intrinsics the kernels use (``__fmaf_rn``, ``__fmul_rn``, ``__fdiv_rn``)
become their IEEE host equivalents, compiled without contraction, so the host results are the device's bit for bit
as long as the device code does what its source says. The PDL prologue is compiled out (``__CUDA_ARCH__`` is not
defined on the host).
"""

from __future__ import annotations

import ctypes
import hashlib
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from ingot.codegen.kernel import KernelSpec

CXX = shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")

HOST_COMMON = r"""
#include <cmath>
#include <cstring>
typedef long long i64;
struct bf16 { unsigned short bits; };
struct fp8e4m3 { unsigned char bits; };
struct HostDim3 { unsigned x, y, z; };
static HostDim3 threadIdx, blockIdx, blockDim, gridDim;
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __restrict__ __restrict
static inline float host_u2f(unsigned u) { float f; std::memcpy(&f, &u, 4); return f; }
static inline unsigned host_f2u(float f) { unsigned u; std::memcpy(&u, &f, 4); return u; }
static inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fdiv_rn(float a, float b) { return a / b; }
static inline float to_f32(float x) { return x; }
static inline float to_f32(bf16 x) { return host_u2f(((unsigned)x.bits) << 16); }
static inline float to_f32(fp8e4m3 x) {
  unsigned b = x.bits, s = (b & 0x80u) << 24, e = (b >> 3) & 0xFu, m = b & 7u;
  if (e == 15u && m == 7u) return host_u2f(0x7fc00000u | s);
  if (e == 0u) { float v = (float)m * 0.001953125f; return s ? -v : v; }
  return host_u2f(s | ((e + 120u) << 23) | (m << 20));
}
template <typename T> T from_f32(float x);
template <> inline float from_f32<float>(float x) { return x; }
template <> inline bf16 from_f32<bf16>(float x) {
  unsigned u = host_f2u(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{(unsigned short)((u >> 16) | 0x40u)};
  u += 0x7fffu + ((u >> 16) & 1u);
  return bf16{(unsigned short)(u >> 16)};
}
// nearest even among the 127 finite magnitudes (codes 0..126), saturating at 448; NaN -> 0x7f
template <> inline fp8e4m3 from_f32<fp8e4m3>(float x) {
  const unsigned char sign = std::signbit(x) ? 0x80 : 0;
  if (std::isnan(x)) return fp8e4m3{(unsigned char)(sign | 0x7f)};
  const float a = std::fabs(x);
  int best = 0;
  float best_d = INFINITY;
  for (int c = 0; c < 127; ++c) {
    const float d = std::fabs(to_f32(fp8e4m3{(unsigned char)c}) - a);
    if (d < best_d || (d == best_d && (c & 1) == 0)) { best = c; best_d = d; }
  }
  if (a >= 448.0f) best = 126;
  return fp8e4m3{(unsigned char)(sign | best)};
}
struct HostPtr {
  void* p;
  template <class T> operator T*() const { return static_cast<T*>(p); }
};
"""

_COMMON_BLOCK = re.compile(r"// ---- \.\./common\.cuh ----\n.*?// ---- end \.\./common\.cuh ----", re.S)
_REFUSED = ("__syncthreads", "__shfl", "__shared__", "atomic")


class HostKernel:
    """``spec``'s kernel built for the host; ``launch(**args)`` with numpy arrays (or None) for pointers."""

    def __init__(self, spec: KernelSpec, workdir: Path | None = None) -> None:
        if CXX is None:
            raise RuntimeError("no host C++ compiler (g++ / clang++)")
        src = spec.source()
        body = src[src.index('extern "C"'):]
        used = [w for w in _REFUSED if w in body]
        if used:
            raise ValueError(f"{spec.entry} uses {used}: its threads cannot run one after another")
        if not _COMMON_BLOCK.search(src):
            raise ValueError(f"{spec.entry}: no inlined common.cuh block to replace")
        self.spec = spec
        src = _COMMON_BLOCK.sub(lambda _: HOST_COMMON, src)
        args = []
        for i, p in enumerate(spec.params):
            args.append({"ptr": f"HostPtr{{ptrs[{i}]}}", "i64": f"ints[{i}]", "i32": f"(int)ints[{i}]",
                         "f32": f"(float)floats[{i}]"}[p.ctype])
        src += f"""
extern "C" void ingot_host_launch(void** ptrs, long long* ints, double* floats, unsigned gx, unsigned gy, unsigned gz,
                                  unsigned bx, unsigned by, unsigned bz) {{
  blockDim = HostDim3{{bx, by, bz}};
  gridDim = HostDim3{{gx, gy, gz}};
  for (unsigned z = 0; z < gz; ++z) for (unsigned y = 0; y < gy; ++y) for (unsigned x = 0; x < gx; ++x)
    for (unsigned tz = 0; tz < bz; ++tz) for (unsigned ty = 0; ty < by; ++ty) for (unsigned tx = 0; tx < bx; ++tx) {{
      blockIdx = HostDim3{{x, y, z}};
      threadIdx = HostDim3{{tx, ty, tz}};
      {spec.entry}({", ".join(args)});
    }}
}}
"""
        digest = hashlib.sha256(src.encode()).hexdigest()[:16]
        self._tmp = None if workdir is not None else tempfile.TemporaryDirectory(prefix="ingot-host-")
        out = Path(workdir if workdir is not None else self._tmp.name)  # type: ignore[union-attr]
        cpp, lib = out / f"{digest}.cpp", out / f"{digest}.so"
        cpp.write_text(src)
        cmd = [CXX, "-std=c++17", "-O1", "-ffp-contract=off", "-fno-strict-aliasing", "-fPIC", "-shared",
               "-Wno-unknown-pragmas", "-o", str(lib), str(cpp)]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if r.returncode != 0:
            raise RuntimeError(f"host build of {spec.entry} failed:\n{r.stderr[-4000:]}")
        self._lib = ctypes.CDLL(str(lib))
        self._fn = self._lib.ingot_host_launch

    def launch(self, **args) -> None:
        """Run every block and thread; pointer arguments are C-contiguous numpy arrays (written in place) or None."""
        names = [p.name for p in self.spec.params]
        missing, extra = [n for n in names if n not in args], sorted(set(args) - set(names))
        if missing or extra:
            raise TypeError(f"{self.spec.entry}: missing params {missing}, unknown params {extra}")
        n = len(names)
        ptrs = (ctypes.c_void_p * n)()
        ints = (ctypes.c_longlong * n)()
        floats = (ctypes.c_double * n)()
        for i, p in enumerate(self.spec.params):
            v = args[p.name]
            if p.ctype == "ptr":
                if v is not None:
                    if not (isinstance(v, np.ndarray) and v.flags.c_contiguous):
                        raise TypeError(f"{p.name}: a C-contiguous numpy array or None")
                    ptrs[i] = v.ctypes.data
            elif p.ctype == "f32":
                floats[i] = float(v)
            else:
                ints[i] = int(v)
        grid = self.spec.grid_dims({p.name: int(args[p.name]) for p in self.spec.params if p.ctype in ("i32", "i64")})
        if min(grid) <= 0:
            return
        self._fn(ptrs, ints, floats, *(ctypes.c_uint(g) for g in grid), *(ctypes.c_uint(b) for b in self.spec.block))


def aligned(a: np.ndarray, alignment: int = 64) -> np.ndarray:
    """A copy of ``a`` whose data starts at a multiple of ``alignment`` bytes (the kernels' 16/32-byte vector
    loads assume the arena's alignment)."""
    raw = np.empty(a.nbytes + alignment, np.uint8)
    start = (-raw.ctypes.data) % alignment
    out = raw[start : start + a.nbytes].view(a.dtype).reshape(a.shape)
    out[...] = a
    return out
