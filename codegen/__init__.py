"""CUDA code generation: targets, kernel families, compile driver.

- ``target``: ``get_target("b200" | "h200" | "h100" | "cpu")``.
- ``kernel``: ``KernelSpec`` (a rule's decisions) and ``render`` (template -> self-contained source; every
  template kernel gets the programmatic-dependent-launch prologue, ``PDL_PROLOGUE``: it waits for the grid
  before it, so a template kernel never needs its own synchronization with the previous launch, and the
  CUDA backend launches it with programmatic stream serialization; ``INGOT_PDL=0`` turns that off;
  ``INGOT_PDL_TRIGGER=early`` at compile time lets the next grid be scheduled before the wait, experimental).
- ``family`` / ``registry``: one folder per family in ``kernels/`` with ``rule.py`` and templates;
  ``registry.plan_op(op, input_types, target)`` returns the launches for an IR op.
- ``compile``: ``compile_spec`` / ``compile_source`` -> cubin + PTX (NVRTC or nvcc), cached by content.
- ``sass``: cuobjdump-based SASS checks.
"""
