"""The long tail: CUDA kernels generated through Apache TVM for every node without a template.

``rule.py`` is the ``tvm`` kernel family (the registry's fallback, tried last); the TE builders live
in one module per op class (``elementwise``, ``reduce``, ``layout``, ``nn``); ``build.py`` schedules
(TVM's ``dlight`` default GPU rules) and compiles through TVM and reads back the CUDA source and the
launch configuration; ``specialize.py`` makes graph-mode graphs static before planning. TVM
(``pip install 'ingot[tvm]'``) is imported only when a kernel has to be generated; generated
kernels are cached by content, so a machine without TVM compiles whatever the cache holds.
"""

from .rule import available

__all__ = ["available"]
