"""`casebook new NAME`: scaffold cases/NAME.yaml, casebook/kernels/NAME.py and the case's notebook notes/NAME.md from
the package templates."""

from __future__ import annotations

import keyword
import re
from importlib import resources
from pathlib import Path

from rich.console import Console
from rich.text import Text

NAME = re.compile(r"^[a-z][a-z0-9_]{0,63}$")


def main(name: str, root: Path = Path(".")) -> int:
    """Write the three files under the book at `root`, refusing to overwrite; 0 when the case validates."""
    from casebook.commands.validate import print_problems
    from casebook.validate import validate

    out = Console(highlight=False, soft_wrap=True)
    if not NAME.match(name) or keyword.iskeyword(name):
        out.print(Text(f"{name!r} is not a case id: use lower_snake_case (a-z, 0-9 and _, starting with a letter, "
                       "at most 64 characters, not a Python keyword)", style="red"))
        return 2
    kernels = root / "casebook" / "kernels"
    if not kernels.is_dir():
        out.print(Text(f"no casebook/kernels/ under {root.resolve()}: run `casebook new` from the book's root",
                       style="red"))
        return 2
    case_path, kernel_path = root / "cases" / f"{name}.yaml", kernels / f"{name}.py"
    notebook_path = root / "notes" / f"{name}.md"
    taken = [p for p in (case_path, kernel_path, notebook_path) if p.exists()]
    if taken:
        out.print(Text(f"{', '.join(map(str, taken))} already exist{'s' * (len(taken) == 1)}; nothing written",
                       style="red"))
        return 2
    case_path.parent.mkdir(exist_ok=True)
    notebook_path.parent.mkdir(exist_ok=True)
    for path, template in ((kernel_path, "kernel.py.tmpl"), (case_path, "case.yaml.tmpl"),
                           (notebook_path, "notebook.md.tmpl")):
        path.write_text(render(template, name), encoding="utf-8")
        out.print(Text(f"wrote {path}"))
    report = validate([case_path])
    print_problems(report.problems, out)
    if report.errors:
        return 2
    out.print(Text(f"{case_path} validates. Next: edit the case and its kernel, write the floors and your "
                   f"predictions in {notebook_path}, `casebook validate {case_path}`, then `casebook run {case_path}`.",
                   style="green"))
    return 0


def render(template: str, name: str) -> str:
    """A template from casebook/templates with `{{name}}` and `{{title}}` filled in."""
    text = resources.files("casebook").joinpath("templates", template).read_text(encoding="utf-8")
    title = name.replace("_", " ").capitalize()
    return text.replace("{{name}}", name).replace("{{title}}", title)
