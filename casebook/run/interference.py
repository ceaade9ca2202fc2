"""What else the machine did while a point was timed: raw readings taken around the timing, where it
happens (in the child). `casebook.stability` judges them; nothing here decides anything.

Linux only where it reads /proc; elsewhere the readings are absent (None), never guessed.
"""

from __future__ import annotations

import functools
import os
import resource
import subprocess
import time
from pathlib import Path

CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
"""/proc/stat counts CPU time in these ticks per second (100 on Linux)."""


CPU_THREADS_ENV = "CASEBOOK_CPU_THREADS"


def cpu_threads() -> int:
    """Threads torch's CPU path runs with in every variant's child: `CASEBOOK_CPU_THREADS` if set, else the
    CPUs this process may run on. Set explicitly (torch's own default follows the physical cores and its
    build) and stored with each point, so a timing says how many threads it had."""
    value = os.environ.get(CPU_THREADS_ENV, "").strip()
    if value:
        return max(1, int(value))
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def busy_ticks() -> tuple[int, int] | None:
    """(ticks the CPUs this process may run on spent busy since boot, how many of them) from /proc/stat's
    per-CPU lines; idle and I/O wait are not busy. A process pinned to its share of the host's cores (a
    pool's worker, `casebook.run.pool`) judges its own cores, not the ones its neighbours were given."""
    try:
        lines = Path("/proc/stat").read_text().splitlines()
    except OSError:
        return None
    try:
        mine = os.sched_getaffinity(0)
    except AttributeError:  # not Linux
        mine = None
    busy = cpus = 0
    for line in lines[1:]:
        name, *fields = line.split()
        if not (name.startswith("cpu") and name[3:].isdigit()) or (mine is not None and int(name[3:]) not in mine):
            continue
        user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in fields[:8])
        busy += user + nice + system + irq + softirq + steal  # guest time is already inside user
        cpus += 1
    return (busy, cpus) if cpus else None


def own_cpu_s() -> float:
    """CPU time of this process (every thread) and of its children that have ended, in seconds."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


_run_processes: tuple[int, ...] = ()
"""Processes of this run besides this one, whose CPU time (and their descendants') a window counts as the
run's own, not the others': in a variant's child, its parent and the parent's other children (the reference's,
the next variant's starting: `casebook.run.isolate`); in a rank, its sibling ranks and the process that launched
them (`casebook.run.distributed`). Empty in a process that times in itself (the ceilings)."""


POOL_ENV = "CASEBOOK_POOL"
"""`<the pool's pid>/<its devices>`, in a pool worker's environment from its start (`casebook.run.pool`) and so in
its children's. A case prestarted on a busy device and the case it waits for carry the same value: each is the
other's run, as the next variant's child starting beside a timing is (`run_roots`)."""


def slot_workers() -> list[int]:
    """The pool's workers on this process's devices, this one's own worker among them (the pool's children
    that started with this process's `POOL_ENV`): none outside a pool. Read from /proc."""
    mark = os.environ.get(POOL_ENV)
    if not mark:
        return []
    pool, want = mark.split("/", 1)[0], f"{POOL_ENV}={mark}".encode()
    try:  # the pool's main thread starts its workers: its children, in one read (where the kernel lists them)
        kids = Path(f"/proc/{pool}/task/{pool}/children").read_text().split()
    except OSError:
        kids = [e.name for e in Path("/proc").glob("[0-9]*")
                if (st := _stat(e.name)) is not None and str(st[0]) == pool]
    out = []
    for pid in kids:
        try:
            if want in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                out.append(int(pid))
        except OSError:
            continue
    return out


def run_roots() -> list[int]:
    """The processes whose trees are this run's own, besides this process: those counted (`count_as_own`) and a
    pool's workers on these devices (`slot_workers`: the case prestarted beside this one, starting its children)."""
    return sorted({*_run_processes, *slot_workers()} - {os.getpid()})


def count_as_own(pids) -> None:
    """Count the CPU time of `pids` and their descendants as this run's own in every window from now on
    (this process itself is counted already, and never twice)."""
    global _run_processes
    _run_processes = tuple(sorted({int(p) for p in pids} - {os.getpid()}))


def _stat(pid: str) -> tuple[int, int] | None:
    """(parent pid, CPU ticks: user + system of every thread, and of the ended children it waited for) from
    /proc/<pid>/stat; None where the process is gone or unreadable."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()  # the name, in parentheses, may hold spaces
    try:
        return int(fields[1]), sum(int(v) for v in fields[11:15])  # ppid; utime, stime, cutime, cstime
    except (IndexError, ValueError):
        return None


def tree_cpu_s(roots) -> float:
    """CPU seconds of the processes `roots` and of all their live descendants (every thread, and the ended
    children each waited for), read from /proc; this process and its own descendants are left out (its
    time is `own_cpu_s`'s). 0 for a root that is gone."""
    return sum(_tree(roots).values()) / CLOCK_TICKS


def tree_pids(roots) -> set[int]:
    """The live processes of `roots`' trees, this process and its descendants left out."""
    return set(_tree(roots))


def _tree(roots) -> dict[int, int]:
    """{pid: CPU ticks} of each live process in the trees of `roots`, this process and its descendants left out."""
    me = os.getpid()
    stats = {}
    try:
        entries = list(Path("/proc").iterdir())
    except OSError:  # not Linux
        return 0.0
    for entry in entries:
        if entry.name.isdigit() and (st := _stat(entry.name)) is not None:
            stats[int(entry.name)] = st
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in stats.items():
        children.setdefault(ppid, []).append(pid)
    ticks, todo = {}, [p for p in roots if p != me]
    while todo:
        pid = todo.pop()
        if pid in ticks or pid not in stats:
            continue
        ticks[pid] = stats[pid][1]
        todo += [c for c in children.get(pid, []) if c != me]
    return ticks


def run_queue_wait_s() -> float | None:
    """Seconds this thread has waited, runnable, for a CPU (/proc/thread-self/schedstat, field 2)."""
    try:
        return int(Path("/proc/thread-self/schedstat").read_text().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return None


def load_average() -> list[float] | None:
    """The 1, 5 and 15 minute load averages."""
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except OSError:
        return None


class Window:
    """Readings over one timing: opened before its first repetition, closed after its last."""

    def __init__(self) -> None:
        self.start = time.perf_counter()  # first, and last in `close`: the window holds its own readings
        self.load_start = load_average()
        self.run = run_roots()
        self.siblings = tree_cpu_s(self.run) if self.run else 0.0
        self.busy, self.own, self.wait = busy_ticks(), own_cpu_s(), run_queue_wait_s()

    def close(self) -> dict:
        """{window_s, other_cpu_s, cpus, run_queue_wait_s, load_average}: `other_cpu_s` is the CPU time every
        CPU was busy over the window less this process's own (so: other processes', to within a tick per CPU).
        In a run of several processes (`count_as_own`), less theirs as well, which is kept as `run_cpu_s`: a
        rank's siblings are the same run, not a busy machine."""
        # a case prestarted during the window is the run's from its start
        roots = sorted({*self.run, *slot_workers()} - {os.getpid()})
        siblings = tree_cpu_s(roots) if roots else 0.0  # read just before the busy time, as in __init__
        busy, own, wait = busy_ticks(), own_cpu_s(), run_queue_wait_s()
        window_s = time.perf_counter() - self.start
        out: dict = {"window_s": window_s, "load_average": load_average(), "load_average_start": self.load_start}
        if busy is not None and self.busy is not None:
            run = max(0.0, siblings - self.siblings)
            out["other_cpu_s"] = max(0.0, (busy[0] - self.busy[0]) / CLOCK_TICKS - (own - self.own) - run)
            out["cpus"] = busy[1]
            if roots:
                out["run_cpu_s"] = run
        if wait is not None and self.wait is not None:
            out["run_queue_wait_s"] = wait - self.wait
        return out


def gpu_state() -> dict | None:
    """The GPU's SM and memory clocks (MHz) and the compute processes on it other than this process, its
    parent and the run's other processes (`count_as_own`), through NVML (pynvml) where installed, else
    nvidia-smi; None where neither answers. In a container the process list may be empty whatever runs
    (another PID namespace): an empty list then says nothing either way."""
    device = (os.environ.get("CUDA_VISIBLE_DEVICES") or "0").split(",")[0].strip()
    index = int(device) if device.isdigit() else 0
    state = _nvml_state(index) or _nvidia_smi_state(device)
    if state is None:
        return None
    mine = run_family() | tree_pids(run_roots())  # the run's workers; a multi-device run's ranks, a prestarted
    # case's worker, and their trees
    return {**state, "other_processes": sorted(p for p in state["other_processes"] if p not in mine)}


def run_family() -> set[int]:
    """This process, its parent, and the parent's other children: the run's own workers (the reference's
    child holds a CUDA context of its own beside the variant's), which are not another tenant. Read from
    /proc where there is one."""
    parent = os.getppid()
    mine = {os.getpid(), parent}
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            if int(fields[1]) == parent:
                mine.add(int(entry.name))
        except (OSError, ValueError, IndexError):
            continue
    return mine


@functools.cache
def _nvml():
    """NVML, initialised once a process (pynvml, from nvidia-ml-py); None where it is not installed or finds no
    driver. Its queries take microseconds where nvidia-smi's two took a tenth of a second a point."""
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml
    except Exception:  # not installed, or no driver
        return None


def gpu_reader() -> str:
    """How the GPU's state is read at every timed point, as a run's progress says it: NVML, or nvidia-smi where
    nvidia-ml-py is not installed (two calls a point, a tenth of a second of each point's wall time)."""
    if _nvml() is not None:
        return "NVML"
    return "nvidia-smi, twice a point (about 0.1 s each point; `pip install nvidia-ml-py` reads NVML in microseconds)"


def _nvml_state(index: int) -> dict | None:
    pynvml = _nvml()
    if pynvml is None:
        return None
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        return {"sm_clock_mhz": float(pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM)),
                "mem_clock_mhz": float(pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_MEM)),
                "other_processes": [p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)]}
    except Exception:  # an NVML error: nvidia-smi may still answer
        return None


def _nvidia_smi_state(device: str) -> dict | None:
    query = lambda *args: subprocess.run(["nvidia-smi", "-i", device, *args, "--format=csv,noheader,nounits"],  # noqa: E731
                                         capture_output=True, text=True, timeout=10).stdout
    try:
        sm, mem = (v.strip() for v in query("--query-gpu=clocks.sm,clocks.mem").splitlines()[0].split(","))
        pids = [int(v) for v in query("--query-compute-apps=pid").split() if v.strip().isdigit()]
        return {"sm_clock_mhz": float(sm), "mem_clock_mhz": float(mem), "other_processes": pids}
    except (OSError, subprocess.SubprocessError, IndexError, ValueError):
        return None
