"""Mixture-of-experts grouped GEMM: many small GEMMs with ragged sizes, one launch instead of one each.

What you will learn: in an MoE layer each expert multiplies only the tokens routed to it, so one large
GEMM becomes E small ones, [m_e, k] @ [k, n] with sum m_e = tokens x top_k and m_e ragged. Launched
one by one they are launch- and occupancy-bound: at 64 experts x 128 rows x 1408 x 4096 each GEMM has
11 output tiles for 132 SMs and ~3 us of work, yet the loop costs ~14 us per expert. One persistent
launch that walks the tiles of all groups fills the machine; what is left is then the roofline of
the whole problem. Its arithmetic intensity is about the mean rows per expert (each expert's weights
are read once for its m_e rows: 2 m_e n k FLOPs over 2 n k bytes), so below ~165 rows per expert in
bf16 the grouped GEMM is bound by streaming the experts' weights, above it by the tensor cores.

Layout (what this case assumes):
  x            [tokens, k]        rows already sorted by expert (the permutation is level 3's job)
  w            [experts, n, k]    each expert an nn.Linear weight (out x in), as checkpoints store them
  group_sizes  [experts] int32    rows per expert, sum == tokens, zeros allowed; stays on the device
  y            [tokens, n]        y[rows of e] = x[rows of e] @ w[e]^T
`tokens` counts (token, expert) pairs: a batch of T tokens with top-k routing gives T x k rows.

Group sizes: each row picks an expert from a Zipf distribution with exponent ZIPF_EXPONENT over a random
permutation of the experts (seeded by the generator), so loads are ragged the way a router's are:
at 64 experts the most popular gets ~4.4x the mean, the least ~0.55x, and small batches leave some
experts empty. Rows are drawn independently (a top-k router picks k distinct experts per token; for the
sizes alone the difference is negligible).

The ladder (baseline: loop):
  loop              torch.mm per non-empty expert after copying the sizes to the host (a sync):
                    E launches, each GEMM too small to fill the GPU
  loop_graph        the same loop captured once in a CUDA graph per (pointers, sizes) and replayed:
                    removes the CPU launch cost, not the small-GEMM occupancy
  torch_grouped_mm  torch._grouped_mm (CUTLASS grouped GEMM on sm90): one launch, bf16 only on CUDA
  triton_grouped    one persistent Triton launch: NUM_SMS programs walk all groups' tiles, the tile ->
                    group map computed on the device from group_sizes (no host sync); TMA loads where
                    valid, pointer loads otherwise
"""

from __future__ import annotations

import collections

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from casebook.kernels import gemm_common
from casebook.kernels.gemm_common import _mma
from casebook.traffic import Term, Traffic

ZIPF_EXPONENT = 0.5
"""Skew of expert popularity: p_i ~ i^-0.5 over experts in a random order."""


def expert_probabilities(experts: int) -> torch.Tensor:
    """Routing probabilities, most popular first (float64, sums to 1)."""
    p = torch.arange(1, experts + 1, dtype=torch.float64) ** -ZIPF_EXPONENT
    return p / p.sum()


def expected_active_experts(experts: int, tokens: int) -> float:
    """Experts expected to receive at least one of `tokens` independent draws."""
    return float((1 - (1 - expert_probabilities(experts)) ** tokens).sum())


# --- reference, inputs, traffic ----------------------------------------------------------------


def reference(x: torch.Tensor, w: torch.Tensor, group_sizes: torch.Tensor) -> torch.Tensor:
    """Each expert's rows times its weight, transposed, in float64 (on a GPU when there is one)."""
    dev = gemm_common.reference_device()
    y = torch.zeros(x.shape[0], w.shape[1], dtype=torch.float64, device=dev)
    start = 0
    for e, size in enumerate(group_sizes.tolist()):
        if size:
            y[start:start + size] = x[start:start + size].to(dev, torch.float64) @ w[e].to(dev, torch.float64).T
        start += size
    return y.to(x.device)


def make_inputs(shape: dict, dtype: torch.dtype, device: str, generator: torch.Generator) -> dict:
    """Sorted tokens, fan-in-scaled expert weights, and Zipf-skewed group sizes (all from `generator`)."""
    experts, tokens, n, k = shape["experts"], shape["tokens"], shape["n"], shape["k"]
    p = expert_probabilities(experts)[torch.randperm(experts, generator=generator)]
    choice = torch.multinomial(p.float(), tokens, replacement=True, generator=generator)
    group_sizes = torch.bincount(choice, minlength=experts).to(torch.int32)
    g = gemm_common.device_generator(generator, device)
    x = torch.randn(tokens, k, generator=g, device=device)
    w = torch.empty(experts, n, k, dtype=dtype, device=device)
    for e in range(experts):  # one expert at a time: no fp32 copy of all the weights
        w[e] = torch.randn(n, k, generator=g, device=device) * k**-0.5
    return {"x": x.to(dtype), "w": w, "group_sizes": group_sizes.to(device)}


def traffic(shape: dict, dtype: torch.dtype) -> Traffic:
    """The floor: x read once, each expert that has rows read once, y written once.

    Which experts are empty depends on the draw; the model uses the expected number of non-empty
    experts under the case's distribution (all of them at realistic token counts)."""
    experts, tokens, n, k = shape["experts"], shape["tokens"], shape["n"], shape["k"]
    e = torch.empty((), dtype=dtype).element_size()
    active = expected_active_experts(experts, tokens)
    return Traffic([
        Term("read x", bytes=tokens * k * e),
        Term(f"read weights of non-empty experts (expected {active:.1f} of {experts})", bytes=active * n * k * e),
        Term("read group sizes", bytes=experts * 4),
        Term("write y", bytes=tokens * n * e),
        Term("multiply-add (2 per row, n, k)", flops=2 * tokens * n * k),
    ])


LAUNCHES = {
    "loop": lambda shape: shape["experts"],  # one GEMM per non-empty expert (at most), plus a 256 B copy to the host
    "loop_graph": lambda shape: 1,  # one graph launch; inside it, still one small GEMM per expert
    "torch_grouped_mm": lambda shape: 2,  # cumsum of the sizes, then the grouped GEMM
    "triton_grouped": lambda shape: 1,
}
"""Kernel launches per call, as the model expects them (the harness counts the real ones with the profiler).
The launch roof is launches x ~4 us: 256 us for the loop at 64 experts, above its bandwidth floor."""


# --- variant 1: a loop of library GEMMs -------------------------------------------------------------


def _loop_into(x: torch.Tensor, w: torch.Tensor, sizes: list[int], y: torch.Tensor) -> None:
    start = 0
    for e, size in enumerate(sizes):
        if size:
            torch.mm(x[start:start + size], w[e].t(), out=y[start:start + size])
        start += size


def loop(x: torch.Tensor, w: torch.Tensor, group_sizes: torch.Tensor) -> torch.Tensor:
    """One cuBLAS GEMM per non-empty expert; the sizes must be on the host first (a device sync)."""
    y = torch.empty(x.shape[0], w.shape[1], device=x.device, dtype=x.dtype)
    _loop_into(x, w, group_sizes.tolist(), y)
    return y


# --- variant 2: the loop replayed from a CUDA graph ---------------------------------------------------

_GRAPHS: collections.OrderedDict = collections.OrderedDict()
GRAPH_CACHE_SIZE = 8


def loop_graph(x: torch.Tensor, w: torch.Tensor, group_sizes: torch.Tensor) -> torch.Tensor:
    """The loop captured once per (pointers, shapes, sizes) and replayed: E kernels, one CPU launch.

    The sizes are still copied to the host (they pick the graph). The graph writes a static output
    buffer, returned as is: the next replay of the same graph overwrites it."""
    if not x.is_cuda:
        raise NotImplementedError("CUDA graphs need a CUDA device")
    sizes = group_sizes.tolist()
    key = (x.data_ptr(), w.data_ptr(), tuple(x.shape), tuple(w.shape), x.dtype, x.device, tuple(sizes))
    entry = _GRAPHS.get(key)
    if entry is None:
        y = torch.empty(x.shape[0], w.shape[1], device=x.device, dtype=x.dtype)
        side = torch.cuda.Stream(device=x.device)  # warm up cuBLAS off the capture stream first
        side.wait_stream(torch.cuda.current_stream(x.device))
        with torch.cuda.stream(side):
            _loop_into(x, w, sizes, y)
        torch.cuda.current_stream(x.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            _loop_into(x, w, sizes, y)
        entry = _GRAPHS[key] = (graph, y)
        while len(_GRAPHS) > GRAPH_CACHE_SIZE:
            _GRAPHS.popitem(last=False)
    _GRAPHS.move_to_end(key)
    graph, y = entry
    graph.replay()
    return y


# --- variant 3: the library's grouped GEMM ------------------------------------------------------------


def torch_grouped_mm(x: torch.Tensor, w: torch.Tensor, group_sizes: torch.Tensor) -> torch.Tensor:
    """torch._grouped_mm(x, w^T per expert, offs = inclusive cumsum of the sizes): one launch.

    On CUDA it takes bf16 only, row strides that are multiples of 16 bytes, and the second operand
    [experts, k, n]; w.transpose(-2, -1) is that view of the [experts, n, k] weights (column-major per
    expert, the layout torchtitan's MoE passes)."""
    if not hasattr(torch, "_grouped_mm"):
        raise NotImplementedError("torch._grouped_mm is absent from this PyTorch (added in 2.8)")
    if x.is_cuda and x.dtype != torch.bfloat16:
        raise NotImplementedError(f"torch._grouped_mm on CUDA takes bf16 only, not {x.dtype}")
    offs = torch.cumsum(group_sizes, dim=0, dtype=torch.int32)
    try:
        return torch._grouped_mm(x, w.transpose(-2, -1), offs=offs)
    except RuntimeError as e:  # e.g. strides not 16-byte multiples, or no kernel for this device/dtype
        raise NotImplementedError(f"torch._grouped_mm: {e}") from e


# --- variant 4: one persistent Triton launch over all groups' tiles -------------------------------


def _grouped_configs() -> list[triton.Config]:
    if gemm_common.INTERPRET:
        return [triton.Config({"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16}, num_warps=4, num_stages=1)]
    # Hopper. BLOCK_M 64 wastes less on ragged groups (on average half a block of padding rows per
    # expert); BLOCK_M 128 reuses each weight tile over more rows when groups are large.
    return [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk}, num_stages=s, num_warps=w)
            for bm, bn, bk, s, w in [
                (64, 128, 64, 4, 4),
                (64, 256, 64, 4, 4),
                (128, 128, 64, 4, 4),
                (128, 128, 64, 4, 8),
                (128, 256, 64, 3, 8),
            ]]


@triton.autotune(configs=_grouped_configs(), key=["TOTAL_M", "N", "K", "E", "USE_TMA"])
@triton.heuristics({"EVEN_K": lambda args: args["K"] % args["BLOCK_K"] == 0})
@triton.jit
def _grouped_kernel(x_ptr, w_ptr, y_ptr, sizes_ptr, TOTAL_M, N, K, E,
                    stride_xm, stride_we, stride_wn, stride_ym,
                    NUM_SMS: tl.constexpr, USE_TMA: tl.constexpr, UPCAST_DOT: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr):
    # Tiles are numbered group by group (within a group, M fastest, so concurrent programs share each
    # weight tile through L2); program p takes tiles p, p + NUM_SMS, ... Every program scans the E
    # group sizes once, keeping a running row offset and tile count: the schedule costs E scalar loads
    # per program and no host round trip.
    if USE_TMA:
        # x as [TOTAL_M, K] and w as [E * N, K]: a tile may run past its group (into the next group's
        # rows or the next expert's weights, or past the end, which TMA zero-fills); those rows and
        # columns of the product are never stored.
        x_desc = tl.make_tensor_descriptor(x_ptr, shape=[TOTAL_M, K], strides=[stride_xm, 1],
                                           block_shape=[BLOCK_M, BLOCK_K])
        w_desc = tl.make_tensor_descriptor(w_ptr, shape=[E * N, K], strides=[stride_wn, 1],
                                           block_shape=[BLOCK_N, BLOCK_K])
    num_n = tl.cdiv(N, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    tile = tl.program_id(0)
    tiles_before = 0
    row_start = 0
    w_expert = w_ptr  # expert g's weights; a 64-bit pointer stepped by stride_we (E n k may pass 2**31)
    for g in range(E):
        size = tl.load(sizes_ptr + g)
        tiles_m = tl.cdiv(size, BLOCK_M)
        n_tiles = tiles_m * num_n
        while tile >= tiles_before and tile < tiles_before + n_tiles:
            t = tile - tiles_before
            pid_m = t % tiles_m
            pid_n = t // tiles_m
            local = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # row within the group
            offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            if USE_TMA:
                for kt in range(tl.cdiv(K, BLOCK_K)):
                    a = x_desc.load([row_start + pid_m * BLOCK_M, kt * BLOCK_K])
                    b = w_desc.load([g * N + pid_n * BLOCK_N, kt * BLOCK_K])  # [BLOCK_N, BLOCK_K]
                    acc = _mma(a, b.T, acc, UPCAST_DOT)
            else:
                # Rows past the group's end read the group's first row, columns past N read column 0:
                # the loads stay unmasked along M and N, the store is masked.
                rows = tl.where(local < size, row_start + local, row_start).to(tl.int64)
                cols = tl.where(offs_n < N, offs_n, 0)
                a_ptrs = x_ptr + rows[:, None] * stride_xm + offs_k[None, :]
                b_ptrs = w_expert + cols[None, :] * stride_wn + offs_k[:, None]
                for kt in range(tl.cdiv(K, BLOCK_K)):
                    if EVEN_K:
                        a = tl.load(a_ptrs)
                        b = tl.load(b_ptrs)  # [BLOCK_K, BLOCK_N], K contiguous
                    else:
                        a = tl.load(a_ptrs, mask=offs_k[None, :] < K - kt * BLOCK_K, other=0.0)
                        b = tl.load(b_ptrs, mask=offs_k[:, None] < K - kt * BLOCK_K, other=0.0)
                    acc = _mma(a, b, acc, UPCAST_DOT)
                    a_ptrs += BLOCK_K
                    b_ptrs += BLOCK_K
            y_rows = (row_start + local).to(tl.int64)
            y_ptrs = y_ptr + y_rows[:, None] * stride_ym + offs_n[None, :]
            tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=(local[:, None] < size) & (offs_n[None, :] < N))
            tile += NUM_SMS
        tiles_before += n_tiles
        row_start += size
        w_expert += stride_we


def grouped_gemm(x: torch.Tensor, w: torch.Tensor, group_sizes: torch.Tensor, use_tma: bool | None = None) -> torch.Tensor:
    """The persistent grouped GEMM; use_tma None picks TMA where it is valid (tests force either path)."""
    x, w = x.contiguous(), w.contiguous()
    tokens, k = x.shape
    experts, n, k_w = w.shape
    if k != k_w or group_sizes.shape != (experts,):
        raise ValueError(f"x {tuple(x.shape)}, w {tuple(w.shape)}, group_sizes {tuple(group_sizes.shape)} disagree")
    y = torch.empty(tokens, n, device=x.device, dtype=x.dtype)
    if tokens == 0:
        return y
    if use_tma is None:
        use_tma = gemm_common.tma_supported(x, w)
    if use_tma and x.is_cuda:
        triton.set_allocator(gemm_common._tma_alloc)
    sms = gemm_common.num_sms(x)
    _grouped_kernel[(sms,)](x, w, y, group_sizes, tokens, n, k, experts,
                            x.stride(0), w.stride(0), w.stride(1), y.stride(0),
                            NUM_SMS=sms, USE_TMA=use_tma, UPCAST_DOT=x.dtype == torch.bfloat16 and not x.is_cuda)
    return y


def triton_grouped(x: torch.Tensor, w: torch.Tensor, group_sizes: torch.Tensor) -> torch.Tensor:
    """One launch, NUM_SMS programs walking every group's tiles; the schedule is computed on the device."""
    return grouped_gemm(x, w, group_sizes)


# --- level 3: an MoE feed-forward layer --------------------------------------------------------------


def make_moe_inputs(shape: dict, dtype: torch.dtype, device: str, generator: torch.Generator) -> dict:
    """Hidden states, routing decisions (top_k distinct experts per token, Zipf-skewed; softmaxed
    weights) and the experts' SwiGLU weights: w13 [experts, 2 inter, hidden], w2 [experts, hidden, inter]."""
    t, h, i, experts, top_k = shape["tokens"], shape["hidden"], shape["inter"], shape["experts"], shape["top_k"]
    p = expert_probabilities(experts)[torch.randperm(experts, generator=generator)]
    topk_ids = torch.multinomial(p.float().expand(t, experts), top_k, replacement=False, generator=generator)
    topk_weights = torch.softmax(torch.randn(t, top_k, generator=generator), dim=-1)
    g = gemm_common.device_generator(generator, device)
    x = torch.randn(t, h, generator=g, device=device)
    w13 = torch.empty(experts, 2 * i, h, dtype=dtype, device=device)
    w2 = torch.empty(experts, h, i, dtype=dtype, device=device)
    for e in range(experts):
        w13[e] = torch.randn(2 * i, h, generator=g, device=device) * h**-0.5
        w2[e] = torch.randn(h, i, generator=g, device=device) * i**-0.5
    return {"x": x.to(dtype), "topk_ids": topk_ids.to(device),
            "topk_weights": topk_weights.to(device=device, dtype=dtype), "w13": w13, "w2": w2}


def moe_ffn(kernel, x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, w13: torch.Tensor,
            w2: torch.Tensor) -> torch.Tensor:
    """Sort rows by expert, grouped gate+up GEMM, SwiGLU, grouped down GEMM, unsort, weighted sum per token."""
    tokens, top_k = topk_ids.shape
    experts, two_i, _ = w13.shape
    inter = two_i // 2
    flat = topk_ids.reshape(-1)  # row r = (token r // top_k, its (r % top_k)-th expert)
    order = torch.argsort(flat, stable=True)  # rows grouped by expert
    # Counting with scatter_add keeps the sizes on the device (bincount on CUDA would sync).
    group_sizes = torch.zeros(experts, dtype=torch.int64, device=x.device).scatter_add_(0, flat, torch.ones_like(flat))
    group_sizes = group_sizes.to(torch.int32)
    h = kernel(x=x[order // top_k], w=w13, group_sizes=group_sizes)  # gather; [tokens * top_k, 2 inter]
    a = F.silu(h[:, :inter]) * h[:, inter:]  # [tokens * top_k, inter]
    o = kernel(x=a, w=w2, group_sizes=group_sizes)  # [tokens * top_k, hidden], sorted order
    unsorted = torch.empty_like(o)
    unsorted[order] = o  # back to (token, j) order: no atomics, deterministic
    # y[t] = sum_j weight[t, j] * row(t, j), as a batch of [1, top_k] @ [top_k, hidden] products.
    return torch.bmm(topk_weights.unsqueeze(1), unsorted.view(tokens, top_k, -1)).squeeze(1)
