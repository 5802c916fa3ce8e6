"""The step kernel of a K-step decode graph (``codegen/kernels/copy/step_inputs.cu``, ``step_rule.py``) without a GPU:
it compiles for sm_90a and sm_100a with 16-byte loads and stores, no local memory and no 64-bit division routine; and,
built for the host (``host_emulation.py``: every thread of every block in turn; the kernel has one writer per byte,
so no thread waits for another), for every step of ``K`` it writes exactly the io bytes and ids it should: the step's
staged bytes up to ``nbytes`` (not a multiple of 16, or one), with the previous step's tokens over ``input_ids``
from the second step on, nothing at or past ``nbytes``, the previous step's ids into their row of ``out_ids``; at
``step == steps`` only the last row of ids; in the 16-byte path and the byte path (io not 16-byte aligned, or
``ids_offset`` not a multiple of 8), in one CTA and in several. The runtime side: tests/runtime/test_decode_steps.py
(a fake driver) and test_decode_steps_gpu.py."""

from __future__ import annotations

import numpy as np
import pytest

from ingot.codegen.kernels.copy.step_rule import TILE, step_inputs_spec
from ingot.codegen.target import get_target
from tests.codegen.common import (  # noqa: F401 (autouse fixture)
    assert_no_local_memory,
    module_kernel_cache,
    needs_compiler,
    sass_opcodes,
)
from tests.codegen.host_emulation import CXX, HostKernel, aligned
from tests.helpers import rng

ARCH = {"h200": "sm_90a", "b200": "sm_100a"}


@needs_compiler
@pytest.mark.parametrize("target", ["h200", "b200"])
def test_compiles_with_16_byte_units_and_no_local_memory(target):
    ops = sass_opcodes(step_inputs_spec(get_target(target)), ARCH[target])
    assert "LDG.E.128" in ops and "STG.E.128" in ops, sorted(ops)
    assert_no_local_memory(ops, "the step kernel")
    assert not any(o.startswith("CALL") for o in ops), sorted(ops)  # no 64-bit division routine in the loops


@pytest.fixture(scope="module")
def kernel() -> HostKernel:
    if CXX is None:
        pytest.skip("no host C++ compiler")
    return HostKernel(step_inputs_spec(get_target("h200")))


#: (nbytes, ids_offset, rows, io misaligned by): the 16-byte path with a tail, exact units, a single byte, several
#: CTAs; the byte path through io's alignment and through ids_offset; input_ids running past nbytes (cut there)
CASES = {
    "tail": (4099, 256, 3, 0),
    "units": (1024, 512, 8, 0),
    "one_byte": (1, 0, 1, 0),
    "ctas": (2 * TILE + 4000, TILE + 64, 5, 0),
    "io_unaligned": (777, 128, 4, 1),
    "ids_offset_unaligned": (700, 100, 2, 0),
    "ids_past_end": (1000, 984, 4, 0),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_step_writes_its_inputs_and_the_previous_ids(kernel, case):
    nbytes, ids_offset, rows, shift = CASES[case]
    steps = 3
    r = rng()
    stride = -(-nbytes // 256) * 256
    staged = aligned(r.integers(0, 256, steps * stride, dtype=np.uint8))
    tokens = aligned(r.integers(0, 1 << 40, rows, dtype=np.int64))
    poison = r.integers(0, 256, nbytes + 64, dtype=np.uint8)
    ids_poison = r.integers(-(1 << 40), 0, (steps, rows), dtype=np.int64)
    for step in range(steps + 2):
        io_buf = aligned(np.concatenate([np.zeros(shift, np.uint8), poison]))
        io = io_buf[shift:]  # a view: C-contiguous, at io_buf + shift
        out_ids = aligned(ids_poison)
        kernel.launch(staged=staged, io=io, nbytes=nbytes, stride=stride, step=step, steps=steps, tokens=tokens,
                      ids_offset=ids_offset, out_ids=out_ids, rows=rows)
        want_io, want_ids = poison.copy(), ids_poison.copy()
        if step < steps:
            want_io[:nbytes] = staged[step * stride : step * stride + nbytes]
            if step > 0:
                fed = tokens.view(np.uint8)[: max(0, min(rows * 8, nbytes - ids_offset))]
                want_io[ids_offset : ids_offset + len(fed)] = fed
        if 0 < step <= steps:
            want_ids[step - 1] = tokens
        assert np.array_equal(io, want_io), f"step {step}: io bytes {np.flatnonzero(io != want_io)[:8]} differ"
        assert np.array_equal(out_ids, want_ids), f"step {step}: out_ids {out_ids} != {want_ids}"
