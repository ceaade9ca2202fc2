"""The norms' backward with the next rows in flight, and rows past 8K columns split by columns: the kernels of the
`triton_pipelined` rung of both backward cases (`rmsnorm_backward`, `layernorm_backward`; CENTERED is
layernorm's mean and db).

The committed `triton_partial` (`rmsnorm._backward`, `layernorm._backward`) holds a whole row of x, dy, w and the
dw (and db) partials in registers, one row a program iteration. Two things hold it back, measured on an H100
(`benchmarks/explore/norm_backward/wide_rows.py`, notes/rmsnorm.md and notes/layernorm.md):

- To 8K columns each program loads a row, then reduces it and stores with no load in flight. `rows` writes the
  same loop as `tl.range(num_stages=STAGES)`, so Triton copies the next rows' x and dy into shared memory while
  this one reduces: +7-26% (rmsnorm 16384 x 4096 2.45 -> 2.65 TB/s, layernorm 16384 x 8192 2.14 -> 2.70, Liger
  2.34). One program an SM, four stages to 4K columns and three at 8K, were the fastest of the sweep.
- At 16K columns layernorm's program spills past the 64-register cap (248-304 B of stack a thread at 32 warps,
  lowered for sm_90a): 0.38 TB/s. `split` gives a row's columns to several programs, each owning a slice of dx,
  dw and db, each reading the row's two sums over the whole row a chunk at a time (the row's other reads come
  from L2, where its neighbours' programs just read them): 1.54 TB/s, level with Liger (1.52), and it takes
  rows of 32K columns, which the committed kernel refuses. rmsnorm spills less there and its committed kernel
  stays faster (1.87 against the split's 1.63), so its rung keeps it from 8K to 16K columns.

Both kernels leave fp32 partials of dw (and db), one row a program or group, summed by rmsnorm's second pass.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from casebook.kernels.device import INTERPRET, num_sms
from casebook.kernels.rmsnorm import _sum_partials_kernel

ROWS_UP_TO = 8192
"""Columns up to which whole rows are pipelined; past it, rows are split by columns (or, for rmsnorm to its
MAX_BACKWARD, the committed kernel)."""

ROWS_STAGES = ((4096, 4), (ROWS_UP_TO, 3))
"""(columns up to, stages) of `rows`: the H100 sweep's fastest, one program an SM."""

SPLIT_SLICE, SPLIT_CHUNK, SPLIT_WARPS, SPLIT_STAGES = 8192, 4096, 16, 3
"""`split`'s slice of a row a program owns, the chunk its sums read at a time, its warps and stages: the H100
sweep's fastest (16 warps beat 32 by 14-17%; 4096-column slices lost 40%)."""


@triton.jit
def _rows_kernel(x_ptr, w_ptr, dy_ptr, mean_ptr, rstd_ptr, dx_ptr, dw_ptr, db_ptr, n_rows, n_cols,
                 CENTERED: tl.constexpr, STAGES: tl.constexpr, BLOCK: tl.constexpr):
    # The committed kernel of both cases (CENTERED: layernorm's mean and db), its row loop pipelined.
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    dw = tl.zeros([BLOCK], dtype=tl.float32)
    db = tl.zeros([BLOCK], dtype=tl.float32)
    for row in tl.range(pid, n_rows, tl.num_programs(0), num_stages=STAGES):
        offs = tl.cast(row, tl.int64) * n_cols + cols
        x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        rstd = tl.load(rstd_ptr + row)
        wdy = w * dy
        if CENTERED:
            xhat = tl.where(mask, (x - tl.load(mean_ptr + row)) * rstd, 0.0)
            c1 = tl.sum(wdy, axis=0) / n_cols
            db += dy
        else:
            xhat = x * rstd
            c1 = 0.0
        c2 = tl.sum(xhat * wdy, axis=0) / n_cols
        tl.store(dx_ptr + offs, ((wdy - c1 - xhat * c2) * rstd).to(dx_ptr.dtype.element_ty), mask=mask)
        dw += dy * xhat
    tl.store(dw_ptr + pid * n_cols + cols, dw, mask=mask)
    if CENTERED:
        tl.store(db_ptr + pid * n_cols + cols, db, mask=mask)


@triton.jit
def _split_kernel(x_ptr, w_ptr, dy_ptr, mean_ptr, rstd_ptr, dx_ptr, dw_ptr, db_ptr, n_rows, n_cols,
                  CENTERED: tl.constexpr, SPLITS: tl.constexpr, SLICE: tl.constexpr, CHUNK: tl.constexpr,
                  STAGES: tl.constexpr):
    # Program pid = group * SPLITS + s walks rows group, group + groups, ... and owns columns
    # [s * SLICE, (s + 1) * SLICE): the row sums over the whole row a CHUNK at a time, then dx, dw and db
    # of its slice. Its partials go to row `group` of [groups, cols] buffers.
    pid = tl.program_id(0)
    group = pid // SPLITS
    groups = tl.num_programs(0) // SPLITS
    own = (pid % SPLITS) * SLICE + tl.arange(0, SLICE)
    own_mask = own < n_cols
    dw = tl.zeros([SLICE], dtype=tl.float32)
    db = tl.zeros([SLICE], dtype=tl.float32)
    for row in range(group, n_rows, groups):
        base = tl.cast(row, tl.int64) * n_cols
        rstd = tl.load(rstd_ptr + row)
        mean = tl.load(mean_ptr + row) if CENTERED else 0.0
        s1 = tl.zeros([CHUNK], dtype=tl.float32)
        s2 = tl.zeros([CHUNK], dtype=tl.float32)
        for start in tl.range(0, n_cols, CHUNK, num_stages=STAGES):
            c = start + tl.arange(0, CHUNK)
            m = c < n_cols
            x = tl.load(x_ptr + base + c, mask=m, other=0.0).to(tl.float32)
            wdy = tl.load(w_ptr + c, mask=m, other=0.0).to(tl.float32) * \
                tl.load(dy_ptr + base + c, mask=m, other=0.0).to(tl.float32)
            s1 += wdy
            s2 += tl.where(m, (x - mean) * rstd, 0.0) * wdy
        c1 = tl.sum(s1, axis=0) / n_cols if CENTERED else 0.0
        c2 = tl.sum(s2, axis=0) / n_cols
        x = tl.load(x_ptr + base + own, mask=own_mask, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + base + own, mask=own_mask, other=0.0).to(tl.float32)
        xhat = tl.where(own_mask, (x - mean) * rstd, 0.0)
        wdy = tl.load(w_ptr + own, mask=own_mask, other=0.0).to(tl.float32) * dy
        tl.store(dx_ptr + base + own, ((wdy - c1 - xhat * c2) * rstd).to(dx_ptr.dtype.element_ty), mask=own_mask)
        dw += dy * xhat
        if CENTERED:
            db += dy
    tl.store(dw_ptr + group * n_cols + own, dw, mask=own_mask)
    if CENTERED:
        tl.store(db_ptr + group * n_cols + own, db, mask=own_mask)


def _finish(partials: torch.Tensor, w: torch.Tensor) -> list[torch.Tensor]:
    """Each [programs, cols] fp32 partial summed into a row of w's dtype, by the committed second pass."""
    out = []
    block_c = 64 if INTERPRET else 256
    for p in partials:
        total = torch.empty(p.shape[1], device=p.device, dtype=w.dtype)
        _sum_partials_kernel[(triton.cdiv(p.shape[1], block_c),)](p, total, p.shape[0], p.shape[1], BLOCK_P=32,
                                                                  BLOCK_C=block_c)
        out.append(total)
    return out


def _partials(n: int, programs: int, x: torch.Tensor) -> torch.Tensor:
    """Room for `n` fp32 partials a program; every program writes its row of each, except when there are no rows."""
    make = torch.empty if x.shape[0] else torch.zeros
    return make(n, programs, x.shape[1], device=x.device, dtype=torch.float32)


def rows(x, w, dy, mean, rstd, stages: int = 3, warps: int | None = None, per_sm: int = 1) -> tuple:
    """Whole rows, the next ones' loads in flight over `stages`; (dx, dw[, db]), db where `mean` is given."""
    n_rows, n_cols = x.shape
    block = triton.next_power_of_2(n_cols)
    programs = max(1, min(n_rows, per_sm * num_sms(x)))
    dx = torch.empty_like(x)
    partials = _partials(2 if mean is not None else 1, programs, x)
    if n_rows:
        _rows_kernel[(programs,)](x, w, dy, rstd if mean is None else mean, rstd, dx, partials[0], partials[-1],
                                  n_rows, n_cols, CENTERED=mean is not None, STAGES=stages, BLOCK=block,
                                  num_warps=warps or max(1, min(32, block // 256)))
    return (dx, *_finish(partials, w))


def split(x, w, dy, mean, rstd, slice_: int | None = None, chunk: int | None = None, warps: int | None = None,
          stages: int | None = None, per_sm: int = 1) -> tuple:
    """Column slices of `slice_`, as many programs a row as slices; (dx, dw[, db]), db where `mean` is given. Left
    out, the slice, chunk, warps and stages are the SPLIT_ constants."""
    n_rows, n_cols = x.shape
    chunk, warps, stages = chunk or SPLIT_CHUNK, warps or SPLIT_WARPS, stages or SPLIT_STAGES
    slice_ = min(slice_ or SPLIT_SLICE, triton.next_power_of_2(n_cols))
    splits = triton.cdiv(n_cols, slice_)
    groups = max(1, min(n_rows, per_sm * num_sms(x) // splits))
    dx = torch.empty_like(x)
    partials = _partials(2 if mean is not None else 1, groups, x)
    if n_rows:
        _split_kernel[(groups * splits,)](x, w, dy, rstd if mean is None else mean, rstd, dx, partials[0],
                                          partials[-1], n_rows, n_cols, CENTERED=mean is not None, SPLITS=splits,
                                          SLICE=slice_, CHUNK=min(chunk, slice_), STAGES=stages, num_warps=warps)
    return (dx, *_finish(partials, w))


def pipelined(x, w, dy, mean, rstd) -> tuple:
    """Rows pipelined to ROWS_UP_TO columns (ROWS_STAGES), split by columns past it; (dx, dw[, db])."""
    x, dy = x.contiguous(), dy.contiguous()
    n_cols = x.shape[1]
    if n_cols <= ROWS_UP_TO:
        stages = next(s for up_to, s in ROWS_STAGES if n_cols <= up_to)
        return rows(x, w, dy, mean, rstd, stages=stages)
    return split(x, w, dy, mean, rstd)
