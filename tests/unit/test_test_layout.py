"""tests/unit and tests/gpu are not packages, so pytest imports their test files by basename: two
files of one name there fail the whole run's collection ("import file mismatch"), as a clean
CI run of cca1652 did. tests/distributed is a package; its names may repeat the others'."""

from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_test_files_outside_packages_have_unique_names():
    loose = [p for p in TESTS.rglob("test_*.py") if not (p.parent / "__init__.py").exists()]
    assert loose, "found no test files outside packages"
    names = Counter(p.name for p in loose)
    assert [name for name, n in names.items() if n > 1] == []
