"""The fused linear cross-entropy: the LM head's GEMM feeding the loss, so the full logits never exist.

What you will learn: a training step needs three things from the LM head and its loss, the mean loss,
d hidden and dW, and none of them is the [tokens, vocab] logits. cross_entropy's one-pass kernel
reads the logits once and writes their gradient once, but the logits and the gradient are still
gigabytes (2.1 GB each in bf16 at 8192 tokens x 128,256), written by one GEMM and read by two more.
Cut the tokens into chunks and each chunk's logits live only while its loss, gradient, d hidden and
its share of dW are computed: the memory falls to the inputs and their gradients plus one chunk, and
the bytes to what the three GEMMs must move. What limits it then is the GEMMs: 3 x 2 x tokens x hidden
x vocab FLOPs (25.8 TFLOP at the claim's shape) over ~2.3 GB, ~11,000 FLOP/byte, compute-bound far
past the ridge point. The loss's own bytes (one read, one write of a chunk's logits) and the per-chunk
read and write of dW (its accumulation) are what a chunked step adds to the GEMMs' time.

The function: the mean cross-entropy of `hidden @ weight^T` over the tokens whose target is not
`IGNORE_INDEX`, with label smoothing, and its gradients with respect to hidden and weight; every
variant returns the tuple (loss, d hidden, d weight), in the inputs' dtype, each checked against float64.

The ladder:
  torch          logits materialised, F.cross_entropy, autograd's backward: the logits, the
                 log-probabilities, the zero-filled d logp and d logits all round-trip memory
  torch_compile  torch.compile of the same head and loss (Inductor's fused loss, cuBLAS GEMMs)
  split          logits materialised, cross_entropy's one-pass split kernel for the loss and d logits
                 (one read, one write), then d hidden and dW by two GEMMs on d logits
  liger          the peer: Liger-Kernel's fused linear cross-entropy (token chunks whose logits fit
                 the size of hidden, its two-sweep loss kernel writing the gradient over the chunk,
                 torch GEMMs around it, dW accumulated with addmm)
  chunked        token chunks sized to a memory budget (8% of the inputs' bytes, at least the 384 tokens
                 where dW's per-chunk update meets the ridge): the chunk's logits by one GEMM into a buffer
                 reused across chunks, the split kernel's loss and gradient written over them in
                 place, d hidden of the chunk by one GEMM, dW accumulated by addmm (the first chunk
                 writes it, no zero fill)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from casebook.kernels import device
from casebook.kernels.cross_entropy import (  # noqa: F401 (make_head_inputs: the level-3 scenario's inputs)
    IGNORE_INDEX,
    IGNORED_SHARE,
    INTERPRETER_BLOCK,
    SMALLEST_CHUNK,
    _grad,
    _n_valid,
    _prune_split,
    _row_loss,
    _split_configs,
    _torch_loss,
    make_head_inputs,
    split_triton,
)
from casebook.kernels.softmax_fusion import _row_barrier, _row_barriers
from casebook.traffic import Term, Traffic

# --- reference, inputs, traffic ----------------------------------------------------------------


def reference(hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, label_smoothing: float):
    """(mean loss, d hidden, d weight) of F.cross_entropy(hidden @ weight^T), in float64."""
    return _autograd(_head_loss, hidden, weight, target, label_smoothing)


def make_inputs(shape: dict, dtype: torch.dtype, device_: str, generator: torch.Generator,
                label_smoothing: float = 0.0) -> dict:
    """Hidden states of unit spread (what a final norm leaves), the head's weight at std 2/sqrt(hidden)
    so that the logits have cross_entropy's spread of 2, targets uniform over the vocabulary with one in
    IGNORED_SHARE set to IGNORE_INDEX (the first token always counts: a batch with no counted token has
    no mean loss). Drawn on the device they live on."""
    t, h, v = shape["tokens"], shape["hidden"], shape["vocab"]
    g = device.on_device(generator, device_)
    hidden = torch.randn(t, h, generator=g, device=device_)
    weight = torch.randn(v, h, generator=g, device=device_) * (2.0 / h**0.5)
    target = torch.randint(v, (t,), generator=g, device=device_)
    ignored = torch.rand(t, generator=g, device=device_) < IGNORED_SHARE
    ignored[0] = False
    target = torch.where(ignored, torch.full_like(target, IGNORE_INDEX), target)
    return {"hidden": hidden.to(dtype), "weight": weight.to(dtype), "target": target,
            "label_smoothing": label_smoothing}


def traffic(shape: dict, dtype: torch.dtype) -> Traffic:
    """The floor: hidden, weight and the targets read once, d hidden and dW written once, the loss
    written; the logits never leave the chip. FLOPs: the three GEMMs (logits, d hidden, dW) and the
    loss's 5 per logit (max, subtract, exp, sum, the gradient's multiply), 0.02% of the GEMMs'."""
    t, h, v = shape["tokens"], shape["hidden"], shape["vocab"]
    b = torch.empty((), dtype=dtype).element_size()
    gemm = 2 * t * h * v
    return Traffic([
        Term("read hidden", bytes=t * h * b),
        Term("read weight", bytes=v * h * b),
        Term("read target (int64)", bytes=t * 8),
        Term("write d hidden", bytes=t * h * b),
        Term("write d weight", bytes=v * h * b),
        Term("write loss (one scalar)", bytes=b),
        Term("logits = hidden @ weight^T (2 t h v)", flops=gemm),
        Term("d hidden = d logits @ weight (2 t h v)", flops=gemm),
        Term("d weight = d logits^T @ hidden (2 t h v)", flops=gemm),
        Term("loss and d logits (5 / logit: max, subtract, exp, sum, scale)", flops=5 * t * v),
    ])


# --- rungs 1, 2: the library and the compiler -----------------------------------------------------


def _head_loss(h: torch.Tensor, w: torch.Tensor, target: torch.Tensor, label_smoothing: float) -> torch.Tensor:
    return _torch_loss(h @ w.T, target, label_smoothing)


def _autograd(loss_fn, hidden, weight, target, label_smoothing):
    h, w = hidden.detach().requires_grad_(), weight.detach().requires_grad_()
    loss = loss_fn(h, w, target, label_smoothing)
    dh, dw = torch.autograd.grad(loss, (h, w))
    return loss.detach(), dh, dw


def torch_autograd(hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, label_smoothing: float):
    """logits = hidden @ weight^T (written), F.cross_entropy (log-probabilities written and read back)
    and autograd's backward: d logits written, then read by the two GEMMs."""
    return _autograd(_head_loss, hidden, weight, target, label_smoothing)


_compiled_head_loss = device.compiled(_head_loss)


def torch_compile(hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, label_smoothing: float):
    """torch.compile of the head and loss: Inductor's generated loss kernels, the GEMMs left to cuBLAS."""
    return _autograd(_compiled_head_loss, hidden, weight, target, label_smoothing)


# --- rung 3: logits materialised, the one-pass loss kernel ----------------------------------------


def split(hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, label_smoothing: float):
    """logits = hidden @ weight^T; loss and d logits by cross_entropy's split kernel (one read, one
    write of the logits); d hidden = d logits @ weight; dW = d logits^T @ hidden."""
    loss, dlogits = split_triton(hidden @ weight.T, target, label_smoothing)
    return loss.to(hidden.dtype), dlogits @ weight, dlogits.T @ hidden


# --- rung 4: the peer, Liger-Kernel ---------------------------------------------------------------


def liger(hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, label_smoothing: float):
    """Liger-Kernel's fused linear cross-entropy forward (`pip install -e '.[peers]'`), which computes
    d hidden and dW on the way (its autograd backward only scales them). Its chunk: the next power of
    two of tokens / ceil(vocab / hidden) (256 tokens at 8192 x 4096 x 128256); dW accumulated in the
    weight's dtype (`accum_dtype=None`, its default); one `.item()` (a host synchronisation) per call."""
    try:
        from liger_kernel.ops.fused_linear_cross_entropy import fused_linear_cross_entropy_forward
    except ImportError as e:
        raise NotImplementedError(f"liger-kernel is not installed (pip install -e '.[peers]'): {e}") from e
    loss, _, _, _, dh, dw, _ = fused_linear_cross_entropy_forward(
        hidden, weight, target, ignore_index=IGNORE_INDEX, label_smoothing=label_smoothing,
        compute_gradients=True, weight_requires_grad=True)
    return loss.detach().to(hidden.dtype), dh, dw


# --- rung 5: token chunks, the split kernel in place -----------------------------------------------


@triton.jit
def _inplace_split_kernel(x_ptr, t_ptr, loss_ptr, n_valid_ptr, m_ptr, s_ptr, sx_ptr, xt_ptr, barrier_ptr,
                          n_rows, n_cols, stride, eps, ignore_index, CHUNK: tl.constexpr,
                          MAX_CHUNKS: tl.constexpr, PHASE: tl.constexpr, BARRIER_STRIDE: tl.constexpr = 32):
    # cross_entropy's `_split_kernel` with the gradient written over the logits. The one change: the
    # target's logit is kept, before the barrier, by the program whose chunk holds it (after the
    # barrier that chunk may already hold its gradient), and read from there for the row's loss.
    # PHASE 0 on the GPU (statistics, barrier, gradient from registers); 1 then 2 under the interpreter.
    n_chunks = tl.cdiv(n_cols, CHUNK)
    pid = tl.program_id(0)
    row = (pid // n_chunks).to(tl.int64)
    chunk = pid % n_chunks
    cols = chunk * CHUNK + tl.arange(0, CHUNK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride + cols, mask=mask, other=-float("inf")).to(tl.float32)
    stats = row * n_chunks
    t = tl.load(t_ptr + row)
    counted = t != ignore_index
    if PHASE != 2:
        chunk_max = tl.max(x, axis=0)
        safe = tl.where(chunk_max == -float("inf"), 0.0, chunk_max)
        tl.store(m_ptr + stats + chunk, chunk_max)
        tl.store(s_ptr + stats + chunk, tl.sum(tl.exp(x - safe), axis=0))
        tl.store(sx_ptr + stats + chunk, tl.sum(tl.where(mask, x, 0.0), axis=0))
        holds = counted & (t >= chunk * CHUNK) & (t < chunk * CHUNK + CHUNK)
        tl.store(xt_ptr + row, tl.sum(tl.where(cols == t, x, 0.0), axis=0), mask=holds)
    if PHASE == 0:
        _row_barrier(barrier_ptr + row * BARRIER_STRIDE, n_chunks)
    if PHASE != 1:
        c = tl.arange(0, MAX_CHUNKS)
        cm = tl.load(m_ptr + stats + c, mask=c < n_chunks, other=-float("inf"), cache_modifier=".cg")
        cs = tl.load(s_ptr + stats + c, mask=c < n_chunks, other=0.0, cache_modifier=".cg")
        row_max = tl.max(cm, axis=0)
        safe = tl.where(row_max == -float("inf"), 0.0, row_max)
        lse = safe + tl.log(tl.sum(cs * tl.exp(cm - safe), axis=0))
        scale = 1.0 / tl.load(n_valid_ptr).to(tl.float32)
        g = _grad(x, cols, t, lse, scale, eps, n_cols, counted)
        tl.store(x_ptr + row * stride + cols, g.to(x_ptr.dtype.element_ty), mask=mask)
        if chunk == 0:
            sum_x = tl.sum(tl.load(sx_ptr + stats + c, mask=c < n_chunks, other=0.0, cache_modifier=".cg"), axis=0)
            x_t = tl.load(xt_ptr + row, mask=counted, other=0.0, cache_modifier=".cg")
            tl.store(loss_ptr + row, _row_loss(lse, x_t, sum_x, counted, eps, n_cols))


_inplace_tuned = triton.heuristics(
    {"MAX_CHUNKS": lambda a: triton.next_power_of_2(triton.cdiv(a["n_cols"], a["CHUNK"]))})(_inplace_split_kernel)
# restore_value: the autotuner times each configuration on the same logits, which each run overwrites.
_inplace_tuned = device.autotune(_split_configs(), key=["n_cols", "n_rows"], restore_value=["x_ptr"],
                                 prune_configs_by={"early_config_prune": _prune_split})(_inplace_tuned)


def split_inplace(logits: torch.Tensor, target: torch.Tensor, label_smoothing: float, n_valid: torch.Tensor,
                  losses: torch.Tensor) -> None:
    """The loss of each row into `losses` (fp32, [rows], not yet divided by the count) and the gradient
    of the batch's mean loss (`n_valid` counted tokens, an int32 scalar on the device) over `logits`."""
    n_rows, n_cols = logits.shape
    if not n_rows:
        return
    eps = float(label_smoothing)
    if device.INTERPRET:
        chunk = INTERPRETER_BLOCK
        n_chunks = triton.cdiv(n_cols, chunk)
        m, s, sx = (torch.empty(n_rows * n_chunks, device=logits.device, dtype=torch.float32) for _ in range(3))
        xt = torch.empty(n_rows, device=logits.device, dtype=torch.float32)
        for phase in (1, 2):
            _inplace_split_kernel[(n_rows * n_chunks,)](
                logits, target, losses, n_valid, m, s, sx, xt, m, n_rows, n_cols, logits.stride(0), eps,
                IGNORE_INDEX, CHUNK=chunk, MAX_CHUNKS=triton.next_power_of_2(n_chunks), PHASE=phase)
        return
    if n_cols > 16384 * device.num_sms(logits):
        raise NotImplementedError(f"rows over {16384 * device.num_sms(logits)} columns need more chunks than "
                                  f"SMs; got {n_cols}")
    m, s, sx = (torch.empty(n_rows * triton.cdiv(n_cols, SMALLEST_CHUNK), device=logits.device,
                            dtype=torch.float32) for _ in range(3))
    xt = torch.empty(n_rows, device=logits.device, dtype=torch.float32)

    def grid(meta):
        return (n_rows * triton.cdiv(n_cols, meta["CHUNK"]),)

    _inplace_tuned[grid](logits, target, losses, n_valid, m, s, sx, xt, _row_barriers(logits.device, n_rows),
                         n_rows, n_cols, logits.stride(0), eps, IGNORE_INDEX, PHASE=0)


CHUNK_BUDGET = 0.08
"""Most bytes of one chunk's logits, as a share of the inputs' (hidden and weight): the chunked rung's
peak is then its outputs (d hidden and dW, as large as the inputs) plus about that share, under the
claim's 1.1x. At 8192 x 4096 x 128256 bf16: 89 MB, 348 tokens."""

DW_RIDGE_TOKENS = 384
"""Fewest tokens of a chunk on a GPU: dW += d logits^T h reads and writes dW (2 x 2 bytes per element,
bf16) for 2 x chunk FLOPs per element, chunk / 2 FLOP/byte, which meets the H200's ridge (~187) at 374
tokens. Under it the accumulation is bandwidth-bound (Liger's 256-token chunks at the claim's shape run
it at 128 FLOP/byte); over the budget it costs memory instead (the boundary of small hidden sizes)."""

CHUNK_ROUND = 64
"""Tokens of a chunk are a multiple of this (a GEMM tile's rows) on a GPU. Under the interpreter the
chunk is the budget's alone, in multiples of 8, so that the CPU run's small shapes still cut into
several chunks, the last one short."""


def chunk_tokens(tokens: int, hidden: int, vocab: int) -> int:
    """Tokens per chunk: the most whose logits fit `CHUNK_BUDGET` of the inputs' bytes, at least
    `DW_RIDGE_TOKENS` on a GPU, rounded down to `CHUNK_ROUND`; never more than the tokens."""
    fit = int(CHUNK_BUDGET * (tokens + vocab) * hidden / vocab)
    if device.INTERPRET:
        return max(1, min(tokens, max(8, fit // 8 * 8)))
    return max(1, min(tokens, max(DW_RIDGE_TOKENS, fit) // CHUNK_ROUND * CHUNK_ROUND))


def chunked_triton(hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, label_smoothing: float = 0.0,
                   chunk: int | None = None):
    """(loss, d hidden, d weight) over token chunks of `chunk` (default `chunk_tokens`) tokens."""
    if hidden.ndim != 2 or weight.ndim != 2 or hidden.shape[1] != weight.shape[1] or target.shape != hidden.shape[:1]:
        raise ValueError(f"hidden [tokens, hidden], weight [vocab, hidden], target [tokens]; got "
                         f"{tuple(hidden.shape)}, {tuple(weight.shape)}, {tuple(target.shape)}")
    (n, h), v = hidden.shape, weight.shape[0]
    chunk = chunk or chunk_tokens(n, h, v)
    target = target.contiguous()
    n_valid = _n_valid(target)  # the batch's count: each chunk's loss and gradient are its share of the mean
    losses = torch.empty(n, device=hidden.device, dtype=torch.float32)
    dh = torch.empty_like(hidden)
    dw = torch.empty_like(weight)
    buffer = torch.empty(min(chunk, n), v, device=hidden.device, dtype=hidden.dtype)  # one chunk's logits
    for i, start in enumerate(range(0, n, chunk)):
        hc = hidden[start:start + chunk]
        logits = buffer[:hc.shape[0]]
        torch.mm(hc, weight.T, out=logits)
        split_inplace(logits, target[start:start + chunk], label_smoothing, n_valid, losses[start:start + chunk])
        torch.mm(logits, weight, out=dh[start:start + chunk])  # logits now hold d logits
        if i == 0:
            torch.mm(logits.T, hc, out=dw)
        else:
            dw.addmm_(logits.T, hc)
    return (losses.sum() / n_valid).to(hidden.dtype), dh, dw


def chunked(hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, label_smoothing: float):
    return chunked_triton(hidden, weight, target, label_smoothing)


# --- level 3: the LM head and loss of a training step ---------------------------------------------


def lm_head_step(kernel, hidden: torch.Tensor, norm_weight: torch.Tensor, weight: torch.Tensor,
                 target: torch.Tensor) -> torch.Tensor:
    """Final RMSNorm, then the head and loss with their backward by `kernel` ((loss, d norm(h), dW)), then
    back through the norm to d hidden, which it returns (dW is dropped, as an optimizer would take it)."""
    h = hidden.detach().requires_grad_()
    xn = F.rms_norm(h, (h.shape[-1],), norm_weight, eps=1e-6)  # [tokens, hidden]
    _, dxn, dweight = kernel(xn.detach(), weight, target, 0.0)
    (dh,) = torch.autograd.grad(xn, h, dxn)
    del dweight
    return dh
