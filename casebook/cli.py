"""The command line, in workflow order. Each command is a few lines that call the library.

Nothing heavy is imported at module level: `casebook --help` must not import torch or triton, and each
command imports what it needs only when it runs. Help is click's plain formatting
(`rich_markup_mode=None`): typer's rich help imports rich's console, markdown and traceback modules
(about 0.1-0.2 s, half of a `--help` on a small machine with typer 0.29 and rich 15); tables and
progress still come from rich, inside the commands that print them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from typer.core import TyperGroup


class Commands(TyperGroup):
    """The command group, less one cost of typer 0.29: it converts the group's own `--help`, absent (None)
    when a command is named, through a pydantic adapter, importing pydantic (0.1-0.3 s, two thirds of a
    `casebook run --help`) before the command even parses. An absent flag is False, and needs no converting."""

    def get_help_option(self, ctx):
        option = super().get_help_option(ctx)
        if option is not None and not getattr(option, "_absent_is_false", False):
            convert = option.process_value
            option.process_value = lambda ctx, value: convert(ctx, False if value is None else value)
            option._absent_is_false = True
        return option


app = typer.Typer(
    cls=Commands,
    help="casebook: GPU operator-optimisation case studies whose entries run.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # plain help: rich's is the slowest part of `--help` (module docstring)
)

CASES_DIR = Path("cases")


def _version(value: bool) -> None:
    if value:
        from casebook import __version__

        typer.echo(f"casebook {__version__}")
        raise typer.Exit()


@app.callback()
def main(
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                          help="Print casebook's version and exit.")] = False,
) -> None:
    """casebook: GPU operator-optimisation case studies whose entries run."""


@app.command()
def new(name: Annotated[str, typer.Argument(metavar="NAME", help="Case id: lower_snake_case.")]) -> None:
    """Scaffold a case YAML and a kernel module that validate and run on CPU out of the box."""
    from casebook.commands import new as impl

    raise typer.Exit(impl.main(name))


@app.command()
def validate(
    paths: Annotated[Optional[list[Path]], typer.Argument(
        metavar="PATHS", help="Case files or folders (default: cases/).")] = None,
    strict: Annotated[bool, typer.Option(help="Also what a reviewer would reject: stale or missing results, CPU check "
                                              "path.")] = False,
) -> None:
    """Validate cases: schema, file:line errors, cross-case links, kernel names (never executed)."""
    from casebook.commands import validate as impl

    raise typer.Exit(impl.main(paths or [CASES_DIR], strict=strict))


@app.command("check")
def check(
    paths: Annotated[Optional[list[Path]], typer.Argument(
        metavar="PATHS", help="Case files or folders (default: cases/).")] = None,
) -> None:
    """Everything a reviewer would reject, before you push (validate --strict)."""
    from casebook.commands import validate as impl

    raise typer.Exit(impl.main(paths or [CASES_DIR], strict=True))


@app.command("list")
def list_cases(
    pattern: Annotated[Optional[str], typer.Option(help="Only cases that apply this pattern.")] = None,
    bottleneck: Annotated[Optional[str], typer.Option(help="Only cases with this bottleneck.")] = None,
    operator: Annotated[Optional[str], typer.Option(help="Only cases of this operator.")] = None,
) -> None:
    """A table of the cases: operator, bottleneck, patterns."""
    from casebook.commands import list as impl

    raise typer.Exit(impl.main(CASES_DIR, pattern=pattern, bottleneck=bottleneck, operator=operator))


@app.command()
def schema(
    out: Annotated[Optional[Path], typer.Option(help="Write here instead of standard output.")] = None,
    result: Annotated[bool, typer.Option("--result", help="The result format's instead of the case format's.")] = False,
) -> None:
    """Write the JSON Schema of the case format (for editors' yaml-language-server), or of the result format."""
    from casebook.commands import schema as impl

    raise typer.Exit(impl.main(out, result))


@app.command()
def hardware(
    remeasure: Annotated[bool, typer.Option(help="Measure the ceilings again instead of using the cache.")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="Print the machine and its ceilings as JSON.")] = False,
) -> None:
    """Measured ceilings of this machine beside its datasheet peaks."""
    from casebook.commands import hardware as impl

    raise typer.Exit(impl.main(remeasure=remeasure, json_out=json_out))


def argv_of(ctx: typer.Context) -> list[str]:
    """The command line a parsed command stands for, every option that differs from its default kept:
    what a result stores, so that its Reproduce command is the one that made it."""
    out = ["casebook", ctx.info_name or ""]
    for param in ctx.command.params:
        value = ctx.params.get(param.name)
        if param.param_type_name == "argument":
            out += [str(v) for v in (value if isinstance(value, (list, tuple)) else [value]) if v is not None]
        elif param.param_type_name == "option" and value != param.default and value not in (None, (), []):
            on = next((o for o in param.opts if o.startswith("--")), param.opts[0])
            if param.is_flag and param.secondary_opts:
                out.append(on if value else param.secondary_opts[0])
            elif param.is_flag:
                out.append(on)
            else:
                out += [x for v in (value if param.multiple else [value]) for x in (on, str(v))]
    return out


@app.command()
def run(
    ctx: typer.Context,
    case: Annotated[Path, typer.Argument(metavar="CASE", help="The case YAML.")],
    variant: Annotated[Optional[list[str]], typer.Option(help="Only these variants (repeatable).")] = None,
    quick: Annotated[bool, typer.Option(help="Fewer repetitions: a smoke run, not a result to publish.")] = False,
    counters: Annotated[bool, typer.Option(
        help="Also read DRAM byte counters with Nsight Compute, if present.")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="Print the result document.")] = False,
    results: Annotated[Path, typer.Option(
        help="The stored results: compared with, and written by --save.")] = Path("results"),
    timeout: Annotated[float, typer.Option(help="Seconds each variant's child process may run.")] = 600.0,
    save: Annotated[bool, typer.Option("--save", help="Also store the run in results/<hardware>/<case>.json.")] = False,
    force: Annotated[bool, typer.Option(
        "--force", help="With --save: replace a current stored result even with a slower or noisier run.")] = False,
) -> None:
    """Check, time, place on the roofline and compare one case, at the three levels; the run is kept under
    $CASEBOOK_CACHE/runs (results/ only with --save)."""
    from casebook.commands import run as impl

    raise typer.Exit(impl.main(case, variants=variant, quick=quick, counters=counters, json_out=json_out,
                               results_dir=results, timeout=timeout, save=save, force=force,
                               argv=argv_of(ctx)))


@app.command()
def record(
    run_file: Annotated[Path, typer.Argument(metavar="RUN.json", help="A run's result, as `casebook run` kept it.")],
    results: Annotated[Path, typer.Option(help="Where results are stored.")] = Path("results"),
    force: Annotated[bool, typer.Option(
        "--force", help="Replace a current stored result even with a slower or noisier run.")] = False,
) -> None:
    """Store a run as results/<hardware>/<case>.json: the explicit act that changes the book's results."""
    from casebook.commands import record as impl

    raise typer.Exit(impl.main(run_file, results, force))


@app.command()
def compare(
    a: Annotated[Path, typer.Argument(metavar="A.json", help="A result JSON.")],
    b: Annotated[Path, typer.Argument(metavar="B.json", help="Another result of the same case.")],
    min_us: Annotated[float, typer.Option(help="Ignore points faster than this, in microseconds.")] = 20.0,
    within: Annotated[float, typer.Option(help="Tolerated relative change of a median.")] = 0.02,
    across_machines: Annotated[bool, typer.Option(help="Compare results from two different machines.")] = False,
) -> None:
    """Run-to-run agreement: every point timed in both results, median against median."""
    from casebook.commands import compare as impl

    raise typer.Exit(impl.main(a, b, min_us=min_us, within=within, across_machines=across_machines))


@app.command()
def project(
    case: Annotated[str, typer.Argument(help="The case id (or its YAML).")],
    to: Annotated[str, typer.Option(help="Target machine: a hardware registry slug, e.g. nvidia-b200.")],
    source: Annotated[Optional[str], typer.Option(
        "--from", help="The stored result's machine (default: the first GPU).")] = None,
    results: Annotated[Path, typer.Option(help="Where results are stored.")] = Path("results"),
    json_out: Annotated[bool, typer.Option("--json", help="Print the projection as JSON.")] = False,
) -> None:
    """What a stored result would do on another GPU: a band per point, never a claim."""
    from casebook.commands import project as impl

    raise typer.Exit(impl.main(case, to, source, results, json_out=json_out))


@app.command()
def history(
    case: Annotated[str, typer.Argument(help="The case id (or its YAML).")],
    machine: Annotated[Optional[str], typer.Option(help="Only this machine's results (a hardware slug).")] = None,
    repo: Annotated[Path, typer.Option(help="The git checkout whose commits hold the results.")] = Path("."),
) -> None:
    """A case's results over the commits: headline per variant, a verdict for every change."""
    from casebook.commands import history as impl

    raise typer.Exit(impl.main(case, repo=repo, machine=machine))


@app.command()
def build(
    out: Annotated[Path, typer.Option(help="Where the site is written.")] = Path("site"),
    strict: Annotated[bool, typer.Option(help="mkdocs --strict: broken links fail the build.")] = True,
) -> None:
    """Render all cases and stored results into the mkdocs-material site."""
    from casebook.commands import build as impl

    raise typer.Exit(impl.main(out, strict=strict))


@app.command()
def serve(
    port: Annotated[int, typer.Option(help="Port on localhost.")] = 8000,
) -> None:
    """Build and preview the site on localhost."""
    from casebook.commands import build as impl

    raise typer.Exit(impl.serve(port))


if __name__ == "__main__":
    app()
