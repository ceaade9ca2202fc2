"""Transpose and permute: one read and one write of the tensor, and still far below copy speed.

What you will learn: a transpose does no arithmetic and its floor is a copy's (every element read
once and written once), yet a kernel that walks the input in order writes the output with a stride of
a whole row: each 2-byte element lands in its own 32-byte sector, so the memory system moves up to
16x the bytes the model counts (or the reverse, if the kernel walks the output in order and gathers
the input). On the roofline this is the signature of a layout-bound kernel: the same arithmetic
intensity as a copy (zero FLOPs per byte), on the same bandwidth roof, and far below it. The cure is
not fewer bytes but whole sectors: a tile is read along its rows, turned on chip (through shared
memory, which the Triton compiler lays out conflict-free), and written along its columns; on Hopper
the TMA moves whole tiles both ways.

Layout (one case covers both forms):
  x  [batch, rows, cols, inner]   contiguous
  y  [batch, cols, rows, inner]   y[b, c, r, i] = x[b, r, c, i], contiguous
A 2-D transpose is inner = 1 (a weight W -> W^T, an activation for a weight gradient, K^T or V^T per
head); the attention permute [B, S, H, D] -> [B, H, S, D] is rows = S, cols = H, inner = D. With inner
elements of at least a sector (16 of bf16) the permute moves whole runs and a naive kernel is already
at copy speed: that is the case's layout boundary, shown at level 1.

The ladder (baseline: torch_contiguous):
  copy                 control: a same-size copy, the roof the transposes are held to
  torch_contiguous     x.transpose(1, 2).contiguous(): the library's strided copy
  torch_compile        Inductor's generated kernel for the same
  naive_write_strided  Triton, programs walk the input in order: reads coalesced, writes strided
  naive_read_strided   Triton, programs walk the output in order: writes coalesced, reads strided
  tiled                a 32 x 32 tile read along rows, turned on chip, written along columns
  tiled_tuned          the same with tile shape and warps autotuned: wider tiles, 16-byte vectors both ways
  tma                  Hopper: tiles moved by TMA loads and stores (host tensor descriptors)
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from casebook.kernels.device import INTERPRET, autotune, compiled, on_device
from casebook.traffic import Term, Traffic

try:  # Triton >= 3.4: host-side tensor descriptors (TMA on sm90+; the interpreter emulates them)
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover - older Triton
    TensorDescriptor = None

# --- reference, inputs, traffic ----------------------------------------------------------------


def reference(x: torch.Tensor) -> torch.Tensor:
    """The exact answer, in float64: rows and cols swapped, inner runs kept."""
    return x.to(torch.float64).transpose(1, 2).contiguous()


def copy_reference(x: torch.Tensor) -> torch.Tensor:
    """What the `copy` control computes: x itself."""
    return x.to(torch.float64).clone()


def make_inputs(shape: dict, dtype: torch.dtype, device: str, generator: torch.Generator) -> dict:
    """x [batch, rows, cols, inner] of unit normals: every element distinct, so a misplaced one shows."""
    dims = (shape["batch"], shape["rows"], shape["cols"], shape["inner"])
    x = torch.randn(dims, generator=on_device(generator, device), device=device, dtype=torch.float32)
    return {"x": x.to(dtype)}


def traffic(shape: dict, dtype: torch.dtype) -> Traffic:
    """The floor: every element read once and written once, no arithmetic (a copy's floor)."""
    n = shape["batch"] * shape["rows"] * shape["cols"] * shape["inner"]
    b = torch.empty((), dtype=dtype).element_size()
    return Traffic([
        Term("read x (batch x rows x cols x inner elements)", bytes=n * b),
        Term("write y (the same elements, rows and cols swapped)", bytes=n * b),
    ])


def _out(x: torch.Tensor) -> torch.Tensor:
    b, r, c, i = x.shape
    return torch.empty((b, c, r, i), device=x.device, dtype=x.dtype)


def _check_size(x: torch.Tensor) -> None:
    if x.dim() != 4:
        raise ValueError(f"x must be [batch, rows, cols, inner], got {tuple(x.shape)}")
    if x.numel() >= 2**31:
        raise ValueError("offsets are 32-bit within a batch-flattened tensor: fewer than 2**31 elements")


# --- variant 0: the roof, a same-size copy (a control, checked against copy_reference) ----------


def copy(x: torch.Tensor) -> torch.Tensor:
    """Read x, write a copy: the same bytes as a transpose, every access coalesced."""
    return x.clone()


# --- variants 1, 2: the library and the compiler -------------------------------------------------


def torch_contiguous(x: torch.Tensor) -> torch.Tensor:
    """The swap as a view, materialised by the library's strided-copy kernel. (`.contiguous()` itself,
    except that it returns the input where the swap is a no-op, one row or one column: clone copies.)"""
    return x.transpose(1, 2).clone(memory_format=torch.contiguous_format)


_compiled_contiguous = compiled(torch_contiguous)


def torch_compile(x: torch.Tensor) -> torch.Tensor:
    """Inductor's generated Triton kernel for the same strided copy."""
    return _compiled_contiguous(x)


# --- variant 3, 4: naive, one side strided -------------------------------------------------------


@triton.jit
def _naive_kernel(x_ptr, y_ptr, n, R, C, D, BLOCK: tl.constexpr, WALK_OUTPUT: tl.constexpr):
    # R, C, D: rows, cols and the inner run's length (D, as head_dim is in the attention permute).
    # One program per BLOCK consecutive elements of one side; the other side's address is computed
    # from the index. Walking the input: neighbouring lanes read neighbouring elements (coalesced) and
    # write R * D elements apart (one sector each when inner is small). Walking the output: the reverse.
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    i = offs % D
    if WALK_OUTPUT:  # offs indexes y[b, c, r, i]
        r = (offs // D) % R
        c = (offs // (D * R)) % C
        b = offs // (D * R * C)
        src = ((b * R + r) * C + c) * D + i  # read C * D apart
        tl.store(y_ptr + offs, tl.load(x_ptr + src, mask=mask), mask=mask)
    else:  # offs indexes x[b, r, c, i]
        c = (offs // D) % C
        r = (offs // (D * C)) % R
        b = offs // (D * C * R)
        dst = ((b * C + c) * R + r) * D + i  # written R * D apart
        tl.store(y_ptr + dst, tl.load(x_ptr + offs, mask=mask), mask=mask)


NAIVE_BLOCK = 1024
"""Elements per program of the naive kernels: 1024 over 4 warps is 8 per thread, a 16-byte bf16 vector
on the walked side."""


def _naive(x: torch.Tensor, walk_output: bool) -> torch.Tensor:
    _check_size(x)
    x = x.contiguous()
    y = _out(x)
    n = x.numel()
    _naive_kernel[(triton.cdiv(n, NAIVE_BLOCK),)](x, y, n, x.shape[1], x.shape[2], x.shape[3],
                                                   BLOCK=NAIVE_BLOCK, WALK_OUTPUT=walk_output, num_warps=4)
    return y


def naive_write_strided(x: torch.Tensor) -> torch.Tensor:
    """Programs walk the input: reads coalesced, writes a row apart."""
    return _naive(x, walk_output=False)


def naive_read_strided(x: torch.Tensor) -> torch.Tensor:
    """Programs walk the output: writes coalesced, reads a row apart."""
    return _naive(x, walk_output=True)


# --- variant 5, 6: tiles turned on chip ----------------------------------------------------------


@triton.jit
def _tile_kernel(x_ptr, y_ptr, R, C, D, BM: tl.constexpr, BN: tl.constexpr, BI: tl.constexpr):
    # Program (tile, b) loads x[b, r0:r0+BM, c0:c0+BN, :] with the fast axis along cols (inner), and
    # stores it as y[b, c0:c0+BN, r0:r0+BM, :] with the fast axis along rows (inner). Between the two
    # the compiler converts the register layout through shared memory (swizzled, so the turn is
    # bank-conflict-free): both global sides move whole sectors.
    n_c = tl.cdiv(C, BN)
    r0 = (tl.program_id(0) // n_c) * BM
    c0 = (tl.program_id(0) % n_c) * BN
    base = tl.program_id(1).to(tl.int64) * R * C * D
    r = r0 + tl.arange(0, BM)
    c = c0 + tl.arange(0, BN)
    if BI == 1:  # a 2-D transpose
        tile = tl.load(x_ptr + base + r[:, None] * C + c[None, :], mask=(r[:, None] < R) & (c[None, :] < C))
        t = tl.trans(tile)  # [BN, BM]
        tl.store(y_ptr + base + c[:, None] * R + r[None, :], t, mask=(c[:, None] < C) & (r[None, :] < R))
    else:  # a permute of runs of D elements: [BM, BN, BI] -> [BN, BM, BI]
        i = tl.arange(0, BI)
        for i0 in range(0, D, BI):
            ii = i0 + i
            m = (r[:, None, None] < R) & (c[None, :, None] < C) & (ii[None, None, :] < D)
            tile = tl.load(x_ptr + base + (r[:, None, None] * C + c[None, :, None]) * D + ii[None, None, :], mask=m)
            t = tl.permute(tile, (1, 0, 2))
            mt = (c[:, None, None] < C) & (r[None, :, None] < R) & (ii[None, None, :] < D)
            tl.store(y_ptr + base + (c[:, None, None] * R + r[None, :, None]) * D + ii[None, None, :], t, mask=mt)


MAX_TILE_ELEMENTS = 16384
"""A tile's elements: 32 KB of bf16 in registers, and as much shared memory for the turn."""


def _inner_block(inner: int) -> int:
    # A power of two covering the inner run, at most 128 elements per step.
    return 1 if inner == 1 else min(triton.next_power_of_2(inner), 128)


def _tiles(x: torch.Tensor, bm: int, bn: int, bi: int, num_warps: int, y: torch.Tensor) -> None:
    b, r, c, i = x.shape
    grid = (triton.cdiv(r, bm) * triton.cdiv(c, bn), b)
    _tile_kernel[grid](x, y, r, c, i, BM=bm, BN=bn, BI=bi, num_warps=num_warps)


TILE = 32
"""The classic shared-memory transpose tile (CUDA's transpose sample): 32 x 32 elements."""


def tiled(x: torch.Tensor) -> torch.Tensor:
    """A fixed 32 x 32 tile (fewer rows and cols when the inner run is long), 4 warps."""
    _check_size(x)
    x = x.contiguous()
    y = _out(x)
    bi = _inner_block(x.shape[3])
    side = TILE
    while side > 1 and side * side * bi > MAX_TILE_ELEMENTS // 4:  # long runs: fewer rows and cols a tile
        side //= 2
    _tiles(x, side, side, bi, 4, y)
    return y


def _tuned_configs() -> list[triton.Config]:
    return [triton.Config({"BM": m, "BN": n}, num_warps=w)
            for m in (4, 8, 16, 32, 64, 128) for n in (4, 8, 16, 32, 64, 128) for w in (4, 8)]


def _prune_tuned(configs, named_args, **kwargs):
    # Tiles of 2K-16K elements: enough bytes in flight per program, no register spills; with long
    # inner runs that means few rows and cols a tile.
    bi = kwargs.get("BI", named_args.get("BI", 1))
    kept = [cf for cf in configs
            if MAX_TILE_ELEMENTS // 8 <= cf.kwargs["BM"] * cf.kwargs["BN"] * bi <= MAX_TILE_ELEMENTS]
    return kept or configs[:2]


_tile_tuned = autotune(_tuned_configs(), key=["R", "C", "D"],
                              prune_configs_by={"early_config_prune": _prune_tuned})(_tile_kernel)


def tiled_tuned(x: torch.Tensor) -> torch.Tensor:
    """The tiled kernel with tile shape and warps autotuned per shape: tiles up to 128 x 128, so each
    thread moves 16-byte vectors on both sides."""
    _check_size(x)
    x = x.contiguous()
    y = _out(x)
    b, r, c, i = x.shape
    bi = _inner_block(i)
    if INTERPRET:  # no autotuning under the interpreter: one small, non-square config
        _tiles(x, 16, 32, bi, 4, y)
        return y
    grid = lambda meta: (triton.cdiv(r, meta["BM"]) * triton.cdiv(c, meta["BN"]), b)  # noqa: E731
    _tile_tuned[grid](x, y, r, c, i, BI=bi)
    return y


# --- variant 7: Hopper, whole tiles moved by the TMA ---------------------------------------------


@triton.jit
def _tma_kernel(x_desc, y_desc, R, C, BM: tl.constexpr, BN: tl.constexpr):
    # x_desc views x as [batch, rows, cols], y_desc y as [batch, cols, rows]. The TMA copies a whole
    # [BM, BN] box into shared memory (zeros past the edges), the tile is turned, and the TMA writes
    # the [BN, BM] box back (clipped at the edges): no per-thread addresses, whole lines both ways.
    n_c = tl.cdiv(C, BN)
    r0 = (tl.program_id(0) // n_c) * BM
    c0 = (tl.program_id(0) % n_c) * BN
    b = tl.program_id(1)
    tile = tl.reshape(x_desc.load([b, r0, c0]), [BM, BN])
    y_desc.store([b, c0, r0], tl.reshape(tl.trans(tile), [1, BN, BM]))


TMA_TILE = (64, 64)
"""TMA box, rows x cols: 8 KB of bf16 each way, several tiles in flight per SM."""


def tma_applies(x: torch.Tensor) -> bool:
    """The TMA path: host descriptors exist, a 2-D transpose (inner 1), on a GPU sm90 or later, every
    row stride a multiple of 16 bytes on both sides (cols and rows), base 16-byte aligned."""
    if TensorDescriptor is None or x.shape[3] != 1:
        return False
    if x.is_cuda and torch.cuda.get_device_capability(x.device)[0] < 9:
        return False
    e = x.element_size()
    return (x.shape[2] * e) % 16 == 0 and (x.shape[1] * e) % 16 == 0 and x.data_ptr() % 16 == 0


def tma(x: torch.Tensor) -> torch.Tensor:
    """TMA loads and stores of tiles where TMA's 16-byte stride rule holds; tiled_tuned elsewhere (inner
    runs longer than one element, rows or cols not a multiple of 16 bytes)."""
    _check_size(x)
    x = x.contiguous()
    if not tma_applies(x):
        return tiled_tuned(x)
    b, r, c, _ = x.shape
    y = _out(x)
    bm, bn = (16, 32) if INTERPRET else TMA_TILE
    x_desc = TensorDescriptor.from_tensor(x.view(b, r, c), [1, bm, bn])
    y_desc = TensorDescriptor.from_tensor(y.view(b, c, r), [1, bn, bm])
    _tma_kernel[(triton.cdiv(r, bm) * triton.cdiv(c, bn), b)](x_desc, y_desc, r, c, BM=bm, BN=bn,
                                                              num_warps=4)
    return y


# --- level 3: a transpose between two GEMMs (a weight gradient) ----------------------------------


def make_weight_grad_inputs(shape: dict, dtype: torch.dtype, device: str, generator: torch.Generator) -> dict:
    """x [tokens, hidden], w_up [hidden, inter], dy [tokens, hidden]: one MLP's up projection forward
    and the gradient arriving at its down projection."""
    t, h, f = shape["tokens"], shape["hidden"], shape["inter"]
    g = on_device(generator, device)
    x = torch.randn(t, h, generator=g, device=device, dtype=torch.float32)
    w_up = torch.randn(h, f, generator=g, device=device, dtype=torch.float32) * h**-0.5
    dy = torch.randn(t, h, generator=g, device=device, dtype=torch.float32)
    return {"x": x.to(dtype), "w_up": w_up.to(dtype), "dy": dy.to(dtype)}


def weight_grad(kernel, x: torch.Tensor, w_up: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
    """The down projection's weight gradient dW = a^T dy with a = x w_up, a^T materialised by `kernel`
    (a framework that hands the GEMM a contiguous transposed operand); cuBLAS could instead read a
    with its transpose flag, folding the layout into the GEMM's loads."""
    a = x @ w_up  # [tokens, inter]
    at = kernel(a.view(1, *a.shape, 1)).view(a.shape[1], a.shape[0])  # [inter, tokens]
    return at @ dy  # [inter, hidden]
