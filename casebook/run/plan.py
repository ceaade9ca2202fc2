"""A case and a machine to the tasks of a run: which variants run where, at which shapes, under which
roofs; the paired timings its speedup claims ask for."""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields

from casebook import claims as claims_mod
from casebook import paths
from casebook.case import Case, Variant
from casebook.levels import Scenario
from casebook.result import Ceilings, Point, shape_label
from casebook.roofline import Roofs
from casebook.run.bench import Protocol
from casebook.run.child import PairTask, ScenarioTask, Task
from casebook.run.oracle import OracleTask

SEED = 20261129


def placement(variant: Variant, on_gpu: bool) -> tuple[str, bool] | None:
    """Where a variant runs on this machine: (device, timed), or None when it cannot run here."""
    if on_gpu and "cuda" in variant.backends:
        return "cuda", True
    if "cpu" in variant.backends:
        return "cpu", True
    if "interpreter" in variant.backends:
        return "cpu", False
    return None


@dataclass
class Group:
    """One variant's share of a run: where it runs (`placement`), its tasks (one child process), and as the run
    goes, what the judge made of each and what the variant cost."""

    variant: Variant
    device: str | None
    """cuda or cpu; None: no backend of it here."""
    timed: bool
    tasks: list[Task]
    outcomes: list[tuple[Task, Point | Scenario]] = field(default_factory=list)
    """(task, record) as each task is judged: a `Point`, or the scenario's `levels.Scenario`."""
    wall_s: float | None = None
    """From its first task to its last, seconds; None until it ran."""
    timed_s: float | None = None
    """Of that, its timed repetitions measured in this run, seconds."""


def plan(case: Case, on_gpu: bool, protocol: Protocol, ceilings: Ceilings, only: list[str] | None = None,
         link_gbps: float | None = None) -> dict[str, Group]:
    """Tasks per variant (one child process each), levels 1 and 2 then level 3. `link_gbps`: a multi-device
    case's measured interconnect ceiling, the roof of its traffic model's link bytes."""
    k, lv = case.kernel, case.levels
    kernel_shapes = lv.kernel.shapes if on_gpu else lv.kernel.cpu_shapes
    workload = lv.workload.shapes if on_gpu else lv.workload.cpu_shapes
    e2e_shape = lv.end_to_end.shape if on_gpu else lv.end_to_end.cpu_shape
    proto = protocol.model_copy(update={"cache": lv.kernel.cache, "graph": lv.kernel.graph})
    groups: dict[str, Group] = {}
    for v in k.variants:
        if only and v.name not in only and v.name != k.baseline:
            continue
        where = placement(v, on_gpu)
        if where is None:
            groups[v.name] = Group(v, None, False, [])
            continue
        device, timed = where
        common = dict(module=k.module, variant=v.name, fn=v.fn, device=device, timed=timed, protocol=proto,
                      tolerance=v.tolerance, reference=v.reference or k.reference, inputs=k.inputs, traffic=k.traffic,
                      devices=k.devices)
        tasks = [Task(shape=s, dtype=d, level="kernel", seed=SEED + i,
                      roofs=Roofs.under(ceilings, d, link_gbps), **common)
                 for i, (s, d) in enumerate((s, d) for s in kernel_shapes for d in lv.kernel.dtypes)]
        tasks += [Task(shape=w.shape, dtype=lv.workload.dtype, level="workload", seed=SEED + 1000 + i,
                       roofs=Roofs.under(ceilings, lv.workload.dtype, link_gbps), **common)
                  for i, w in enumerate(workload)]
        if timed and v.name in (lv.end_to_end.baseline, lv.end_to_end.variant):
            tasks.append(ScenarioTask(shape=e2e_shape, dtype=lv.end_to_end.dtype, level="end_to_end",
                              seed=SEED + 2000, scenario=lv.end_to_end.scenario,
                              scenario_inputs=lv.end_to_end.inputs, **common))
        groups[v.name] = Group(v, device, timed, tasks)
    return groups


COMPILE_CACHES = {"TORCHINDUCTOR_CACHE_DIR": "inductor", "TRITON_CACHE_DIR": "triton"}
"""Where Inductor's and Triton's compiled kernels are kept, under casebook's cache (the caller's choice wins)."""


CPU_MALLOC = "glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=268435456"
"""glibc's allocator for a child timed on a CPU: blocks up to 32 MiB from the heap, and the heap not handed back
to the system under 256 MiB free. By default a freed block of over 128 KiB goes back to the system and the
next call faults fresh zeroed pages in, or not, as the allocator's sliding threshold stands: the rmsnorm case's
eager rung at 64 x 4096 bf16 timed bimodally, 265 or 1100-1300 us within one point, and `casebook check`
refused it as unstable; pinned to one core, 200 calls read p10-p90 481-1331 us by default and 277-397 us with
these settings. A kernel is timed as it runs in a process whose allocator is warm (a server's, or
jemalloc's and tcmalloc's as PyTorch's CPU guides advise), not on its page faults."""


def variant_env(*, interpreted: bool, devices: int = 1, cpu: bool = False) -> dict[str, str]:
    """Environment of a variant's child process. Triton's interpreter where Triton kernels are checked
    on a CPU. The compilers' caches under casebook's cache unless the caller chose others (`COMPILE_CACHES`),
    with Triton's autotuning picks kept there too (`TRITON_CACHE_AUTOTUNING`): torch.compile and
    `triton.autotune` benchmark candidate kernels at their first call and keep the winner, so consecutive
    runs measure the same kernels instead of re-deciding per process, and a second run on a machine does not
    compile and tune again (on the H200 the softmax ladder's first calls, compilation and autotuning, were
    164 s of a fresh run's 280 s of points). Inductor compiles in the child itself (`TORCHINDUCTOR_COMPILE_THREADS`
    1): its pool of compiling processes, busy beside the timing, took up to a core and left the timing thread
    waiting for a CPU 22% of a timing on a 16-core H200 host. A multi-device case's children are told its device count
    (`CASEBOOK_DEVICES`): the reference's child makes every rank's inputs without joining the ranks. A child
    that times on a CPU (`cpu`) gets a warm allocator (`CPU_MALLOC`), unless the caller set GLIBC_TUNABLES."""
    env = {"TRITON_INTERPRET": "1"} if interpreted else {}
    if devices > 1:
        env["CASEBOOK_DEVICES"] = str(devices)
    for var, folder in COMPILE_CACHES.items():
        if var not in os.environ:
            env[var] = str(paths.CACHE_DIR / folder)
    if "TRITON_CACHE_AUTOTUNING" not in os.environ:
        env["TRITON_CACHE_AUTOTUNING"] = "1"
    if "TORCHINDUCTOR_COMPILE_THREADS" not in os.environ:
        env["TORCHINDUCTOR_COMPILE_THREADS"] = "1"
    if cpu and "GLIBC_TUNABLES" not in os.environ:
        env["GLIBC_TUNABLES"] = CPU_MALLOC
    return env


def traffic_task(case: Case) -> OracleTask:
    """The traffic model at the case's first level-1 (GPU) shape and first dtype, in a child like the rest."""
    k = case.kernel
    return OracleTask(module=k.module, shape=case.levels.kernel.shapes[0], dtype=case.levels.kernel.dtypes[0],
                      device="cpu", traffic=k.traffic)


PAIR_TIME_CAP_S = 0.5
"""A paired timing's each measurement stops here at the latest; a shape takes 12 of them."""


def pair_tasks(case: Case, slug: str, groups: dict[str, Group], protocol: Protocol) -> list[PairTask]:
    """A paired timing (`child._pair`) for each point of each kernel-level speedup claim that names its
    shapes and applies here, where both variants were timed and measured ok in the ladder."""
    ok = {(t.variant, shape_label(t.shape), t.dtype): t for g in groups.values()
          for t, p in g.outcomes if t.kind == "point" and t.level == "kernel" and p.status == "ok"}
    cap = min(protocol.time_cap_s, PAIR_TIME_CAP_S)
    tasks, seen = [], set()
    for claim in case.claims:
        if (claim.kind != "speedup" or claim.level != "kernel" or claim.where.shapes is None
                or (claim.hardware is not None and slug not in claim.hardware)):
            continue
        for shape in claim.where.shapes:
            for dtype in claim.where.dtypes or case.levels.kernel.dtypes:
                mine = ok.get((claim.variant, shape_label(shape), dtype))
                over = ok.get((claim.over, shape_label(shape), dtype))
                key = claims_mod.pair_key(claim.variant, claim.over, shape, dtype)
                if mine is None or over is None or mine.device != over.device or key in seen:
                    continue
                seen.add(key)
                point = {f.name: getattr(mine, f.name) for f in fields(Task)}
                tasks.append(PairTask(**{**point, "protocol": mine.protocol.model_copy(update={"time_cap_s": cap})},
                                      over=claim.over, over_fn=over.fn))
    return tasks
