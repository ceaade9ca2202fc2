"""Kernels lowered for sm_90a without a GPU, for the tests that hold a kernel's lowered shape (what the pipeliner
made of its loops, the buffers it keeps in flight): Triton compiles for any target it knows, but not the
interpreter's kernels, so the lowering runs in a child process without TRITON_INTERPRET, with the explorations'
`lower` (benchmarks/explore/aot.py) at hand."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

LOWER = "import sys; sys.path.insert(0, 'benchmarks/explore'); from aot import lower\n"


def lowered(snippet: str) -> str:
    """What `snippet` prints, run with `lower` imported in a process without TRITON_INTERPRET (Triton's default
    FP fusion kept, as the launcher's)."""
    try:
        from triton.backends.nvidia import compiler  # noqa: F401
    except ImportError:
        pytest.skip("this Triton has no NVIDIA backend")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"
    r = subprocess.run([sys.executable, "-c", LOWER + textwrap.dedent(snippet)], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    return r.stdout
