"""ingot: an ahead-of-time compiler and serving runtime for LLMs on NVIDIA Blackwell and Hopper.

Public API (stable)::

    import ingot
    ingot.compile("model.onnx", target="cpu", out="m.ingot")
    model = ingot.load("m.ingot", device="cpu")
    outputs = model.run({"input_ids": ids})
    llm = ingot.LLM("m.ingot")                        # LLM-mode artifact: the serving engine, offline
    outs = llm.generate(prompts=["text"], max_tokens=16)
"""

__version__ = "0.1.0"

from .api import LLM, Completion, Model, compile, load  # noqa: E402

__all__ = ["compile", "load", "Model", "LLM", "Completion", "__version__"]
