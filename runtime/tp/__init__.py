"""Tensor parallelism: running the ranks of a TP artifact (``ingot compile --tp N``) together.

- ``artifact.py``: the TP artifact (one sub-artifact per rank, one manifest over all of them).
- ``comm.py``: the CPU all-reduce transport (shared memory + a barrier) and its in-process twin.
- ``nccl.py``: the GPU all-reduce (``ncclAllReduce`` on the CUDA backend's stream).
- ``worker.py``: the process that runs one rank (ranks 1..N-1).
- ``executor.py``: ``TpExecutor``, the N ranks behind the single-device executor interface.

See docs/SCALE_OUT.md (Tensor parallelism).
"""
