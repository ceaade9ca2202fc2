"""Does a Gluon kernel lower for a GPU this machine lacks, and with what registers and spills (ptxas)?

Triton lowers a kernel ahead of time for any target it knows; its bundled ptxas then reports registers
and spills. This checks that an exploration lowers (layouts, shared memory, warp specialisation) before it
costs device time. It does not check that it runs or what it computes.
"""
import re
import subprocess
import tempfile
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource


def compile_report(kernel, signature: dict[str, str], constexprs: dict[str, object], arch: int = 90,
                   **options) -> str:
    """Lower `kernel` for sm_`arch`(a) with these argument types ('*bf16', 'i32', 'tensordesc<...>',
    'constexpr') and constexpr values; a line with its shared memory, registers and spill stores."""
    names = list(signature)
    src = GluonASTSource(kernel, signature, {(names.index(k), ): v for k, v in constexprs.items()})
    return report(triton.compile(src, target=GPUTarget("cuda", arch, 32), options=options), arch)


def report(compiled, arch: int = 90) -> str:
    """What ptxas says of a kernel compiled for sm_`arch`(a): shared memory, registers, spill stores."""
    ptxas = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
    with tempfile.NamedTemporaryFile("w", suffix=".ptx") as f:
        f.write(compiled.asm["ptx"])
        f.flush()
        info = subprocess.run([str(ptxas), "--gpu-name", f"sm_{arch}a", "-v", f.name, "-o", "/dev/null"],
                              capture_output=True, text=True).stderr
    regs, spills = re.findall(r"Used (\d+) registers", info), re.findall(r"(\d+) bytes spill stores", info)
    return (f"compiled for sm_{arch}a with Triton {triton.__version__}: shared {compiled.metadata.shared} B, "
            f"registers {'/'.join(regs)}, spill stores {'/'.join(spills)} B")
