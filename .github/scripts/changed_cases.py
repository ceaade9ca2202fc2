"""The case ids a pull request touches, one per line: what CI re-checks and the GPU job re-measures.

    python .github/scripts/changed_cases.py BASE_SHA [--root .]

A case is touched when its case file, its kernel module or one of its stored results changed, or when
a kernel module it imports from `casebook.kernels` changed (a shared helper such as gemm_common). A change to the
measurement harness (timing, checking, the roofline, claims, the hardware registry) touches every case. Deleted files touch nothing. File names come from the pull request: they are matched against
patterns and never passed to a shell.
"""

from __future__ import annotations

import argparse
import ast
import re
import subprocess
import sys
from pathlib import Path

IDENT = re.compile(r"^[a-z][a-z0-9_]*$")
CASE_FILE = re.compile(r"^cases/([a-z][a-z0-9_]*)\.yaml$")
KERNEL_FILE = re.compile(r"^casebook/kernels/([a-z][a-z0-9_]*)\.py$")
RESULT_FILE = re.compile(r"^results/[a-z0-9][a-z0-9-]*/([a-z][a-z0-9_]*)\.json$")
HARNESS = re.compile(r"^casebook/(bench|check|claims|counters|hardware|isolate|measure|roofline|run|stats|traffic)\.py$"
                     r"|^casebook/data/")
"""What every measurement goes through: a change here can change any case's numbers."""


def changed_files(base: str, root: Path) -> list[str]:
    """Added, copied, modified or renamed paths between the merge base of `base` and HEAD."""
    out = subprocess.run(["git", "diff", "--name-only", "--no-renames", "--diff-filter=ACMR", "-z", f"{base}...HEAD"],
                         cwd=root, capture_output=True, check=True).stdout
    return [p for p in out.decode("utf-8", "replace").split("\0") if p]


def kernel_imports(source: Path) -> set[str]:
    """Modules of `casebook.kernels` that a kernel module imports (read with ast, never run)."""
    try:
        tree = ast.parse(source.read_bytes())
    except (SyntaxError, ValueError, OSError):
        return set()
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "casebook.kernels":
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("casebook.kernels."):
            found.add(node.module.split(".")[2])
        elif isinstance(node, ast.ImportFrom) and node.level == 1:  # from . import x / from .x import y
            found |= {node.module.split(".")[0]} if node.module else {a.name for a in node.names}
        elif isinstance(node, ast.Import):
            found |= {a.name.split(".")[2] for a in node.names if a.name.startswith("casebook.kernels.")}
    return found


def case_modules(root: Path) -> dict[str, str]:
    """Each case id in the book and its kernel module (cases that do not load are left to validate)."""
    sys.path.insert(0, str(root))
    from casebook.load import CaseError, load_case

    modules = {}
    for path in sorted((root / "cases").glob("*.yaml")):
        try:
            modules[path.stem] = load_case(path).kernel.module
        except CaseError:
            continue
    return modules


def touched(files: list[str], root: Path) -> list[str]:
    modules = case_modules(root)
    if any(HARNESS.match(f) for f in files):
        return sorted(modules)
    ids = {m.group(1) for f in files if (m := CASE_FILE.match(f) or RESULT_FILE.match(f))}
    changed_modules = {m.group(1) for f in files if (m := KERNEL_FILE.match(f))}
    kernels = root / "casebook" / "kernels"
    for case_id, module in modules.items():
        uses = {module} | kernel_imports(kernels / f"{module}.py")
        if uses & changed_modules:
            ids.add(case_id)
    return sorted(i for i in ids if IDENT.match(i) and (root / "cases" / f"{i}.yaml").is_file())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("base", help="the base commit (github.event.pull_request.base.sha)")
    parser.add_argument("--root", type=Path, default=Path("."), help="the repository root")
    args = parser.parse_args()
    root = args.root.resolve()
    for case_id in touched(changed_files(args.base, root), root):
        print(case_id)
    return 0


if __name__ == "__main__":
    sys.exit(main())
