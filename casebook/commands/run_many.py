"""`casebook run CASE... | --all`: many cases at once, over the GPUs of this host (`casebook.run.pool`) or a Ray
cluster (`--ray`, `casebook.run.cluster`). Each case is one `casebook run CASE` (`commands.child`); its
result crosses back as its JSON document (`results.document`), is validated into a `Result` here as it ends,
and is kept, and with --save stored; progress per device; a table of what ran where."""

from __future__ import annotations

import json
import time
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from casebook.commands.run import STATUS_STYLE, console, out
from casebook.result import Result
from casebook.run.pool import Job, Outcome


def measure_case(case: Path, args: dict, progress, gate=None) -> dict:
    """The work of one pool worker or Ray task: `casebook run CASE` measured, with the single-case command
    line that reproduces it (`args["flags"]`: the options it ran with). Its result as plain JSON data
    (`results.document`), to cross the pipe or Ray back to the caller, which validates it (`land`). `gate`: the
    pool's, where it prestarted the case (`casebook.run.pool`)."""
    from casebook.commands.run import last_cut_short, measure
    from casebook.load import load_case
    from casebook.results import document

    argv = ["casebook", "run", Path(case).as_posix(), *args["flags"]]
    loaded = load_case(case)
    earlier = last_cut_short(loaded) if args.get("resume") else None
    return document(measure(case, variants=args["variants"], quick=args["quick"], counters=args["counters"],
                            timeout=args["timeout"], argv=argv, progress=progress, say=lambda msg: None,
                            ceilings=args.get("ceilings"), loaded=loaded,
                            resume=earlier[1] if earlier else None, gate=gate))


def current_result(path: Path, case, results_dir: Path) -> Path | None:
    """The stored result of `case` for this machine, where it is current: complete, of the case and kernel as they
    are now, and written in the current result format (an older one reads through its migration, but lacks what
    the format has gained since, such as each point's harness cost). What a resumed run of many cases leaves
    alone (a job cut short by its time limit is followed by the same command, which measures what is left)."""
    from casebook import results
    from casebook.provenance import stale_reasons
    from casebook.run import hardware
    from casebook.validate import older_format

    stored = results.result_path(results_dir, hardware.identify(devices=case.kernel.devices).slug, case.id)
    if not stored.is_file():
        return None
    try:
        result = results.load(stored)
    except ValueError:
        return None
    current = result.complete is not False and not older_format(result) and not stale_reasons(result, path, case)
    return stored if current else None


def jobs_of(paths: list[Path], say: Console, results_dir: Path, save: bool,
            skip_current: bool = False) -> list[Job] | None:
    """A job a case, taking the devices its `topology.devices` names; None (after every problem printed,
    `file:line: field: message`) where any case does not load or would not end well (`casebook.run.preflight`).
    `skip_current`: no job for a case whose stored result is current here (`current_result`), said so."""
    from rich.text import Text

    from casebook.commands.run import preflight_problem
    from casebook.commands.validate import print_problems
    from casebook.load import CaseError, load_case

    jobs, bad = [], False
    for path in paths:
        try:
            case = load_case(path)
        except CaseError as e:
            print_problems(getattr(e, "errors", None) or [e], say)
            bad = True
            continue
        if skip_current and (stored := current_result(Path(path), case, results_dir)):
            say.print(f"{path}: current ({stored}), not measured again (`--force` measures it)", highlight=False)
            continue
        if why := preflight_problem(Path(path), results_dir, save):
            say.print(Text(why, style="red"))
            bad = True
            continue
        jobs.append(Job(Path(path), case.topology.devices))
    return None if bad else jobs


def main(paths: list[Path], *, devices: list[str] | None, ray_address: str | None, hardware: str | None,
         variants, quick: bool, counters: bool, json_out: bool, results_dir: Path, timeout: float, save: bool,
         force: bool, flags: list[str], resume: bool = False) -> int:
    """`resume`: each case's run cut short on this host goes on (`casebook run CASE --resume`), and with --save a
    case whose stored result is current here is left alone (unless --force): the same command, run again after
    a job's time limit ended it, measures what is left."""
    jobs = jobs_of(paths, console, results_dir, save, skip_current=resume and save and not force)
    if jobs is None:
        return 2
    if not jobs:
        console.print("every case is current here: nothing to measure" if resume else "no cases to run",
                      highlight=False)
        return 0 if resume else 2
    args = {"variants": variants, "quick": quick, "counters": counters, "timeout": timeout, "flags": flags,
            "resume": resume}
    landed: dict[Path, dict] = {}

    def land(o: Outcome) -> None:
        """Validate a case's run into its `Result` and keep (and with --save store) it the moment it ends, each
        file written atomically, and print its claims' verdicts."""
        from casebook.commands.run import keep, print_claims, store
        from casebook.run import assemble

        rec = landed.setdefault(o.job.case, {})
        if o.doc is None:
            console.print(f"[bold red]{o.job.case}: {o.status}[/]: {o.error}", highlight=False)
            return
        rec["result"] = result = Result.model_validate(o.doc)
        rec["kept"] = keep(result)
        rec["failed"] = assemble.failed(result)
        if save:
            rec["store"] = store(result, results_dir, o.job.case, force, console)
        if not json_out:  # as each case lands: a run cut short later has still said what its claims read
            print_claims(result, f"{o.job.case.stem} on {result.hardware.slug}: claims")

    start = time.monotonic()
    with _Board(console, len(jobs)) as board:
        def on_event(kind: str, info: dict) -> None:
            board.event(kind, info)
            if kind == "done":
                land(info["outcome"])

        if ray_address is not None:
            from casebook.run import cluster

            outcomes = cluster.run_on_ray(jobs, measure_case, args, address=ray_address, hardware=hardware,
                                          runtime_env=cluster.ship(Path.cwd()), on_event=on_event)
        else:
            from casebook.run import pool

            devs = pool.host_devices(devices)
            on_gpus = bool(pool.gpu_indices())
            if not on_gpus:  # one CPU's ceilings, measured once, before its workers share them out
                from casebook.run import hardware as hardware_mod

                args["ceilings"] = hardware_mod.ceilings()
            board.devices(devs)
            outcomes = pool.run_pool(jobs, devs, measure_case, args, on_event=on_event, prestart=on_gpus)
    wall = time.monotonic() - start
    if json_out:
        out.print_json(json.dumps([_row(o, landed.get(o.job.case, {})) for o in outcomes]))
    else:
        out.print(where_table(outcomes, landed))
    for line in ceilings_agreement([landed[o.job.case]["result"] for o in outcomes if o.doc is not None]):
        console.print(line, highlight=False)
    console.print(f"{len(outcomes)} case(s) in {wall:.1f} s", highlight=False)
    bad = [o for o in outcomes if o.doc is None or landed[o.job.case].get("failed")
           or landed[o.job.case].get("store", 0)]
    return 1 if bad else 0


def _row(o: Outcome, rec: dict) -> dict:
    return {"case": o.job.case.as_posix(), "status": o.status, "where": o.where, "devices": list(o.devices),
            "attempts": o.attempts, "seconds": round(o.seconds, 1), "failed": rec.get("failed"),
            "kept": str(rec["kept"]) if rec.get("kept") else None,
            "stored": rec["store"] == 0 if "store" in rec else None, "error": o.error}


def where_table(outcomes: list[Outcome], landed: dict) -> Table:
    """What ran where: a row a case, with its attempts, its wall time and what became of its result."""
    t = Table(title="What ran where", title_justify="left", header_style="bold")
    for col in ("case", "where", "attempts", "status", "seconds", "result"):
        t.add_column(col)
    for o in outcomes:
        rec = landed.get(o.job.case, {})
        status = o.status if o.doc is None else ("failed" if rec.get("failed") else "ok")
        result = ("-" if o.doc is None else
                  "stored" if rec.get("store") == 0 else "not stored" if "store" in rec else "kept")
        tries = " then ".join(f"{','.join(a['devices']) or '-'} {a['status']}" for a in o.attempts) or "-"
        t.add_row(o.job.case.stem, o.where or "-", tries, f"[{STATUS_STYLE.get(status, 'bold red')}]{status}[/]",
                  f"{o.seconds:.1f}", result)
    return t


def ceilings_agreement(runs: list[Result]) -> list[str]:
    """For each GPU kind that ran on more than one device: whether the devices' measured ceilings agree
    (`roofline.ceilings_apart`), that is whether the site counts them as one machine."""
    from casebook.roofline import ceilings_apart

    by_device: dict[str, dict[str, dict]] = {}
    for r in runs:
        hw = r.hardware
        if hw.kind != "gpu":
            continue
        dev = r.environment.device
        name = (dev.uuid or dev.cuda_visible_devices if dev is not None else None) or "?"
        by_device.setdefault(hw.slug, {}).setdefault(name, hw.measured)
    lines = []
    for slug, devs in by_device.items():
        if len(devs) < 2:
            continue
        (first, ref), *rest = devs.items()
        apart = {name: ceilings_apart(ref, m) for name, m in rest}
        if not any(apart.values()):
            lines.append(f"{slug}: the ceilings of its {len(devs)} devices agree: one machine to the site")
        for name, why in apart.items():
            if why:
                lines.append(f"[yellow]{slug}: device {name}'s ceilings are apart from {first}'s ({'; '.join(why)})"
                             ": the site shows them as two machines[/]")
    return lines


class _Board:
    """Progress per device (a row each: the case it runs, the task it is at) under a row for the cases;
    where no live display can be drawn (a log), a line as each case starts and ends."""

    def __init__(self, say: Console, cases: int) -> None:
        self.say = say
        self.bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                            console=say, transient=True)
        self.cases = self.bar.add_task("cases", total=cases)
        self.rows: dict[str, int] = {}

    def __enter__(self) -> _Board:
        self.bar.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.bar.__exit__(*exc)

    def devices(self, devs: list[str]) -> None:
        for d in devs:
            self.rows[d] = self.bar.add_task(f"device {d}: idle", total=None)

    def event(self, kind: str, info: dict) -> None:
        row = self.rows.get(info.get("devices", ("",))[0]) if info.get("devices") else None
        if kind == "start" and info.get("devices"):
            again = f" (attempt {info['attempt']})" if info["attempt"] > 1 else ""
            self.bar.update(row, description=f"device {','.join(info['devices'])}: {info['case'].stem}{again}",
                            total=None, completed=0)
            if not self.say.is_terminal:
                self.say.print(f"{info['case'].stem}: started on device {','.join(info['devices'])}{again}",
                               highlight=False)
        elif kind == "progress" and row is not None:
            e, i = info["event"], info["info"]
            if e in ("plan", "pairs"):
                self.bar.update(row, total=i["total"], completed=0)
            elif e == "task":
                self.bar.update(row, advance=1, description=f"device {','.join(info['devices'])}: "
                                                            f"{info['case'].stem} {i['label']}")
        elif kind == "retry":
            self.say.print(f"[yellow]{info['case'].stem}: {info['error']}; trying it once more[/]", highlight=False)
        elif kind == "done":
            o = info["outcome"]
            self.bar.update(self.cases, advance=1)
            for d in o.devices:
                if d in self.rows:
                    self.bar.update(self.rows[d], description=f"device {d}: idle", total=None, completed=0)
            if not self.say.is_terminal:
                self.say.print(f"{o.job.case.stem}: {o.status} ({o.where or '-'}, {o.seconds:.1f} s)",
                               highlight=False)
