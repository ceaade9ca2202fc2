"""This machine: who it is (its slug, its software, its checkout's state) and its ceilings, measured here and cached
per machine (the datasheet peaks beside them are `casebook.datasheets`')."""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import platform
import subprocess
import time
from pathlib import Path

from casebook import paths, stability
from casebook.datasheets import datasheets
from casebook.evidence import ceilings_problems
from casebook.result import Ceilings, Interference, Machine, slug
from casebook.run.bench import Protocol, time_fn
from casebook.run.interference import Window

CEILINGS_VERSION = 7
"""Bumped when what is cached changes meaning; 5: only ceilings measured on a quiet machine are cached, so
an older cache, which may hold a busy machine's, is measured again; 6: every matmul rate is measured in its own
dtype (5 copied fp32's to fp64, and on a CPU to every dtype); 7: a read-only and a write-only stream are measured
beside the copy."""

MATMUL_SHAPES = [(8192, 8192, 8192), (4096, 4096, 4096), (2048, 28672, 4096), (2048, 2048, 16384)]
"""m x n x k shapes whose fastest torch.matmul is the compute ceiling (the last two: gemm_tiled shapes
where kernels outran the 8192^3 rate on an H200)."""
MATMUL_REST_S = 0.5
"""Idle time before each ceiling matmul, for the clock to recover from the power limit. 2 s brought an H200
back from 3 s of matmuls at its power limit; each ceiling matmul is timed for a few tens of milliseconds, so
the GPU is never hot for long (docs/method.md, 3: "Ceilings are measured rested")."""
MATMUL_BEST_SHAPES = 2
"""bf16 and tf32 are timed at every `MATMUL_SHAPES`; fp16 and fp8 at this many of them, the fastest for bf16. At
bf16's two fastest, tf32 read 3.6-4.7% under the rate over every shape (408 and 403 against 423 TFLOP/s on an H200)
where fp16 and bf16 agreed within 1%: its fastest shape is likely not bf16's, so it is timed at each (1-2 s more)."""


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


MODEL_NOISE = r"\((r|tm)\)|\b(cpu|processor|\d+-core)\b|@.*$"
"""Words of a CPU's model name that tell no two machines apart: trademarks, "CPU", "Processor",
"64-Core" (the core count comes from the machine), the clock after "@"."""

MEMORY_CLASSES_GIB = sorted({m * 2**k for k in range(12) for m in (1, 1.5)} - {1.5})
"""1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, ... GiB: a machine's memory, to the nearest (in ratio) of these,
is its class. MemTotal reads a little under the installed size (the kernel keeps some), and differs between
boots; the class does not."""


def memory_class_gib(total_bytes: int) -> float:
    """The memory class (`MEMORY_CLASSES_GIB`) nearest to `total_bytes` in ratio: 23.5 GiB -> 24."""
    import math

    gib = total_bytes / 2**30
    return min(MEMORY_CLASSES_GIB, key=lambda c: abs(math.log(gib / c)))


def cpu_slug(model: str, cores: int, memory_bytes: int | None) -> str:
    """A CPU machine's hardware name: `cpu-<model>-<cores>c-<memory class>g`, e.g. `cpu-amd-epyc-7b13-2c-24g`
    or `cpu-intel-xeon-2c-24g`. The model alone is not a machine: one "AMD EPYC" name once stood for a
    46 GB/s and a 16-19 GB/s copy ceiling; the cores (logical CPUs) and the memory class tell such
    machines apart. The model is the name less `MODEL_NOISE`, at most 32 characters."""
    import re

    name = slug(re.sub(MODEL_NOISE, " ", model, flags=re.IGNORECASE))[:32].strip("-") or "unknown"
    memory = f"-{memory_class_gib(memory_bytes):g}g" if memory_bytes else ""
    return f"cpu-{name}-{cores}c{memory}"


def memory_bytes() -> int | None:
    """Installed memory as /proc/meminfo's MemTotal; None where unreadable."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def device_memory_bytes(device: str) -> int:
    """The memory of the device a run judges on: a GPU's (the first visible) where `device` is one and CUDA is
    there, else the host's; 8 GiB where neither can be read."""
    if device == "cuda":
        import torch

        if torch.cuda.is_available():
            return torch.cuda.get_device_properties(0).total_memory
    return memory_bytes() or 8 * 2**30


def identify(devices: int = 1) -> Machine:
    """Which machine this is: slug, name, kind, the datasheet entry if any. Over one device, the devices a
    case runs on together are the machine: `-x<devices>` on the slug (2 H200s and 8 are different machines)."""
    ident = _identify()
    if devices > 1:
        return Machine(**{**ident.given(), "slug": f"{ident.slug}-x{devices}", "devices": devices})
    return ident


def _identify() -> Machine:
    import torch

    if torch.cuda.is_available():
        name = torch.cuda.get_device_name(0)
        for key, spec in datasheets().items():
            if any(m in name for m in spec["match"]):
                return Machine(slug=key, name=name, kind="gpu", datasheet=spec)
        return Machine(slug=slug(name), name=name, kind="gpu", datasheet=None)
    model, cores, memory = cpu_model(), os.cpu_count() or 1, memory_bytes()
    return Machine(slug=cpu_slug(model, cores, memory), name=model, kind="cpu", datasheet=None, cores=cores,
                   memory_gib=round(memory / 2**30, 1) if memory else None)


def environment() -> dict:
    """Everything about the software and device that a result depends on."""
    import torch

    env = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
    }
    try:
        import triton

        env["triton"] = triton.__version__
    except ImportError:
        env["triton"] = None
    env.update(_git(), casebook_sha256=source_sha256())
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        env.update(device_name=p.name, sm_count=p.multi_processor_count, memory_gb=round(p.total_memory / 1e9, 1),
                   l2_mb=round(getattr(p, "L2_cache_size", 0) / 2**20, 1), capability=f"{p.major}.{p.minor}")
        env.update(_nvidia_smi())
    env["device"] = device()
    return env


def device() -> dict:
    """Which device of the host ran: what `CUDA_VISIBLE_DEVICES` named (a pool's or Ray's pinning), and on a
    GPU its UUID and PCI bus id (nvidia-smi), so that two GPUs of one host are told apart in the results."""
    out: dict = {"cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}
    out.update(_nvidia_smi(("uuid", "pci.bus_id")))
    return out


def visible_device() -> str:
    """The first device `CUDA_VISIBLE_DEVICES` names (an index or a UUID, as nvidia-smi's `-i` takes them);
    "0" where unset. nvidia-smi ignores `CUDA_VISIBLE_DEVICES`, so its queries name the device."""
    return (os.environ.get("CUDA_VISIBLE_DEVICES") or "0").split(",")[0].strip() or "0"


def clocks() -> dict:
    """SM and memory clocks now (MHz), where nvidia-smi answers."""
    return _nvidia_smi(("clocks.sm", "clocks.mem", "temperature.gpu", "power.draw"))


def _nvidia_smi(fields=("driver_version", "clocks.max.sm", "clocks.max.mem", "power.limit")) -> dict:
    try:
        out = subprocess.run(["nvidia-smi", "-i", visible_device(), f"--query-gpu={','.join(fields)}",
                              "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10).stdout.splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        return {}
    return {f.replace(".", "_"): v.strip() for f, v in zip(fields, out.split(","))}


def source_sha256(root: Path | None = None) -> str:
    """sha256 over casebook's own Python sources (path and bytes, in path order): the harness that
    measured, identified without git. A working copy on another machine can carry an older HEAD and
    local changes; this names the code that actually ran."""
    root = root or Path(__file__).resolve().parents[1]  # casebook/
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


MEASURED_PATHS = ("casebook", "cases", "pyproject.toml")
"""What a run measures with, in a checkout: the harness and the kernels, the cases, the declared dependencies. An
edit there makes a run `casebook_dirty`; a result a run stored in results/ (the run before it, in a batch) does
not."""


def _git() -> dict:
    root = Path(__file__).resolve().parents[2]
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True,
                                timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", *MEASURED_PATHS],
                               cwd=root, capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return {"casebook_commit": None, "casebook_dirty": None}
    if len(commit) != 40:  # not a git checkout (a copied tree): say nothing rather than something wrong
        return {"casebook_commit": None, "casebook_dirty": None}
    return {"casebook_commit": commit, "casebook_dirty": bool(dirty)}


# --- measured ceilings -------------------------------------------------------------------------

LAUNCH_DELAY_US = 100.0
"""The device-side delay before each repetition of the launch ceiling's 200 launches, fixed: the host's pace of
issue is what that ceiling measures, so the delay does not hide it (the kernels' timings' least delay, 300 us,
would queue more of them first)."""

CEILING_ATTEMPTS = 3
"""Measurements of the ceilings before a busy machine's are used as they are (and not cached)."""


def ceilings(remeasure: bool = False) -> dict:
    """Measured ceilings of this machine, from the cache unless asked to measure again.

    Only a measurement taken on a quiet machine (`casebook.stability`'s bounds on other processes' CPU
    and on waiting for a CPU) is cached: a copy ceiling measured beside a busy process read 3.7 GB/s on
    a 2-core box whose quiet copy is several times that, and every honest kernel timed against it later
    was refused as faster than physics. A busy measurement is taken again, up to `CEILING_ATTEMPTS`
    times, keeping each ceiling's best (interference only ever slows); if the machine stays busy, the
    ceilings are used for this run with the reasons under `unstable`, and measured again next time."""
    import tempfile

    import torch

    ident = identify()
    path = cache_path(ident)
    if not remeasure and path.exists():
        try:
            cached = json.loads(path.read_text())
        except (OSError, ValueError):
            cached = {}
        if (isinstance(cached, dict) and cached.get("version") == CEILINGS_VERSION
                and cached.get("torch") == torch.__version__ and not cached.get("unstable")
                and cached_valid(cached) and not ceilings_implausible(cached, ident)):
            return cached
    measure = measure_gpu if ident.kind == "gpu" else measure_cpu
    measured: dict = {}
    t0 = time.perf_counter()
    for _ in range(CEILING_ATTEMPTS):
        window = Window()
        attempt = measure()
        reading = window.close()
        measured = best_of(measured, attempt) if measured else attempt
        # On a GPU the ceilings are the device's: the host's other processes do not slow a copy or a matmul
        # there, and the measurement rests the clock between matmuls, so only a CPU's reading is judged.
        busy = stability.reading_reasons(Interference(**reading)) if ident.kind == "cpu" else []
        measured.update(interference=reading, unstable=busy or None)
        if not measured["unstable"]:
            break
    measured.update(version=CEILINGS_VERSION, torch=torch.__version__, slug=ident.slug,
                    measure_s=round(time.perf_counter() - t0, 2),
                    measured_at=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))
    if not measured["unstable"]:
        paths.CACHE_DIR.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=paths.CACHE_DIR, prefix=f".{path.stem}.", suffix=".tmp")  # one a process:
        with os.fdopen(fd, "w") as f:                                                     # a pool's side by side
            f.write(json.dumps(measured, indent=1))
        os.replace(tmp, path)
    return measured


def cache_path(ident: Machine | None = None) -> Path:
    """Where this machine's ceilings are cached (`ceilings`)."""
    return paths.CACHE_DIR / f"ceilings-{ceilings_key(ident or identify())}.json"


def provenance_of(measured: dict, since: float) -> str:
    """Whether `measured` was measured by this process (after `since`, a `time.time()`) or read from the cache,
    and when and where, in words: a run says which ceilings it is placed under."""
    when = measured.get("measured_at")
    took = f" in {measured['measure_s']:.1f} s" if measured.get("measure_s") is not None else ""
    if when and datetime.datetime.fromisoformat(when).timestamp() >= since - 1:
        return f"measured now{took}"
    return (f"read from the cache {cache_path()} (measured {when or 'at an unrecorded time'}{took}; "
            "`casebook hardware --remeasure` measures them again)")


def ceilings_key(ident: Machine) -> str:
    """The ceilings' cache name: the slug, and on a GPU the device's UUID, so that each GPU of a host is
    measured on itself (a pool's workers, one a GPU; the site counts two GPUs as one machine only where
    their ceilings agree, `roofline.ceilings_apart`)."""
    if ident.kind != "gpu":
        return ident.slug
    uuid = _nvidia_smi(("uuid",)).get("uuid") or visible_device()
    return f"{ident.slug}-{slug(uuid)}"


def ceilings_implausible(measured: dict, ident: Machine) -> list[str]:
    """Why cached ceilings cannot be this machine's (empty: they can): a rate that is no positive number, or
    one beyond the datasheet's peak (`evidence.ceilings_problems`). The cache is a file any process of the
    user can write, a variant's child among them: read back, it is measured again rather than believed."""
    rates = [measured.get("copy_gbps"), measured.get("launch_us"),
             *(measured[k] for k in ("read_gbps", "write_gbps") if measured.get(k) is not None),
             *((measured.get("matmul_tflops") or {}).values() if isinstance(measured.get("matmul_tflops"), dict)
               else [None])]
    if not all(isinstance(r, (int, float)) and r > 0 and r == r and r != float("inf") for r in rates):
        return ["a ceiling is not a positive number"]
    return ceilings_problems(Ceilings(**measured), ident.datasheet)


def cached_valid(cached: dict) -> bool:
    """Whether a cached file is ceilings as a result records them (the cache is a file any process of the user can
    write: one with a key of its own, or a rate that is not a number, is measured again, not believed)."""
    from pydantic import ValidationError

    try:
        Ceilings.model_validate(cached)
    except ValidationError:
        return False
    return True


def best_of(a: dict, b: dict) -> dict:
    """Two measurements of the ceilings merged, each ceiling at its best: the higher rate, the lower cost."""
    streams = {k: max(v for v in (a.get(k), b.get(k)) if v is not None) for k in ("read_gbps", "write_gbps")
               if a.get(k) is not None or b.get(k) is not None}
    return {**b, **streams, "copy_gbps": max(a["copy_gbps"], b["copy_gbps"]),
            "matmul_tflops": {d: max(a["matmul_tflops"].get(d, 0.0), v) for d, v in b["matmul_tflops"].items()},
            "launch_us": min(a["launch_us"], b["launch_us"]),
            "graph_launch_us": min(a["graph_launch_us"], b["graph_launch_us"])}


# Ceilings take the fastest repetition, not the median: interference only ever slows a run down, and a
# ceiling measured low would let an honest kernel look faster than physics.


def measure_gpu(rest_s: float = MATMUL_REST_S, best_shapes: int | None = MATMUL_BEST_SHAPES,
                time_cap_s: float = 0.25) -> dict:
    """Copy bandwidth (read + write), a read-only and a write-only stream, dense matmul per dtype, one launch, one
    kernel inside a graph. `rest_s`, `best_shapes` (None: every shape for every dtype) and `time_cap_s` (each
    ceiling's timing) make it as thorough as before (2.0, None, 1.0: 41 s on an H200) for a comparison
    (benchmarks/explore/method/)."""
    import torch

    proto = Protocol(cache="warm", time_cap_s=time_cap_s)
    g = torch.Generator(device="cuda").manual_seed(0)
    src = torch.randn(2**28, device="cuda", generator=g)  # 1 GiB of fp32, far over L2
    dst = torch.empty_like(src)
    copy_us = time_fn(lambda: dst.copy_(src), "cuda", proto).summary.min_us  # noqa: F821 (called before the del below)
    copy_gbps = 2 * src.numel() * 4 / copy_us / 1e3
    read_gbps, write_gbps = _streams(src, dst, "cuda", proto)
    del src, dst

    # A GPU at its power limit runs matmuls at a clock set by its recent power draw, so a ceiling
    # measured hot reads low and the gate refuses honest points: each shape is timed after a rest,
    # and the ceiling is the fastest of several shapes (docs/method.md, 3: "Ceilings are measured rested").
    def rates(dtype, shapes, call=torch.matmul, b_column_major=False) -> dict:
        out = {}
        for m, n, k in shapes:
            a = torch.randn(m, k, device="cuda", generator=g).to(dtype)
            b = (torch.randn(n, k, device="cuda", generator=g).to(dtype).t() if b_column_major
                 else torch.randn(k, n, device="cuda", generator=g).to(dtype))
            torch.cuda.synchronize()
            time.sleep(rest_s)
            out[(m, n, k)] = 2 * m * n * k / time_fn(lambda a=a, b=b: call(a, b), "cuda", proto).summary.min_us / 1e6
        return out

    bf16 = rates(torch.bfloat16, MATMUL_SHAPES)
    best = sorted(bf16, key=bf16.get, reverse=True)[:best_shapes] if best_shapes else MATMUL_SHAPES
    matmul = {"bf16": max(bf16.values())}
    for name, dtype, shapes in (("fp16", torch.float16, best), ("tf32", torch.float32, MATMUL_SHAPES),
                                ("fp32", torch.float32, [(4096,) * 3]), ("fp64", torch.float64, [(4096,) * 3])):
        torch.backends.cuda.matmul.allow_tf32 = name == "tf32"
        matmul[name] = max(rates(dtype, shapes).values())
    torch.backends.cuda.matmul.allow_tf32 = False
    if hasattr(torch, "float8_e4m3fn") and hasattr(torch, "_scaled_mm"):
        one = torch.ones((), device="cuda")
        try:
            scaled_mm = lambda a, b: torch._scaled_mm(a, b, one, one, out_dtype=torch.bfloat16)  # noqa: E731
            matmul["fp8_e4m3"] = max(rates(  # _scaled_mm wants B column-major
                torch.float8_e4m3fn, best, scaled_mm, b_column_major=True).values())
        except (RuntimeError, TypeError):
            pass

    # One tiny launch, back to back: what each extra kernel in a sequence costs. Behind the fixed least
    # delay, not one that hides the host: the host's pace of issue is what this ceiling is.
    x = torch.zeros(1, device="cuda")
    n = 200
    # the host's pace scatters: a launch's fastest needs many repetitions
    proto = proto.model_copy(update={"time_cap_s": 1.0})
    launch_us = time_fn(lambda: [x.add_(1) for _ in range(n)], "cuda",
                        proto.model_copy(update={"host_slack_us": LAUNCH_DELAY_US})).summary.min_us / n

    # The same tiny kernel inside a replayed CUDA graph.
    graph = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        x.add_(1)
    torch.cuda.synchronize()
    with torch.cuda.graph(graph):
        for _ in range(n):
            x.add_(1)
    graph_launch_us = time_fn(graph.replay, "cuda", proto).summary.min_us / n
    return {"copy_gbps": copy_gbps, "read_gbps": read_gbps, "write_gbps": write_gbps, "matmul_tflops": matmul,
            "launch_us": launch_us, "graph_launch_us": graph_launch_us, "method": {
                "copy": "1 GiB fp32 device-to-device copy_, bytes read + written",
                "read": STREAMS_METHOD["read"].format(size="1 GiB"),
                "write": STREAMS_METHOD["write"].format(size="1 GiB"),
                "matmul": "the fastest random m x n x k torch.matmul of "
                          + ", ".join("x".join(map(str, s)) for s in MATMUL_SHAPES)
                          + (f" in bf16 and tf32, of bf16's {len(best)} fastest in fp16 and fp8" if best_shapes
                             else "")
                          + f" (fp32 without tf32, and fp64: 4096^3), each after {rest_s:g} s idle; a dtype not "
                            "listed (fp8_e5m2) is not measured: its points are placed under the fp32 roof",
                "launch": f"{n} back-to-back x.add_(1) on one element, per launch",
                "graph_launch": f"the same {n} kernels replayed in one CUDA graph, per kernel"}}


STREAMS_METHOD = {"read": "the fastest of sum() and a matrix-vector product (torch.mv, square) over {size} of fp32, "
                            "bytes read",
                  "write": "the faster of fill_(1.0) and zero_() of {size} of fp32, bytes written"}


def _streams(src, dst, device: str, proto: Protocol) -> tuple[float, float]:
    """Read-only and write-only stream rates over `src` and `dst` (GB/s): the roofs of traffic that is not a copy's
    half-and-half mix (`roofline.Roofs.bandwidth_at`). Each is the fastest of library kernels that keep different
    amounts in flight, since one that keeps too few would read low, and a ceiling measured low lets an honest
    kernel look faster than physics."""
    import torch

    side = int(src.numel() ** 0.5)
    square, vector = src[: side * side].view(side, side), src[:side]
    read_us = min(time_fn(lambda: src.sum(), device, proto).summary.min_us,
                  time_fn(lambda: torch.mv(square, vector), device, proto).summary.min_us * src.numel() / side**2)
    write_us = min(time_fn(lambda: dst.fill_(1.0), device, proto).summary.min_us,
                   time_fn(lambda: dst.zero_(), device, proto).summary.min_us)
    return src.numel() * 4 / read_us / 1e3, dst.numel() * 4 / write_us / 1e3


def measure_cpu() -> dict:
    """Copy bandwidth (read + write), a read-only and a write-only stream, the matmuls, the cost of one tiny op
    call."""
    import torch

    proto = Protocol(cache="warm", time_cap_s=0.5)
    g = torch.Generator().manual_seed(0)
    src = torch.randn(2**25, generator=g)  # 128 MiB
    dst = torch.empty_like(src)
    copy_us = time_fn(lambda: dst.copy_(src), "cpu", proto).summary.min_us
    read_gbps, write_gbps = _streams(src, dst, "cpu", proto)
    matmul = {}
    for name, dtype, n in CPU_MATMULS:
        a = torch.randn(n, n, generator=g).to(getattr(torch, dtype))
        b = torch.randn(n, n, generator=g).to(getattr(torch, dtype))
        matmul[name] = 2 * n**3 / time_fn(lambda a=a, b=b: a @ b, "cpu", proto).summary.min_us / 1e6
    x = torch.zeros(1)
    call_us = time_fn(lambda: x.add_(1), "cpu", proto).summary.min_us
    return {"copy_gbps": 2 * src.numel() * 4 / copy_us / 1e3, "read_gbps": read_gbps, "write_gbps": write_gbps,
            "matmul_tflops": matmul, "launch_us": call_us, "graph_launch_us": call_us,
            "method": {"copy": "128 MiB fp32 copy_, bytes read + written",
                       "read": STREAMS_METHOD["read"].format(size="128 MiB"),
                       "write": STREAMS_METHOD["write"].format(size="128 MiB"),
                       "matmul": "torch.matmul in each dtype: "
                                 + ", ".join(f"{name} {n}^3" for name, _, n in CPU_MATMULS)
                                 + " (a CPU has no tf32: its points are placed under the fp32 roof)",
                       "launch": "one x.add_(1) on one element",
                       "graph_launch": "a CPU has no graphs: one op's cost, as launch"}}


CPU_MATMULS = (("fp32", "float32", 1024), ("fp64", "float64", 1024), ("bf16", "bfloat16", 1024),
               ("fp16", "float16", 256))
"""The matmuls of a CPU's ceilings, each in its own dtype (one 2-core AMD EPYC: fp32 0.17, fp64 0.08, bf16 0.41
TFLOP/s; fp16 0.001, which has no fast path there: 2 s a 1024^3 call, so it is timed at 256^3)."""
