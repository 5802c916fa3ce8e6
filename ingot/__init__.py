"""ingot: an ahead-of-time compiler and serving runtime for LLMs on NVIDIA Blackwell and Hopper.

Public API (stable)::

    import ingot
    ingot.compile("model.onnx", target="cpu", out="m.ingot")
    model = ingot.load("m.ingot", device="cpu")
    outputs = model.run({"input_ids": ids})
"""

__version__ = "0.1.0"

from .api import Model, compile, load  # noqa: E402

__all__ = ["compile", "load", "Model", "__version__"]
