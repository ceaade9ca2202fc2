"""Every GPU of one host: cases side by side, one worker process a device, pinned with `CUDA_VISIBLE_DEVICES`.

Each case runs whole on the device(s) it is given, in a fresh worker process that sees only them and owns
a share of the host's cores (its timings are its own; `casebook.run.interference` judges its own cores). A
case that spans several devices (`topology.devices`) waits for that many free ones and takes them
together. A worker that dies loses only its case: the case is tried once more on other devices where
the host has them, then recorded as crashed. What a worker measured comes back to the caller through
`on_event("done", ...)` the moment it finishes, for the caller to write.

On GPUs the next case of a busy device is prestarted: its worker starts while the case before it runs, loads
its case and starts its children (imports, the device's context: seconds of host work), then waits at its gate
until the device is free, and only then measures (`run_case`'s `gate`).

The dispatch is a loop over free devices and worker pipes (`multiprocessing.connection.wait`), nothing
more: past one host, `casebook.run.cluster` hands the same work to Ray.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import subprocess
import time
import traceback
from collections import deque
from dataclasses import dataclass, field
from multiprocessing.connection import wait
from pathlib import Path
from typing import Any, Callable

from casebook.run.interference import POOL_ENV
from casebook.run.isolate import started_with

FAKE_DEVICES_ENV = "CASEBOOK_FAKE_DEVICES"
"""`CASEBOOK_FAKE_DEVICES=N`: a pool of N devices named 0..N-1 where there is no GPU (each worker is
pinned with its `CUDA_VISIBLE_DEVICES` all the same, and runs the CPU path): the tests' pool, and a CPU
host split into N workers."""

RETRIES = 1
"""A case whose worker died is tried this many more times, on other devices where there are any."""

_ctx = mp.get_context("spawn")  # a fresh interpreter: CUDA_VISIBLE_DEVICES is set before torch is imported

Work = Callable[..., dict]
"""`work(case, args, progress, gate=None) -> result document`: a module-level function (pickled by name); the
document is plain JSON data (`results.document` of a `Result`), which the caller validates where it lands.
`gate`, where given, is called before the case touches its devices, and returns once they are its own."""


@dataclass(frozen=True)
class Job:
    case: Path
    devices: int = 1
    """How many devices the case takes together (its `topology.devices`)."""


@dataclass
class Outcome:
    """One case's end: `status` ok (ran; the document may still record failures), crashed (its worker died
    on every attempt), error (the run raised), unplaced (needs more devices than the pool has)."""

    job: Job
    status: str
    devices: tuple[str, ...] = ()
    doc: dict | None = None
    error: str | None = None
    attempts: list[dict] = field(default_factory=list)
    seconds: float = 0.0
    where: str = ""
    """Where it ran, in words (a device list here, a Ray node and its GPUs in `casebook.run.cluster`)."""


def host_devices(explicit: list[str] | None = None) -> list[str]:
    """The devices a pool spreads over: `explicit` (`--devices 0,1`), else `CASEBOOK_FAKE_DEVICES`, else the
    GPUs `CUDA_VISIBLE_DEVICES` leaves visible, else every GPU nvidia-smi lists, else one device, "cpu"."""
    if explicit:
        return list(explicit)
    fake = os.environ.get(FAKE_DEVICES_ENV, "").strip()
    if fake:
        return [str(i) for i in range(max(1, int(fake)))]
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [d.strip() for d in visible.split(",") if d.strip()] or ["cpu"]
    return gpu_indices() or ["cpu"]


def gpu_indices() -> list[str]:
    """The host's GPUs as nvidia-smi numbers them; empty where it lists none (or is absent)."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in out.splitlines() if line.strip().isdigit()]


def cpu_shares(n: int, cpus: list[int] | None = None) -> list[tuple[int, ...]]:
    """The host's cores (those this process may use) in `n` contiguous shares, one a device; with fewer
    cores than devices, devices share a core each in turn."""
    cpus = sorted(cpus if cpus is not None else os.sched_getaffinity(0))
    if n <= len(cpus):
        size, extra = divmod(len(cpus), n)
        out, start = [], 0
        for i in range(n):
            end = start + size + (i < extra)
            out.append(tuple(cpus[start:end]))
            start = end
        return out
    return [(cpus[i % len(cpus)],) for i in range(n)]


def worker_env(devices: tuple[str, ...]) -> dict[str, str]:
    """What a worker's environment adds: its devices, numbered as nvidia-smi numbers them (PCI bus order,
    not CUDA's fastest-first), so that the index it records and queries is the one it ran on."""
    if devices == ("cpu",):
        return {}
    return {"CUDA_VISIBLE_DEVICES": ",".join(devices), "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


def _worker(work: Work, case: Path, args: dict, env: dict, cpus: tuple[int, ...], conn, gate=None) -> None:
    os.setpgrp()  # its own process group: the variants' children end with it (`_end`)
    os.environ.update(env)
    if cpus and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, cpus)

    def progress(event: str, info: dict) -> None:
        conn.send(("progress", event, _plain(event, info)))

    try:
        doc = work(case, args, progress, gate=gate.wait if gate is not None else None)
    except Exception as e:  # the run itself raised: recorded, not retried (it would raise again)
        conn.send(("error", f"{type(e).__name__}: {e}", traceback.format_exc(limit=8)))
    else:
        conn.send(("done", doc))
    conn.close()


def _plain(event: str, info: dict) -> dict:
    """A progress event as plain data for the pipe: counts, and a task's label, status and error (a paired timing
    that timed has none)."""
    if event == "task":
        t, p = info["task"], info["record"]
        name = f"{t.variant} / {t.over}" if t.kind == "pair" else t.variant
        return {"label": f"{name} {'x'.join(str(v) for v in t.shape.values())} {t.dtype}",
                "status": p.status, "error": p.error if p.status != "ok" else None}
    return {k: v for k, v in info.items() if isinstance(v, (int, float, str))}


@dataclass
class _Running:
    job: Job
    devices: tuple[str, ...]
    proc: Any
    started: float
    attempts: list[dict]
    gate: Any = None
    """A prestarted worker's event, set when its devices are free; None: it was started on free devices."""

    @property
    def waiting(self) -> bool:
        """Prestarted, and its devices still another case's."""
        return self.gate is not None and not self.gate.is_set()


def run_pool(jobs: list[Job], devices: list[str], work: Work, args: dict, *,
             on_event: Callable[[str, dict], None] | None = None, retries: int = RETRIES,
             prestart: bool = False) -> list[Outcome]:
    """Run every job, as many at once as the devices allow; return their outcomes in `jobs`' order.

    `on_event(kind, info)`: "start" (case, devices, attempt, pid: as the case takes its devices), "progress"
    (case, devices, event, info: a `casebook.run` progress event as plain data), "retry" (case, devices, error),
    "done" (the `Outcome`, as each case ends: the caller keeps and stores it there). `prestart`: the next
    one-device case of each busy device starts its worker early and waits at its gate (for GPUs; on a CPU a
    start would take cores from the timing).
    """
    pool = _Pool(jobs, devices, work, args, on_event or (lambda kind, info: None), retries, prestart)
    before = _on_terminate()
    try:
        pool.dispatch()
    finally:  # interrupted (Ctrl-C, a time limit's SIGTERM): no worker outlives the pool
        for _, r in pool.running.values():
            _end(r.proc, died=True)
        if before is not None:
            signal.signal(signal.SIGTERM, before)
    return [pool.outcomes[i] for i in range(len(jobs))]


class _Pool:
    def __init__(self, jobs, devices, work, args, emit, retries, prestart=False) -> None:
        self.jobs, self.devices, self.work, self.args = jobs, devices, work, args
        self.emit, self.retries, self.prestart = emit, retries, prestart
        self.shares = dict(zip(devices, cpu_shares(len(devices))))
        self.free = list(devices)
        self.outcomes: dict[int, Outcome] = {}
        self.pending: deque[tuple[int, list[dict]]] = deque()
        self.running: dict[Any, tuple[int, _Running]] = {}  # the worker's pipe -> (job index, the worker)
        for i, job in enumerate(jobs):
            if job.devices > len(devices):
                self.finish(i, Outcome(job, "unplaced", error=f"needs {job.devices} devices together; the pool "
                                                             f"has {len(devices)} ({', '.join(devices)})"))
            else:
                self.pending.append((i, []))

    def start(self, i: int, attempts: list[dict], devs: tuple[str, ...], waiting: bool = False) -> None:
        """Start job i's worker on `devs`: free devices, taken now; or, `waiting`, busy ones it takes at its gate."""
        job = self.jobs[i]
        parent, child = _ctx.Pipe(duplex=False)
        cpus = tuple(c for d in devs for c in self.shares[d])
        gate = _ctx.Event() if waiting else None
        proc = _ctx.Process(target=_worker, args=(self.work, job.case, self.args, worker_env(devs), cpus, child, gate))
        # in its environment from its start: who it is to the case it waits for (`interference.slot_workers`)
        with started_with({POOL_ENV: f"{os.getpid()}/{','.join(devs)}"}):
            proc.start()
        child.close()
        r = _Running(job, devs, proc, time.monotonic(), attempts, gate)
        self.running[parent] = (i, r)
        if not waiting:
            self.take(r)

    def take(self, r: _Running) -> None:
        """The worker's devices become its own (a prestarted one's gate opens): the case starts, its time with it."""
        for d in r.devices:
            self.free.remove(d)
        if r.gate is not None:
            r.gate.set()
        r.started = time.monotonic()
        self.emit("start", {"case": r.job.case, "devices": r.devices, "attempt": len(r.attempts) + 1,
                            "pid": r.proc.pid})

    def open_gates(self) -> None:
        """Each prestarted worker whose devices are all free takes them, before any job still pending can."""
        for _, r in list(self.running.values()):
            if r.waiting and all(d in self.free for d in r.devices):
                self.take(r)

    def prestart_next(self) -> None:
        """The first pending one-device job (not yet tried) starts on a busy device no prestarted job waits for."""
        if not self.prestart:
            return
        claimed = {d for _, r in self.running.values() if r.waiting for d in r.devices}
        busy = [d for d in self.devices if d not in self.free and d not in claimed]
        item = next(((i, a) for i, a in self.pending if self.jobs[i].devices == 1 and not a), None)
        if busy and item is not None:
            self.pending.remove(item)
            self.start(item[0], item[1], (busy[0],), waiting=True)

    def finish(self, i: int, outcome: Outcome) -> None:
        self.outcomes[i] = outcome
        self.emit("done", {"outcome": outcome})

    def dispatch(self) -> None:
        while self.pending or self.running:
            self.open_gates()
            for item in list(self.pending):
                i, attempts = item
                devs = _pick(self.free, self.devices, self.jobs[i].devices,
                             {d for a in attempts for d in a["devices"]})
                if devs:
                    self.pending.remove(item)
                    self.start(i, attempts, devs)
            self.prestart_next()
            for conn in wait(list(self.running)):
                self.receive(conn)

    def receive(self, conn) -> None:
        i, r = self.running[conn]
        try:
            msg = conn.recv()
        except EOFError:  # the worker died: a segfault, the out-of-memory killer, a kill
            msg = None
        if msg is not None and msg[0] == "progress":
            self.emit("progress", {"case": r.job.case, "devices": r.devices, "event": msg[1], "info": msg[2]})
            return
        del self.running[conn]
        conn.close()
        code = _end(r.proc, died=msg is None)
        at_gate = r.waiting  # a prestarted worker that ended at its gate never took its devices
        if not at_gate:
            self.free.extend(r.devices)
        seconds = time.monotonic() - r.started
        status = "crashed" if msg is None else "ok" if msg[0] == "done" else "error"
        error = (f"worker died (exit code {code}) on device {','.join(r.devices)}" if msg is None
                 else msg[1] if status == "error" else None)
        attempts = [*r.attempts, {"devices": list(r.devices), "status": status, "error": error, "seconds": seconds}]
        if status == "crashed" and len(attempts) <= self.retries:
            self.emit("retry", {"case": r.job.case, "devices": r.devices, "error": error})
            self.pending.appendleft((i, attempts))
            return
        doc = msg[1] if status == "ok" else None
        if status == "error":
            error = f"{msg[1]}\n{msg[2]}"
        where = f"{'at its gate, before ' if at_gate else ''}device {','.join(r.devices)}"
        self.finish(i, Outcome(r.job, status, () if at_gate else r.devices, doc=doc, error=error, attempts=attempts,
                               seconds=seconds, where=where))


def _on_terminate():
    """SIGTERM (`timeout`, a batch system) ends the pool as Ctrl-C does, through its `finally`: the workers
    run in process groups of their own, out of reach of a signal to the caller's. The handler it replaces."""
    def stop(signum, frame):
        raise SystemExit(128 + signum)

    try:
        return signal.signal(signal.SIGTERM, stop)
    except ValueError:  # not the main thread: left as it is
        return None


def _pick(free: list[str], devices: list[str], need: int, failed_on: set[str]) -> tuple[str, ...] | None:
    """`need` free devices, none the case's worker died on where the pool has enough others (else any)."""
    others = [d for d in devices if d not in failed_on]
    usable = [d for d in free if d not in failed_on] if len(others) >= need else list(free)
    return tuple(usable[:need]) if len(usable) >= need else None


def _end(proc, died: bool) -> int | None:
    """Reap a worker. One that died leaves its variants' children running: its process group is ended
    first, while the dead worker (unreaped) still holds its number."""
    if died:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    proc.join(30)
    if proc.is_alive():
        proc.kill()
        proc.join(10)
    return proc.exitcode
