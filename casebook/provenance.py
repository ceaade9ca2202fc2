"""What a result was measured from: the meaning of the case's measured part, and the kernel module's bytes.

A kernel module that imports another kernel module (a shared GEMM core, say) is hashed together with
it, so a change to the shared code marks every result that ran it as stale.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

if TYPE_CHECKING:
    from casebook.result import Result

KERNELS_DIR = Path(__file__).parent / "kernels"
"""The installed kernel modules (`casebook/kernels/<module>.py`)."""


def kernel_path(module: str, kernels_dir: Path | None = None) -> Path:
    """The source file of kernel module `module` (a name, never a path)."""
    if not re.fullmatch(r"[a-z][a-z0-9_]*", module):
        raise ValueError(f"kernel module {module!r} is not a lower_snake_case name")
    return Path(kernels_dir or KERNELS_DIR) / f"{module}.py"


def kernel_source(module: str) -> Path | None:
    """The file the children import as `casebook.kernels.<module>`, found as the package finds it (its own folder,
    then each folder of CASEBOOK_KERNELS_PATH, read afresh) without importing the package: the parent of a run
    runs no code of the kernels' folder. None where there is none (or `module` is not a module's name)."""
    if not re.fullmatch(r"[a-z][a-z0-9_]*", module):
        return None
    for folder in [KERNELS_DIR, *filter(None, os.environ.get("CASEBOOK_KERNELS_PATH", "").split(os.pathsep))]:
        if (Path(folder) / f"{module}.py").is_file():
            return Path(folder) / f"{module}.py"
    return None


def kernel_file(module: str, case_path: str | Path | None = None) -> Path:
    """The kernel module a case names: the case's own book's (`casebook/kernels/` beside its `cases/` folder, which
    is the package's where the book is installed), else where a run's children import it from, the package's
    folder and CASEBOOK_KERNELS_PATH's (`kernel_source`; all a run itself asks, with no `case_path`). Where none
    has it, the file it is missing as (in the book's folder where the book has one). Every check that reads a
    case's kernel (`validate`, `check`, `record`, `run --all --resume`, the site) reads this one."""
    path = kernel_path(module)  # a name, never a path
    if case_path is not None:
        own = Path(case_path).resolve().parent.parent / "casebook" / "kernels"
        if (own / path.name).is_file():
            return own / path.name
    found = kernel_source(module)
    if found is not None:
        return found
    return own / path.name if case_path is not None and own.is_dir() else path


def case_sha256(path: str | Path) -> str:
    """sha256 hex of the case file's bytes."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def kernel_sha256(module: str, kernels_dir: Path | None = None, extra: list[str] | tuple = ()) -> str:
    """sha256 hex of the kernel module file's bytes, then those of every kernel module it imports,
    directly or through another, and of the `extra` ones (those a run saw its child import at run
    time, `kernel_modules` in a result), in name order. A module named but absent counts as its name."""
    path = kernel_path(module, kernels_dir)
    digest = hashlib.sha256(path.read_bytes())
    deps = imported_closure(module, path.parent)
    for name in extra:
        if isinstance(name, str) and re.fullmatch(r"[a-z][a-z0-9_]*", name):
            deps |= imported_closure(name, path.parent) | {name}
    for dep in sorted(deps - {module}):
        dep_path = path.parent / f"{dep}.py"
        digest.update(b"\0" + dep.encode() + b"\0" + (dep_path.read_bytes() if dep_path.is_file() else b"<absent>"))
    return digest.hexdigest()


def imported_closure(module: str, folder: Path) -> set[str]:
    """`module` and the kernel modules in `folder` it reaches through imports."""
    seen, todo = set(), [module]
    while todo:
        name = todo.pop()
        path = folder / f"{name}.py"
        if name in seen or not path.exists():
            continue
        seen.add(name)
        todo += kernel_imports(path.read_bytes())
    return seen


def kernel_imports(source: bytes) -> set[str]:
    """Names of the `casebook.kernels` modules a module imports (read from its source, never run)."""
    found: set[str] = set()
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return found
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == "casebook.kernels":
                found |= {a.name for a in node.names}
            elif node.module.startswith("casebook.kernels."):
                found.add(node.module.split(".")[2])
            elif node.level == 1 and node.module:  # from .gemm_common import ...
                found.add(node.module.split(".")[0])
        elif isinstance(node, ast.Import):
            found |= {a.name.split(".")[2] for a in node.names if a.name.startswith("casebook.kernels.")}
    return found


def measurement_sha256(case: Any) -> str:
    """sha256 of what a run measures and judges, by meaning: the validated case's kernel, levels and
    claims (not its prose), keys sorted, every field left at its default omitted.

    So a result stays current through reformatting, comments, reordered keys, a default spelled out
    (`fn` equal to the variant's name) and a new optional field in the schema; any change of value stales it.
    """
    spec = {"kernel": meaning(case.kernel), "levels": meaning(case.levels),
            "claims": [meaning(c) for c in case.claims]}
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()


def meaning(value: Any) -> Any:
    """A validated model as plain JSON data without the fields that hold their default."""
    if isinstance(value, BaseModel):
        data = {}
        for name, field in type(value).model_fields.items():
            v = getattr(value, name)
            if not field.is_required() and v == field.get_default(call_default_factory=True,
                                                                  validated_data=dict(value)):
                continue
            data[name] = meaning(v)
        return data
    if isinstance(value, dict):
        return {k: meaning(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [meaning(v) for v in value]
    return value


def stale_reasons(result: Result, case_path: str | Path, case: Any) -> list[str]:
    """Why a stored result no longer describes the current case and kernel (empty: it does). The kernel module is
    the one a run of the case would find (`kernel_file`)."""
    reasons = []
    if result.measurement_sha256 is not None:
        if result.measurement_sha256 != measurement_sha256(case):
            reasons.append(f"the kernel, levels or claims of {Path(case_path).name} changed since the run")
    elif result.case_sha256 != case_sha256(case_path):
        reasons.append(f"the case file {Path(case_path).name} changed since the run")
    module = case.kernel.module
    try:
        source = kernel_file(module, case_path)
    except ValueError:
        source = None
    if source is None or not source.is_file():
        reasons.append(f"the kernel module {module}.py is missing")
    elif result.kernel_sha256 != kernel_sha256(module, source.parent, result.kernel_modules or ()):
        reasons.append(f"the kernel module {module}.py changed since the run")
    return reasons
