"""Tensor parallelism's all-reduce of a layer's partial output, fused with the residual add and RMSNorm after it.

What you will learn: in a tensor-parallel layer every device holds a partial sum of the layer's output
(the row-parallel GEMM's share); an all-reduce sums them, then the residual add and the next pre-norm
read the sum back from memory. The all-reduce is bound by the link for large messages (each device
sends and receives 2(n-1)/n of the message, NCCL's bus bytes) and by latency for small ones (decode:
a few to a few hundred KB, where a ring's 2(n-1) steps cost more than the bytes). Three things decide
its speed: the algorithm (a ring, a one-shot read of every peer's buffer, or reduce-scatter plus
all-gather), how many passes the add and the norm add over HBM, and whether the norm rides inside the
collective's last pass instead of after it.

Each rank runs the same function; `torch.distributed` is initialised by `casebook.distributed` (NCCL
on GPUs, gloo on a CPU). The inputs hold every rank's partial, [ranks, tokens, hidden], drawn alike
on every rank from one seed, so the float64 reference sums all of them; a rank reduces only its own.

The ladder:
  allreduce_separate    the partial copied into a communication buffer, all-reduced in place (NCCL's
                        ring or tree; gloo on a CPU), then x + r and torch's rms_norm: two more launches
  allreduce_fused       the same all-reduce, then rmsnorm's fused residual + RMSNorm kernel (four passes)
  oneshot               symmetric memory's one-shot all-reduce: every device reads every peer's buffer
                        over NVLink in one kernel (latency: one step instead of 2(n-1)); then the fused norm
  twoshot               reduce-scatter then all-gather (each device reduces 1/n of the rows), then the
                        fused norm over the whole tensor
  twoshot_fused         the norm moved between the two halves: each device adds and normalises only its
                        1/n of the rows, then all-gathers s and y (the norm's HBM bytes divided by n)
  oneshot_fused         one Triton kernel over symmetric memory: each program reads its row from every
                        peer, sums, adds r, normalises and writes s and y: the all-reduce's only pass is
                        the norm's
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
import triton
import triton.language as tl

from casebook.kernels.device import on_device
from casebook.kernels.rmsnorm import EPS, reference_residual, triton_onepass_residual
from casebook.traffic import Term, Traffic

# --- references, inputs, traffic ---------------------------------------------------------------


def world() -> tuple[int, int]:
    """(rank, ranks) of this process; outside a process group (the reference's child) rank 0 of the
    case's `CASEBOOK_DEVICES` (1 when unset)."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, int(os.environ.get("CASEBOOK_DEVICES", "1"))


def reference(partials: torch.Tensor, r: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(s, y): s = sum of the ranks' partials + r, y = rmsnorm(s) * w, in float64."""
    return reference_residual(partials.sum(0), r, w)


def make_inputs(shape: dict, dtype: torch.dtype, device: str, generator: torch.Generator) -> dict:
    """Every rank's partial (unit spread each: the row-parallel GEMM's shares), the residual stream r
    (larger, as deep in a network) and a norm weight near 1; identical on every rank."""
    _, n = world()
    g = on_device(generator, device)
    t, h = shape["tokens"], shape["hidden"]
    partials = torch.randn(n, t, h, generator=g, device=device).to(dtype)
    r = (torch.randn(t, h, generator=g, device=device) * 4.0).to(dtype)
    w = (1.0 + 0.3 * torch.randn(h, generator=g, device=device)).to(dtype)
    return {"partials": partials, "r": r, "w": w}


def traffic(shape: dict, dtype: torch.dtype) -> Traffic:
    """Per device: the all-reduce's bus bytes (over the link) and the HBM passes of the add and norm."""
    _, n = world()
    t, h = shape["tokens"], shape["hidden"]
    b = torch.empty((), dtype=dtype).element_size()
    message = t * h * b
    return Traffic([
        Term("all-reduce bus bytes, 2(n-1)/n of the message (over the link)", bytes=2 * (n - 1) / n * message,
             link=True),
        Term("copy the partial into the communication buffer (read + write)", bytes=2 * message),
        Term("read the reduced sum", bytes=message),
        Term("read r", bytes=message),
        Term("write s = sum + r", bytes=message),
        Term("write y", bytes=message),
        Term("read w (one row, once)", bytes=h * b),
        Term("reduce the partials ((n-1) / element)", flops=(n - 1) * t * h),
        Term("add r (1 / element)", flops=t * h),
        Term("square and sum (2 / element)", flops=2 * t * h),
        Term("rsqrt (1 / row)", flops=t),
        Term("scale by 1/rms and w (2 / element)", flops=2 * t * h),
    ])


def _local(partials: torch.Tensor) -> torch.Tensor:
    """This rank's partial, copied into a buffer the collective may overwrite (the inputs stay unmodified)."""
    rank, _ = world()
    return partials[rank].clone()


# --- variant 1: NCCL all-reduce, then the add and the norm as two more kernels ---------------------


def allreduce_separate(partials, r, w) -> tuple[torch.Tensor, torch.Tensor]:
    x = _local(partials)
    dist.all_reduce(x)
    s = x + r
    return s, torch.nn.functional.rms_norm(s, (s.shape[-1],), w, EPS)


# --- variant 2: NCCL all-reduce, then the rmsnorm case's fused residual + RMSNorm ---------------------


def allreduce_fused(partials, r, w) -> tuple[torch.Tensor, torch.Tensor]:
    x = _local(partials)
    dist.all_reduce(x)
    return triton_onepass_residual(x, r, w)


# --- variant 3: one-shot all-reduce over symmetric memory ------------------------------------------

_symm: dict = {}


def _symm_buffer(shape: tuple, dtype: torch.dtype, device: torch.device):
    """A buffer every peer can read (symmetric memory, rendezvoused once per shape and dtype) and its handle."""
    key = (shape, dtype, str(device))
    if key not in _symm:
        import torch.distributed._symmetric_memory as symm_mem

        group = dist.group.WORLD.group_name
        if hasattr(symm_mem, "enable_symm_mem_for_group"):  # needed before torch 2.8's implicit enable
            symm_mem.enable_symm_mem_for_group(group)
        buf = symm_mem.empty(shape, dtype=dtype, device=device)
        _symm[key] = (buf, symm_mem.rendezvous(buf, group), group)
    return _symm[key]


def _cuda_only(x: torch.Tensor, what: str) -> None:
    if x.device.type != "cuda":
        raise NotImplementedError(f"{what} needs symmetric memory, which is CUDA-only")


def oneshot(partials, r, w) -> tuple[torch.Tensor, torch.Tensor]:
    _cuda_only(partials, "the one-shot all-reduce")
    rank, _ = world()
    buf, _, group = _symm_buffer(tuple(partials.shape[1:]), partials.dtype, partials.device)
    buf.copy_(partials[rank])
    x = torch.ops.symm_mem.one_shot_all_reduce(buf, "sum", group)
    return triton_onepass_residual(x, r, w)


# --- variant 4: two-shot: reduce-scatter, then all-gather -------------------------------------------


def _padded(partials: torch.Tensor) -> tuple[torch.Tensor, int]:
    """This rank's partial in a buffer of rows padded to a multiple of the ranks (zeros below), and rows a rank."""
    rank, n = world()
    t = partials.shape[1]
    m = -(-t // n)
    x = partials.new_zeros(n * m, partials.shape[2])
    x[:t].copy_(partials[rank])
    return x, m


def twoshot(partials, r, w) -> tuple[torch.Tensor, torch.Tensor]:
    x, m = _padded(partials)
    shard = x.new_empty(m, x.shape[1])
    dist.reduce_scatter_tensor(shard, x)
    dist.all_gather_into_tensor(x, shard)
    return triton_onepass_residual(x[: r.shape[0]], r, w)


# --- variant 5: the norm between the two halves ---------------------------------------------------


def twoshot_fused(partials, r, w) -> tuple[torch.Tensor, torch.Tensor]:
    rank, _ = world()
    x, m = _padded(partials)
    t = r.shape[0]
    shard = x.new_empty(m, x.shape[1])
    dist.reduce_scatter_tensor(shard, x)
    lo, hi = min(rank * m, t), min((rank + 1) * m, t)  # this rank's rows of the real tokens
    s_all, y_all = torch.empty_like(x), torch.empty_like(x)
    s_mine, y_mine = s_all.new_zeros(m, x.shape[1]), y_all.new_zeros(m, x.shape[1])
    if hi > lo:
        s_mine[: hi - lo], y_mine[: hi - lo] = triton_onepass_residual(shard[: hi - lo], r[lo:hi], w)
    dist.all_gather_into_tensor(s_all, s_mine)
    dist.all_gather_into_tensor(y_all, y_mine)
    return s_all[:t], y_all[:t]


# --- variant 6: the all-reduce's one pass is the norm's ----------------------------------------------


@triton.jit
def _oneshot_norm_kernel(ptrs, r_ptr, w_ptr, s_ptr, y_ptr, n_cols, eps, RANKS: tl.constexpr, BLOCK: tl.constexpr):
    # One row a program: the row read from every peer's buffer (NVLink loads), summed in fp32 in rank
    # order (every rank gets the same bits), r added, normalised; s and y written to local HBM only.
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    offs = row.to(tl.int64) * n_cols + cols
    h = tl.load(r_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    for p in tl.static_range(RANKS):
        peer = tl.load(ptrs + p).to(tl.pointer_type(s_ptr.dtype.element_ty))
        h += tl.load(peer + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(s_ptr + offs, h.to(s_ptr.dtype.element_ty), mask=mask)
    rstd = tl.rsqrt(tl.sum(h * h, axis=0) / n_cols + eps)
    wv = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + offs, (h * rstd * wv).to(y_ptr.dtype.element_ty), mask=mask)


MAX_HIDDEN = 32768
"""Longest row one program holds (as rmsnorm's one-pass kernel)."""

_ptr_tables: dict = {}


def oneshot_fused(partials, r, w) -> tuple[torch.Tensor, torch.Tensor]:
    _cuda_only(partials, "the fused one-shot all-reduce")
    rank, n = world()
    t, h = partials.shape[1:]
    if h > MAX_HIDDEN:
        raise NotImplementedError(f"oneshot_fused holds rows of at most {MAX_HIDDEN}; got {h}")
    buf, handle, _ = _symm_buffer((t, h), partials.dtype, partials.device)
    key = id(handle)
    if key not in _ptr_tables:
        _ptr_tables[key] = torch.tensor(handle.buffer_ptrs, dtype=torch.int64, device=partials.device)
    buf.copy_(partials[rank])
    s, y = torch.empty_like(r), torch.empty_like(r)
    handle.barrier(channel=0)  # every peer's partial is in its buffer
    block = triton.next_power_of_2(h)
    _oneshot_norm_kernel[(t,)](_ptr_tables[key], r, w, s, y, h, EPS, RANKS=n, BLOCK=block,
                               num_warps=min(16, max(4, block // 1024)))
    handle.barrier(channel=1)  # every peer has read this rank's buffer before the next call overwrites it
    return s, y


# --- level 3: a tensor-parallel MLP block ------------------------------------------------------------


def make_mlp_inputs(shape: dict, dtype: torch.dtype, device: str, generator: torch.Generator) -> dict:
    """A Llama MLP split over the ranks (Megatron's split): the gate/up projection by columns, the down
    projection by rows, this rank's shards only; the input y and the residual stream r replicated."""
    rank, n = world()
    t, h, ffn = shape["tokens"], shape["hidden"], shape["ffn"]
    if ffn % n:
        raise NotImplementedError(f"ffn {ffn} does not split over {n} ranks")
    g = on_device(generator, device)
    x = torch.randn(t, h, generator=g, device=device).to(dtype)
    r = (torch.randn(t, h, generator=g, device=device) * 4.0).to(dtype)
    w = (1.0 + 0.3 * torch.randn(h, generator=g, device=device)).to(dtype)
    mine = torch.Generator(device=g.device).manual_seed(int(g.initial_seed()) + 1 + rank)
    f = ffn // n
    gate_up = (torch.randn(h, 2 * f, generator=mine, device=device) / h**0.5).to(dtype)
    down = (torch.randn(f, h, generator=mine, device=device) / f**0.5).to(dtype)
    return {"x": x, "r": r, "w": w, "gate_up": gate_up, "down": down}


def tp_mlp(kernel, x, r, w, gate_up, down) -> torch.Tensor:
    """GEMM (gate/up, this rank's columns), SiLU-gated product, GEMM (down, this rank's rows) giving the
    partial output, then the all-reduce + residual + RMSNorm under test; s is added into y so that both
    outputs are live and compared."""
    _, n = world()
    gu = x @ gate_up
    gate, up = gu.chunk(2, dim=-1)
    partial = (torch.nn.functional.silu(gate) * up) @ down
    # The variants take every rank's partial and reduce partials[rank]: an expanded view hands each rank
    # its own without a copy.
    s, y = kernel(partials=partial.unsqueeze(0).expand(n, *partial.shape), r=r, w=w)
    return y + s
