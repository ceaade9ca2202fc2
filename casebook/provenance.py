"""What a result was measured from: sha256 of the case file and of the kernel module, byte for byte."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

KERNELS_DIR = Path(__file__).parent / "kernels"
"""The installed kernel modules (`casebook/kernels/<module>.py`)."""


def kernel_path(module: str, kernels_dir: Path | None = None) -> Path:
    """The source file of kernel module `module` (a name, never a path)."""
    if not re.fullmatch(r"[a-z][a-z0-9_]*", module):
        raise ValueError(f"kernel module {module!r} is not a lower_snake_case name")
    return Path(kernels_dir or KERNELS_DIR) / f"{module}.py"


def case_sha256(path: str | Path) -> str:
    """sha256 hex of the case file's bytes."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def kernel_sha256(module: str, kernels_dir: Path | None = None) -> str:
    """sha256 hex of the kernel module file's bytes."""
    return hashlib.sha256(kernel_path(module, kernels_dir).read_bytes()).hexdigest()
