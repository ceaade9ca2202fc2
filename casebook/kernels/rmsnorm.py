"""RMSNorm over rows: the forward, the pre-norm block with its residual add fused, and the backward.

What you will learn: RMSNorm does ~4 FLOPs an element against 4 bytes moved (bf16 read + write), so,
like softmax, it is bandwidth-bound and its speed is the number of tensor passes. Three things decide
them: holding the row on chip between its reduction and its scaling (one read, one write), fusing the
residual add that precedes every pre-norm in an LLM layer (four passes instead of five), and, in the
backward, reducing dw across rows without serialising on atomics.

Three cases share this module, one function each (a case has one reference and one traffic model):
  rmsnorm            y = x / rms(x) * w
  rmsnorm_residual   s = x + r; y = s / rms(s) * w, returning (s, y): the pre-norm block
  rmsnorm_backward   (dx, dw) from x, w, dy and the forward's saved 1/rms per row

The forward ladder (both forward cases):
  eager            the Hugging Face LlamaRMSNorm composite: upcast, square, mean, rsqrt, two multiplies
  torch            torch.nn.functional.rms_norm (after a separate add, for the residual case)
  torch_compile    Inductor fuses the composite (and the add)
  liger            Liger-Kernel's Triton RMSNorm (LigerFusedAddRMSNorm for the residual case): the peer
  triton_onepass   one program per block of rows, each row whole in registers: one read, one write
  triton_long      rows of any length: the one-pass kernel to 32K columns, a two-sweep chunked loop beyond
                   (the second sweep re-reads the row, from L2 when the rows in flight fit there); softmax's
                   persistent streaming of 16K-32K rows was slower here (measured, `triton_long`)

The backward ladder: eager formula; torch's fused backward kernel; torch.compile; Liger; then dx in one
pass with dw reduced across rows three ways:
  triton_atomic    every block of rows adds its dw partial into one fp32 row by atomics
  triton_partial   persistent programs (a few per SM) each keep a dw partial in registers over the rows
                   they walk, write it once, and a second small pass sums the partials
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from casebook.kernels.device import INTERPRET, autotune, compiled, num_sms, on_device, peer
from casebook.traffic import Term, Traffic

EPS = 1e-5
"""rms_norm_eps of the Llama-3, Qwen2.5 and Mistral configs."""

# --- references, inputs, traffic ---------------------------------------------------------------


def reference(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """y = x / sqrt(mean(x^2) + eps) * w over the last dimension, in float64."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * w


def reference_residual(x: torch.Tensor, r: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(s, y): the residual stream s = x + r and its norm y, in float64."""
    s = x + r
    return s, reference(s, w)


def reference_backward(x, w, dy, rstd) -> tuple[torch.Tensor, torch.Tensor]:
    """(dx, dw) of y = rmsnorm(x) * w against dy, by float64 autograd (rstd is the forward's saved
    statistic, which the exact answer recomputes from x)."""
    del rstd
    x, w = x.detach().requires_grad_(), w.detach().requires_grad_()
    dx, dw = torch.autograd.grad(reference(x, w), (x, w), dy)
    return dx, dw


def _hidden(shape: dict, dtype: torch.dtype, device: str, generator: torch.Generator) -> torch.Tensor:
    g = on_device(generator, device)
    return torch.randn(shape["rows"], shape["cols"], generator=g, device=device, dtype=torch.float32).to(dtype)


def _weight(shape: dict, dtype: torch.dtype, device: str, generator: torch.Generator) -> torch.Tensor:
    # Trained norm weights sit near 1 with a spread (Llama-3 8B's: mean ~0.4-1.0 by layer); never all ones.
    g = on_device(generator, device)
    return (1.0 + 0.3 * torch.randn(shape["cols"], generator=g, device=device)).to(dtype)


def make_inputs(shape: dict, dtype: torch.dtype, device: str, generator: torch.Generator) -> dict:
    """Hidden states with unit spread and a norm weight near 1."""
    return {"x": _hidden(shape, dtype, device, generator), "w": _weight(shape, dtype, device, generator)}


def make_residual_inputs(shape: dict, dtype: torch.dtype, device: str, generator: torch.Generator) -> dict:
    """A layer's output x and the residual stream r it is added to (r larger, as deep in a network)."""
    x = _hidden(shape, dtype, device, generator)
    r = (_hidden(shape, torch.float32, device, generator) * 4.0).to(dtype)
    return {"x": x, "r": r, "w": _weight(shape, dtype, device, generator)}


def make_backward_inputs(shape: dict, dtype: torch.dtype, device: str, generator: torch.Generator) -> dict:
    """x, w and the incoming gradient dy, with the 1/rms per row (fp32) the forward saved for the backward."""
    x = _hidden(shape, dtype, device, generator)
    w = _weight(shape, dtype, device, generator)
    dy = _hidden(shape, dtype, device, generator)
    return {"x": x, "w": w, "dy": dy, **_saved_rstd({"x": x})}


def _saved_rstd(inputs: dict) -> dict:
    """The statistic the forward saves, from x: what a blend of the inputs recomputes
    (`make_backward_inputs.derived`)."""
    return {"rstd": torch.rsqrt(inputs["x"].float().pow(2).mean(-1) + EPS)}


make_backward_inputs.derived = _saved_rstd


def _sizes(shape: dict, dtype: torch.dtype) -> tuple[int, int, int, int]:
    rows, cols = shape["rows"], shape["cols"]
    return rows, cols, rows * cols, torch.empty((), dtype=dtype).element_size()


def traffic(shape: dict, dtype: torch.dtype) -> Traffic:
    """The floor of the forward: x read once, y written once, w read once."""
    rows, cols, n, b = _sizes(shape, dtype)
    return Traffic([
        Term("read x", bytes=n * b),
        Term("write y", bytes=n * b),
        Term("read w (one row, once)", bytes=cols * b),
        Term("square and sum (2 / element)", flops=2 * n),
        Term("rsqrt (1 / row)", flops=rows),
        Term("scale by 1/rms and w (2 / element)", flops=2 * n),
    ])


def traffic_residual(shape: dict, dtype: torch.dtype) -> Traffic:
    """The floor of the pre-norm block: x and r read once, s and y written once (four tensor passes)."""
    rows, cols, n, b = _sizes(shape, dtype)
    return Traffic([
        Term("read x", bytes=n * b),
        Term("read r", bytes=n * b),
        Term("write s = x + r", bytes=n * b),
        Term("write y", bytes=n * b),
        Term("read w (one row, once)", bytes=cols * b),
        Term("add (1 / element)", flops=n),
        Term("square and sum (2 / element)", flops=2 * n),
        Term("rsqrt (1 / row)", flops=rows),
        Term("scale by 1/rms and w (2 / element)", flops=2 * n),
    ])


def traffic_backward(shape: dict, dtype: torch.dtype) -> Traffic:
    """The floor of the backward: x, dy read once, dx written once, rstd and w read once, dw written.

    dw is a sum over every row. The partial sums a variant writes and reads back to get it
    (`triton_partial`: 264 fp32 rows on an H200, 2% of the bytes at 16384 x 4096, 40% at 512 rows) are
    that variant's cost, not the floor's: one program per column block, or atomics, move none. So a
    claim's TB/s here counts x, dy, dx, rstd, w and dw only, stricter than counting the partials."""
    rows, cols, n, b = _sizes(shape, dtype)
    return Traffic([
        Term("read x", bytes=n * b),
        Term("read dy", bytes=n * b),
        Term("write dx", bytes=n * b),
        Term("read rstd (fp32, 1 / row)", bytes=rows * 4),
        Term("read w (one row, once)", bytes=cols * b),
        Term("write dw", bytes=cols * b),
        Term("x hat, w dy (2 / element)", flops=2 * n),
        Term("row sum of x hat w dy (2 / element)", flops=2 * n),
        Term("dx = (w dy - x hat c) rstd (3 / element)", flops=3 * n),
        Term("dw += dy x hat (2 / element)", flops=2 * n),
    ])


# --- variant 1: eager composite -------------------------------------------------------------------


def eager(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Hugging Face's LlamaRMSNorm: each op a pass over memory (upcast, square, mean, scale, cast, scale)."""
    h = x.float()  # read x, write h (fp32)
    rstd = torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + EPS)  # read h, write h^2, read h^2
    return w * (h * rstd).to(x.dtype)  # read h, write, read, write y


def eager_residual(x: torch.Tensor, r: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    s = x + r  # read x, r; write s
    return s, eager(s, w)


# --- variant 2, 3: the library and the compiler -----------------------------------------------------


def torch_rms_norm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.rms_norm(x, (x.shape[-1],), w, EPS)


def torch_residual(x: torch.Tensor, r: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The unfused block: the add (read x, r; write s), then the library norm (read s; write y): five passes."""
    s = x + r
    return s, torch_rms_norm(s, w)


torch_compile = compiled(eager)
torch_compile_residual = compiled(eager_residual)


# --- variant 4: the peer, Liger-Kernel --------------------------------------------------------------


def liger(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    ops = peer("liger_kernel.ops.rms_norm", x, "Liger's RMSNorm")
    return ops.LigerRMSNormFunction.apply(x, w, EPS)


def liger_residual(x: torch.Tensor, r: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    ops = peer("liger_kernel.ops.fused_add_rms_norm", x, "Liger's fused add + RMSNorm")
    y, s = ops.LigerFusedAddRMSNormFunction.apply(x, r, w, EPS)
    return s, y


# --- variant 5: one pass, rows in registers ---------------------------------------------------------


@triton.jit
def _rows_kernel(x_ptr, r_ptr, w_ptr, s_ptr, y_ptr, n_rows, n_cols, eps,
                 RESIDUAL: tl.constexpr, ROWS: tl.constexpr, BLOCK: tl.constexpr):
    # ROWS rows per program, each whole in registers: x (and r) read once, (s and) y written once.
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)[:, None]
    cols = tl.arange(0, BLOCK)[None, :]
    mask = (rows < n_rows) & (cols < n_cols)
    offs = rows.to(tl.int64) * n_cols + cols
    h = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    if RESIDUAL:
        h += tl.load(r_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        tl.store(s_ptr + offs, h.to(s_ptr.dtype.element_ty), mask=mask)
    rstd = tl.rsqrt(tl.sum(h * h, axis=1) / n_cols + eps)[:, None]
    w = tl.load(w_ptr + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
    tl.store(y_ptr + offs, (h * rstd * w).to(y_ptr.dtype.element_ty), mask=mask)


MAX_ONEPASS = 32768
"""Longest row one program holds: 32K fp32 values over 1024 threads is 32 registers each."""


def _rows_configs() -> list[triton.Config]:
    return [triton.Config({"ROWS": r}, num_warps=w) for r in (1, 2, 4, 8, 16) for w in (4, 8, 16, 32)]


def _prune_rows(configs, named_args, **kwargs):
    # A tile of 1K-32K elements, at least 4 per thread (16-byte loads of fp32, 8-byte of bf16).
    block = triton.next_power_of_2(named_args["n_cols"])
    kept = [c for c in configs if 1024 <= c.kwargs["ROWS"] * block <= MAX_ONEPASS
            and c.num_warps * 32 * 4 <= c.kwargs["ROWS"] * block]
    return kept or configs[:1]


_rows_tuned = autotune(_rows_configs(), key=["n_cols", "n_rows", "RESIDUAL"],
                              prune_configs_by={"early_config_prune": _prune_rows})(_rows_kernel)


def _outputs(x: torch.Tensor, residual: bool) -> tuple[torch.Tensor, torch.Tensor]:
    return (torch.empty_like(x) if residual else x), torch.empty_like(x)


def _onepass(x, r, w) -> tuple[torch.Tensor, torch.Tensor]:
    n_rows, n_cols = x.shape
    if n_cols > MAX_ONEPASS:
        raise NotImplementedError(f"triton_onepass holds at most {MAX_ONEPASS} columns on chip; got {n_cols}")
    residual = r is not None
    s, y = _outputs(x, residual)
    r = x if r is None else r  # an unused pointer when RESIDUAL is off
    block = triton.next_power_of_2(n_cols)
    if INTERPRET:  # no autotuning under the interpreter: two rows a program
        _rows_kernel[(triton.cdiv(n_rows, 2),)](x, r, w, s, y, n_rows, n_cols, EPS, RESIDUAL=residual,
                                                ROWS=2, BLOCK=block)
    else:
        grid = lambda meta: (triton.cdiv(n_rows, meta["ROWS"]),)  # noqa: E731
        _rows_tuned[grid](x, r, w, s, y, n_rows, n_cols, EPS, RESIDUAL=residual, BLOCK=block)
    return s, y


def triton_onepass(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """One read and one write, rows up to MAX_ONEPASS columns; rows per program and warps autotuned."""
    return _onepass(x.contiguous(), None, w)[1]


def triton_onepass_residual(x, r, w) -> tuple[torch.Tensor, torch.Tensor]:
    """The add fused into the one-pass kernel: read x, r; write s, y."""
    return _onepass(x.contiguous(), r.contiguous(), w)


# --- variant 6: long rows ------------------------------------------------------------------------


@triton.jit
def _chunked_rows_kernel(x_ptr, r_ptr, w_ptr, s_ptr, y_ptr, n_rows, n_cols, eps,
                         RESIDUAL: tl.constexpr, CHUNK: tl.constexpr):
    # Rows longer than a program holds: one program a row, two sweeps over CHUNK-column pieces. Sweep 1
    # sums the squares (and writes s); sweep 2 reads the row again (s, when there is a residual: already
    # rounded, as the unfused block would read it) and writes y. With a program or two a row per SM the
    # rows in flight are a few tens of MB, so the second read can come from L2.
    row = tl.program_id(0).to(tl.int64)
    base = row * n_cols
    acc = tl.zeros([CHUNK], dtype=tl.float32)
    for start in range(0, n_cols, CHUNK):
        cols = start + tl.arange(0, CHUNK)
        mask = cols < n_cols
        h = tl.load(x_ptr + base + cols, mask=mask, other=0.0).to(tl.float32)
        if RESIDUAL:
            h += tl.load(r_ptr + base + cols, mask=mask, other=0.0).to(tl.float32)
            tl.store(s_ptr + base + cols, h.to(s_ptr.dtype.element_ty), mask=mask)
        acc += h * h
    rstd = tl.rsqrt(tl.sum(acc, axis=0) / n_cols + eps)
    if RESIDUAL:
        tl.debug_barrier()  # this program's s is stored before it is read back
    src = s_ptr if RESIDUAL else x_ptr
    for start in range(0, n_cols, CHUNK):
        cols = start + tl.arange(0, CHUNK)
        mask = cols < n_cols
        h = tl.load(src + base + cols, mask=mask, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(y_ptr + base + cols, (h * rstd * w).to(y_ptr.dtype.element_ty), mask=mask)


LONG_CHUNK = 8192
"""Columns per piece of the chunked two-sweep kernel on a GPU (8 per thread at 32 warps)."""

INTERPRETER_CHUNK = 1024
"""The chunked kernel's piece under the interpreter: small, so that tests' rows span several pieces."""


def _long(x, r, w) -> tuple[torch.Tensor, torch.Tensor]:
    n_rows, n_cols = x.shape
    if n_cols <= MAX_ONEPASS:
        return _onepass(x, r, w)
    residual = r is not None
    s, y = _outputs(x, residual)
    r_arg = x if r is None else r
    chunk = INTERPRETER_CHUNK if INTERPRET else LONG_CHUNK
    _chunked_rows_kernel[(n_rows,)](x, r_arg, w, s, y, n_rows, n_cols, EPS, RESIDUAL=residual, CHUNK=chunk,
                                    num_warps=32)
    return s, y


def triton_long(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Any row length: one pass to 32K columns, two chunked sweeps beyond. (Persistent programs streaming
    32K rows with the next two in flight, softmax's method, measured 2.35-2.45 TB/s on an H200 at 2048 and
    4096 x 32768 bf16, against 3.56-3.76 for the autotuned one-pass kernel in the same run.)"""
    return _long(x.contiguous(), None, w)[1]


def triton_long_residual(x, r, w) -> tuple[torch.Tensor, torch.Tensor]:
    """triton_long with the add fused: the chunked sweeps read back s, which they wrote."""
    return _long(x.contiguous(), r.contiguous(), w)


# --- the backward: eager, torch, the compiler, the peer ---------------------------------------------


def eager_backward(x, w, dy, rstd) -> tuple[torch.Tensor, torch.Tensor]:
    """dx = rstd (w dy - x_hat mean(x_hat w dy)), dw = sum over rows of dy x_hat, as tensor ops in fp32."""
    xhat = x.float() * rstd[:, None]
    wdy = w.float() * dy.float()
    c = (xhat * wdy).mean(-1, keepdim=True)
    dx = (wdy - xhat * c) * rstd[:, None]
    return dx.to(x.dtype), (dy.float() * xhat).sum(0).to(w.dtype)


def torch_backward(x, w, dy, rstd) -> tuple[torch.Tensor, torch.Tensor]:
    """The backward kernel torch.nn.functional.rms_norm's autograd runs (aten._fused_rms_norm_backward),
    fed the saved rstd as autograd would. CUDA only: torch has no CPU kernel for it."""
    if not x.is_cuda:
        raise NotImplementedError("aten._fused_rms_norm_backward has no CPU kernel")
    dx, dw = torch.ops.aten._fused_rms_norm_backward(dy, x, [x.shape[-1]], rstd[:, None], w, [True, True])
    return dx, dw


torch_compile_backward = compiled(eager_backward)


def liger_backward(x, w, dy, rstd) -> tuple[torch.Tensor, torch.Tensor]:
    """Liger's RMSNorm backward (what LigerRMSNormFunction.backward calls), on the same saved rstd."""
    ops = peer("liger_kernel.ops.rms_norm", x, "Liger's RMSNorm backward")
    block, warps = ops.calculate_settings(x.shape[-1])
    dx, dw = ops.rms_norm_backward(dy, x, w, rstd, 0.0, ops._CASTING_MODE_LLAMA.value, block, warps,
                                   False, None)
    return dx, dw


# --- variant 5, 6 of the backward: dx in one pass, dw by atomics or by partial sums -------------------


@triton.jit
def _backward_kernel(x_ptr, w_ptr, dy_ptr, rstd_ptr, dx_ptr, dw_ptr, n_rows, n_cols,
                     ATOMIC: tl.constexpr, BLOCK: tl.constexpr):
    # Each program walks rows pid, pid + programs, ...: dx of each row from registers (its one extra
    # reduction, the row sum of x_hat w dy, done while the row is on chip), dy x_hat summed into a dw
    # partial in registers. ATOMIC: the partial is added into one fp32 row by atomics; else it is
    # written to row pid of a [programs, cols] buffer for a second pass to sum.
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    dw = tl.zeros([BLOCK], dtype=tl.float32)
    for row in range(pid, n_rows, tl.num_programs(0)):
        offs = tl.cast(row, tl.int64) * n_cols + cols
        x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        rstd = tl.load(rstd_ptr + row)
        xhat = x * rstd
        wdy = w * dy
        c = tl.sum(xhat * wdy, axis=0) / n_cols
        tl.store(dx_ptr + offs, ((wdy - xhat * c) * rstd).to(dx_ptr.dtype.element_ty), mask=mask)
        dw += dy * xhat
    if ATOMIC:
        tl.atomic_add(dw_ptr + cols, dw, mask=mask, sem="relaxed")
    else:
        tl.store(dw_ptr + pid * n_cols + cols, dw, mask=mask)


@triton.jit
def _sum_partials_kernel(p_ptr, dw_ptr, n_partials, n_cols, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr):
    # The second pass: each program sums a BLOCK_C-column strip of the [partials, cols] buffer.
    cols = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    acc = tl.zeros([BLOCK_C], dtype=tl.float32)
    for start in range(0, n_partials, BLOCK_P):
        p = start + tl.arange(0, BLOCK_P)[:, None]
        m = (p < n_partials) & (cols[None, :] < n_cols)
        acc += tl.sum(tl.load(p_ptr + p * n_cols + cols[None, :], mask=m, other=0.0), axis=0)
    tl.store(dw_ptr + cols, acc.to(dw_ptr.dtype.element_ty), mask=cols < n_cols)


MAX_BACKWARD = 16384
"""Longest row the backward holds: x, dy, w and the dw partial, 4 x 16K fp32 over 1024 threads is 64
registers each; at 32K they would spill."""

ATOMIC_ROWS = 4
"""Rows per program of triton_atomic on a GPU: n_rows / 4 programs, each one atomic add of a dw row."""

PARTIALS_PER_SM = 2
"""Persistent programs per SM of triton_partial: each writes one fp32 dw partial."""


def _backward(x, w, dy, rstd, atomic: bool) -> tuple[torch.Tensor, torch.Tensor]:
    n_rows, n_cols = x.shape
    if n_cols > MAX_BACKWARD:
        raise NotImplementedError(f"the backward holds at most {MAX_BACKWARD} columns on chip; got {n_cols}")
    x, dy = x.contiguous(), dy.contiguous()
    block = triton.next_power_of_2(n_cols)
    warps = max(1, min(32, block // 256))  # 8 fp32 of each of four rows per thread
    dx = torch.empty_like(x)
    dw = torch.empty(n_cols, device=x.device, dtype=w.dtype)
    if atomic:
        programs = triton.cdiv(n_rows, 2 if INTERPRET else ATOMIC_ROWS)
        acc = torch.zeros(n_cols, device=x.device, dtype=torch.float32)
        _backward_kernel[(programs,)](x, w, dy, rstd, dx, acc, n_rows, n_cols, ATOMIC=True, BLOCK=block,
                                      num_warps=warps)
        dw.copy_(acc)
        return dx, dw
    programs = min(n_rows, PARTIALS_PER_SM * num_sms(x))
    partials = torch.empty(programs, n_cols, device=x.device, dtype=torch.float32)
    _backward_kernel[(programs,)](x, w, dy, rstd, dx, partials, n_rows, n_cols, ATOMIC=False, BLOCK=block,
                                  num_warps=warps)
    block_c = 64 if INTERPRET else 256
    _sum_partials_kernel[(triton.cdiv(n_cols, block_c),)](partials, dw, programs, n_cols, BLOCK_P=32,
                                                          BLOCK_C=block_c)
    return dx, dw


def triton_atomic(x, w, dy, rstd) -> tuple[torch.Tensor, torch.Tensor]:
    """dx in one pass; each block of rows adds its dw partial into one fp32 row by atomics (then cast)."""
    return _backward(x, w, dy, rstd, atomic=True)


def triton_partial(x, w, dy, rstd) -> tuple[torch.Tensor, torch.Tensor]:
    """dx in one pass by persistent programs, each keeping a dw partial in registers; a second pass sums them."""
    return _backward(x, w, dy, rstd, atomic=False)


# --- level 3: a decoder layer's pre-norm around a projection -----------------------------------------


def make_layer_inputs(shape: dict, dtype: torch.dtype, device: str, generator: torch.Generator) -> dict:
    """Hidden states [tokens, hidden], the norm weight and a projection [hidden, out]."""
    g = on_device(generator, device)
    t, h, o = shape["tokens"], shape["hidden"], shape["out"]
    x = torch.randn(t, h, generator=g, device=device).to(dtype)
    w = (1.0 + 0.3 * torch.randn(h, generator=g, device=device)).to(dtype)
    proj = (torch.randn(h, o, generator=g, device=device) * h**-0.5).to(dtype)
    return {"x": x, "w": w, "proj": proj}


def make_residual_layer_inputs(shape: dict, dtype: torch.dtype, device: str, generator: torch.Generator) -> dict:
    """make_layer_inputs and the residual stream r [tokens, hidden] that x is added to."""
    inputs = make_layer_inputs(shape, dtype, device, generator)
    g = on_device(generator, device)
    r = (torch.randn(shape["tokens"], shape["hidden"], generator=g, device=device) * 4.0).to(dtype)
    return {**inputs, "r": r}


def make_backward_layer_inputs(shape: dict, dtype: torch.dtype, device: str, generator: torch.Generator) -> dict:
    """make_layer_inputs, the rstd its forward saved, and the gradient dout arriving at the projection's output."""
    inputs = make_layer_inputs(shape, dtype, device, generator)
    g = on_device(generator, device)
    dout = torch.randn(shape["tokens"], shape["out"], generator=g, device=device).to(dtype)
    rstd = torch.rsqrt(inputs["x"].float().pow(2).mean(-1) + EPS)
    return {**inputs, "rstd": rstd, "dout": dout}


def prenorm_projection(kernel, x, w, proj) -> torch.Tensor:
    """The attention half's entry of a Llama layer: y = rmsnorm(x) * w (x the residual stream), then the
    fused QKV projection y @ proj ([hidden, hidden + 2 kv_heads x head_dim])."""
    return kernel(x=x, w=w) @ proj


def residual_prenorm_projection(kernel, x, r, w, proj) -> torch.Tensor:
    """s = x + r (the attention output joins the residual stream), y = rmsnorm(s) * w, then the MLP's
    fused gate/up projection y @ proj. The next residual add reads s, so s is added into the first
    columns of the result: both outputs stay live and are compared."""
    s, y = kernel(x=x, r=r, w=w)
    out = y @ proj
    out[:, : s.shape[1]] += s
    return out


def prenorm_projection_backward(kernel, x, w, rstd, proj, dout) -> torch.Tensor:
    """The backward of prenorm_projection's input path: dy = dout @ proj^T (the projection's input
    gradient, a GEMM of the forward's size; its weight gradient, another, is left out), then the
    norm's (dx, dw); dx is returned with dw added into its first row, so that both are compared."""
    dy = dout @ proj.T
    dx, dw = kernel(x=x, w=w, dy=dy, rstd=rstd)
    dx[0] += dw
    return dx
