"""Kernels lowered for sm_90a without a GPU, for the tests that hold a kernel's lowered shape (what the pipeliner
made of its loops, the buffers it keeps in flight): Triton compiles for any target it knows, but not the
interpreter's kernels, so the lowering runs in a child process without TRITON_INTERPRET."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

LOWER = textwrap.dedent("""
    import json, sys
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    def lower(kernel, types, constexprs, **options):
        '''The TTGIR of `kernel` for sm_90a, every pointer and integer 16-divisible as the launcher specialises
        the book's aligned tensors and shapes.'''
        while not isinstance(kernel, triton.runtime.jit.JITFunction):
            kernel = kernel.fn
        names = kernel.arg_names
        sig = {n: "constexpr" if n in constexprs else types.get(n, "*bf16" if n.endswith("ptr") else "i32")
               for n in names}
        aligned = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names) if sig[n][0] == "*" or sig[n] == "i32"}
        src = ASTSource(kernel, sig, {(names.index(k),): v for k, v in constexprs.items()}, aligned)
        return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options).asm["ttgir"]
""")


def lowered(snippet: str) -> str:
    """What `snippet` prints, run after `LOWER` (its `lower` at hand) in a process without TRITON_INTERPRET."""
    try:
        from triton.backends.nvidia import compiler  # noqa: F401
    except ImportError:
        pytest.skip("this Triton has no NVIDIA backend")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "-c", LOWER + textwrap.dedent(snippet)], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout
