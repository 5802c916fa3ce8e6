"""The inputs of one step of a K-step decode graph (``step_inputs.cu``), a runtime kernel like the greedy argmax.

``CudaExecutor.greedy_tokens_steps`` (``runtime/cuda_backend.py``, "Decode steps") copies all ``K`` steps' staged
io bytes to the device at once and captures the ``K`` steps as one CUDA graph: before step ``j``'s launches, this
kernel (``step = j``) copies step ``j``'s bytes into the io region, with the previous step's argmax ids as its
``input_ids`` from the second step on, and files the previous step's ids in ``out_ids``; after the last step
(``step = K``) it only files the last ids. It is no graph op's kernel, so the copy family's ``plan`` never sees it.
"""

from __future__ import annotations

from ...kernel import GridDim, KernelSpec
from ...target import Target

BLOCK = 256
#: io bytes per CTA (16-byte units, four per thread); a small bucket's inputs take one CTA
TILE = BLOCK * 16 * 4
PARAMS = [("staged", "ptr"), ("io", "ptr"), ("nbytes", "i64"), ("stride", "i64"), ("step", "i64"), ("steps", "i64"),
          ("tokens", "ptr"), ("ids_offset", "i64"), ("out_ids", "ptr"), ("rows", "i64")]


def step_inputs_spec(target: Target) -> KernelSpec:
    """``io[:nbytes] = staged[step * stride:][:nbytes]`` with ``input_ids`` (at byte ``ids_offset`` of io, ``rows``
    ids) taken from ``tokens`` for ``step > 0``, and ``out_ids[step - 1, :rows] = tokens`` (``i64[steps, rows]``);
    ``step == steps``: only the latter. Params: staged, io, nbytes, stride, step, steps, tokens, ids_offset, out_ids,
    rows; the grid covers ``nbytes`` (``TILE`` bytes a CTA)."""
    return KernelSpec.make("copy", "step_inputs.cu", "step_inputs", target.arch or "", {"BLOCK": BLOCK}, PARAMS,
                           BLOCK, [GridDim("nbytes", TILE)])
