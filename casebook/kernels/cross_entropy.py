"""Cross-entropy over a vocabulary: the loss and its gradient in one pass over the logits.

What you will learn: the loss of a row needs only two numbers, its log-sum-exp and its target's logit,
and the gradient `softmax(x) - onehot(t)` needs only the log-sum-exp besides the logits themselves. So
the online (max, sum) reduction of softmax pays twice: one read of the logits gives the loss, and the
gradient can be written in the same pass, from the chunk still on chip. About 5 FLOPs per element
against 4 bytes (bf16: one read, one write) is 1.25 FLOP/byte, two orders of magnitude under an H200's
ridge point: bandwidth-bound, and what counts is how many times the logits cross device memory. At a
vocabulary of 128K-262K the logits of a 4K-8K-token micro-batch are 1-4 GB in bf16, so every extra
copy a composite makes (an fp32 upcast, the log-probabilities, the gradient) is gigabytes of memory too.

The function, as a training step needs it: the mean loss over the tokens whose target is not
`IGNORE_INDEX`, with label smoothing `label_smoothing`, and its gradient with respect to the logits,
`(softmax(x) - (1 - eps) onehot(t) - eps / V) / n_valid` per counted row, zero for ignored rows. Each
variant returns the gradient (the [tokens, vocab] tensor that the traffic model counts, and what the
harness checks against the float64 reference); the Triton launchers (`two_sweep_triton`,
`split_triton`) return the loss beside it, which the tests check. A forward alone (the loss, no
gradient) is sweep 1 of triton_two_sweep, not a rung: it moves half the floor's bytes, and one traffic
model serves every rung.

The ladder:
  eager              Hugging Face's loss: logits upcast to fp32, log_softmax, nll_loss, autograd
                     backward: the fp32 copy, the log-probabilities and their gradient all round trip
  torch_cross_entropy  F.cross_entropy and its backward on the logits as they are: log_softmax
                     (read, write the log-probabilities), nll_loss's backward (a zero-filled d logp
                     written), log_softmax's backward (both read, the gradient written): ~6 passes
  torch_compile      Inductor's fused forward and backward kernels for the same code
  liger              the peer: Liger-Kernel's cross-entropy, one program per row sweeping it twice
                     (online max and sum, then the gradient written over its input in place)
  triton_two_sweep   Liger's structure out of place: one program per row, sweep 1 the online
                     (max, sum) with the target gathered, sweep 2 re-reads the row and writes the
                     gradient: 2 reads + 1 write, unless the second read hits L2
  triton_split       each row split over programs holding a chunk each in registers; the chunks'
                     (max, sum, sum x) merged at a per-row barrier, the gradient written from
                     registers: 1 read + 1 write, as the floor
  cluster_bulk       Hopper, CUDA C++ (cross_entropy_cluster): softmax_cluster's kernel with the gradient
                     stored and the loss written: each row split over a thread-block cluster, each chunk
                     landed in shared memory by bulk copies, so loads stay in flight without registers
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from casebook.kernels import cross_entropy_cluster, device, softmax_cluster
from casebook.kernels.softmax_fusion import _row_barrier, _row_barriers
from casebook.traffic import Term, Traffic

IGNORE_INDEX = -100
"""Target of a token that does not count (padding, the prompt in supervised fine-tuning): PyTorch's
and Hugging Face's convention."""

IGNORED_SHARE = 1 / 16
"""Share of the inputs' targets set to IGNORE_INDEX: prompt and padding tokens masked out (assumed)."""

# --- reference, inputs, traffic ----------------------------------------------------------------


def reference(logits: torch.Tensor, target: torch.Tensor, label_smoothing: float) -> torch.Tensor:
    """The exact gradient of the mean cross-entropy over the counted tokens, in float64: on a counted token's row
    softmax(x) less the smoothed one-hot ((1 - eps) at the target, eps / vocab everywhere), over the number of
    counted tokens; zero on an ignored one's, and everywhere where none counts. Written out, not taken by
    autograd (`autograd_reference`, which the tests hold it to), whose saved log-probabilities and gradients were
    three more float64 copies of the logits: the reference's child needed 36 GB at 4096 x 262144, where this
    needs the logits and the answer."""
    x = logits.to(torch.float64)
    counted = target != IGNORE_INDEX
    grad = torch.softmax(x, -1)
    if label_smoothing:
        grad -= label_smoothing / x.shape[-1]
    rows = counted.nonzero().squeeze(1)
    grad[rows, target[rows]] -= 1.0 - label_smoothing
    grad[~counted] = 0.0
    return grad.div_(counted.sum().clamp(min=1))  # no counted token: zero, as autograd's gradient is


def autograd_reference(logits: torch.Tensor, target: torch.Tensor, label_smoothing: float) -> torch.Tensor:
    """The same gradient as `reference`, by autograd through torch's F.cross_entropy: the definition it is held to."""
    x = logits.to(torch.float64).detach().requires_grad_()
    loss = F.cross_entropy(x, target, ignore_index=IGNORE_INDEX, label_smoothing=label_smoothing)
    (grad,) = torch.autograd.grad(loss, x)
    return grad


def reference_loss(logits: torch.Tensor, target: torch.Tensor, label_smoothing: float) -> torch.Tensor:
    """The exact mean loss, in float64 (the tests hold the Triton launchers' loss to it)."""
    return F.cross_entropy(logits.to(torch.float64), target, ignore_index=IGNORE_INDEX,
                           label_smoothing=label_smoothing)


def make_inputs(shape: dict, dtype: torch.dtype, device_: str, generator: torch.Generator,
                label_smoothing: float = 0.0) -> dict:
    """Logits with the spread of a trained LM head's (std 2, and each row's target a few nats above the
    rest, as a model that has learned something makes it), targets uniform over the vocabulary, and
    one target in IGNORED_SHARE set to IGNORE_INDEX. Drawn on the device they live on."""
    t, v = shape["tokens"], shape["vocab"]
    g = device.on_device(generator, device_)
    logits = torch.randn(t, v, generator=g, device=device_, dtype=torch.float32) * 2.0
    target = torch.randint(v, (t,), generator=g, device=device_)
    rows = torch.arange(t, device=device_)
    logits[rows, target] += 4.0
    ignored = torch.rand(t, generator=g, device=device_) < IGNORED_SHARE
    target = torch.where(ignored, torch.full_like(target, IGNORE_INDEX), target)
    return {"logits": logits.to(dtype), "target": target, "label_smoothing": label_smoothing}


def traffic(shape: dict, dtype: torch.dtype) -> Traffic:
    """The floor: the logits read once and the gradient written once; the targets read, one loss per
    row written; per element the (max, sum) reduction and one multiply for the gradient."""
    t, v = shape["tokens"], shape["vocab"]
    n = t * v
    b = torch.empty((), dtype=dtype).element_size()
    return Traffic([
        Term("read logits", bytes=n * b),
        Term("read target (int64)", bytes=t * 8),
        Term("write grad", bytes=n * b),
        Term("write loss (fp32 / row)", bytes=t * 4),
        Term("max (1 compare / element)", flops=n),
        Term("subtract, exp (2 / element)", flops=2 * n),
        Term("sum (1 add / element)", flops=n),
        Term("gradient: scale by 1 / (sum n_valid) (1 multiply / element)", flops=n),
    ])


# --- variant 1: eager composite, as Hugging Face writes it ---------------------------------------


def _smoothed_loss(logp: torch.Tensor, target: torch.Tensor, label_smoothing: float) -> torch.Tensor:
    nll = F.nll_loss(logp, target, ignore_index=IGNORE_INDEX)
    if not label_smoothing:
        return nll
    valid = target != IGNORE_INDEX
    # Over the counted rows; no row counted: 0 here (the nll term is torch's NaN), not a NaN gradient.
    smooth = -(logp.sum(dim=-1) * valid).sum() / (valid.sum().clamp(min=1) * logp.shape[-1])
    return (1 - label_smoothing) * nll + label_smoothing * smooth


def eager(logits: torch.Tensor, target: torch.Tensor, label_smoothing: float) -> torch.Tensor:
    """`logits.float()` (transformers' ForCausalLMLoss upcasts before the loss), log_softmax, nll_loss,
    then autograd's backward kernels; the gradient flows back through the cast to the logits' dtype."""
    x = logits.detach().requires_grad_()
    logp = F.log_softmax(x.float(), dim=-1)  # read logits, write fp32 copy; read it, write logp (fp32)
    loss = _smoothed_loss(logp, target, label_smoothing)  # gather: T elements
    (grad,) = torch.autograd.grad(loss, x)  # read logp, write d logp; cast: read, write grad
    return grad


# --- variant 2, 3: the library and the compiler -------------------------------------------------


def _torch_loss(x: torch.Tensor, target: torch.Tensor, label_smoothing: float) -> torch.Tensor:
    return F.cross_entropy(x, target, ignore_index=IGNORE_INDEX, label_smoothing=label_smoothing)


def torch_cross_entropy(logits: torch.Tensor, target: torch.Tensor, label_smoothing: float) -> torch.Tensor:
    """F.cross_entropy on the logits in their dtype (log_softmax + nll_loss inside) and its backward."""
    x = logits.detach().requires_grad_()
    (grad,) = torch.autograd.grad(_torch_loss(x, target, label_smoothing), x)
    return grad


_compiled_loss = device.compiled(_torch_loss)


def torch_compile(logits: torch.Tensor, target: torch.Tensor, label_smoothing: float) -> torch.Tensor:
    """torch.compile of the loss: Inductor generates the forward, AOTAutograd the backward's kernels."""
    x = logits.detach().requires_grad_()
    (grad,) = torch.autograd.grad(_compiled_loss(x, target, label_smoothing), x)
    return grad


# --- variant 4: the peer, Liger-Kernel ----------------------------------------------------------


def liger(logits: torch.Tensor, target: torch.Tensor, label_smoothing: float) -> torch.Tensor:
    """Liger-Kernel's cross-entropy (`pip install -e '.[peers]'`). It writes the gradient over its input
    to save memory, and the harness forbids modified inputs, so it gets a copy of the logits: its time
    includes that copy (one more read and write of the logits). It also reads the count of counted
    tokens back to the host (`.item()`), a synchronisation per call."""
    try:
        from liger_kernel.ops.cross_entropy import cross_entropy_forward
    except ImportError as e:
        raise NotImplementedError(f"liger-kernel is not installed (pip install -e '.[peers]'): {e}") from e
    x = logits.detach().clone().requires_grad_()  # Liger's kernel writes d loss / d x only when x needs it
    _, _, _, _, grad = cross_entropy_forward(x, target, None, IGNORE_INDEX, 0.0, label_smoothing, "mean",
                                             None, False)
    return grad.detach()


# --- the per-row statistics, shared by the two Triton variants ------------------------------------


@triton.jit
def _merge(m, s, chunk_max, chunk_sum):
    # Online (max, sum) update: rescale the running sum to the new max. A max of -inf (a chunk or row
    # of -inf so far) contributes nothing, never exp(-inf - -inf) = NaN.
    new_max = tl.maximum(m, chunk_max)
    safe = tl.where(new_max == -float("inf"), 0.0, new_max)
    return new_max, s * tl.exp(m - safe) + chunk_sum * tl.exp(chunk_max - safe)


@triton.jit
def _row_loss(lse, x_t, sum_x, counted, eps, n_cols):
    # (1 - eps) (lse - x_t) + eps (lse - mean x): the smoothed target's cross-entropy; 0 when ignored.
    smooth = tl.where(eps > 0, eps * (lse - sum_x / n_cols), 0.0)
    return tl.where(counted, (1 - eps) * (lse - x_t) + smooth, 0.0)


@triton.jit
def _grad(x, cols, t, lse, scale, eps, n_cols, counted):
    # (softmax - (1 - eps) onehot - eps / V) / n_valid; a row that does not count gets zeros.
    g = tl.exp(x - lse) - tl.where(cols == t, 1 - eps, 0.0) - eps / n_cols
    return tl.where(counted, g * scale, 0.0)


# --- variant 5: one program per row, two sweeps ---------------------------------------------------


@triton.jit
def _two_sweep_kernel(x_ptr, t_ptr, g_ptr, loss_ptr, n_valid_ptr, n_cols, stride, eps, ignore_index,
                      BLOCK: tl.constexpr):
    # Sweep 1 reads the row for its online (max, sum) and the sum of its logits (for smoothing); the
    # target's logit is one more load. Sweep 2 reads the row again and writes the gradient.
    row = tl.program_id(0).to(tl.int64)
    x_row, g_row = x_ptr + row * stride, g_ptr + row * stride
    t = tl.load(t_ptr + row)
    counted = t != ignore_index
    scale = 1.0 / tl.load(n_valid_ptr).to(tl.float32)
    m = -float("inf")
    s = 0.0
    sum_x = 0.0
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(x_row + cols, mask=cols < n_cols, other=-float("inf")).to(tl.float32)
        chunk_max = tl.max(x, axis=0)
        safe = tl.where(chunk_max == -float("inf"), 0.0, chunk_max)
        m, s = _merge(m, s, chunk_max, tl.sum(tl.exp(x - safe), axis=0))
        sum_x += tl.sum(tl.where(cols < n_cols, x, 0.0), axis=0)
    lse = m + tl.log(s)
    x_t = tl.load(x_row + tl.where(counted, t, 0)).to(tl.float32)
    tl.store(loss_ptr + row, _row_loss(lse, x_t, sum_x, counted, eps, n_cols))
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(x_row + cols, mask=cols < n_cols, other=-float("inf")).to(tl.float32)
        g = _grad(x, cols, t, lse, scale, eps, n_cols, counted)
        tl.store(g_row + cols, g.to(g_ptr.dtype.element_ty), mask=cols < n_cols)


TWO_SWEEP_BLOCK = 8192
"""Columns per step of a sweep: 32 KB of fp32 over 16 warps is 16 values a thread (Liger uses 64K
columns and 32 warps on Hopper)."""

INTERPRETER_BLOCK = 1024
"""Columns per step, and chunk of a split row, under the interpreter: small, so that the tests' rows
span several chunks and end in a masked tail."""


def _n_valid(target: torch.Tensor) -> torch.Tensor:
    # Counted on the device: no host synchronisation (Liger's `.item()` is one per call).
    return (target != IGNORE_INDEX).sum().to(torch.int32)


def _check_args(logits: torch.Tensor, target: torch.Tensor) -> None:
    if logits.ndim != 2 or target.shape != logits.shape[:1]:
        raise ValueError(f"logits [tokens, vocab] and target [tokens]; got {tuple(logits.shape)} and "
                         f"{tuple(target.shape)}")


def two_sweep_triton(logits: torch.Tensor, target: torch.Tensor, label_smoothing: float = 0.0):
    """(mean loss, gradient) by `_two_sweep_kernel`."""
    _check_args(logits, target)
    x = logits.contiguous()
    n_rows, n_cols = x.shape
    grad = torch.empty_like(x)
    losses = torch.empty(n_rows, device=x.device, dtype=torch.float32)
    n_valid = _n_valid(target)
    block = min(INTERPRETER_BLOCK if device.INTERPRET else TWO_SWEEP_BLOCK, triton.next_power_of_2(n_cols))
    if n_rows:
        _two_sweep_kernel[(n_rows,)](x, target.contiguous(), grad, losses, n_valid, n_cols, x.stride(0),
                                     float(label_smoothing), IGNORE_INDEX, BLOCK=block,
                                     num_warps=16 if block >= 4096 else 4)
    return losses.sum() / n_valid, grad


def triton_two_sweep(logits: torch.Tensor, target: torch.Tensor, label_smoothing: float) -> torch.Tensor:
    return two_sweep_triton(logits, target, label_smoothing)[1]


# --- variant 6: each row split over programs, one read and one write ------------------------------


@triton.jit
def _split_kernel(x_ptr, t_ptr, g_ptr, loss_ptr, n_valid_ptr, m_ptr, s_ptr, sx_ptr, barrier_ptr,
                  n_rows, n_cols, stride, eps, ignore_index, CHUNK: tl.constexpr, MAX_CHUNKS: tl.constexpr,
                  PHASE: tl.constexpr, BARRIER_STRIDE: tl.constexpr = 32):
    # The programs of a row each hold one CHUNK of it in registers. PHASE 0 (the GPU): chunk (max, sum,
    # sum x) stored, a barrier across the row's programs (softmax_fusion's `_row_barrier`), the row's
    # log-sum-exp from every chunk's statistics, the gradient written from registers: one read, one
    # write. PHASE 1 then 2 (two launches, for the interpreter, which runs programs one after another
    # and so cannot wait on a later one): statistics, then re-read, combine and write.
    n_chunks = tl.cdiv(n_cols, CHUNK)
    pid = tl.program_id(0)
    row = (pid // n_chunks).to(tl.int64)
    chunk = pid % n_chunks
    cols = chunk * CHUNK + tl.arange(0, CHUNK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride + cols, mask=mask, other=-float("inf")).to(tl.float32)
    stats = row * n_chunks
    if PHASE != 2:
        chunk_max = tl.max(x, axis=0)
        safe = tl.where(chunk_max == -float("inf"), 0.0, chunk_max)
        tl.store(m_ptr + stats + chunk, chunk_max)
        tl.store(s_ptr + stats + chunk, tl.sum(tl.exp(x - safe), axis=0))
        tl.store(sx_ptr + stats + chunk, tl.sum(tl.where(mask, x, 0.0), axis=0))
    if PHASE == 0:
        _row_barrier(barrier_ptr + row * BARRIER_STRIDE, n_chunks)
    if PHASE != 1:
        c = tl.arange(0, MAX_CHUNKS)
        # .cg: read at L2, where the other programs' statistics are, never a stale L1 line.
        cm = tl.load(m_ptr + stats + c, mask=c < n_chunks, other=-float("inf"), cache_modifier=".cg")
        cs = tl.load(s_ptr + stats + c, mask=c < n_chunks, other=0.0, cache_modifier=".cg")
        row_max = tl.max(cm, axis=0)
        safe = tl.where(row_max == -float("inf"), 0.0, row_max)
        lse = safe + tl.log(tl.sum(cs * tl.exp(cm - safe), axis=0))
        t = tl.load(t_ptr + row)
        counted = t != ignore_index
        scale = 1.0 / tl.load(n_valid_ptr).to(tl.float32)
        g = _grad(x, cols, t, lse, scale, eps, n_cols, counted)
        tl.store(g_ptr + row * stride + cols, g.to(g_ptr.dtype.element_ty), mask=mask)
        if chunk == 0:  # one program per row writes its loss; the target's logit is one load
            sum_x = tl.sum(tl.load(sx_ptr + stats + c, mask=c < n_chunks, other=0.0, cache_modifier=".cg"), axis=0)
            x_t = tl.load(x_ptr + row * stride + tl.where(counted, t, 0)).to(tl.float32)
            tl.store(loss_ptr + row, _row_loss(lse, x_t, sum_x, counted, eps, n_cols))


def _split_configs() -> list[triton.Config]:
    return [triton.Config({"CHUNK": c}, num_warps=w) for c in (4096, 8192, 16384) for w in (8, 16)]


def _prune_split(configs, named_args, **kwargs):
    # 8-64 elements a thread, and no more chunks in a row than SMs: one program fits on every SM, so a
    # row's programs can always be resident together (the barrier's condition, as in softmax_fusion).
    n_cols, sms = named_args["n_cols"], device.num_sms(named_args["x_ptr"])
    block = triton.next_power_of_2(n_cols)
    kept = [c for c in configs if 8 <= c.kwargs["CHUNK"] // (32 * c.num_warps) <= 64
            and triton.cdiv(n_cols, c.kwargs["CHUNK"]) <= sms and c.kwargs["CHUNK"] <= max(block, 4096)]
    return kept or configs[-1:]


_split_tuned = triton.heuristics(
    {"MAX_CHUNKS": lambda a: triton.next_power_of_2(triton.cdiv(a["n_cols"], a["CHUNK"]))})(_split_kernel)
_split_tuned = device.autotune(_split_configs(), key=["n_cols", "n_rows"],
                               prune_configs_by={"early_config_prune": _prune_split})(_split_tuned)

SMALLEST_CHUNK = 4096


def split_triton(logits: torch.Tensor, target: torch.Tensor, label_smoothing: float = 0.0,
                 n_valid: torch.Tensor | None = None):
    """(mean loss, gradient) by `_split_kernel`: one read of the logits, one write of the gradient.

    `n_valid` (an int32 scalar on the device), when given, is the count the mean divides by: a chunk of
    a larger batch's tokens (a chunked linear cross-entropy) then returns its share of the batch's mean
    loss and its rows of the batch's gradient."""
    _check_args(logits, target)
    x = logits.contiguous()
    n_rows, n_cols = x.shape
    grad = torch.empty_like(x)
    losses = torch.empty(n_rows, device=x.device, dtype=torch.float32)
    n_valid = _n_valid(target) if n_valid is None else n_valid
    target = target.contiguous()
    if not n_rows:
        return losses.sum() / n_valid, grad
    eps = float(label_smoothing)
    if device.INTERPRET:
        chunk = INTERPRETER_BLOCK
        n_chunks = triton.cdiv(n_cols, chunk)
        m, s, sx = (torch.empty(n_rows * n_chunks, device=x.device, dtype=torch.float32) for _ in range(3))
        for phase in (1, 2):
            _split_kernel[(n_rows * n_chunks,)](x, target, grad, losses, n_valid, m, s, sx, m, n_rows, n_cols,
                                                x.stride(0), eps, IGNORE_INDEX, CHUNK=chunk,
                                                MAX_CHUNKS=triton.next_power_of_2(n_chunks), PHASE=phase)
        return losses.sum() / n_valid, grad
    sms = device.num_sms(x)
    if n_cols > 16384 * sms:
        raise NotImplementedError(f"rows over {16384 * sms} columns need more chunks than SMs; got {n_cols}")
    m, s, sx = (torch.empty(n_rows * triton.cdiv(n_cols, SMALLEST_CHUNK), device=x.device, dtype=torch.float32)
                for _ in range(3))
    barriers = _row_barriers(x.device, n_rows)

    def grid(meta):  # the autotuner's chunk size sets the programs per row
        return (n_rows * triton.cdiv(n_cols, meta["CHUNK"]),)

    _split_tuned[grid](x, target, grad, losses, n_valid, m, s, sx, barriers, n_rows, n_cols, x.stride(0), eps,
                       IGNORE_INDEX, PHASE=0)
    return losses.sum() / n_valid, grad


def triton_split(logits: torch.Tensor, target: torch.Tensor, label_smoothing: float) -> torch.Tensor:
    return split_triton(logits, target, label_smoothing)[1]


# --- variant 7: Hopper's clusters and bulk copies (CUDA C++) -------------------------------------


def cluster_loss(logits: torch.Tensor, target: torch.Tensor, label_smoothing: float = 0.0,
                 n_valid: torch.Tensor | None = None):
    """(mean loss, gradient) by `cross_entropy_cluster`'s kernel: each row split over a thread-block cluster,
    its chunks landed in shared memory by bulk copies (Hopper). Rows it cannot split (not a whole number of
    16-byte vectors, over 1 MB, or not starting on a 16-byte boundary) go to `split_triton`; off Hopper a
    splittable row fails, rather than quietly timing another kernel. `n_valid` as for `split_triton`."""
    _check_args(logits, target)
    x = logits.contiguous()
    if softmax_cluster.plan(*x.shape, x.element_size(), 1) is None or x.data_ptr() % 16:
        return split_triton(x, target, label_smoothing, n_valid)
    n_valid = _n_valid(target) if n_valid is None else n_valid
    losses, grad = cross_entropy_cluster.loss_and_grad(x, target, label_smoothing, n_valid, IGNORE_INDEX)
    return losses.sum() / n_valid, grad


def cluster_bulk(logits: torch.Tensor, target: torch.Tensor, label_smoothing: float) -> torch.Tensor:
    return cluster_loss(logits, target, label_smoothing)[1]


# --- level 3: the LM head and loss of a training step ---------------------------------------------


def make_head_inputs(shape: dict, dtype: torch.dtype, device_: str, generator: torch.Generator) -> dict:
    """The last hidden states [tokens, hidden], the final RMSNorm's weight [hidden], the LM head's
    weight [vocab, hidden] (std 1/sqrt(hidden), so logits have unit-order spread) and the targets."""
    t, h, v = shape["tokens"], shape["hidden"], shape["vocab"]
    g = device.on_device(generator, device_)
    hidden = torch.randn(t, h, generator=g, device=device_)
    norm_weight = 1.0 + 0.1 * torch.randn(h, generator=g, device=device_)
    weight = torch.randn(v, h, generator=g, device=device_) * (2.0 / h**0.5)
    target = torch.randint(v, (t,), generator=g, device=device_)
    ignored = torch.rand(t, generator=g, device=device_) < IGNORED_SHARE
    target = torch.where(ignored, torch.full_like(target, IGNORE_INDEX), target)
    return {"hidden": hidden.to(dtype), "norm_weight": norm_weight.to(dtype), "weight": weight.to(dtype),
            "target": target}


def lm_head_step(kernel, hidden: torch.Tensor, norm_weight: torch.Tensor, weight: torch.Tensor,
                 target: torch.Tensor) -> torch.Tensor:
    """Final RMSNorm, LM head, loss and backward to the hidden states, the loss's gradient by `kernel`:
    logits = norm(h) W^T; d logits = kernel(logits, target); dW = d logits^T norm(h); d norm(h) =
    d logits W, then back through the norm. Returns d hidden (dW is computed and dropped, as an
    optimizer would take it)."""
    h = hidden.detach().requires_grad_()
    xn = F.rms_norm(h, (h.shape[-1],), norm_weight, eps=1e-6)  # [tokens, hidden]
    logits = xn.detach() @ weight.T  # [tokens, vocab]: written, read by the loss
    dlogits = kernel(logits, target, 0.0)  # [tokens, vocab]: written, read by both GEMMs below
    dweight = dlogits.T @ xn.detach()  # [vocab, hidden]
    dxn = dlogits @ weight  # [tokens, hidden]
    (dh,) = torch.autograd.grad(xn, h, dxn)
    del dweight
    return dh
