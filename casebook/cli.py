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


@app.command(short_help='Scaffold a case and a kernel module that run on CPU.')
def new(name: Annotated[str, typer.Argument(metavar="NAME", help="Case id: lower_snake_case.")]) -> None:
    """Scaffold a case YAML and a kernel module that validate and run on CPU out of the box."""
    from casebook.commands import new as impl

    raise typer.Exit(impl.main(name))


@app.command(short_help='Schema, links and kernel names, with file:line.')
def validate(
    paths: Annotated[Optional[list[Path]], typer.Argument(
        metavar="PATHS", help="Case files or folders (default: cases/).")] = None,
    strict: Annotated[bool, typer.Option(help="Also what a reviewer would reject: stale or missing results, CPU check "
                                              "path.")] = False,
) -> None:
    """Validate cases: schema, file:line errors, cross-case links, kernel names (never executed)."""
    from casebook.commands import validate as impl

    raise typer.Exit(impl.main(paths or [CASES_DIR], strict=strict))


@app.command("check", short_help='What review would reject, results included.')
def check(
    paths: Annotated[Optional[list[Path]], typer.Argument(
        metavar="PATHS", help="Case files or folders (default: cases/).")] = None,
) -> None:
    """Everything a reviewer would reject, before you push (validate --strict)."""
    from casebook.commands import validate as impl

    raise typer.Exit(impl.main(paths or [CASES_DIR], strict=True))


@app.command("list", short_help='A table of the cases.')
def list_cases(
    pattern: Annotated[Optional[str], typer.Option(help="Only cases that apply this pattern.")] = None,
    bottleneck: Annotated[Optional[str], typer.Option(help="Only cases with this bottleneck.")] = None,
    operator: Annotated[Optional[str], typer.Option(help="Only cases of this operator.")] = None,
) -> None:
    """A table of the cases: operator, bottleneck, patterns."""
    from casebook.commands import list as impl

    raise typer.Exit(impl.main(CASES_DIR, pattern=pattern, bottleneck=bottleneck, operator=operator))


@app.command(short_help='The JSON Schema of the case (or result) format.')
def schema(
    out: Annotated[Optional[Path], typer.Option(help="Write here instead of standard output.")] = None,
    result: Annotated[bool, typer.Option("--result", help="The result format's instead of the case format's.")] = False,
) -> None:
    """Write the JSON Schema of the case format (for editors' yaml-language-server), or of the result format."""
    from casebook.commands import schema as impl

    raise typer.Exit(impl.main(out, result))


@app.command(short_help="This machine's measured ceilings beside its datasheet.")
def hardware(
    remeasure: Annotated[bool, typer.Option(help="Measure the ceilings again instead of using the cache.")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="Print the machine and its ceilings as JSON.")] = False,
) -> None:
    """Measured ceilings of this machine beside its datasheet peaks."""
    from casebook.commands import hardware as impl

    raise typer.Exit(impl.main(remeasure=remeasure, json_out=json_out))


def argv_of(ctx: typer.Context, drop: tuple[str, ...] = (), arguments: list[str] | None = None) -> list[str]:
    """The command line a parsed command stands for, every option that differs from its default kept:
    what a result stores, so that its Reproduce command is the one that made it. `drop`: options left out
    (a many-case run's own), `arguments`: the positional arguments instead of those given."""
    out = ["casebook", ctx.info_name or ""]
    if arguments is not None:
        out += arguments
    for param in ctx.command.params:
        value = ctx.params.get(param.name)
        if param.name in drop:
            continue
        if param.param_type_name == "argument":
            if arguments is None:
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


MANY = ("all_cases", "devices", "ray", "hardware", "json_out")
"""`casebook run`'s options for many cases at once: not part of one case's command line."""


@app.command(short_help='Check, time and judge a case (--save stores it).')
def run(
    ctx: typer.Context,
    cases: Annotated[Optional[list[Path]], typer.Argument(
        metavar="CASE...", help="The case YAML(s); several run side by side, one a device.")] = None,
    all_cases: Annotated[bool, typer.Option("--all", help="Every case under cases/.")] = False,
    variant: Annotated[Optional[list[str]], typer.Option(help="Only these variants (repeatable).")] = None,
    quick: Annotated[bool, typer.Option(help="Fewer repetitions: a smoke run, not a result to publish.")] = False,
    counters: Annotated[bool, typer.Option(
        help="Also read DRAM byte counters with Nsight Compute, if present.")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="Print the result document (with several cases: what "
                                                          "ran where).")] = False,
    results: Annotated[Path, typer.Option(
        help="The stored results: compared with, and written by --save.")] = Path("results"),
    timeout: Annotated[float, typer.Option(help="Seconds each variant's child process may run.")] = 600.0,
    save: Annotated[bool, typer.Option("--save", help="Also store the run in results/<hardware>/<case>.json.")] = False,
    force: Annotated[bool, typer.Option(
        "--force", help="With --save: replace a current stored result even with a slower or noisier run.")] = False,
    devices: Annotated[Optional[str], typer.Option(
        help="With several cases: the devices to spread over, as CUDA_VISIBLE_DEVICES names them, e.g. 0,1,2,3 "
             "(default: every GPU visible; CASEBOOK_FAKE_DEVICES=N fakes N on a CPU).")] = None,
    ray: Annotated[Optional[str], typer.Option(
        metavar="ADDRESS", help="Run the cases on a Ray cluster (the `cluster` extra): one task a case.")] = None,
    hardware: Annotated[Optional[str], typer.Option(
        help="With --ray: only on nodes offering this GPU kind (the Ray resource hardware:<slug>).")] = None,
    resume: Annotated[bool, typer.Option(
        "--resume", help="Continue each case's last run on this machine that was cut short: its points measured "
                         "with the same code, case and protocol are kept, the rest measured. With several cases "
                         "and --save, a case whose stored result is current here is left alone.")] = False,
) -> None:
    """Check, time, place on the roofline and compare one case, at the three levels; the run is kept under
    $CASEBOOK_CACHE/runs (results/ only with --save). Several cases (or --all) run side by side, one worker
    a GPU of this host, or on a Ray cluster with --ray."""
    paths = sorted(CASES_DIR.glob("*.yaml")) if all_cases else []
    paths += [p for p in cases or [] if p not in paths]
    if not paths:
        raise typer.BadParameter("name a case, or --all", param_hint="CASE...")
    if hardware and ray is None:
        raise typer.BadParameter("--hardware places cases on a Ray cluster: give --ray ADDRESS",
                                 param_hint="--hardware")
    if len(paths) == 1 and not all_cases and devices is None and ray is None:
        from casebook.commands import run as impl

        raise typer.Exit(impl.main(paths[0], variants=variant, quick=quick, counters=counters, json_out=json_out,
                                   results_dir=results, timeout=timeout, save=save, force=force,
                                   argv=argv_of(ctx, drop=MANY), resume=resume))
    if resume and ray is not None:
        raise typer.BadParameter("continues the runs kept on this host: not with --ray", param_hint="--resume")
    from casebook.commands import run_many

    flags = argv_of(ctx, drop=MANY, arguments=[])[2:]
    raise typer.Exit(run_many.main(paths, devices=[d.strip() for d in devices.split(",") if d.strip()] if devices
                                   else None, ray_address=ray, hardware=hardware, variants=variant, quick=quick,
                                   counters=counters, json_out=json_out, results_dir=results, timeout=timeout,
                                   save=save, force=force, flags=flags, resume=resume))


@app.command(short_help='Store a kept run in results/.')
def record(
    run_file: Annotated[Path, typer.Argument(metavar="RUN.json", help="A run's result, as `casebook run` kept it.")],
    results: Annotated[Path, typer.Option(help="Where results are stored.")] = Path("results"),
    force: Annotated[bool, typer.Option(
        "--force", help="Replace a current stored result even with a slower or noisier run.")] = False,
) -> None:
    """Store a run as results/<hardware>/<case>.json: the explicit act that changes the book's results."""
    from casebook.commands import record as impl

    raise typer.Exit(impl.main(run_file, results, force))


@app.command(short_help='Run-to-run agreement of two results.')
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


@app.command(short_help='A stored result projected onto another GPU.')
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


@app.command(short_help="A case's results over the commits.")
def history(
    case: Annotated[str, typer.Argument(help="The case id (or its YAML).")],
    machine: Annotated[Optional[str], typer.Option(help="Only this machine's results (a hardware slug).")] = None,
    repo: Annotated[Path, typer.Option(help="The git checkout whose commits hold the results.")] = Path("."),
) -> None:
    """A case's results over the commits: headline per variant, a verdict for every change."""
    from casebook.commands import history as impl

    raise typer.Exit(impl.main(case, repo=repo, machine=machine))


@app.command(short_help='Render the cases and results into the site.')
def build(
    out: Annotated[Path, typer.Option(help="Where the site is written.")] = Path("site"),
    strict: Annotated[bool, typer.Option(help="mkdocs --strict: broken links fail the build.")] = True,
) -> None:
    """Render all cases and stored results into the mkdocs-material site."""
    from casebook.commands import build as impl

    raise typer.Exit(impl.main(out, strict=strict))


@app.command(short_help='Build and preview the site on localhost.')
def serve(
    port: Annotated[int, typer.Option(help="Port on localhost.")] = 8000,
) -> None:
    """Build and preview the site on localhost."""
    from casebook.commands import build as impl

    raise typer.Exit(impl.serve(port))


if __name__ == "__main__":
    app()
