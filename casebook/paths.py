"""Where casebook reads and writes: the files a book may read (its own, never through a symbolic link nor
outside its folder), and casebook's own cache outside the book (`CACHE_DIR`).

A case file, a kernel module or a stored result that is a symlink (or sits under one, or resolves outside
the book) could publish another file's text in the site and its search index, or echo it into a log:
`validate`, `check` and `build` refuse it with this one reason.
"""

from __future__ import annotations

import os
from pathlib import Path

CACHE_DIR = Path(os.environ.get("CASEBOOK_CACHE", Path.home() / ".cache" / "casebook"))
"""casebook's own files outside the book (`$CASEBOOK_CACHE`, default ~/.cache/casebook): measured ceilings, every
run (`results.runs_dir`), Inductor's kernels."""


def refusal(path: Path, root: Path) -> str | None:
    """Why `path` may not be read as part of the book at `root` (None: it may)."""
    path, root = Path(path), Path(root)
    if path.is_symlink():
        return "is a symbolic link; a book's case files, kernel modules and results are plain files in it"
    try:
        path.resolve().relative_to(root.resolve())
    except ValueError:
        return f"resolves outside the book ({root}); a book's files are plain files in it"
    return None
