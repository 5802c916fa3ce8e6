"""docs/ENVIRONMENT.md stays complete: every ``INGOT_*`` name in the package's code is documented there, and every
name its tables list is still read somewhere (the package, the tests or the benchmarks). No compiles: text only."""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "ENVIRONMENT.md"
#: the folders of the ``ingot`` package (pyproject.toml's package-dir)
PACKAGE_DIRS = ("codegen", "runtime", "frontend", "passes", "quant", "ingot", "ir")
#: where a documented name may also be read: the test suite and the benchmark scripts
OTHER_DIRS = ("tests", "bench")
NAME = re.compile(r"INGOT_[A-Z0-9_]+")


def names_in_code(root: Path, dirs: Iterable[str], exclude: Iterable[Path] = ()) -> dict[str, list[str]]:
    """Every ``INGOT_*`` name in the ``.py`` files under ``root/<dir>``, with the files (relative) it occurs in."""
    skip = {p.resolve() for p in exclude}
    found: dict[str, list[str]] = {}
    for d in dirs:
        for path in sorted((root / d).rglob("*.py")):
            if path.resolve() in skip:
                continue
            for name in sorted(set(NAME.findall(path.read_text(encoding="utf-8", errors="replace")))):
                found.setdefault(name, []).append(str(path.relative_to(root)))
    return found


def undocumented(code: dict[str, list[str]], doc: str) -> dict[str, list[str]]:
    """The names of ``code`` that ``doc`` does not mention backquoted (`` `INGOT_X` ``)."""
    return {name: files for name, files in sorted(code.items()) if f"`{name}`" not in doc}


def table_names(doc: str) -> set[str]:
    """The ``INGOT_*`` names in the first column of the doc's tables."""
    names = set()
    for line in doc.splitlines():
        cells = line.split("|")
        if line.startswith("|") and len(cells) > 2:
            names.update(NAME.findall(cells[1]))
    return names


def _doc() -> str:
    return DOC.read_text(encoding="utf-8")


def test_every_variable_the_package_reads_is_documented() -> None:
    code = names_in_code(ROOT, PACKAGE_DIRS)
    assert code, f"no INGOT_* names found under {ROOT} ({', '.join(PACKAGE_DIRS)}): the scan is broken"
    missing = undocumented(code, _doc())
    assert not missing, (
        "INGOT_* names in the package's code but not in docs/ENVIRONMENT.md (add a row: default, values, what it "
        "does, the module that reads it):\n"
        + "\n".join(f"  {name}: {', '.join(files)}" for name, files in missing.items()))


def test_no_stale_entries() -> None:
    listed = table_names(_doc())
    assert listed, "docs/ENVIRONMENT.md has no table rows naming INGOT_* variables"
    read = names_in_code(ROOT, PACKAGE_DIRS + OTHER_DIRS, exclude=[Path(__file__)])
    stale = sorted(listed - set(read))
    assert not stale, (f"docs/ENVIRONMENT.md lists variables nothing under {', '.join(PACKAGE_DIRS + OTHER_DIRS)} "
                       f"reads any more (remove or rename their rows): {', '.join(stale)}")


def test_the_check_sees_a_new_variable(tmp_path: Path) -> None:
    """The scan is not vacuous: a name added to a package file without a doc row is reported, with its file."""
    (tmp_path / "runtime").mkdir()
    (tmp_path / "runtime" / "new.py").write_text('import os\nX = os.environ.get("INGOT_BRAND_NEW", "")\n')
    code = names_in_code(tmp_path, PACKAGE_DIRS)
    assert undocumented(code, _doc()) == {"INGOT_BRAND_NEW": ["runtime/new.py"]}
    assert undocumented(code, "| `INGOT_BRAND_NEW` | off |") == {}
    assert table_names("| `INGOT_A` | on | `0` | `INGOT_B=1` |\n`INGOT_C` in prose") == {"INGOT_A"}
