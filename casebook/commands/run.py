"""`casebook run CASE`: progress over variants x shapes, a table per level, the claims, the stored result."""

from __future__ import annotations

import json
import shlex
import signal
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from casebook.commands import console as terminal
from casebook.levels import Scenario, regressions
from casebook.result import ClaimPairedTiming, IntensityCheck, Point, Result, shape_label, shape_named
from casebook.roofline import host_bound

console = terminal(stderr=True)
out = terminal()

STATUS_STYLE = {"ok": "green", "checked": "cyan", "failed": "bold red", "crashed": "bold red",
                "timeout": "bold red", "skipped": "dim"}


def main(case: Path, *, variants, quick: bool, counters: bool, json_out: bool, results_dir: Path,
         timeout: float, save: bool = False, force: bool = False, argv: list[str] | None = None,
         resume: bool = False) -> int:
    """Run, keep the run under the cache's runs folder, compare it with the stored result for this machine;
    with `save`, also store it in `results_dir` (`casebook.commands.record`). `argv`, the command line as
    parsed, is stored with the run (every flag kept, for the page's Reproduce). `resume`: continue the case's
    last run on this machine that was cut short (`casebook.resume.resumable` says what it keeps)."""
    from casebook.commands.validate import print_problems
    from casebook.load import CaseError, read_case

    try:
        loaded = read_case(case)  # the one load of the run: preflight, the run and the counters take it
    except CaseError as e:
        print_problems(getattr(e, "errors", None) or [e], console)
        return 2

    if why := preflight_problem(case, results_dir, save, loaded):
        console.print(Text(why, style="red"))
        return 2
    previous = signal.signal(signal.SIGTERM, _terminated)
    kept: list[Path] = []
    try:
        return _run(case, variants=variants, quick=quick, counters=counters, json_out=json_out,
                    results_dir=results_dir, timeout=timeout, save=save, force=force, argv=argv, loaded=loaded[0],
                    resume=resume, kept=kept)
    except Terminated:
        console.print(f"casebook run: terminated (SIGTERM); every child process ended; "
                      f"{_what_was_kept(kept, case, argv)}", highlight=False)
        return 143
    except KeyboardInterrupt:
        console.print(f"casebook run: interrupted; every child process ended; {_what_was_kept(kept, case, argv)}",
                      highlight=False)
        return 130
    except OSError as e:  # a full disk, a folder that cannot be written: one line, never a traceback
        console.print(Text(f"casebook run: {e.filename or ''}: {e.strerror or e}", style="red"))
        return 2
    finally:
        signal.signal(signal.SIGTERM, previous)


def _what_was_kept(kept: list[Path], case: Path, argv: list[str] | None = None) -> str:
    """Where a run cut short left what it measured, and the command that goes on from it (the run's own flags
    kept: a resumed run keeps points timed under the same protocol only)."""
    if not kept:
        return "nothing was measured yet, nothing stored"
    again = shlex.join([*argv, "--resume"] if argv and "--resume" not in argv else argv) if argv else \
        f"casebook run {case} --resume"
    return f"what it measured is kept in {kept[-1]} (nothing stored in results/); `{again}` goes on from it"


class Terminated(BaseException):
    """SIGTERM, raised where the run stands so that its children are ended on the way out, as for Ctrl-C."""


def _terminated(signum, frame) -> None:
    raise Terminated()


def preflight_problem(case: Path, results_dir: Path, save: bool, loaded: tuple | None = None) -> str | None:
    from casebook.run.preflight import problems

    found = problems(case, results_dir if save else None, loaded)
    return found[0] if found else None


def _run(case: Path, *, variants, quick: bool, counters: bool, json_out: bool, results_dir: Path,
         timeout: float, save: bool, force: bool, argv: list[str] | None, loaded=None, resume: bool = False,
         kept: list | None = None) -> int:
    from casebook.run import assemble

    earlier = None
    if resume:
        earlier = last_cut_short(loaded)
        console.print(f"resuming {earlier[0]}" if earlier else "no run of this case cut short on this machine: "
                      "measuring afresh", highlight=False)

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=True) as bar:
        job = bar.add_task("measuring ceilings", total=None)

        def progress(event: str, info: dict) -> None:
            if event == "ceilings":
                bar.update(job, description=f"ceilings of {info['hardware']}")
            elif event == "topology":
                bar.update(job, description=f"the link between {info['devices']} devices")
            elif event == "plan":
                bar.update(job, total=info["total"], completed=0, description="checking and timing")
            elif event == "pairs":
                bar.update(job, total=info["total"], completed=0, description="claims: paired timings")
            elif event == "variant" and info["points"]:
                console.print(harness_line(info), highlight=False)
            elif event == "task":
                t, p = info["task"], info["record"]
                name = f"{t.variant} / {t.over}" if t.kind == "pair" else t.variant
                bar.update(job, advance=1, description=f"{name} {shape_named(t.shape)} {t.dtype}")
                error = p.error if p.status in ("failed", "crashed", "timeout") else None
                if not console.is_terminal:  # a log, line by line, where no live bar can be drawn
                    console.print(f"  {t.level:10s} {name} {shape_named(t.shape)} {t.dtype}: {p.status}"
                                  f"{f': {error}' if error is not None else ''} {measured(p)}", highlight=False)
                elif error is not None:
                    console.print(f"[red]{name} {shape_named(t.shape)} {t.dtype}: {p.status}: "
                                  f"{escape(str(error or ''))}[/red]", highlight=False)

        result = measure(case, variants=variants, quick=quick, counters=counters, timeout=timeout, argv=argv,
                         progress=progress, say=lambda msg: console.print(msg, highlight=False), loaded=loaded,
                         resume=earlier[1] if earlier else None, kept=kept)
    if json_out:
        from casebook.results import document

        out.print_json(json.dumps(document(result)))
    else:
        report(result)
    path = keep(result)
    console.print(f"this run: [bold]{path}[/bold]", highlight=False)
    against_stored(result, results_dir)
    code = 1 if assemble.failed(result) else 0
    if save:
        code = max(code, store(result, results_dir, case, force))
    else:
        console.print(f"results/ untouched: `--save`, or `casebook record {path}`, stores it", highlight=False)
    return code


def measure(case: Path, *, variants, quick: bool, counters: bool, timeout: float, argv: list[str] | None,
            progress, say, ceilings: dict | None = None, loaded=None, resume: Result | None = None,
            kept: list | None = None, gate=None) -> Result:
    """One case's run (`casebook.run.orchestrate.run_case`), its counters if asked, the command line that made it: the
    `Result`, not yet kept. A checkpoint is kept after each point (`keep`), so a run cut short leaves what it
    measured, and `kept` (a list, where given) gets the checkpoint's path. The same for one case here and for
    each case of a pool or a cluster (`ceilings`: the machine's, measured once for a CPU pool's workers; else
    this device's, cached). `loaded`: the case at `case`, where the caller has loaded it. `resume`: a kept run
    cut short, to go on from. `gate`: a pool's, for a case prestarted beside the one before it (`run_case`)."""
    from casebook import results
    from casebook.run import orchestrate

    def checkpoint(partial: Result) -> None:
        path = results.save_as(partial, results.run_path(results.runs_dir(), partial))
        if kept is not None:
            kept[:] = [path]

    def noted(event: str, info: dict) -> None:
        if event == "note":
            say(info["message"])
        elif progress is not None:
            progress(event, info)

    # argv: the exact command, every flag kept (--counters, --timeout, ...), for the page's Reproduce
    return orchestrate.run_case(case, only=variants, quick=quick, timeout_s=timeout, progress=noted,
                                checkpoint=checkpoint, ceilings=ceilings, counters=counters, case=loaded,
                                argv=list(argv) if argv else None, resume=resume, gate=gate)


def last_cut_short(case) -> tuple[Path, Result] | None:
    """This case's newest kept run on this machine that was cut short (`<start>.json.partial` under the runs
    folder), loaded; None where there is none."""
    from casebook import results
    from casebook.run import hardware

    folder = results.runs_dir() / hardware.identify(devices=case.kernel.devices).slug / case.id
    partials = sorted(folder.glob(f"*.json{results.PARTIAL}"), key=lambda p: p.stat().st_mtime)
    for path in reversed(partials):
        try:
            return path, results.load(path)
        except ValueError:
            continue
    return None


def measured(record) -> str:
    """What a task's record measured, in a few words: a point's median, a paired timing's speedup, a scenario's
    times; nothing where it measured nothing."""
    match record:
        case Point(median_us=float() as us):
            return f"{us:.1f} us"
        case ClaimPairedTiming(speedup=speedup):
            return f"{speedup:.3f}x paired"
        case Scenario(scenario_us=float() as whole, kernel_us=float() as alone):
            return f"scenario {whole:.1f} us, kernel alone {alone:.1f} us"
    return ""


def harness_line(info: dict) -> str:
    """A variant's cost in the run: its points, its wall time and the share of it its timed calls took."""
    wall, timed, n = info["wall_s"], info["timed_s"], info["points"]
    kept = f", {info['kept']} kept from the run resumed" if info.get("kept") else ""
    crossed = f"; outputs crossed: {'; '.join(info['crossing'])}" if info.get("crossing") else ""
    return (f"  {info['name']}: {n} tasks in {wall:.1f} s, {timed:.2f} s of it timed calls; harness "
            f"{wall - timed:.1f} s ({(wall - timed) / max(n, 1):.2f} s a task){kept}{crossed}")


def keep(result: Result) -> Path:
    """Keep a run as `$CASEBOOK_CACHE/runs/<hardware>/<case>/<start>.json` (atomically, replacing its
    checkpoint); the path."""
    from casebook import results

    return results.save_as(result, results.run_path(results.runs_dir(), result))


def store(result: Result, results_dir: Path, case: Path, force: bool, say: Console | None = None) -> int:
    """`--save`: store a kept run in results/ (`casebook.commands.record.store`, atomic, refusing to replace a
    current better result without `force`)."""
    from casebook.commands.record import store as record_store

    return record_store(result, results_dir, case, force, say or console)


def against_stored(result: Result, results_dir: Path) -> None:
    """How this run compares with the stored result of its case on this machine, if there is one."""
    from casebook import results
    from casebook.commands.compare import show

    stored = results.result_path(results_dir, result.hardware.slug, result.case_id)
    if not stored.exists():
        console.print(f"no stored result for this machine ({stored}) to compare with", highlight=False)
        return
    try:
        before = results.load(stored)
    except ValueError as e:
        console.print(f"the stored result {stored} is unreadable: {e}", highlight=False)
        return
    console.print(f"[bold]Against the stored result[/bold] {stored} (A) -> this run (B):", highlight=False)
    shaky = sum(1 for p in result.kernel_level + result.workload_level.points if p.unstable)
    if shaky:
        console.print(f"  {shaky} of this run's points are unstable (above): where they moved, the machine moved "
                      "them, not the code", highlight=False)
    show(console, before, result, (stored.name, "this run"), min_us=0.0)


def _fmt(v, spec: str, missing: str = "-") -> str:
    return missing if v is None else format(v, spec)


def _regime(p: Point) -> str:
    """Which roof binds the point, and how far below it the point is ("bandwidth roof, 480x below")."""
    regime = p.regime
    if not regime:
        return "-"
    if regime == "launch" and host_bound(p.host_issue_us, p.floor_us):
        regime = "launch (host)"
    frac = p.roof_fraction
    if isinstance(frac, (int, float)) and 0 < frac < 0.5:
        return f"{regime} roof, {1 / frac:.0f}x below"
    return f"{regime} roof"


def _rate(x, unit: str, base: float) -> str:
    """A rate in the unit that fits it (GFLOP/s on a CPU, not 0.0000210 TFLOP/s)."""
    if not isinstance(x, (int, float)) or x <= 0:
        return "-"
    v = x * base
    for prefix, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if v >= scale:
            return f"{v / scale:.3g} {prefix}{unit}"
    return f"{v:.3g} {unit}"


def _status(p: Point) -> str:
    """The status, with its reason where it was not timed (`skipped: no backend of ['cuda'] here`)."""
    status = p.status
    style = STATUS_STYLE.get(status, "")
    why = p.error if status not in ("ok", "checked") else None
    shown = f"{status}: {why}" if why else status
    shown = shown if len(shown) <= 60 else shown[:59] + "…"
    return f"[{style}]{escape(shown)}[/]" if style else escape(shown)


def _points_table(title: str, points: list[Point], weighted: bool = False) -> Table:
    t = Table(title=title, title_justify="left", header_style="bold")
    dims = " x ".join(points[0].shape) if points else ""
    columns = ("variant", f"shape ({dims})" if dims else "shape", "dtype", "median us", "p10-p90 us", "bandwidth",
               "compute", "% roof", "binding roof", "speedup", "rel err", "status")
    for col in columns + (("weight",) if weighted else ()):
        t.add_column(col, justify="left" if col in ("variant", "dtype", "binding roof", "status")
                     or col.startswith("shape") else "right")
    for p in points:
        t.add_row(p.variant, shape_label(p.shape), p.dtype, _fmt(p.median_us, ".1f"),
                  f"{p.p10_us:.1f}-{p.p90_us:.1f}" if p.p10_us else "-",
                  _rate(p.gbps, "B/s", 1e9), _rate(p.tflops, "FLOP/s", 1e12),
                  _fmt(p.roof_fraction and 100 * p.roof_fraction, ".1f"), _regime(p),
                  _fmt(p.speedup, ".2f"),
                  _fmt(p.max_rel_err, ".1e") if p.status in ("ok", "checked") else "-",
                  _status(p) + (" [yellow]unstable[/]" if p.unstable else ""),
                  *((_fmt(p.weight, ".2f"),) if weighted else ()))
    return t


def report(result: Result) -> None:
    hw = result.hardware
    m = hw.measured
    out.print(f"[bold]{escape(result.case_id)}[/bold] on {escape(hw.name)} ({hw.slug}): copy "
              f"{_rate(m.copy_gbps, 'B/s', 1e9)}, launch {m.launch_us:.1f} us, matmul " +
              ", ".join(f"{k} {_rate(v, 'FLOP/s', 1e12)}" for k, v in m.matmul_tflops.items()) + " (measured)"
              + (f" [yellow]on a busy machine: {escape('; '.join(m.unstable))}[/]" if m.unstable else ""))
    out.print(_points_table("Level 1: the single-kernel limit", result.kernel_level))
    first = [f"{v.name} {v.first_call_s:.3g} s (max {v.first_call_s_max:.3g} s)"
             for v in result.variants if v.first_call_s is not None]
    if first:  # JIT, autotuning, compilation: paid once per shape, never inside the medians above
        out.print("First call per shape (JIT / autotune / compile), first shape and slowest: " + "; ".join(first))
    w = result.workload_level
    out.print(_points_table(f"Level 2: the workload ({w.dtype})", w.points, weighted=True))
    s = Table(title="Level 2 summary (weighted over the distribution)", title_justify="left", header_style="bold")
    for col in ("variant", "geomean speedup", "worst speedup", "worst shape", "regressions"):
        s.add_column(col)
    for row in w.summary:
        s.add_row(row.variant, _fmt(row.geomean_speedup, ".2f"), _fmt(row.worst_speedup, ".2f"),
                  shape_label(row.worst_shape) if row.worst_shape else "-",
                  regressions(row, w.points))
    out.print(s)
    e = result.end_to_end
    line = f"[bold]Level 3[/bold] {e.baseline} -> {e.variant}: {e.status}"
    if e.kernel_share is not None:
        line += f"; kernel share of baseline {e.kernel_share:.1%}"
    if e.measured_speedup is not None:
        line += (f"; kernel {e.kernel_speedup:.2f}x; Amdahl predicts {e.amdahl_speedup:.3f}x; "
                 f"measured {e.measured_speedup:.3f}x")
    if e.error:
        line += f" ({e.error})"
    out.print(line, highlight=False)
    if result.counters:
        c = Table(title="DRAM bytes: modelled vs measured (ncu)", title_justify="left", header_style="bold")
        for col in ("variant", "shape", "dtype", "modelled MB", "measured MB", "gap"):
            c.add_column(col)
        for r in result.counters:
            if r.gap is None:  # ncu gave nothing for this variant: say why
                c.add_row(r.variant, shape_label(r.shape), r.dtype, "-", "-", "-" if r.error is None else r.error)
                continue
            c.add_row(r.variant, shape_label(r.shape), r.dtype, f"{r.modelled_bytes / 1e6:.1f}",
                      f"{r.measured_bytes / 1e6:.1f}",
                      f"{100 * r.gap:+.0f}%" + (" (flagged)" if r.flagged else ""))
        out.print(c)
    _stability(result)
    _intensity(result.arithmetic_intensity)
    print_claims(result)


def print_claims(result: Result, title: str = "Claims") -> None:
    """Each claim's verdict on this machine, with its number."""
    out.print(f"[bold]{title}[/bold]", highlight=False)
    for c in result.claims:
        mark = {True: "[green]held[/]", False: "[bold red]FAILED[/]", None: "[dim]n/a[/]"}[c.held]
        out.print(f"  {mark}  {c.text}  [dim]{c.detail}[/]", highlight=False)


def _stability(result: Result) -> None:
    """How quiet the machine was: the count of unstable points, each with its reason."""
    st, env = result.stability, result.environment
    loads = " -> ".join(f"{la[0]:.2f}" for la in (env.load_average_start, env.load_average_end) if la)
    busiest = (f"; other processes at most {st.other_cores_max:.2f} cores"
               if st is not None and st.other_cores_max is not None else "")
    head = (f"[bold]Stability[/bold] {st.unstable if st else 0} of {st.points if st else 0} timed points unstable; "
            f"{env.cpu_threads} CPU threads; load average {loads or '-'}{busiest}")
    out.print(head, highlight=False)
    points = result.kernel_level + result.workload_level.points
    for p in (p for p in points if p.unstable):
        out.print(f"  [yellow]unstable[/]  {p.variant} {shape_label(p.shape)} {p.dtype}: "
                  + "; ".join(p.unstable), highlight=False)
    if st is not None and st.unstable:
        out.print("  `casebook check` will not publish this result: run it again on a quiet machine", highlight=False)


def _intensity(rec: IntensityCheck | None) -> None:
    """The declared arithmetic intensity beside the traffic model's, at the first level-1 shape."""
    if rec is None:
        return
    if rec.modelled is None:
        if rec.error:
            out.print(f"[bold]Arithmetic intensity[/bold] not modelled: {rec.error}", highlight=False)
        return
    line = (f"[bold]Arithmetic intensity[/bold] at {shape_label(rec.shape)} {rec.dtype}: the traffic model "
            f"gives {rec.modelled:.4g} FLOP/byte")
    if rec.difference is not None:
        line += f", the case declares {rec.declared:g} ({rec.difference:+.1%})"
    elif rec.declared is not None:  # a model of no FLOPs (a copy, a transpose): no ratio to take
        line += f", the case declares {rec.declared:g}"
        if rec.flagged:
            line += f" [bold red]more than {rec.tolerance:.0%} apart: `casebook check` flags it[/]"
    out.print(line, highlight=False)
