"""Past one host: one Ray task a case, each asking Ray for the GPUs it needs, the result returned to the caller.

Ray is the engine: it places each task on a node with free GPUs (of the hardware asked for, through a
resource label), pins it there with `CUDA_VISIBLE_DEVICES`, retries it once where its worker dies, and
carries the result back. Nothing here queues, schedules or transports. Needs the `cluster` extra (ray).

A node offers its kind of GPU as a resource named `hardware_resource(slug)`, one unit a GPU, e.g.
`ray start --address HEAD:6379 --num-gpus 8 --resources '{"hardware:nvidia-h200": 8}'`; `--hardware
nvidia-h200` then sends each case to such a node, asking one unit a device it takes.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Callable

from casebook.run.pool import Job, Outcome, Work, cpu_shares

RETRIES = 1
"""Ray's `max_retries`: a task whose worker process dies runs once more (wherever Ray places it)."""

SHIP_EXCLUDES = [".git", "site", "results"]
"""What of the book is not sent to the cluster's nodes (Ray's `working_dir` also leaves out what .gitignore
does): the results come back as the tasks' return values, and are written here."""


def hardware_resource(slug: str) -> str:
    """The Ray resource a node of this kind of GPU offers: `hardware:<slug>`."""
    return f"hardware:{slug}"


def task_options(job: Job, hardware: str | None) -> dict:
    """A case's resource request: a GPU a device it takes (`topology.devices`), and as many units of the
    hardware's label where one is asked for."""
    opts = {"num_gpus": job.devices, "max_retries": RETRIES, "retry_exceptions": False}
    if hardware:
        opts["resources"] = {hardware_resource(hardware): job.devices}
    return opts


def ship(root: Path) -> dict:
    """The runtime environment that sends the book at `root` (its cases and the casebook package) to every
    node, and numbers GPUs as nvidia-smi does there (PCI bus order), so a result's recorded index is its GPU."""
    return {"working_dir": str(root), "excludes": SHIP_EXCLUDES, "env_vars": {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}}


def _task(work: Work, case: str, args: dict) -> dict:
    """One case on the GPUs Ray gave this task, pinned to their share of the node's cores."""
    import ray

    gpus = [str(g) for g in ray.get_gpu_ids()]
    node = ray.get_runtime_context().get_node_id()
    total = next((int(n["Resources"].get("GPU", 0)) for n in ray.nodes() if n["NodeID"] == node), 0)
    if gpus and total and hasattr(os, "sched_setaffinity"):
        shares = cpu_shares(total)
        os.sched_setaffinity(0, {c for g in gpus if g.isdigit() and int(g) < total for c in shares[int(g)]}
                             or os.sched_getaffinity(0))
    started = time.monotonic()
    doc = work(Path(case), args, lambda event, info: None)
    return {"doc": doc, "node": ray.util.get_node_ip_address(), "gpus": gpus,
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"), "seconds": time.monotonic() - started}


def run_on_ray(jobs: list[Job], work: Work, args: dict, *, address: str | None, hardware: str | None = None,
               runtime_env: dict | None = None,
               on_event: Callable[[str, dict], None] | None = None) -> list[Outcome]:
    """Send every job to Ray (connecting to `address` unless Ray is already initialised in this process) and
    wait for them as they finish; `on_event("done", {"outcome": ...})` for each, as in `casebook.run.pool`."""
    import ray

    emit = on_event or (lambda kind, info: None)
    if not ray.is_initialized():
        ray.init(address=address, runtime_env=runtime_env, log_to_driver=False)
    remote = ray.remote(_task)
    started = time.monotonic()
    offered = ray.cluster_resources()
    outcomes: dict[int, Outcome] = {}
    refs = {}
    for i, job in enumerate(jobs):
        opts = task_options(job, hardware)
        short = lacking(opts, offered)
        if short:  # Ray would hold it for a node that is not there
            outcomes[i] = Outcome(job, "unplaced", error=short, where="ray")
            emit("done", {"outcome": outcomes[i]})
            continue
        refs[remote.options(**opts).remote(work, str(job.case), args)] = i
        emit("start", {"case": job.case, "devices": (), "attempt": 1, "pid": None})
    waiting = list(refs)
    while waiting:
        ready, waiting = ray.wait(waiting, num_returns=1)
        i = refs[ready[0]]
        outcomes[i] = _outcome(jobs[i], ready[0], time.monotonic() - started)
        emit("done", {"outcome": outcomes[i]})
    return [outcomes[i] for i in range(len(jobs))]


def lacking(opts: dict, offered: dict) -> str | None:
    """What the cluster lacks, in all, of what a task asks for (None: it offers enough)."""
    wants = {"GPU": opts.get("num_gpus", 0), **opts.get("resources", {})}
    short = [f"{n:g} {name} (the cluster offers {offered.get(name, 0):g})" for name, n in wants.items()
             if n and offered.get(name, 0) < n]
    return "needs " + ", ".join(short) if short else None


def _outcome(job: Job, ref, waited: float) -> Outcome:
    import ray
    from ray.exceptions import RayTaskError

    try:
        got = ray.get(ref)
    except RayTaskError as e:  # the run raised on the node: recorded, not retried
        return Outcome(job, "error", error=str(e).strip().splitlines()[-1], seconds=waited, where="ray")
    except ray.exceptions.RayError as e:  # its worker died on every attempt, its node was lost, ...
        return Outcome(job, "crashed", error=f"{type(e).__name__}: {str(e).strip().splitlines()[0]}",
                       seconds=waited, where="ray")
    gpus = tuple(got["gpus"])
    return Outcome(job, "ok", gpus, doc=got["doc"], seconds=got["seconds"],
                   attempts=[{"devices": list(gpus), "status": "ok", "seconds": got["seconds"]}],
                   where=f"{got['node']} gpu {','.join(gpus) or '-'}")
