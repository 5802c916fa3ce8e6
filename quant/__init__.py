"""Compile-time quantization: the per-layer plan (``config``), calibration (``calibration``), the eval
data (``eval_data``), teacher-forced scoring (``evaluate``), the accuracy gate with fallback
(``gate``) and the report (``report``). The numerics live in ``ingot.ir.quant``; the graph rewrites
are the ``calibrate``, ``quantize`` and ``pack-*`` passes."""
