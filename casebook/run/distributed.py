"""One task of a multi-device case, run on its ranks: one process per device, each rank's answer gathered.

`child.work` hands a task here when its case declares `kernel.devices > 1`. The ranks are started as
fresh interpreters (`python -m casebook.run.rank`), since the measuring child is a daemon process and
may not fork children of its own through multiprocessing; they live as long as the measuring child
(one variant's tasks). Each rank joins a process group (NCCL on GPUs, gloo over loopback on a CPU),
runs the single-device path of `child.work` on each task it is sent, and writes its payload; the
slowest rank's timing is the point's. Each task tells the ranks the run's process ids (theirs and the
launcher's): a rank's reading of the machine counts its siblings' CPU as the run's own, not as other
processes' (`interference.count_as_own`), so that two ranks on one machine are not a busy machine to each
other, while any other process still is. A rank that dies or hangs past `rank_timeout_s()`
ends the others, and the task is recorded as crashed or timed out, like any variant's.
"""

from __future__ import annotations

import contextlib
import math
import os
import pickle
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from casebook.result import Protocol
from casebook.run.transport import decode


def rank_timeout_s() -> float:
    """All ranks of a task must answer within this (`CASEBOOK_RANK_TIMEOUT_S`, default 300 s: under `isolate`'s
    per-task limit, so the ranks are ended here, not orphaned by the measuring child's death). Read when a task
    runs: the child's environment is set after this module is imported."""
    return float(os.environ.get("CASEBOOK_RANK_TIMEOUT_S", "300"))

FIXED_REPS = {"cuda": 100, "cpu": 20}
"""Repetitions every rank times: a collective must be called as often on every rank, so the stopping
rule cannot be each rank's own (a confidence interval or a time cap would end them at different counts)."""

LINK_MESSAGE_BYTES = {"cuda": 256 * 2**20, "cpu": 16 * 2**20}
"""The all-reduce whose bus bandwidth is the measured link ceiling: 256 MB on GPUs (past the size
where NCCL's bus bandwidth levels off), 16 MB over gloo on a CPU."""


LOCKSTEP = (f"each rank times the same repetitions (two warm-up calls, then {FIXED_REPS['cuda']} on a GPU, "
            f"{FIXED_REPS['cpu']} on a CPU), every rank meeting the others at a barrier after its flush and before "
            "each repetition, outside its time; each rank's median kept, the slowest rank's the point's")
"""How a multi-device case's points are timed, as the result's protocol says it."""


def lockstep(protocol: Protocol, device: str) -> Protocol:
    """A timing protocol every rank follows to the same number of calls: two warm-up calls, then exactly
    `FIXED_REPS` repetitions (no confidence-interval or time-cap stop), the ranks meeting before each."""
    reps = min(FIXED_REPS[device], protocol.max_reps)
    return protocol.model_copy(update={"warmup_ms": 0.0, "min_reps": reps, "max_reps": reps, "target_ci": 0.0,
                                       "time_cap_s": math.inf, "rank_barrier": True})


_pool: dict = {}
"""The ranks of this measuring child, kept across its tasks (one variant's points): starting n
interpreters that import torch costs seconds, a task's timing less."""


def run_ranks(task, timeout_s: float | None = None) -> dict:
    """Run `task` on `task.devices` ranks and return one payload: the slowest rank's, with every rank's."""
    n = task.devices
    if task.device == "cuda":
        import torch

        if torch.cuda.device_count() < n:
            return {"status": "skipped", "error": f"the case needs {n} GPUs; this machine has "
                                                  f"{torch.cuda.device_count()}"}
    timeout_s = rank_timeout_s() if timeout_s is None else timeout_s
    procs, tmp = _ranks(n, task.device)
    outs = [tmp / f"task{_pool['tasks']}-rank{r}.msg" for r in range(n)]
    _pool["tasks"] += 1
    run = [os.getpid(), *(p.pid for p in procs)]  # what each rank's timing counts as the run's own CPU
    try:
        for p, out in zip(procs, outs):
            pickle.dump((task, str(out), run), p.stdin)
            p.stdin.flush()
    except (BrokenPipeError, OSError):
        pass  # a rank already dead: _wait says which
    status, error = _wait(procs, outs, timeout_s)
    if status != "ok":
        error += _stderr_tail(tmp, n)
        shutdown()
        return {"status": status, "error": error}
    return merge(task, [decode(out.read_bytes()) for out in outs])


def _ranks(n: int, device: str) -> tuple[list, Path]:
    """This child's n rank processes, started on first use (or after a failure ended the last ones)."""
    if _pool.get("key") != (n, device):
        shutdown()
        tmp = Path(tempfile.mkdtemp(prefix="casebook-ranks-"))
        port = _free_port()
        procs = [subprocess.Popen([sys.executable, "-m", "casebook.run.rank", str(r), str(n), str(port), device],
                                  stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                  stderr=open(tmp / f"rank{r}.err", "wb"), start_new_session=True,
                                  preexec_fn=_die_with_parent)
                 for r in range(n)]
        _pool.update(key=(n, device), procs=procs, tmp=tmp, tasks=0)
    return _pool["procs"], _pool["tmp"]


def shutdown() -> None:
    """End this child's ranks, if any."""
    if _pool.get("procs"):
        for p in _pool["procs"]:
            with contextlib.suppress(OSError):
                p.stdin.close()
        _end(_pool["procs"], grace_s=5.0)
        shutil.rmtree(_pool["tmp"], ignore_errors=True)
    _pool.clear()


def _wait(procs: list, outs: list, timeout_s: float) -> tuple[str, str]:
    """Wait for every rank's answer; end them all when one dies or the time runs out."""
    deadline = time.monotonic() + timeout_s
    while True:
        if all(out.exists() for out in outs):
            return "ok", ""
        codes = [p.poll() for p in procs]
        dead = [r for r, c in enumerate(codes) if c is not None and not outs[r].exists()]
        if dead:
            _end(procs)
            return "crashed", f"rank {dead[0]} died (exit code {codes[dead[0]]}); the other ranks were ended"
        if time.monotonic() > deadline:
            hung = [r for r, out in enumerate(outs) if not out.exists()]
            _end(procs)
            return "timeout", (f"rank {', '.join(map(str, hung))} gave no answer within {timeout_s:.0f} s: "
                               "all ranks ended")
        time.sleep(0.02)


def _end(procs: list, grace_s: float = 0.0) -> None:
    deadline = time.monotonic() + grace_s
    while grace_s and time.monotonic() < deadline and any(p.poll() is None for p in procs):
        time.sleep(0.02)
    for p in procs:
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
    for p in procs:
        p.wait(10)


def _stderr_tail(tmp: Path, n: int) -> str:
    for r in range(n):
        err = (tmp / f"rank{r}.err").read_text(errors="replace").strip().splitlines()
        if err:
            return f" (rank {r}: {err[-1][:300]})"
    return ""


def _die_with_parent() -> None:
    """Linux: a rank gets SIGKILL when the measuring child that started it dies (killed by `isolate`)."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def merge(task, payloads: list[dict]) -> dict:
    """One raw payload from every rank's (`casebook.run.judge` judges it as any child's): a rank that did not run
    decides; else the slowest rank's, by its median time (its reading of the machine), with every rank's
    outputs (`rank_calls`, each checked), what any rank rebound or loaded, and every rank's repetitions and
    reading beside it (`rank_times_us`, from which the parent takes each rank's
    median and the slowest again, `judge.slowest_rank`; `rank_interference`, each judged by `stability`)."""
    for r, p in enumerate(payloads):
        if p.get("status") not in ("ran", "ok"):
            return {**p, "error": f"rank {r}: {p.get('error')}"}
    key = {"point": "times_us", "end_to_end": "scenario_times_us"}.get(task.kind)
    medians = [statistics.median(p[key]) if key and p.get(key) else None for p in payloads]
    r = 0
    if all(m is not None for m in medians):
        r = max(range(len(payloads)), key=lambda i: medians[i])
    out = {**payloads[r], "ranks": len(payloads), "slowest_rank": r,
           "rebound": sorted({name for p in payloads for name in p.get("rebound") or []}),
           "loaded": sorted({name for p in payloads for name in p.get("loaded") or []})}
    if task.kind == "point":  # every rank's outputs are checked, not the slowest's alone
        out["rank_calls"] = [p.get("calls") or [] for p in payloads]
    if all(m is not None for m in medians):
        out["rank_median_us"] = medians
        if task.kind == "point":
            out["rank_times_us"] = [p[key] for p in payloads]
            out["rank_interference"] = [p.get("interference") or {} for p in payloads]
    return out
