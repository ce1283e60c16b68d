"""The Python examples of the README and of the reference pages run as written (in order, one namespace
per page)."""

import re
from pathlib import Path

import pytest
from fmnist import needs_fmnist

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"

# page -> the least number of ```python blocks it must hold (guards against a fence typo hiding them)
PAGES = {
    README: 4,
    DOCS / "functional.md": 10,
    DOCS / "linen.md": 3,
    DOCS / "nnx.md": 1,
    DOCS / "models.md": 1,
    DOCS / "enorm.md": 1,
    DOCS / "optim.md": 5,
    DOCS / "diagnostics.md": 2,
    DOCS / "data.md": 1,
    DOCS / "training.md": 1,
    DOCS / "scale_invariance.md": 5,
}
# pages whose examples read the offline Fashion-MNIST (Debian package dataset-fashion-mnist)
NEEDS_FMNIST = {DOCS / "data.md"}

_BLOCK = re.compile(r"```python\n(.*?)```", flags=re.DOTALL)


def python_blocks(page: Path) -> list[tuple[int, str]]:
    """``(line, code)`` of each ```python block of ``page``; ``line``: 0-based, of its first code line."""
    text = page.read_text()
    return [(text.count("\n", 0, match.start(1)), match.group(1)) for match in _BLOCK.finditer(text)]


@pytest.mark.parametrize(
    "page",
    [pytest.param(page, marks=[needs_fmnist] if page in NEEDS_FMNIST else []) for page in PAGES],
    ids=lambda page: str(page.relative_to(ROOT)),
)
def test_readme_python_blocks_run(page, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # what the examples write (a run's workdir) lands outside the repo
    blocks = python_blocks(page)
    assert len(blocks) >= PAGES[page]
    namespace: dict = {}
    for line, block in blocks:
        # leading newlines keep the page's line numbers in tracebacks
        exec(compile("\n" * line + block, str(page), "exec"), namespace)


def test_enorm_mlp_example_runs(tmp_path):
    """``examples/enorm_mlp.py`` (README, docs/enorm.md) runs, keeps the function (its own assertion) and
    writes its figure."""
    import subprocess
    import sys

    out = tmp_path / "enorm_mlp.png"
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "enorm_mlp.py"), "--out", str(out), "--cycles", "5"],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "max |f_balanced - f|" in result.stdout and out.stat().st_size > 0
