"""Docstrings give formulas and references, not benchmark diaries or paths outside the repository
(performance numbers live in docs/benchmarks.md; issue 14)."""

import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "jaxnorm"
DIARY = re.compile(
    r"\d+(\.\d+)?\s*(-\s*\d+(\.\d+)?\s*)?%\s+(faster|slower)"  # "12-20 % faster"
    r"|\d+(\.\d+)?\s*(-\s*\d+(\.\d+)?)?x\s+(flax|faster|slower)"  # "0.8-0.9x flax", "3x faster"
    r"|\.\./shared|/work/"
)


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_benchmark_diary_or_outside_path(path):
    hits = [
        f"{path.name}:{n}: {line.strip()}"
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if DIARY.search(line)
    ]
    assert not hits, "\n".join(hits)


def test_the_pattern_catches_a_diary():
    assert DIARY.search("runs 5-10 % slower") and DIARY.search("(0.8-0.9x flax's forward)")
    assert DIARY.search("see ../shared/papers/001") and not DIARY.search("sqrt(2 / pi) = 0.798")
