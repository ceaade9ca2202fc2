"""Shared fixtures: a scratch book with copies of the real softmax case, and the CLI run in-process."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SOFTMAX = REPO / "cases" / "softmax_fusion.yaml"


@pytest.fixture
def softmax_text() -> str:
    """The real softmax case, as text, without its transfers' links to the book's other cases (a scratch
    book holds only its own copies, where those links could not resolve)."""
    return re.sub(r"^    case: [a-z0-9_]+\n", "", SOFTMAX.read_text(), flags=re.MULTILINE)


@pytest.fixture
def make_case(tmp_path: Path, softmax_text: str):
    """Write `<tmp>/cases/<name>.yaml`: the softmax case with its id set to `name` and each `edits` pair applied once."""

    def make(edits: dict[str, str] | None = None, name: str = "softmax_fusion", text: str | None = None) -> Path:
        if text is None:
            text = softmax_text.replace("\nid: softmax_fusion\n", f"\nid: {name}\n")
            for old, new in (edits or {}).items():
                assert text.count(old) == 1, f"edit target not unique: {old!r}"
                text = text.replace(old, new)
        path = tmp_path / "cases" / f"{name}.yaml"
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
        return path

    return make


@pytest.fixture
def cli():
    """Run `casebook ARGS...` in-process; the output never holds a traceback."""
    from typer.testing import CliRunner

    from casebook.cli import app

    def run(*args: str):
        result = CliRunner().invoke(app, [str(a) for a in args])
        assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
        assert "Traceback" not in result.output
        return result

    return run


@pytest.fixture
def line_of():
    """`line_of(path, snippet, nth=1)`: the 1-based line of the nth line of a file containing `snippet`."""

    def find(path: Path, snippet: str, nth: int = 1) -> int:
        rows = Path(path).read_bytes().decode("utf-8", "replace").splitlines()
        return [i for i, row in enumerate(rows, 1) if snippet in row][nth - 1]

    return find
