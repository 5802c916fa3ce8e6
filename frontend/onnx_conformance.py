"""Run the ONNX node test cases that ship in the ``onnx`` package through ingot.

Each case is imported with ingot's ONNX importer, executed by the CPU backend and compared with the
expected outputs using the tolerances of onnx's own backend test runner (``rtol``/``atol`` of the
case; exact equality for non-float outputs; NaN equals NaN).

    python -m ingot.frontend.onnx_conformance --write docs/ONNX_COVERAGE.md
    python -m ingot.frontend.onnx_conformance -k "conv|pool" -v
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import re
import sys
import warnings
from collections.abc import Iterable
from pathlib import Path

import numpy as np


@dataclasses.dataclass
class CaseResult:
    name: str
    op_type: str
    status: str  # passed | failed | unsupported
    reason: str = ""


def _op_type(case) -> str:
    nodes = [n.op_type for n in case.model.graph.node]
    main = [t for t in nodes if t != "Constant"]
    return (main or nodes or ["?"])[0] if len(nodes) <= 2 else _expanded_op(case.name)


def _expanded_op(name: str) -> str:
    return name


def load_cases(pattern: str | None = None) -> list:
    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = collect_testcases()
    if pattern:
        rx = re.compile(pattern)
        cases = [c for c in cases if rx.search(c.name)]
    return cases


def _as_comparable(a: np.ndarray) -> np.ndarray:
    from ..ir.types import DType

    try:
        dt = DType.from_np(a.dtype)
    except TypeError:
        return a
    if dt.is_float and dt not in (DType.f32, DType.f64, DType.f16):
        return a.astype(np.float32)
    if dt in (DType.i4, DType.u4):
        return a.astype(np.int8)
    return a


def _to_array(x):
    import onnx
    from onnx import numpy_helper

    if isinstance(x, np.generic):  # 0-d expected values come as numpy scalars
        return np.asarray(x)
    return numpy_helper.to_array(x) if isinstance(x, onnx.TensorProto) else x


def compare(expected: np.ndarray, got: np.ndarray, rtol: float, atol: float) -> str:
    """Empty string when equal within tolerance, else a short description of the mismatch."""
    if not isinstance(expected, np.ndarray):
        return f"expected a {type(expected).__name__} output (sequences/optionals are not supported)"
    if got.dtype != expected.dtype:
        return f"dtype {got.dtype}, expected {expected.dtype}"
    if got.shape != expected.shape:
        return f"shape {got.shape}, expected {expected.shape}"
    e, g = _as_comparable(expected), _as_comparable(got)
    if e.dtype == object:
        return "" if np.array_equal(e, g) else "values differ"
    if e.dtype.kind in "biu":
        if np.array_equal(e, g):
            return ""
        bad = int(np.sum(e != g))
        return f"{bad}/{e.size} elements differ"
    try:
        np.testing.assert_allclose(g, e, rtol=rtol, atol=atol, equal_nan=True)
    except AssertionError as err:
        lines = [ln for ln in str(err).splitlines() if "Mismatch" in ln or "Max" in ln]
        return "; ".join(ln.strip() for ln in lines) or "values differ"
    return ""


def run_case(case) -> CaseResult:
    from ..runtime.cpu import run_graph
    from .onnx import ImportError_, UnsupportedOpsError, import_onnx

    op = _op_type(case)
    try:
        g = import_onnx(case.model)
    except UnsupportedOpsError as e:
        reasons = sorted({f"{p[2]}: {p[4]}" for p in e.problems})
        return CaseResult(case.name, op, "unsupported", "; ".join(reasons))
    except ImportError_ as e:
        return CaseResult(case.name, op, "unsupported", str(e).splitlines()[0])
    except Exception as e:  # an importer bug: report it, keep going
        return CaseResult(case.name, op, "failed", f"import crashed: {type(e).__name__}: {e}")
    names = [vi.name for vi in case.model.graph.input]
    init = {t.name for t in case.model.graph.initializer}
    names = [n for n in names if n not in init]
    for inputs, outputs in case.data_sets:
        inputs, outputs = [_to_array(x) for x in inputs], [_to_array(x) for x in outputs]
        if any(not isinstance(x, np.ndarray) for x in list(inputs) + list(outputs)):
            return CaseResult(case.name, op, "unsupported", "sequence or optional inputs/outputs")
        feeds = dict(zip(names, inputs))
        try:
            with np.errstate(all="ignore"):
                got = run_graph(g, feeds)
        except Exception as e:
            return CaseResult(case.name, op, "failed", f"run: {type(e).__name__}: {str(e)[:300]}")
        for vi, exp in zip(case.model.graph.output, outputs):
            why = compare(exp, got[vi.name], case.rtol, case.atol)
            if why:
                return CaseResult(case.name, op, "failed", f"output {vi.name!r}: {why}")
    return CaseResult(case.name, op, "passed")


def run_all(cases: Iterable) -> list[CaseResult]:
    results = []
    for c in cases:
        results.append(run_case(c))
    base_ops = {r.name: r.op_type for r in results if not r.name.endswith("_expanded")}
    for r in results:
        if r.name.endswith("_expanded"):
            stem = r.name[: -len("_expanded")]
            r.op_type = base_ops.get(stem, base_ops.get(re.sub(r"_ver\d+$", "", stem), r.op_type))
            if r.op_type == r.name:
                r.op_type = stem.removeprefix("test_")
    return results


def summarize(results: list[CaseResult]) -> dict[str, int]:
    c = collections.Counter(r.status for r in results)
    return {"total": len(results), **{k: c.get(k, 0) for k in ("passed", "failed", "unsupported")}}


def write_report(results: list[CaseResult], path: Path) -> None:
    import onnx

    s = summarize(results)
    by_op: dict[str, list[CaseResult]] = collections.defaultdict(list)
    for r in results:
        by_op[r.op_type].append(r)
    lines = [
        "# ONNX node test coverage",
        "",
        f"The node test cases shipped in onnx {onnx.__version__} "
        "(`onnx.backend.test.case.node.collect_testcases`), imported by ingot's ONNX importer and run "
        "on the CPU backend, compared with onnx's tolerances.",
        "",
        "Regenerate: `python -m ingot.frontend.onnx_conformance --write docs/ONNX_COVERAGE.md`",
        "",
        f"**{s['passed']} of {s['total']} passed ({100 * s['passed'] / max(s['total'], 1):.1f}%)**, "
        f"{s['failed']} failed, {s['unsupported']} unsupported.",
        "",
        "| op | cases | passed | failed | unsupported |",
        "|---|---|---|---|---|",
    ]
    for op in sorted(by_op):
        rs = by_op[op]
        c = collections.Counter(r.status for r in rs)
        lines.append(f"| {op} | {len(rs)} | {c['passed']} | {c['failed']} | {c['unsupported']} |")
    lines += ["", "## Unsupported and failed cases, with the reason", ""]
    lines += ["| case | op | status | reason |", "|---|---|---|---|"]
    for r in sorted(results, key=lambda r: (r.op_type, r.name)):
        if r.status != "passed":
            reason = r.reason.replace("|", "\\|").replace("\n", " ")[:200]
            lines.append(f"| {r.name} | {r.op_type} | {r.status} | {reason} |")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-k", "--filter", help="regular expression on case names")
    ap.add_argument("--write", type=Path, help="write the Markdown report here")
    ap.add_argument("-v", "--verbose", action="store_true", help="print every non-passing case")
    args = ap.parse_args(argv)
    results = run_all(load_cases(args.filter))
    if args.verbose:
        for r in results:
            if r.status != "passed":
                print(f"{r.status:12s} {r.name}: {r.reason}")
    s = summarize(results)
    print(f"{s['passed']}/{s['total']} passed, {s['failed']} failed, {s['unsupported']} unsupported")
    if args.write:
        write_report(results, args.write)
        print(f"wrote {args.write}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
