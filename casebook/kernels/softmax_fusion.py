"""Row softmax: from five passes over memory to one read and one write.

What you will learn: softmax is bandwidth-bound (about 5 FLOPs per element against 4 bytes moved in
bf16: an arithmetic intensity near 1 FLOP/byte, two orders of magnitude under an H200's ridge point),
so the only thing that matters is how many times each element crosses device memory.

The ladder:
  eager            max, subtract, exp, sum, divide as separate tensor ops: 5 kernels, ~4 reads + 3 writes
  torch_softmax    the library's fused kernel: 1 read + 1 write when the row fits, more when it does not
  torch_compile    Inductor's generated fused kernel
  triton_onepass   one program per block of rows, the row held on chip: 1 read + 1 write
  triton_online    any row length. Up to 16K columns, the one-pass kernel; from 16K to 32K, persistent
                   programs that stream whole rows with the next two in flight (loads never wait for
                   a row's reductions); beyond, each row split into chunks, one program per chunk
                   holding it in registers, the chunks' (max, sum) exchanged through a per-row barrier
                   and each program normalising its chunk in place: still one read, one write
  cluster_bulk     Hopper, CUDA C++ (softmax_cluster): rows over 32 KB split over a thread-block
                   cluster, each chunk landed in shared memory by bulk copies, so a CTA holds no
                   registers while its bytes are in flight; shorter rows run triton_online
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl

from casebook.kernels import softmax_cluster
from casebook.traffic import Term, Traffic

# --- reference, inputs, traffic ----------------------------------------------------------------


def reference(x: torch.Tensor) -> torch.Tensor:
    """Exact softmax over the last dimension, in float64."""
    return torch.softmax(x.to(torch.float64), dim=-1)


def on_device(generator: torch.Generator, device: str) -> torch.Generator:
    """A generator on `device` seeded from `generator`: large inputs are drawn where they live."""
    seed = int(torch.randint(2**62, (1,), generator=generator))
    return torch.Generator(device=device).manual_seed(seed)


def make_inputs(shape: dict, dtype: torch.dtype, device: str, generator: torch.Generator) -> dict:
    """Logits with the spread of real attention scores (std 2), never zeros or ones."""
    g = on_device(generator, device)
    x = torch.randn(shape["rows"], shape["cols"], generator=g, device=device, dtype=torch.float32) * 2.0
    return {"x": x.to(dtype)}


def traffic(shape: dict, dtype: torch.dtype) -> Traffic:
    """The floor: every element read once and written once."""
    n = shape["rows"] * shape["cols"]
    b = torch.empty((), dtype=dtype).element_size()
    return Traffic([
        Term("read x", bytes=n * b),
        Term("write y", bytes=n * b),
        Term("max (1 compare / element)", flops=n),
        Term("subtract, exp (2 / element)", flops=2 * n),
        Term("sum (1 add / element)", flops=n),
        Term("scale by 1/sum (1 multiply / element)", flops=n),
    ])


# --- variant 1: eager composite ------------------------------------------------------------------


def eager(x: torch.Tensor) -> torch.Tensor:
    """Five separate ops; every intermediate makes a round trip through device memory."""
    m = x.amax(dim=-1, keepdim=True)  # read x
    z = x - m  # read x, write z
    e = torch.exp(z)  # read z, write e
    s = e.sum(dim=-1, keepdim=True)  # read e
    return e / s  # read e, write y


# --- variant 2, 3: the library and the compiler -------------------------------------------------


def torch_softmax(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x, dim=-1)


@functools.cache
def _compiled():
    import torch._dynamo as dynamo

    # Each (shape, dtype) is its own graph; keep them all instead of falling back to eager.
    for knob in ("recompile_limit", "cache_size_limit"):
        if hasattr(dynamo.config, knob):
            setattr(dynamo.config, knob, 256)
    return torch.compile(eager, dynamic=False)


def torch_compile(x: torch.Tensor) -> torch.Tensor:
    return _compiled()(x)


# --- variant 4: one pass, the row on chip -------------------------------------------------------


@triton.jit
def _onepass_kernel(x_ptr, y_ptr, n_rows, n_cols, stride, ROWS: tl.constexpr, BLOCK: tl.constexpr):
    # ROWS rows per program, each row whole in registers: one read, one write.
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)[:, None]
    cols = tl.arange(0, BLOCK)[None, :]
    mask = (rows < n_rows) & (cols < n_cols)
    offs = rows.to(tl.int64) * stride + cols
    x = tl.load(x_ptr + offs, mask=mask, other=-float("inf")).to(tl.float32)
    m = tl.max(x, axis=1)[:, None]
    e = tl.exp(x - m)
    inv = 1.0 / tl.sum(e, axis=1)[:, None]
    tl.store(y_ptr + offs, (e * inv).to(y_ptr.dtype.element_ty), mask=mask)


MAX_ONEPASS = 32768
"""Longest row held whole by one program: 32K fp32 values over 1024 threads is 32 registers each."""

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


def _onepass_configs() -> list[triton.Config]:
    # Rows per program x warps; the launcher drops configs whose tile is too large for the row length.
    return [triton.Config({"ROWS": r}, num_warps=w) for r in (1, 2, 4, 8, 16) for w in (4, 8, 16, 32)]


def _prune_onepass(configs, named_args, **kwargs):
    block = triton.next_power_of_2(named_args["n_cols"])
    kept = [c for c in configs if 1024 <= c.kwargs["ROWS"] * block <= MAX_ONEPASS
            and c.num_warps * 32 * 4 <= c.kwargs["ROWS"] * block]
    return kept or configs[:1]


_onepass_tuned = triton.autotune(_onepass_configs(), key=["n_cols", "n_rows"],
                                 prune_configs_by={"early_config_prune": _prune_onepass})(_onepass_kernel)


def triton_onepass(x: torch.Tensor) -> torch.Tensor:
    """One read and one write, for rows up to MAX_ONEPASS columns; rows per program and warps autotuned."""
    n_rows, n_cols = x.shape
    if n_cols > MAX_ONEPASS:
        raise NotImplementedError(f"triton_onepass holds at most {MAX_ONEPASS} columns on chip; got {n_cols}")
    x = x.contiguous()
    y = torch.empty_like(x)
    block = triton.next_power_of_2(n_cols)
    if INTERPRETED:  # no autotuning under the interpreter: one small config
        _onepass_kernel[(triton.cdiv(n_rows, 2),)](x, y, n_rows, n_cols, x.stride(0), ROWS=2, BLOCK=block)
        return y
    grid = lambda meta: (triton.cdiv(n_rows, meta["ROWS"]),)  # noqa: E731
    _onepass_tuned[grid](x, y, n_rows, n_cols, x.stride(0), BLOCK=block)
    return y


@triton.jit
def _streaming_rows_kernel(x_ptr, y_ptr, n_rows, n_cols, stride, BLOCK: tl.constexpr, STAGES: tl.constexpr):
    # Persistent: each program walks rows pid, pid + programs, ...; with STAGES = 3 Triton copies the
    # next two rows into shared memory asynchronously while this one reduces and stores, so the loads
    # never stop for the reductions (one row per program at a time leaves those phases load-free).
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    for row in tl.range(tl.program_id(0), n_rows, tl.num_programs(0), num_stages=STAGES):
        offs = tl.cast(row, tl.int64) * stride + cols
        x = tl.load(x_ptr + offs, mask=mask, other=-float("inf")).to(tl.float32)
        m = tl.max(x, axis=0)
        e = tl.exp(x - m)
        tl.store(y_ptr + offs, (e * (1.0 / tl.sum(e, axis=0))).to(y_ptr.dtype.element_ty), mask=mask)


STREAM_ABOVE = 16384
"""triton_online streams rows longer than this (up to SPLIT_ABOVE) through the persistent prefetching
kernel. Measured on an H200 at 4096 x 32768 bf16: 3.44-3.46 TB/s against 3.08-3.10 for the one-pass
kernel (benchmarks/explore/persistent_prefetch.py); at 4K-8K columns the one-pass kernel is faster."""

STREAM_SHARED_BYTES = 160 * 1024
"""Two rows in flight must fit in shared memory beside the reduction scratch (228 KB per SM on sm90)."""


def _stream_rows(x: torch.Tensor) -> torch.Tensor | None:
    """The persistent prefetching kernel, or None where two rows in flight do not fit on chip."""
    n_rows, n_cols = x.shape
    block = triton.next_power_of_2(n_cols)
    if 2 * block * x.element_size() > STREAM_SHARED_BYTES:
        return None
    y = torch.empty_like(x)
    programs = n_rows if INTERPRETED else min(n_rows, _sm_count(x.device))
    _streaming_rows_kernel[(programs,)](x, y, n_rows, n_cols, x.stride(0), BLOCK=block, STAGES=3,
                                        num_warps=32 if block >= 32768 else 16)
    return y


# --- variant 5: rows of any length, split across cooperating programs -----------------------------


@triton.jit
def _row_barrier(barrier_ptr, n_programs):
    # One int32 word per row, alone in its 128-byte line: arrivals in the low 16 bits, a generation
    # above them. Arriving is one atomic that also tells this program the generation; the last to
    # arrive adds 2**16 - n, which bumps the generation and zeroes the count in one step. The others
    # poll with plain loads (atomics polling one line queue behind each other at L2: measured, medians
    # doubled at a few rows), then take one acquiring atomic once the generation has moved. All of a
    # row's programs are resident together (see `_prune_split`), so the wait always ends.
    tl.debug_barrier()  # every thread's statistics are stored before this program arrives
    ticket = tl.atomic_add(barrier_ptr, 1, sem="acq_rel")
    generation = ticket >> 16
    if (ticket & 0xFFFF) == n_programs - 1:
        tl.atomic_add(barrier_ptr, 65536 - n_programs, sem="release")
    else:
        seen = generation
        while seen == generation:
            seen = tl.load(barrier_ptr, volatile=True) >> 16
        tl.atomic_add(barrier_ptr, 0, sem="acquire")
    tl.debug_barrier()


@triton.jit
def _split_row_kernel(x_ptr, y_ptr, m_ptr, s_ptr, barrier_ptr, n_rows, n_cols, stride,
                      CHUNK: tl.constexpr, MAX_CHUNKS: tl.constexpr, PHASE: tl.constexpr,
                      BARRIER_STRIDE: tl.constexpr = 32):
    # The programs of a row each hold one CHUNK of it in registers. PHASE 0 (the GPU): chunk max and
    # sum, exchanged through a row barrier, then normalise from registers: one read, one write.
    # PHASE 1 then PHASE 2 (two launches, for the interpreter, which runs programs one after another
    # and so cannot wait on a later one): statistics, then re-read, combine and normalise.
    n_chunks = tl.cdiv(n_cols, CHUNK)
    pid = tl.program_id(0)
    row = (pid // n_chunks).to(tl.int64)
    chunk = pid % n_chunks
    cols = chunk * CHUNK + tl.arange(0, CHUNK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride + cols, mask=mask, other=-float("inf")).to(tl.float32)
    chunk_max = tl.max(x, axis=0)
    e = tl.exp(x - chunk_max)
    stats = row * n_chunks
    if PHASE != 2:
        tl.store(m_ptr + stats + chunk, chunk_max)
        tl.store(s_ptr + stats + chunk, tl.sum(e, axis=0))
    if PHASE == 0:
        _row_barrier(barrier_ptr + row * BARRIER_STRIDE, n_chunks)
    if PHASE != 1:
        c = tl.arange(0, MAX_CHUNKS)
        # .cg: read at L2, where the other programs' statistics are, never a stale L1 line.
        cm = tl.load(m_ptr + stats + c, mask=c < n_chunks, other=-float("inf"), cache_modifier=".cg")
        cs = tl.load(s_ptr + stats + c, mask=c < n_chunks, other=0.0, cache_modifier=".cg")
        row_max = tl.max(cm, axis=0)
        scale = tl.exp(chunk_max - row_max) / tl.sum(cs * tl.exp(cm - row_max), axis=0)
        tl.store(y_ptr + row * stride + cols, (e * scale).to(y_ptr.dtype.element_ty), mask=mask)


def _split_configs() -> list[triton.Config]:
    return [triton.Config({"CHUNK": c}, num_warps=w) for c in (2048, 4096, 8192, 16384) for w in (4, 8, 16)]


def _prune_split(configs, named_args, **kwargs):
    # Keep 8-64 elements per thread, and no more chunks in a row than SMs: one program fits on every
    # SM, so a row's programs can always be resident together.
    n_cols, sms = named_args["n_cols"], _sm_count(named_args["x_ptr"].device)
    kept = [c for c in configs if 8 <= c.kwargs["CHUNK"] // (32 * c.num_warps) <= 64
            and triton.cdiv(n_cols, c.kwargs["CHUNK"]) <= sms]
    return kept or configs[-1:]


_split_row_tuned = triton.heuristics(
    {"MAX_CHUNKS": lambda a: triton.next_power_of_2(triton.cdiv(a["n_cols"], a["CHUNK"]))})(_split_row_kernel)
_split_row_tuned = triton.autotune(_split_configs(), key=["n_cols", "n_rows"],
                                   prune_configs_by={"early_config_prune": _prune_split})(_split_row_tuned)

SPLIT_ABOVE = MAX_ONEPASS
"""triton_online splits rows longer than this across programs; shorter rows take the one-pass kernel
(measured on an H200: within 3% at 4096 x 32768, and 2.5x faster at 64 x 32000, where the split has only
256 programs and the barrier's wait shows)."""

INTERPRETER_CHUNK = 1024
"""Chunk under the interpreter: small, so that the tests' rows span several chunks."""

_barriers: dict = {}


def _row_barriers(device: torch.device, n_rows: int) -> torch.Tensor:
    # One word per row, every 32nd int32 (a 128-byte line each), zeroed once and left with a zero count
    # by every launch; one array per stream, so that launches on two streams never share a barrier.
    # The generation wraps harmlessly.
    key = (device, torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0)
    held = _barriers.get(key)
    if held is None or held.numel() < 32 * n_rows:
        held = _barriers[key] = torch.zeros(32 * max(n_rows, 1024), device=device, dtype=torch.int32)
    return held


@functools.cache
def _sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def triton_online(x: torch.Tensor) -> torch.Tensor:
    """Any row length: one pass when the row fits one program (streamed by persistent programs with the
    next rows in flight from 16K columns on), else the row split across programs."""
    n_rows, n_cols = x.shape
    if STREAM_ABOVE < n_cols <= SPLIT_ABOVE:
        y = _stream_rows(x.contiguous())
        if y is not None:
            return y
    if n_cols <= SPLIT_ABOVE:
        return triton_onepass(x)
    x = x.contiguous()
    y = torch.empty_like(x)
    if INTERPRETED:
        chunk = INTERPRETER_CHUNK
        n_chunks = triton.cdiv(n_cols, chunk)
        m = torch.empty(n_rows * n_chunks, device=x.device, dtype=torch.float32)
        s = torch.empty_like(m)
        for phase in (1, 2):
            _split_row_kernel[(n_rows * n_chunks,)](x, y, m, s, m, n_rows, n_cols, x.stride(0), CHUNK=chunk,
                                                    MAX_CHUNKS=triton.next_power_of_2(n_chunks), PHASE=phase)
        return y
    sms = _sm_count(x.device)
    if n_cols > 16384 * sms:
        raise NotImplementedError(f"rows over {16384 * sms} columns need more chunks than SMs; got {n_cols}")
    m = torch.empty(n_rows * triton.cdiv(n_cols, 2048), device=x.device, dtype=torch.float32)
    s = torch.empty_like(m)
    barriers = _row_barriers(x.device, n_rows)
    grid = lambda meta: (n_rows * triton.cdiv(n_cols, meta["CHUNK"]),)  # noqa: E731
    _split_row_tuned[grid](x, y, m, s, barriers, n_rows, n_cols, x.stride(0), PHASE=0)
    return y


# --- variant 6: Hopper's clusters and bulk copies (CUDA C++) -------------------------------------

CLUSTER_ABOVE_BYTES = 32 * 1024
"""Rows longer than this take softmax_cluster's kernel. Up to 8K bf16 columns triton_online is at the
copy rate; at 16K (32 KB) it reached 3.8 TB/s, as did the cluster kernel with 32 KB chunks
(benchmarks/explore/cluster_softmax.py)."""


def cluster_bulk(x: torch.Tensor) -> torch.Tensor:
    """Rows over 32 KB: softmax_cluster's kernel (Hopper: each chunk of a row landed in shared memory by
    bulk copies, the chunks' (max, sum) exchanged over a thread-block cluster). Shorter rows, and rows it
    cannot split (not a whole number of 16-byte vectors, or over 1 MB), run triton_online. On a GPU
    without clusters the long rows fail, rather than quietly timing another kernel."""
    if x.shape[-1] * x.element_size() <= CLUSTER_ABOVE_BYTES:
        return triton_online(x)
    x = x.contiguous()
    if softmax_cluster.plan(*x.shape, x.element_size(), 1) is None or x.data_ptr() % 16:
        return triton_online(x)
    return softmax_cluster.softmax(x)


# --- level 3: a non-flash attention block ---------------------------------------------------------


def make_attention_inputs(shape: dict, dtype: torch.dtype, device: str, generator: torch.Generator) -> dict:
    """q, k, v of one attention layer: [batch, heads, seq, head_dim]."""
    dims = (shape["batch"], shape["heads"], shape["seq"], shape["head_dim"])
    g = on_device(generator, device)
    q, k, v = (torch.randn(dims, generator=g, device=device).to(dtype) for _ in range(3))
    return {"q": q, "k": k, "v": v}


def attention_block(kernel, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """softmax(q k^T / sqrt(d)) v with the score matrix materialised, softmax done by `kernel`."""
    b, h, s, d = q.shape
    scores = torch.matmul(q, k.transpose(-1, -2)) * d**-0.5  # [b, h, s, s]: written, then read
    p = kernel(scores.view(b * h * s, s)).view(b, h, s, s)
    return torch.matmul(p, v)  # [b, h, s, d]
