"""The ONNX node test cases shipped in the onnx package, through ingot's importer and CPU backend.

Tolerances are those of onnx's own backend test runner (each case's rtol/atol). The report with
every case's status and reason is written by
``python -m ingot.frontend.onnx_conformance --write docs/ONNX_COVERAGE.md``.
"""

import collections

import pytest

from ingot.frontend.onnx_conformance import load_cases, run_all, summarize

MIN_PASS_RATE = 0.80


@pytest.fixture(scope="module")
def results():
    return run_all(load_cases())


def test_at_least_80_percent_of_node_tests_pass(results):
    s = summarize(results)
    assert s["total"] >= 1800, f"expected onnx's ~1884 node cases, collected {s['total']}"
    rate = s["passed"] / s["total"]
    failing = collections.Counter(r.op_type for r in results if r.status != "passed")
    assert rate >= MIN_PASS_RATE, (
        f"{s['passed']}/{s['total']} = {rate:.1%} passed (need {MIN_PASS_RATE:.0%}); "
        f"most failing ops: {failing.most_common(15)}"
    )


def test_no_importer_crashes(results):
    """Unsupported inputs must be reported as such, never as an exception inside the importer."""
    crashed = [f"{r.name}: {r.reason}" for r in results if r.reason.startswith("import crashed")]
    assert not crashed, "\n".join(crashed[:20])
