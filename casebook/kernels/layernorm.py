"""LayerNorm over rows: mean and variance in one read, forward and backward.

What you will learn: LayerNorm is RMSNorm with a second statistic (the mean) and a bias; it is as
bandwidth-bound (about 1.1 FLOP/byte in bf16), so the work is again the number of passes. What is new
is the variance: the textbook one-pass form E[x^2] - E[x]^2 cancels catastrophically when the mean is
large against the spread, while the centred form needs the mean first. With the row in registers the
centred form is free (the second sweep is over registers, not memory); only a row too long to hold
must choose, and it merges per-chunk (count, mean, M2) by Chan's formula (Welford's update for
blocks), which is exact in exact arithmetic and loses no digits to cancellation.
`variance_error` measures both at large means (the test prints the numbers, notes/layernorm.md has them).

Two cases share this module: `layernorm` (y = (x - mean) rstd w + b) and `layernorm_backward`
((dx, dw, db) from x, w, dy and the forward's saved mean and rstd).

The forward ladder:
  eager            mean, centre, square, mean, rsqrt, scale, shift as tensor ops
  torch            torch.nn.functional.layer_norm
  torch_compile    Inductor's fused kernel
  liger            Liger-Kernel's Triton LayerNorm: the peer
  triton_onepass   a block of rows a program, each in registers: mean, then the centred variance from
                   the registers, then the output: one read, one write
  triton_long      to 32K columns the one-pass kernel; beyond, two sweeps a row, the first merging chunk
                   statistics by Chan's formula (softmax's persistent streaming of 16K-32K rows was slower
                   here: measured, `triton_long`)
The backward: eager formula, torch's native_layer_norm_backward, torch.compile, Liger, then dx in one
pass with dw and db summed by atomics (`triton_atomic`) or by persistent programs' partials and a second
pass (`triton_partial`), as in rmsnorm_backward.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from casebook.kernels.device import INTERPRET, autotune, compiled, num_sms, on_device, peer
from casebook.traffic import Term, Traffic

EPS = 1e-5
"""torch.nn.LayerNorm's default (BERT, GPT-2, ViT use 1e-5 to 1e-12; the error measurement uses it too)."""

# --- references, inputs, traffic -----------------------------------------------------------------


def reference(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """y = (x - mean) / sqrt(var + eps) * w + b over the last dimension (biased variance), in float64."""
    mean = x.mean(-1, keepdim=True)
    var = (x - mean).pow(2).mean(-1, keepdim=True)
    return (x - mean) * torch.rsqrt(var + EPS) * w + b


def reference_backward(x, w, b, dy, mean, rstd) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dx, dw, db) against dy by float64 autograd (mean and rstd are the forward's saved statistics,
    which the exact answer recomputes)."""
    del mean, rstd
    x, w, b = (t.detach().requires_grad_() for t in (x, w, b))
    return torch.autograd.grad(reference(x, w, b), (x, w, b), dy)


def _rows(shape, dtype, device, generator, offset: float = 0.0) -> torch.Tensor:
    g = on_device(generator, device)
    x = torch.randn(shape["rows"], shape["cols"], generator=g, device=device, dtype=torch.float32)
    return (x + offset).to(dtype)


def _params(shape, dtype, device, generator) -> tuple[torch.Tensor, torch.Tensor]:
    g = on_device(generator, device)
    w = 1.0 + 0.3 * torch.randn(shape["cols"], generator=g, device=device)
    b = 0.1 * torch.randn(shape["cols"], generator=g, device=device)
    return w.to(dtype), b.to(dtype)


def make_inputs(shape: dict, dtype: torch.dtype, device: str, generator: torch.Generator) -> dict:
    """Activations with a non-zero mean (0.5: post-GELU/residual streams are not centred), w near 1, b small."""
    w, b = _params(shape, dtype, device, generator)
    return {"x": _rows(shape, dtype, device, generator, offset=0.5), "w": w, "b": b}


def make_backward_inputs(shape: dict, dtype: torch.dtype, device: str, generator: torch.Generator) -> dict:
    """make_inputs, the incoming gradient dy, and the per-row fp32 mean and rstd the forward saved."""
    inputs = make_inputs(shape, dtype, device, generator)
    return {**inputs, "dy": _rows(shape, dtype, device, generator), **_saved_statistics(inputs)}


def _saved_statistics(inputs: dict) -> dict:
    """The per-row mean and rstd the forward saves, from x: what a blend of the inputs recomputes
    (`make_backward_inputs.derived`)."""
    h = inputs["x"].float()
    mean = h.mean(-1)
    return {"mean": mean, "rstd": torch.rsqrt((h - mean[:, None]).pow(2).mean(-1) + EPS)}


make_backward_inputs.derived = _saved_statistics


def traffic(shape: dict, dtype: torch.dtype) -> Traffic:
    """The floor of the forward: x read once, y written once, w and b read once."""
    rows, cols = shape["rows"], shape["cols"]
    n, e = rows * cols, torch.empty((), dtype=dtype).element_size()
    return Traffic([
        Term("read x", bytes=n * e),
        Term("write y", bytes=n * e),
        Term("read w, b (one row each, once)", bytes=2 * cols * e),
        Term("sum for the mean (1 / element)", flops=n),
        Term("centre, square, sum (3 / element)", flops=3 * n),
        Term("rsqrt (1 / row)", flops=rows),
        Term("scale by rstd and w, add b (3 / element)", flops=3 * n),
    ])


def traffic_backward(shape: dict, dtype: torch.dtype) -> Traffic:
    """The floor of the backward: x and dy read once, dx written once, the row statistics and w read,
    dw and db written. The partial sums a variant moves to reduce dw and db across rows are its own
    cost, not the floor's (as in rmsnorm.traffic_backward)."""
    rows, cols = shape["rows"], shape["cols"]
    n, e = rows * cols, torch.empty((), dtype=dtype).element_size()
    return Traffic([
        Term("read x", bytes=n * e),
        Term("read dy", bytes=n * e),
        Term("write dx", bytes=n * e),
        Term("read mean, rstd (fp32, 2 / row)", bytes=2 * rows * 4),
        Term("read w (one row, once)", bytes=cols * e),
        Term("write dw, db", bytes=2 * cols * e),
        Term("x hat, w dy (3 / element)", flops=3 * n),
        Term("row sums of w dy and x hat w dy (3 / element)", flops=3 * n),
        Term("dx = (w dy - c1 - x hat c2) rstd (4 / element)", flops=4 * n),
        Term("dw += dy x hat, db += dy (3 / element)", flops=3 * n),
    ])


# --- the variance, measured: why the long-row kernel merges (count, mean, M2) ----------------------


def variance_error(offset: float, cols: int = 4096, rows: int = 64, seed: int = 0) -> dict:
    """Relative error of the per-row variance of fp32 rows N(offset, 1), computed in fp32 three ways
    against float64: E[x^2] - E[x]^2 in one sweep, chunk (count, mean, M2) merged by Chan's formula
    (what triton_long's chunked sweep does, 1K chunks), and the centred two-sweep form (what the
    one-pass kernel does from registers). Worst row of `rows`."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, cols, generator=g) + offset
    exact = x.double().var(-1, unbiased=False)
    sumsq = (x * x).mean(-1) - x.mean(-1) ** 2
    n, mean, m2 = torch.zeros(rows), torch.zeros(rows), torch.zeros(rows)
    for c in x.split(1024, dim=-1):  # Chan et al.: merge (n_a, mean_a, M2_a) with (n_b, mean_b, M2_b)
        nb, mb = c.shape[-1], c.mean(-1)
        m2b = (c - mb[:, None]).pow(2).sum(-1)
        delta, total = mb - mean, n + nb
        mean = mean + delta * nb / total
        m2 = m2 + m2b + delta * delta * n * nb / total
        n = total
    welford = m2 / n
    centred = (x - x.mean(-1, keepdim=True)).pow(2).mean(-1)
    def err(v: torch.Tensor) -> float:
        return float(((v.double() - exact).abs() / exact).max())

    return {"sum_sumsq": err(sumsq), "chan_merge": err(welford), "centred": err(centred)}


# --- variant 1: eager composite ---------------------------------------------------------------------


def eager(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """As tensor ops in fp32: each a pass over memory."""
    h = x.float()
    mean = h.mean(-1, keepdim=True)
    c = h - mean
    rstd = torch.rsqrt(c.pow(2).mean(-1, keepdim=True) + EPS)
    return (c * rstd * w.float() + b.float()).to(x.dtype)


# --- variant 2, 3, 4: the library, the compiler, the peer ---------------------------------------------


def torch_layer_norm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.layer_norm(x, (x.shape[-1],), w, b, EPS)


torch_compile = compiled(eager)


def liger(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    ops = peer("liger_kernel.ops.layer_norm", x, "Liger's LayerNorm")
    return ops.LigerLayerNormFunction.apply(x, w, b, EPS)


# --- variant 5: one pass, rows in registers ----------------------------------------------------------


@triton.jit
def _rows_kernel(x_ptr, w_ptr, b_ptr, y_ptr, n_rows, n_cols, eps, ROWS: tl.constexpr, BLOCK: tl.constexpr):
    # ROWS rows a program, each whole in registers: the mean, then the centred variance from the same
    # registers (no cancellation, no second read), then y.
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)[:, None]
    cols = tl.arange(0, BLOCK)[None, :]
    mask = (rows < n_rows) & (cols < n_cols)
    offs = rows.to(tl.int64) * n_cols + cols
    h = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    mean = tl.sum(h, axis=1)[:, None] / n_cols
    c = tl.where(mask, h - mean, 0.0)
    rstd = tl.rsqrt(tl.sum(c * c, axis=1)[:, None] / n_cols + eps)
    w = tl.load(w_ptr + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
    tl.store(y_ptr + offs, (c * rstd * w + b).to(y_ptr.dtype.element_ty), mask=mask)


MAX_ONEPASS = 32768
"""Longest row one program holds: 32K fp32 values over 1024 threads is 32 registers each."""


def _rows_configs() -> list[triton.Config]:
    return [triton.Config({"ROWS": r}, num_warps=w) for r in (1, 2, 4, 8, 16) for w in (4, 8, 16, 32)]


def _prune_rows(configs, named_args, **kwargs):
    block = triton.next_power_of_2(named_args["n_cols"])
    kept = [c for c in configs if 1024 <= c.kwargs["ROWS"] * block <= MAX_ONEPASS
            and c.num_warps * 32 * 4 <= c.kwargs["ROWS"] * block]
    return kept or configs[:1]


_rows_tuned = autotune(_rows_configs(), key=["n_cols", "n_rows"],
                              prune_configs_by={"early_config_prune": _prune_rows})(_rows_kernel)


def triton_onepass(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """One read and one write, rows up to MAX_ONEPASS columns; rows per program and warps autotuned."""
    n_rows, n_cols = x.shape
    if n_cols > MAX_ONEPASS:
        raise NotImplementedError(f"triton_onepass holds at most {MAX_ONEPASS} columns on chip; got {n_cols}")
    x = x.contiguous()
    y = torch.empty_like(x)
    block = triton.next_power_of_2(n_cols)
    if INTERPRET:
        _rows_kernel[(triton.cdiv(n_rows, 2),)](x, w, b, y, n_rows, n_cols, EPS, ROWS=2, BLOCK=block)
    else:
        grid = lambda meta: (triton.cdiv(n_rows, meta["ROWS"]),)  # noqa: E731
        _rows_tuned[grid](x, w, b, y, n_rows, n_cols, EPS, BLOCK=block)
    return y


# --- variant 6: long rows ---------------------------------------------------------------------------


@triton.jit
def _chunked_rows_kernel(x_ptr, w_ptr, b_ptr, y_ptr, n_rows, n_cols, eps, CHUNK: tl.constexpr):
    # One program a row, two sweeps. Sweep 1 takes each chunk's (count, mean, M2) from registers and
    # merges it into the row's by Chan's formula: no E[x^2] - E[x]^2 cancellation. Sweep 2 reads the
    # row again (from L2 while the rows in flight fit there) and writes y.
    row = tl.program_id(0).to(tl.int64)
    base = row * n_cols
    n = 0.0
    mean = 0.0
    m2 = 0.0
    for start in range(0, n_cols, CHUNK):
        cols = start + tl.arange(0, CHUNK)
        mask = cols < n_cols
        h = tl.load(x_ptr + base + cols, mask=mask, other=0.0).to(tl.float32)
        nb = tl.minimum(n_cols - start, CHUNK).to(tl.float32)
        mb = tl.sum(h, axis=0) / nb
        cb = tl.where(mask, h - mb, 0.0)
        m2b = tl.sum(cb * cb, axis=0)
        total = n + nb
        delta = mb - mean
        mean += delta * nb / total
        m2 += m2b + delta * delta * n * nb / total
        n = total
    rstd = tl.rsqrt(m2 / n_cols + eps)
    for start in range(0, n_cols, CHUNK):
        cols = start + tl.arange(0, CHUNK)
        mask = cols < n_cols
        h = tl.load(x_ptr + base + cols, mask=mask, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        b = tl.load(b_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(y_ptr + base + cols, ((h - mean) * rstd * w + b).to(y_ptr.dtype.element_ty), mask=mask)


LONG_CHUNK = 8192
INTERPRETER_CHUNK = 1024


def triton_long(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Any row length: one pass to 32K columns, two sweeps with merged statistics beyond. (Persistent programs
    streaming 16K-32K rows with the next ones in flight, softmax's method, measured 1.16 TB/s on an H200 at
    2048 x 32768 bf16 against the one-pass kernel's 2.96.)"""
    n_rows, n_cols = x.shape
    if n_cols <= MAX_ONEPASS:
        return triton_onepass(x, w, b)
    x = x.contiguous()
    y = torch.empty_like(x)
    chunk = INTERPRETER_CHUNK if INTERPRET else LONG_CHUNK
    _chunked_rows_kernel[(n_rows,)](x, w, b, y, n_rows, n_cols, EPS, CHUNK=chunk, num_warps=32)
    return y


# --- the backward --------------------------------------------------------------------------------------


def eager_backward(x, w, b, dy, mean, rstd) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dx = rstd (w dy - mean(w dy) - x_hat mean(x_hat w dy)); dw = sum dy x_hat; db = sum dy; fp32 ops."""
    del b
    xhat = (x.float() - mean[:, None]) * rstd[:, None]
    wdy = w.float() * dy.float()
    c1 = wdy.mean(-1, keepdim=True)
    c2 = (xhat * wdy).mean(-1, keepdim=True)
    dx = (wdy - c1 - xhat * c2) * rstd[:, None]
    return dx.to(x.dtype), (dy.float() * xhat).sum(0).to(w.dtype), dy.float().sum(0).to(w.dtype)


def torch_backward(x, w, b, dy, mean, rstd) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """aten.native_layer_norm_backward, the kernel layer_norm's autograd runs, on the saved statistics
    (fp32 on a GPU; torch's CPU kernel keeps them in the input's dtype, so they are rounded to it there)."""
    stats = torch.float32 if x.is_cuda else x.dtype
    return torch.ops.aten.native_layer_norm_backward(dy, x, [x.shape[-1]], mean[:, None].to(stats),
                                                     rstd[:, None].to(stats), w, b, [True, True, True])


torch_compile_backward = compiled(eager_backward)


def liger_backward(x, w, b, dy, mean, rstd) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Liger's LayerNorm backward (what LigerLayerNormFunction.backward calls), on the same statistics."""
    ops = peer("liger_kernel.ops.layer_norm", x, "Liger's LayerNorm backward")
    return ops.layer_norm_backward(dy, x, w, b, mean, rstd)


@triton.jit
def _backward_kernel(x_ptr, w_ptr, dy_ptr, mean_ptr, rstd_ptr, dx_ptr, dw_ptr, db_ptr, n_rows, n_cols,
                     ATOMIC: tl.constexpr, BLOCK: tl.constexpr):
    # Each program walks rows pid, pid + programs, ...: dx from registers (two row sums), dw and db
    # partials in registers; ATOMIC adds them into fp32 rows, else they are written to row pid of
    # [programs, cols] buffers for the second pass.
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    dw = tl.zeros([BLOCK], dtype=tl.float32)
    db = tl.zeros([BLOCK], dtype=tl.float32)
    for row in range(pid, n_rows, tl.num_programs(0)):
        offs = tl.cast(row, tl.int64) * n_cols + cols
        x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        rstd = tl.load(rstd_ptr + row)
        xhat = tl.where(mask, (x - tl.load(mean_ptr + row)) * rstd, 0.0)
        wdy = w * dy
        c1 = tl.sum(wdy, axis=0) / n_cols
        c2 = tl.sum(xhat * wdy, axis=0) / n_cols
        tl.store(dx_ptr + offs, ((wdy - c1 - xhat * c2) * rstd).to(dx_ptr.dtype.element_ty), mask=mask)
        dw += dy * xhat
        db += dy
    if ATOMIC:
        tl.atomic_add(dw_ptr + cols, dw, mask=mask, sem="relaxed")
        tl.atomic_add(db_ptr + cols, db, mask=mask, sem="relaxed")
    else:
        tl.store(dw_ptr + pid * n_cols + cols, dw, mask=mask)
        tl.store(db_ptr + pid * n_cols + cols, db, mask=mask)


@triton.jit
def _sum_partials_kernel(p_ptr, out_ptr, n_partials, n_cols, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr):
    # The second pass: each program sums a BLOCK_C-column strip of a [partials, cols] buffer.
    cols = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    acc = tl.zeros([BLOCK_C], dtype=tl.float32)
    for start in range(0, n_partials, BLOCK_P):
        p = start + tl.arange(0, BLOCK_P)[:, None]
        m = (p < n_partials) & (cols[None, :] < n_cols)
        acc += tl.sum(tl.load(p_ptr + p * n_cols + cols[None, :], mask=m, other=0.0), axis=0)
    tl.store(out_ptr + cols, acc.to(out_ptr.dtype.element_ty), mask=cols < n_cols)


MAX_BACKWARD = 16384
"""Longest row the backward holds: x, dy, w and two partials, 5 x 16K fp32 over 1024 threads is 80
registers each."""

ATOMIC_ROWS = 4
PARTIALS_PER_SM = 2


def _backward(x, w, dy, mean, rstd, atomic: bool):
    n_rows, n_cols = x.shape
    if n_cols > MAX_BACKWARD:
        raise NotImplementedError(f"the backward holds at most {MAX_BACKWARD} columns on chip; got {n_cols}")
    x, dy = x.contiguous(), dy.contiguous()
    block = triton.next_power_of_2(n_cols)
    warps = max(1, min(32, block // 256))
    dx = torch.empty_like(x)
    dw = torch.empty(n_cols, device=x.device, dtype=w.dtype)
    db = torch.empty_like(dw)
    if atomic:
        programs = triton.cdiv(n_rows, 2 if INTERPRET else ATOMIC_ROWS)
        acc = torch.zeros(2, n_cols, device=x.device, dtype=torch.float32)
        _backward_kernel[(programs,)](x, w, dy, mean, rstd, dx, acc[0], acc[1], n_rows, n_cols, ATOMIC=True,
                                      BLOCK=block, num_warps=warps)
        dw.copy_(acc[0])
        db.copy_(acc[1])
        return dx, dw, db
    programs = min(n_rows, PARTIALS_PER_SM * num_sms(x))
    partials = torch.empty(2, programs, n_cols, device=x.device, dtype=torch.float32)
    _backward_kernel[(programs,)](x, w, dy, mean, rstd, dx, partials[0], partials[1], n_rows, n_cols,
                                  ATOMIC=False, BLOCK=block, num_warps=warps)
    block_c = 64 if INTERPRET else 256
    for p, out in ((partials[0], dw), (partials[1], db)):
        _sum_partials_kernel[(triton.cdiv(n_cols, block_c),)](p, out, programs, n_cols, BLOCK_P=32, BLOCK_C=block_c)
    return dx, dw, db


def triton_atomic(x, w, b, dy, mean, rstd):
    """dx in one pass; each block of rows adds its dw and db partials into fp32 rows by atomics."""
    del b
    return _backward(x, w, dy, mean, rstd, atomic=True)


def triton_partial(x, w, b, dy, mean, rstd):
    """dx in one pass by persistent programs keeping dw and db partials in registers; a second pass sums them."""
    del b
    return _backward(x, w, dy, mean, rstd, atomic=False)


# --- level 3: a pre-LN transformer block's norm before a projection -----------------------------------


def make_layer_inputs(shape: dict, dtype: torch.dtype, device: str, generator: torch.Generator) -> dict:
    """Hidden states [tokens, hidden], LayerNorm's w and b, and a projection [hidden, out]."""
    g = on_device(generator, device)
    t, h, o = shape["tokens"], shape["hidden"], shape["out"]
    x = (torch.randn(t, h, generator=g, device=device) + 0.5).to(dtype)
    w = (1.0 + 0.3 * torch.randn(h, generator=g, device=device)).to(dtype)
    b = (0.1 * torch.randn(h, generator=g, device=device)).to(dtype)
    proj = (torch.randn(h, o, generator=g, device=device) * h**-0.5).to(dtype)
    return {"x": x, "w": w, "b": b, "proj": proj}


def make_backward_layer_inputs(shape: dict, dtype: torch.dtype, device: str, generator: torch.Generator) -> dict:
    """make_layer_inputs, the forward's saved mean and rstd, and the gradient dout at the projection's output."""
    inputs = make_layer_inputs(shape, dtype, device, generator)
    g = on_device(generator, device)
    h = inputs["x"].float()
    mean = h.mean(-1)
    rstd = torch.rsqrt((h - mean[:, None]).pow(2).mean(-1) + EPS)
    dout = torch.randn(shape["tokens"], shape["out"], generator=g, device=device).to(dtype)
    return {**inputs, "mean": mean, "rstd": rstd, "dout": dout}


def prenorm_projection(kernel, x, w, b, proj) -> torch.Tensor:
    """A pre-LN block's entry (GPT-2, ViT, Whisper): y = layernorm(x), then the fused QKV projection."""
    return kernel(x=x, w=w, b=b) @ proj


def prenorm_projection_backward(kernel, x, w, b, mean, rstd, proj, dout) -> torch.Tensor:
    """Its backward's input path: dy = dout @ proj^T, then the norm's (dx, dw, db); dx is returned with
    dw and db added into its first two rows, so that all three are compared."""
    dy = dout @ proj.T
    dx, dw, db = kernel(x=x, w=w, b=b, dy=dy, mean=mean, rstd=rstd)
    dx[0] += dw
    dx[1 % dx.shape[0]] += db
    return dx
