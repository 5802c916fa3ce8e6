"""Compiler passes: the registry and pipelines (``manager``), the pattern rewriter (``rewrite``),
and one module per pass."""

from .manager import (
    PASSES,
    PIPELINES,
    DumpIRInstrument,
    Instrument,
    Pass,
    PassContext,
    PassError,
    TimingInstrument,
    extend_pipeline,
    function_pass,
    get_pass,
    register_pass,
    run_passes,
)
from .rewrite import Const, P, Rule, Var, rewrite

__all__ = [
    "PASSES", "PIPELINES", "Pass", "PassContext", "PassError", "Instrument", "TimingInstrument",
    "DumpIRInstrument", "register_pass", "function_pass", "get_pass", "run_passes", "extend_pipeline",
    "P", "Var", "Const", "Rule", "rewrite",
]
