"""A decode step's chain of small kernels: launch-bound, from one launch per op to one launch in all.

What you will learn: at batch 1 a decode step runs, per layer, an RMSNorm, a skinny GEMM (a GEMV: one
row of activations against a weight matrix), an activation and a residual add. Each op's work is a
few microseconds or less (the norm, the activation and the add touch a few KB), but each costs a
launch (~4-6 us from the host) and, even replayed from a CUDA graph, ~1 us of GPU time between
kernels. So the chain sits far above its bandwidth floor (the weights, read once) and under its
launch floor: it is launch-bound, and the cure is fewer launches, not fewer bytes. A CUDA graph
removes the host's cost per launch; fusion removes kernels; a persistent kernel runs every layer in
one launch, its programs meeting at a grid barrier between layers.

The chain (one layer, repeated `layers` times; weights per layer):
  n = x * rsqrt(mean(x^2) + EPS) * g[l]     RMSNorm                      x [batch, hidden]
  u = n @ w[l]^T                             the GEMV                     w [layers, hidden, hidden]
  x = x + silu(u)                            activation, residual add     g [layers, hidden]
and y = x after the last layer. (A Llama MLP has gate, up and down projections and an attention block
between the norms; one square GEMV per layer keeps the chain's shape, a norm, a GEMV and two
elementwise ops a layer, with sizes set by `hidden`.)

The ladder (baseline: eager):
  eager                 torch ops as a model's forward writes them: ~10 kernels a layer, each launched
  torch_compile         Inductor: norm and elementwise ops fused around cuBLAS GEMVs, still launched
  torch_compile_graphs  the same with Inductor's CUDA graphs (mode="reduce-overhead")
  liger_norm            peer: the eager chain with liger-kernel's fused RMSNorm, 4 launches a layer
  graph                 the eager chain captured in one CUDA graph and replayed: one host launch
  fused                 one Triton kernel a layer: the norm in the GEMV (its sums in the K loop,
                        its 1/rms on the output), silu and the residual in its epilogue
  persistent            one Triton launch for the whole chain: programs stay resident, walk each
                        layer's output tiles, and meet at a grid barrier before the next layer
"""

from __future__ import annotations

import collections

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from casebook.kernels.device import INTERPRET, compiled, num_sms, on_device
from casebook.traffic import Term, Traffic

EPS = 1e-5
"""RMSNorm's epsilon (Llama's rms_norm_eps)."""

# --- reference, inputs, traffic ----------------------------------------------------------------


def reference(x: torch.Tensor, w: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """The exact chain, in float64."""
    x, w, g = (t.to(torch.float64) for t in (x, w, g))
    for layer in range(w.shape[0]):
        n = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * g[layer]
        x = x + F.silu(n @ w[layer].T)
    return x


def make_inputs(shape: dict, dtype: torch.dtype, device: str, generator: torch.Generator) -> dict:
    """x of unit normals; w scaled by hidden^-1/2 (so that u has unit spread, as a trained layer's
    pre-activations roughly do); norm weights near 1."""
    b, h, layers = shape["batch"], shape["hidden"], shape["layers"]
    gen = on_device(generator, device)
    x = torch.randn(b, h, generator=gen, device=device)
    w = torch.randn(layers, h, h, generator=gen, device=device) * h**-0.5
    g = 1.0 + 0.1 * torch.randn(layers, h, generator=gen, device=device)
    return {"x": x.to(dtype), "w": w.to(dtype), "g": g.to(dtype)}


def traffic(shape: dict, dtype: torch.dtype) -> Traffic:
    """The floor: weights and norm weights read once, x read once, y written once; the activations
    between layers never need to leave the chip."""
    b, h, layers = shape["batch"], shape["hidden"], shape["layers"]
    e = torch.empty((), dtype=dtype).element_size()
    return Traffic([
        Term("read x (batch x hidden)", bytes=b * h * e),
        Term("read w (layers x hidden x hidden)", bytes=layers * h * h * e),
        Term("read g (layers x hidden)", bytes=layers * h * e),
        Term("write y (batch x hidden)", bytes=b * h * e),
        Term("GEMV multiply-add (2 per batch x hidden x hidden x layer)", flops=2 * b * h * h * layers),
        Term("RMSNorm: square, sum, scale by rstd and g (4 per element x layer)", flops=4 * b * h * layers),
        Term("silu (~4 per element: exp, add, divide, multiply) and residual add (1) per layer",
             flops=5 * b * h * layers),
    ])


# --- variant 1: eager, one launch per op -----------------------------------------------------------


def _rmsnorm(x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    # As Llama's RMSNorm module writes it: in fp32, then back to the activations' dtype.
    xf = x.float()  # cast (a kernel in bf16)
    var = xf.pow(2).mean(-1, keepdim=True)  # square, mean
    xf = xf * torch.rsqrt(var + EPS)  # add, rsqrt, multiply
    return g * xf.to(x.dtype)  # cast, multiply


def eager(x: torch.Tensor, w: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """Each op its own kernel: per layer ~10 launches (casts, square, mean, add, rsqrt, two multiplies,
    the GEMV, silu, the add)."""
    for layer in range(w.shape[0]):
        x = x + F.silu(F.linear(_rmsnorm(x, g[layer]), w[layer]))
    return x


# --- variants 2, 3: the compiler, without and with its CUDA graphs ------------------------------

_compiled_eager = compiled(eager)
_compiled_graphs = compiled(eager, mode="reduce-overhead")


def torch_compile(x: torch.Tensor, w: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """Inductor: the norm and the elementwise ops fused into generated kernels around the GEMVs."""
    return _compiled_eager(x, w, g)


def torch_compile_graphs(x: torch.Tensor, w: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """The same, replayed from Inductor's CUDA graphs. The weights are marked static (as a model's
    parameters are), so the graph reads them in place rather than copying them in per call; the
    output is cloned out of the graph's pool, which the next replay overwrites."""
    if not x.is_cuda:
        raise NotImplementedError("CUDA graphs need a CUDA device")
    for t in (w, g):
        torch._dynamo.mark_static_address(t)
    torch.compiler.cudagraph_mark_step_begin()
    return _compiled_graphs(x, w, g).clone()


# --- variant 4: a peer, liger-kernel's fused RMSNorm in the eager chain ---------------------------


def liger_norm(x: torch.Tensor, w: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """The eager chain with liger-kernel's one-kernel Triton RMSNorm (Llama casting): 4 launches a layer.
    liger-kernel is the `peers` extra; it runs only compiled (its kernels fail under the interpreter)."""
    try:
        from liger_kernel.transformers.functional import liger_rms_norm
    except ImportError as e:
        raise NotImplementedError(f"liger-kernel is not installed (pip install -e '.[peers]'): {e}") from e
    if not x.is_cuda:
        raise NotImplementedError("liger-kernel's Triton kernels need a GPU (they fail under the interpreter)")
    for layer in range(w.shape[0]):
        x = x + F.silu(F.linear(liger_rms_norm(x, g[layer], EPS), w[layer]))
    return x


# --- variant 5: the eager chain in one CUDA graph ------------------------------------------------

_GRAPHS: collections.OrderedDict = collections.OrderedDict()
GRAPH_CACHE_SIZE = 8


def graph(x: torch.Tensor, w: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """The eager chain captured once per (pointers, shapes) and replayed: one host launch, every eager
    kernel still run. The output is the graph's static buffer, overwritten by the next replay."""
    if not x.is_cuda:
        raise NotImplementedError("CUDA graphs need a CUDA device")
    key = (x.data_ptr(), w.data_ptr(), g.data_ptr(), tuple(x.shape), tuple(w.shape), x.dtype, x.device)
    entry = _GRAPHS.get(key)
    if entry is None:
        side = torch.cuda.Stream(device=x.device)  # warm up cuBLAS off the capture stream first
        side.wait_stream(torch.cuda.current_stream(x.device))
        with torch.cuda.stream(side):
            eager(x, w, g)
        torch.cuda.current_stream(x.device).wait_stream(side)
        captured = torch.cuda.CUDAGraph()
        with torch.cuda.graph(captured):
            y = eager(x, w, g)
        entry = _GRAPHS[key] = (captured, y)
        while len(_GRAPHS) > GRAPH_CACHE_SIZE:
            _GRAPHS.popitem(last=False)
    _GRAPHS.move_to_end(key)
    captured, y = entry
    captured.replay()
    return y


# --- the layer as one tile loop: the norm's sums and the GEMV, then 1/rms, silu and residual --------


@triton.jit
def _layer_tile(x_ptr, out_ptr, w_ptr, g_ptr, tile, B, H, eps,
                BB: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, UPCAST: tl.constexpr):
    # Output columns [tile * BN, +BN) of out = x + silu(rmsnorm(x) * g @ w^T) for all B rows. The norm's
    # 1/rms is a factor of each row, so it is applied after the GEMV: the loop that streams this program's
    # [BN, H] slab of w in [BN, BK] tiles also sums the rows' squares from the x tiles it loads anyway (from
    # L2). A prologue loop of its own was H / BK loads from L2 one after another, which the pipeliner left
    # unpipelined: ~16 round trips a layer at hidden 4096 before the first weight arrived.
    rows = tl.arange(0, BB)
    ks = tl.arange(0, BK)
    row_ok = rows < B
    cols = tile * BN + tl.arange(0, BN)
    col_ok = cols < H
    sumsq = tl.zeros([BB], dtype=tl.float32)
    acc = tl.zeros([BB, BN], dtype=tl.float32)
    for k0 in range(0, H, BK):
        k = k0 + ks
        k_ok = k < H
        xk = tl.load(x_ptr + rows[:, None] * H + k[None, :], mask=row_ok[:, None] & k_ok[None, :],
                     other=0.0, cache_modifier=".cg").to(tl.float32)
        sumsq += tl.sum(xk * xk, axis=1)
        xg = xk * tl.load(g_ptr + k, mask=k_ok, other=0.0).to(tl.float32)[None, :]
        wk = tl.load(w_ptr + cols[:, None] * H + k[None, :], mask=col_ok[:, None] & k_ok[None, :], other=0.0)
        if UPCAST:  # the interpreter's dot on CPU: fp32 operands
            acc += tl.dot(xg, tl.trans(wk.to(tl.float32)))
        else:  # x g rounded to the weights' dtype, as the eager chain's norm output is (before its 1/rms here)
            acc += tl.dot(xg.to(wk.dtype), tl.trans(wk))
    acc *= (1.0 / tl.sqrt(sumsq / H + eps))[:, None]

    # Epilogue: silu and the residual, in fp32, one store.
    res = tl.load(x_ptr + rows[:, None] * H + cols[None, :], mask=row_ok[:, None] & col_ok[None, :],
                  other=0.0, cache_modifier=".cg").to(tl.float32)
    y = res + acc * tl.sigmoid(acc)
    tl.store(out_ptr + rows[:, None] * H + cols[None, :], y.to(out_ptr.dtype.element_ty),
             mask=row_ok[:, None] & col_ok[None, :])


@triton.jit
def _fused_layer_kernel(x_ptr, out_ptr, w_ptr, g_ptr, B, H, eps,
                        BB: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, UPCAST: tl.constexpr):
    _layer_tile(x_ptr, out_ptr, w_ptr, g_ptr, tl.program_id(0), B, H, eps, BB, BN, BK, UPCAST)


MAX_BATCH = 64
"""Rows the fused kernels hold in one tile (the GEMV becomes a GEMM past that: a tensor-core tile loop)."""

BLOCK_N, BLOCK_K = 32, 256
"""Output columns a tile, and the K step: at hidden 4096, 128 tiles a layer for 132 SMs, each streaming a
256 KB slab of w in 16 KB steps."""


def _blocks(x: torch.Tensor) -> dict:
    b, h = x.shape
    if b > MAX_BATCH:
        raise NotImplementedError(f"the fused chain holds at most {MAX_BATCH} rows a tile; got {b}")
    bn, bk = (64, 128) if INTERPRET else (BLOCK_N, BLOCK_K)  # the interpreter pays per step: few, large tiles
    return {"BB": max(16, triton.next_power_of_2(b)), "BN": bn, "BK": min(bk, max(16, triton.next_power_of_2(h))),
            "UPCAST": not x.is_cuda}


# --- variant 6: one fused kernel a layer -----------------------------------------------------------


def fused(x: torch.Tensor, w: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """One launch a layer: the norm in the GEMV's K loop and on its output, silu and the residual after."""
    x, w, g = x.contiguous(), w.contiguous(), g.contiguous()
    b, h = x.shape
    meta = _blocks(x)
    bufs = [torch.empty_like(x), torch.empty_like(x)]
    src = x
    for layer in range(w.shape[0]):
        dst = bufs[layer % 2]
        _fused_layer_kernel[(triton.cdiv(h, meta["BN"]),)](src, dst, w[layer], g[layer], b, h, EPS,
                                                           num_warps=4, num_stages=3, **meta)
        src = dst
    return src


# --- variant 7: the whole chain in one persistent launch -----------------------------------------


@triton.jit
def _grid_barrier(count_ptr, target):
    # Every program adds one arrival, then waits until all have: `target` counts the arrivals of every
    # earlier barrier (this launch's and the launches' before it), so the counter never needs a reset.
    # All programs are resident (one per SM), so the wait ends. acq_rel on the arrival publishes this
    # program's stores. Waiters poll with plain volatile loads (atomics polling one line queue at L2
    # in front of the last arrival: softmax_fusion's row barrier measured it), then take one acquiring
    # atomic; their loads of x after it go to L2 (.cg), never a stale L1 line.
    tl.debug_barrier()
    seen = tl.atomic_add(count_ptr, 1, sem="acq_rel") + 1
    while seen < target:
        seen = tl.load(count_ptr, volatile=True)
    tl.atomic_add(count_ptr, 0, sem="acquire")
    tl.debug_barrier()


@triton.jit
def _persistent_kernel(x_ptr, buf_ptr, w_ptr, g_ptr, count_ptr, epoch, B, H, LAYERS, eps,
                       BB: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, UPCAST: tl.constexpr):
    # Layer l reads src and writes dst (x, then the two halves of buf in turn); the programs walk the
    # layer's tiles pid, pid + programs, ..., then meet at the barrier before layer l + 1 reads dst.
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    tiles = tl.cdiv(H, BN)
    for tile in range(pid, tiles, programs):  # layer 0 reads x
        _layer_tile(x_ptr, buf_ptr, w_ptr, g_ptr, tile, B, H, eps, BB, BN, BK, UPCAST)
    for layer in range(1, LAYERS):
        _grid_barrier(count_ptr, epoch + layer * programs)
        src = buf_ptr + ((layer + 1) % 2) * B * H
        dst = buf_ptr + (layer % 2) * B * H
        for tile in range(pid, tiles, programs):
            _layer_tile(src, dst, w_ptr + tl.cast(layer, tl.int64) * H * H, g_ptr + layer * H, tile, B, H, eps,
                        BB, BN, BK, UPCAST)


_counters: dict = {}
"""Per device: [the barrier's arrival counter, arrivals so far]. Launches on one stream only."""

COUNTER_RESET = 2**30
"""Arrivals after which the counter is zeroed again (an int32, far from overflow)."""


def persistent(x: torch.Tensor, w: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """One launch: one program per SM (so all are resident and the grid barrier's wait ends); under the
    interpreter, which runs programs one after another, a single program."""
    x, w, g = x.contiguous(), w.contiguous(), g.contiguous()
    b, h = x.shape
    layers = w.shape[0]
    meta = _blocks(x)
    programs = 1 if INTERPRET else min(num_sms(x), triton.cdiv(h, meta["BN"]))
    state = _counters.get(x.device)
    if state is None or state[1] > COUNTER_RESET:
        state = _counters[x.device] = [torch.zeros(1, device=x.device, dtype=torch.int32), 0]
    buf = torch.empty((2, b, h), device=x.device, dtype=x.dtype)
    _persistent_kernel[(programs,)](x, buf, w, g, state[0], state[1], b, h, layers, EPS,
                                    num_warps=4, num_stages=3, **meta)
    state[1] += (layers - 1) * programs
    return buf[(layers - 1) % 2]


# --- level 3: a small model's decode step ----------------------------------------------------------


def make_step_inputs(shape: dict, dtype: torch.dtype, device: str, generator: torch.Generator) -> dict:
    """One decode step of a small model: token ids, an embedding table, the chain's weights, an
    unembedding (the LM head)."""
    b, h, layers, vocab = shape["batch"], shape["hidden"], shape["layers"], shape["vocab"]
    gen = on_device(generator, device)
    chain = make_inputs({"batch": b, "hidden": h, "layers": layers}, dtype, device, generator)
    emb = torch.randn(vocab, h, generator=gen, device=device).to(dtype)
    head = (torch.randn(vocab, h, generator=gen, device=device) * h**-0.5).to(dtype)
    ids = torch.randint(vocab, (b,), generator=gen, device=device)
    return {"ids": ids, "emb": emb, "w": chain["w"], "g": chain["g"], "g_final": chain["g"][0].clone(), "head": head}


def decode_step(kernel, ids: torch.Tensor, emb: torch.Tensor, w: torch.Tensor, g: torch.Tensor,
                g_final: torch.Tensor, head: torch.Tensor) -> torch.Tensor:
    """Embed the batch's tokens, run the layers' chain with `kernel`, final norm, the logits: the step a
    server runs per generated token (attention left out: the chain's launches are the point)."""
    x = emb[ids]  # [batch, hidden]
    x = kernel(x, w, g)
    return F.linear(_rmsnorm(x, g_final), head)  # [batch, vocab]
