"""One rank of a multi-device task: a fresh interpreter (`python -m casebook.run.rank RANK WORLD PORT DEVICE`)
started by `distributed`, which joins the process group and runs each task it is sent as a single-device
child would (`child.work`), under the lockstep protocol; and the topology the ranks measure first."""

from __future__ import annotations

import contextlib
import os
import pickle
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

from casebook.result import MeasuredLink
from casebook.run.child import TopologyTask, work
from casebook.run.distributed import LINK_MESSAGE_BYTES, lockstep, rank_timeout_s, run_ranks, shutdown
from casebook.run.interference import count_as_own
from casebook.run.messages import TopologyRun, read
from casebook.run.transport import encode


def measure_topology(n: int, device: str, timeout_s: float | None = None) -> MeasuredLink:
    """The devices, their link and its measured bus bandwidth, on ranks started for it alone."""
    run = read(TopologyRun, run_ranks(TopologyTask(device, n), timeout_s))
    shutdown()
    return run.topology if isinstance(run, TopologyRun) else MeasuredLink(devices=n, error=run.error)


def topology(device: str) -> dict:
    """The devices, the link between them and its measured bus bandwidth: a large all-reduce, timed."""
    import torch
    import torch.distributed as dist

    n = dist.get_world_size()
    nbytes = LINK_MESSAGE_BYTES[device]
    buf = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    for _ in range(3):
        dist.all_reduce(buf)
    sync()
    dist.barrier()
    times = []
    for _ in range(10):
        t0 = time.perf_counter()
        dist.all_reduce(buf)
        sync()
        times.append(time.perf_counter() - t0)
    seconds = min(times)  # a ceiling, as `hardware.ceilings`: interference only ever slows a repetition
    return {"devices": n, "backend": dist.get_backend(), "link": link(device), "message_bytes": nbytes,
            "bus_gbps": 2 * (n - 1) / n * nbytes / seconds / 1e9,
            "method": f"the fastest of 10 all-reduces of {nbytes // 2**20} MB fp32; bus bytes 2(n-1)/n of the "
                      "message"}


def link(device: str) -> str:
    """`loopback` for CPU ranks; between GPUs 0 and 1, what `nvidia-smi topo -m` says (NV# is NVLink)."""
    if device != "cuda":
        return "loopback"
    try:
        text = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    for line in text.splitlines():
        cells = line.split()
        if cells and cells[0] == "GPU0" and len(cells) > 2:
            kind = cells[2]
            return "nvlink" if kind.startswith("NV") else {"PIX": "pcie", "PXB": "pcie", "PHB": "pcie",
                                                             "NODE": "pcie", "SYS": "pcie-numa"}.get(kind, kind.lower())
    return "unknown"


def main(rank: int, world: int, port: int, device: str) -> None:
    """One rank: join the group, then run each task that arrives on stdin and write its payload."""
    import datetime as dt

    import torch
    import torch.distributed as dist

    if device == "cuda":
        torch.cuda.set_device(rank)
    os.environ.setdefault("CASEBOOK_CPU_THREADS", str(max(1, (os.cpu_count() or 1) // world)))
    dist.init_process_group("nccl" if device == "cuda" else "gloo", init_method=f"tcp://127.0.0.1:{port}",
                            rank=rank, world_size=world, timeout=dt.timedelta(seconds=rank_timeout_s()))
    while True:
        try:
            task, out, run = pickle.load(sys.stdin.buffer)
        except EOFError:
            break
        count_as_own(run)  # the sibling ranks and their launcher: this run, not a busy machine
        try:
            if task.kind == "topology":
                payload = {"status": "ran", "topology": topology(device)}
            else:
                payload = work(replace(task, devices=1, protocol=lockstep(task.protocol, task.device)))
            payload = {**payload, "rank": rank}
        except Exception as e:  # recorded like a raising task in `isolate`
            payload = {"status": "crashed", "error": f"{type(e).__name__}: {e}"}
        Path(out + ".part").write_bytes(encode(payload))  # data and tensors, never code (`transport.encode`)
        os.replace(out + ".part", out)  # whole or absent
    with contextlib.suppress(Exception):
        dist.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
