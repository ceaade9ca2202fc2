"""Row softmax: from five passes over memory to one read and one write.

What you will learn: softmax is bandwidth-bound (about 5 FLOPs per element against 4 bytes moved in
bf16: an arithmetic intensity near 1 FLOP/byte, two orders of magnitude under an H200's ridge point),
so the only thing that matters is how many times each element crosses device memory.

The ladder:
  eager            max, subtract, exp, sum, divide as separate tensor ops: 5 kernels, ~4 reads + 3 writes
  torch_softmax    the library's fused kernel: 1 read + 1 write when the row fits, more when it does not
  torch_compile    Inductor's generated fused kernel
  triton_onepass   one program per block of rows, the row held on chip: 1 read + 1 write
  triton_online    rows too long for one program: online max/sum over tiles, then a second sweep in
                   reverse order so that it re-reads what is still in L2; few very long rows are split
                   across programs (per-chunk statistics, then a combine-and-normalise pass)
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl

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


# --- variant 5: online max/sum for rows of any length ---------------------------------------------


@triton.jit
def _online_row_kernel(x_ptr, y_ptr, n_rows, n_cols, stride, BLOCK: tl.constexpr, PER_SM: tl.constexpr):
    # Persistent: a few programs per SM walk the rows, so the rows in flight (programs x row bytes)
    # stay under L2 and sweep 2's re-read is served from L2, not DRAM.
    lanes = tl.arange(0, BLOCK)
    n_tiles = tl.cdiv(n_cols, BLOCK)
    pid = tl.program_id(0).to(tl.int64)
    n_prog = tl.num_programs(0)
    for i in range(0, tl.cdiv(n_rows - pid, n_prog)):
        row = pid + i * n_prog
        x_row = x_ptr + row * stride
        y_row = y_ptr + row * stride
        # Sweep 1 keeps a running max and a rescaled running sum per lane.
        m = tl.full([BLOCK], -float("inf"), tl.float32)
        s = tl.zeros([BLOCK], tl.float32)
        for t in range(0, n_tiles):
            cols = t * BLOCK + lanes
            x = tl.load(x_row + cols, mask=cols < n_cols, other=-float("inf")).to(tl.float32)
            m_new = tl.maximum(m, x)
            s = s * tl.exp(m - m_new) + tl.exp(x - m_new)
            m = m_new
        row_max = tl.max(m, axis=0)
        inv = 1.0 / tl.sum(s * tl.exp(m - row_max), axis=0)
        # Sweep 2 walks the row backwards: the tiles read last in sweep 1 are the likeliest still in L2.
        for j in range(0, n_tiles):
            cols = (n_tiles - 1 - j) * BLOCK + lanes
            mask = cols < n_cols
            x = tl.load(x_row + cols, mask=mask, other=-float("inf")).to(tl.float32)
            tl.store(y_row + cols, (tl.exp(x - row_max) * inv).to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _chunk_stats_kernel(x_ptr, m_ptr, s_ptr, n_cols, stride, n_chunks, CHUNK: tl.constexpr, BLOCK: tl.constexpr):
    # Split rows, step 1: each program reduces one chunk of one row to (max, sum of exp(x - max)).
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    lanes = tl.arange(0, BLOCK)
    m = tl.full([BLOCK], -float("inf"), tl.float32)
    s = tl.zeros([BLOCK], tl.float32)
    for t in range(0, CHUNK // BLOCK):
        cols = chunk * CHUNK + t * BLOCK + lanes
        x = tl.load(x_ptr + row * stride + cols, mask=cols < n_cols, other=-float("inf")).to(tl.float32)
        m_new = tl.maximum(m, x)
        # A lane that has seen only padding keeps m = -inf; guard its rescale factor against NaN.
        s = s * tl.where(m_new == -float("inf"), 0.0, tl.exp(m - m_new)) + tl.exp(x - m_new)
        m = m_new
    cmax = tl.max(m, axis=0)
    csum = tl.sum(tl.where(m == -float("inf"), 0.0, s * tl.exp(m - cmax)), axis=0)
    tl.store(m_ptr + row * n_chunks + chunk, cmax)
    tl.store(s_ptr + row * n_chunks + chunk, csum)


@triton.jit
def _chunk_normalize_kernel(x_ptr, y_ptr, m_ptr, s_ptr, n_cols, stride, n_chunks, CHUNK: tl.constexpr,
                            BLOCK: tl.constexpr, MAX_CHUNKS: tl.constexpr):
    # Split rows, step 2: combine the row's chunk statistics, then normalise this chunk (an L2 re-read).
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    c = tl.arange(0, MAX_CHUNKS)
    cm = tl.load(m_ptr + row * n_chunks + c, mask=c < n_chunks, other=-float("inf"))
    cs = tl.load(s_ptr + row * n_chunks + c, mask=c < n_chunks, other=0.0)
    row_max = tl.max(cm, axis=0)
    inv = 1.0 / tl.sum(cs * tl.exp(cm - row_max), axis=0)
    lanes = tl.arange(0, BLOCK)
    for t in range(0, CHUNK // BLOCK):
        cols = chunk * CHUNK + t * BLOCK + lanes
        mask = cols < n_cols
        x = tl.load(x_ptr + row * stride + cols, mask=mask, other=-float("inf")).to(tl.float32)
        tl.store(y_ptr + row * stride + cols, (tl.exp(x - row_max) * inv).to(y_ptr.dtype.element_ty), mask=mask)


ONLINE_BLOCK = 4096
SPLIT_CHUNK = 16384

_online_row_tuned = triton.autotune(
    [triton.Config({"BLOCK": b, "PER_SM": p}, num_warps=w) for b in (4096, 8192) for w in (8, 16) for p in (1, 2, 4, 64)],
    key=["n_cols", "n_rows"])(_online_row_kernel)


@functools.cache
def _sm_count(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 4  # the interpreter: any small number exercises the split path


def triton_online(x: torch.Tensor) -> torch.Tensor:
    """Any row length: one pass when the row fits, online two-sweep per row, or split rows when few."""
    n_rows, n_cols = x.shape
    if n_cols <= MAX_ONEPASS:
        return triton_onepass(x)
    x = x.contiguous()
    y = torch.empty_like(x)
    sms = _sm_count(x.device)
    if n_rows >= 2 * sms:
        # Rows in flight = programs x row bytes: fewer programs per SM keep sweep 2's re-read in L2,
        # more keep more bytes in flight. Measured on an H200, neither fixed choice won at every row
        # length, so the programs per SM, the tile and the warps are autotuned per shape.
        if INTERPRETED:
            _online_row_kernel[(min(n_rows, sms),)](x, y, n_rows, n_cols, x.stride(0), BLOCK=ONLINE_BLOCK, PER_SM=1)
            return y
        grid = lambda meta: (min(n_rows, meta["PER_SM"] * sms),)  # noqa: E731
        _online_row_tuned[grid](x, y, n_rows, n_cols, x.stride(0))
        return y
    # Too few rows to fill the machine: split each row into chunks, two launches; the re-read hits L2.
    n_chunks = triton.cdiv(n_cols, SPLIT_CHUNK)
    m = torch.empty(n_rows, n_chunks, device=x.device, dtype=torch.float32)
    s = torch.empty_like(m)
    grid = (n_rows, n_chunks)
    _chunk_stats_kernel[grid](x, m, s, n_cols, x.stride(0), n_chunks, CHUNK=SPLIT_CHUNK, BLOCK=2048, num_warps=8)
    _chunk_normalize_kernel[grid](x, y, m, s, n_cols, x.stride(0), n_chunks, CHUNK=SPLIT_CHUNK, BLOCK=2048,
                                  MAX_CHUNKS=triton.next_power_of_2(n_chunks), num_warps=8)
    return y


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
