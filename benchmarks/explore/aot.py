"""Does a kernel lower for a GPU this machine lacks, and with what registers and spills?

Triton lowers a kernel ahead of time for any target it knows, a Gluon kernel or a `@triton.jit` one; the
cubin's resource usage then gives registers and the stack that spills land in. This checks that an
exploration lowers (layouts, shared memory, warp specialisation) before it costs device time. It does not
check that it runs or what it computes.
"""
import re
import subprocess
import tempfile
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.experimental.gluon._runtime import GluonASTSource


def compile_report(kernel, signature: dict[str, str], constexprs: dict[str, object], arch: int = 90,
                   **options) -> str:
    """Lower `kernel` for sm_`arch`(a) with these argument types ('*bf16', 'i32', 'tensordesc<...>',
    'constexpr') and constexpr values; a line with its shared memory, registers and spill stores."""
    names = list(signature)
    src = GluonASTSource(kernel, signature, {(names.index(k), ): v for k, v in constexprs.items()})
    return report(triton.compile(src, target=GPUTarget("cuda", arch, 32), options=options), arch)


def lower(kernel, types: dict[str, str], constexprs: dict[str, object], arch: int = 90, unaligned=(), **options):
    """A `@triton.jit` kernel (or an autotuned or heuristics wrapper of one) compiled for sm_`arch`(a) as its
    launcher would: arguments named in `types` take that type, other `*_ptr`s bf16, the rest i32; every pointer
    and integer 16-divisible, as the launcher specialises the book's aligned tensors and shapes (sizes that are
    multiples of 16), except those named in `unaligned`. The divisibility decides whether loads vectorise and
    whether the pipeliner may copy them asynchronously: without it a loop comes out unpipelined. The compiled
    kernel: its `asm` holds the TTGIR, PTX and cubin."""
    while not isinstance(kernel, triton.runtime.jit.JITFunction):
        kernel = kernel.fn
    names = kernel.arg_names
    signature = {n: "constexpr" if n in constexprs else types.get(n, "*bf16" if n.lower().endswith("ptr") else "i32")
                 for n in names}
    aligned = {(i, ): [["tt.divisibility", 16]] for i, n in enumerate(names)
               if (signature[n].startswith("*") or signature[n] in ("i32", "i64")) and n not in unaligned}
    src = ASTSource(kernel, signature, {(names.index(k), ): v for k, v in constexprs.items() if k in names}, aligned)
    return triton.compile(src, target=GPUTarget("cuda", arch, 32), options=options)


def jit_report(kernel, types: dict[str, str], constexprs: dict[str, object], arch: int = 90, unaligned=(),
               **options) -> str:
    """`report` of the kernel as `lower` compiles it."""
    return report(lower(kernel, types, constexprs, arch, unaligned, **options), arch)


def report(compiled, arch: int = 90) -> str:
    """What the compiled cubin for sm_`arch`(a) uses: shared memory, registers, the stack (spilled registers
    live there) and the SASS's local-memory loads and stores. Read from the cubin with the bundled
    cuobjdump, so it holds whichever ptxas Triton used (the bundled ptxas can be older than the PTX that a
    newer Triton writes)."""
    tools = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    with tempfile.NamedTemporaryFile("wb", suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        usage = subprocess.run([str(tools / "cuobjdump"), "-res-usage", f.name], capture_output=True, text=True).stdout
        sass = subprocess.run([str(tools / "cuobjdump"), "-sass", f.name], capture_output=True, text=True).stdout
    regs, stack = re.findall(r"REG:(\d+)", usage), re.findall(r"STACK:(\d+)", usage)
    spill = len(re.findall(r"\bSTL\b", sass)), len(re.findall(r"\bLDL\b", sass))
    return (f"compiled for sm_{arch}a with Triton {triton.__version__}: shared {compiled.metadata.shared} B, "
            f"registers {'/'.join(regs)}, stack {'/'.join(stack)} B, local stores/loads {spill[0]}/{spill[1]}")
