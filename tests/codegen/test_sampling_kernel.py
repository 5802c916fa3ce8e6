"""The greedy-sampling kernel (``codegen/kernels/sampling``) the CUDA executor runs for device sampling:
compile-only checks (NVRTC or nvcc, sm_90a and sm_100a: 16-byte loads, no local memory) and, on a GPU
(``-m gpu``), numpy's argmax exactly: ties to the first index, NaN first, -inf rows, -0.0 == 0.0."""

from __future__ import annotations

import numpy as np
import pytest

from ingot.codegen.compile import compile_spec
from ingot.codegen.kernels.sampling.rule import greedy_spec, pack_width
from ingot.codegen.sass import disassemble, opcodes
from ingot.codegen.target import get_target
from ingot.ir.types import DType
from tests.codegen.common import (  # noqa: F401 (autouse fixture)
    assert_no_local_memory,
    module_kernel_cache,
    needs_compiler,
    needs_cuobjdump,
)

f32, bf16 = DType.f32, DType.bf16
#: the engine's vocabularies: Llama 3, SmolLM2, the tiny test models, an odd one (scalar loads)
VOCABS = (128256, 49152, 260, 256, 7)


def test_pack_width_divides_the_row():
    assert pack_width(f32, 128256) == 4 and pack_width(f32, 258) == 2 and pack_width(f32, 7) == 1
    assert pack_width(bf16, 1000) == 8 and pack_width(bf16, 1004) == 4
    for v in VOCABS:
        spec = greedy_spec(f32, v, get_target("h200"))
        vec = int(spec.value("VEC"))
        assert v % vec == 0 and spec.block[0] % 32 == 0 and spec.block[0] <= 1024


@needs_compiler
@pytest.mark.parametrize("target", ["h200", "b200"])
@pytest.mark.parametrize("vocab", VOCABS)
def test_greedy_kernel_compiles(target, vocab):
    spec = greedy_spec(f32, vocab, get_target(target))
    assert compile_spec(spec).cubin


@needs_compiler
@needs_cuobjdump
@pytest.mark.parametrize("target", ["h200", "b200"])
def test_greedy_kernel_loads_16_bytes_without_spills(target):
    ops = opcodes(disassemble(compile_spec(greedy_spec(f32, 128256, get_target(target))).cubin))
    assert any(o.startswith("LDG") and ".128" in o for o in ops), sorted(ops)
    assert_no_local_memory(ops, "the argmax")


# -- the reduction order, emulated ------------------------------------------------------------------


def _ahead(x: float, i: int, best: float, bi: int) -> bool:
    """``argmax_ahead`` of kernel.cu."""
    if np.isnan(x) or np.isnan(best):
        return bool(np.isnan(x) and (not np.isnan(best) or i < bi))
    return bool(x > best or (x == best and i < bi))


def _emulate(row: np.ndarray, block: int, vec: int, unroll: int) -> int:
    """kernel.cu's visiting order on one row: each thread's packs, then the xor shuffles within each warp,
    then warp 0 over the warps' results."""
    v = len(row)
    packs = v // vec
    pairs = []
    for t in range(block):
        best, idx = -np.inf, v
        for p0 in range(t, packs, block * unroll):
            for u in range(unroll):
                p = p0 + u * block
                for e in range(vec if p < packs else 0):
                    if _ahead(row[p * vec + e], p * vec + e, best, idx):
                        best, idx = row[p * vec + e], p * vec + e
        pairs.append((best, idx))

    def warp_reduce(lanes: list[tuple[float, int]]) -> tuple[float, int]:
        for o in (16, 8, 4, 2, 1):
            lanes = [lanes[i ^ o] if _ahead(*lanes[i ^ o], *b) else b for i, b in enumerate(lanes)]
        return lanes[0]

    warps = [warp_reduce(pairs[w : w + 32]) for w in range(0, block, 32)]
    best, idx = warp_reduce(warps + [(-np.inf, v)] * (32 - len(warps)))
    return idx if idx < v else 0


@pytest.mark.parametrize("vocab", [260, 7, 1000, 4100])
def test_the_kernels_reduction_order_is_numpy_argmax(vocab):
    spec = greedy_spec(f32, vocab, get_target("h200"))
    block, vec, unroll = spec.block[0], int(spec.value("VEC")), int(spec.value("UNROLL"))
    x = _cases(vocab, 7, np.random.default_rng(vocab))
    assert [_emulate(r, block, vec, unroll) for r in x] == np.argmax(x, axis=1).tolist()


# -- on a GPU -------------------------------------------------------------------------------------


def _cases(vocab: int, rows: int, rng: np.random.Generator) -> np.ndarray:
    """Fresh random rows, then the cases the tie and NaN rules decide."""
    x = rng.standard_normal((rows, vocab)).astype(np.float32)
    x[0, [vocab // 3, vocab - 1]] = 50.0  # a tie: the first wins
    x[1, [vocab - 1, 0]] = 50.0  # a tie at both ends
    x[2] = -np.inf  # nothing but -inf: index 0
    x[3, [5 % vocab, 1 % vocab]] = np.nan  # NaN first, the lower index of two
    x[3, vocab // 2] = np.inf
    x[4] = 0.0
    x[4, [vocab // 2, vocab - 1]] = -0.0  # -0.0 == 0.0: index 0 still wins
    x[5] = np.float32(1.5)  # every entry tied
    x[6, vocab - 1] = np.inf  # the last entry, in the remainder of the packs
    return x


@pytest.mark.gpu
@pytest.mark.parametrize("vocab", VOCABS)
def test_greedy_kernel_is_numpy_argmax(gpu, vocab):
    target = get_target("h200" if gpu.arch == "sm_90a" else "b200")
    rng = np.random.default_rng(vocab)
    for rows in (7, 9, 64):
        x = _cases(vocab, rows, rng)
        spec = greedy_spec(f32, vocab, target)
        tokens = gpu.alloc((rows,), np.int64)
        gpu.launch(spec, logits=gpu.upload(x), tokens=tokens, num_rows=rows)
        got, want = gpu.download(tokens), np.argmax(x, axis=1)
        bad = np.flatnonzero(got != want)
        assert not len(bad), f"rows {bad}: {got[bad]} on the GPU, numpy's argmax {want[bad]}"
