"""The tiled Triton GEMM core shared by the GEMM cases (gemm_tiled, gemm_epilogue).

C[m, n] = epilogue(sum_k A[m, k] B[k, n]), accumulated in fp32 and rounded once on the store.
Three schedules of the same tile computation, simplest first:

  tiled            one program per BLOCK_M x BLOCK_N tile of C; tiles launched in GROUP_M-row bands
                   (the "grouped" order of Triton tutorial 03) so that the programs resident at one
                   time share A row-panels and B column-panels in L2
  persistent       one (or two) programs per SM, each walking tiles tile_id, tile_id + programs, ... in the same
                   grouped order: no tail of short-lived programs, and the next tile's loads overlap
                   this tile's epilogue (tutorial 09)
  tma_persistent   the persistent schedule with tiles moved by the Hopper tensor memory accelerator
                   (host-side tensor descriptors, built once per call and passed as kernel arguments):
                   fewer address instructions, hardware bounds handling. Used only where the hardware, the Triton version and the strides allow;
                   otherwise it runs the `persistent` pointer kernel (see `tma_supported`).

The epilogue is optional: `+ bias[n]` and GELU (the exact erf form, torch's default, or the tanh form)
applied to the fp32 accumulator before the single store. That is the whole of the gemm_epilogue case.

Autotuning: a handful of known-good Hopper configurations per schedule, keyed on M, N, K (and the
epilogue flags). Under the Triton interpreter (TRITON_INTERPRET=1) each list collapses to one tiny
configuration so that tests at awkward shapes run in seconds on a CPU.
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl

from casebook.kernels import gelu_fit

try:
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # Triton before 3.4: no host-side descriptors, the TMA schedule runs `persistent`
    TensorDescriptor = None

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
"""Read once at import, like Triton itself: kernels are interpreted on CPU tensors."""

INTERPRETER_SMS = 3
"""Programs of a persistent grid under the interpreter: odd, so that programs get unequal tile counts."""


def _configs(gpu: list[tuple], group_m: int = 8, pre_hook=None, persistent: bool = False) -> list[triton.Config]:
    """(BLOCK_M, BLOCK_N, BLOCK_K, num_stages, num_warps[, PER_SM]) tuples; one tiny config under the
    interpreter. Persistent schedules also get PER_SM, the programs per SM (default 1)."""
    if INTERPRET:
        gpu, group_m = [(32, 16, 16, 1, 4)], 2
    configs = []
    for bm, bn, bk, s, w, *per_sm in gpu:
        meta = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": group_m}
        if persistent:
            meta["PER_SM"] = per_sm[0] if per_sm else 1
        configs.append(triton.Config(meta, num_stages=s, num_warps=w, pre_hook=pre_hook))
    return configs


def _set_tma_blocks(nargs: dict) -> None:
    # Host descriptors are built before the autotuner picks a tile: give each the chosen block shape.
    bm, bn, bk = nargs["BLOCK_M"], nargs["BLOCK_N"], nargs["BLOCK_K"]
    nargs["a_desc"].block_shape = [bm, bk]
    nargs["b_desc"].block_shape = [bk, bn]
    nargs["c_desc"].block_shape = [bm, bn]


# Hopper (sm90, 228 KB shared memory per SM). A 128x256x64 bf16 stage is 48 KB of shared memory, so
# three stages fit with room for the epilogue; a config that does not fit is dropped by the autotuner.
TILED_CONFIGS = _configs([
    (128, 256, 64, 3, 8),
    (256, 128, 64, 3, 8),
    (128, 128, 64, 4, 4),
    (128, 128, 64, 4, 8),
    (128, 128, 128, 3, 8),
    (64, 256, 64, 4, 4),
    (64, 128, 64, 4, 4),  # few, small tiles: thin problems that would leave SMs idle with 128x256
])
# Two programs per SM (the last entries): one program's epilogue runs while the other's main loop
# keeps the tensor cores busy, the overlap a warp-specialised kernel would build by hand.
PERSISTENT_CONFIGS = _configs([
    (128, 256, 64, 3, 8),
    (128, 128, 64, 4, 8),
    (128, 128, 64, 4, 4),
    (128, 128, 128, 3, 8),
    (64, 128, 64, 4, 4),
    (128, 128, 64, 3, 8, 2),
    (128, 128, 64, 3, 4, 2),
], persistent=True)
# TMA store keeps the C tile in shared memory too: 128x256 bf16 is 64 KB on top of the stages.
TMA_CONFIGS = _configs([
    (128, 256, 64, 3, 8),
    (128, 128, 64, 4, 8),
    (128, 128, 64, 4, 4),
    (128, 128, 128, 3, 8),
    (64, 128, 64, 4, 4),
    (128, 128, 64, 3, 8, 2),
    (128, 128, 64, 3, 4, 2),
], pre_hook=_set_tma_blocks, persistent=True)

KEY = ["M", "N", "K", "HAS_BIAS", "GELU"]


def _prune_tma(configs, named_args, **kwargs):
    """Plain GEMMs with at least two full waves of 128x256 tiles run the 128x256 configuration alone.

    Measured on an H200 (benchmarks/explore/gemm_configs.py, each configuration timed alone): it is
    the fastest at 4096^3 and 8192^3 bf16 (0.987x and 1.006x cuBLAS; the next best 0.907x and 0.968x),
    yet in one case run the autotuner, timing each configuration once, picked the 0.907x one at
    4096^3. Fused epilogues keep the full choice: their register pressure changes the ranking."""
    args = {**named_args, **kwargs}
    plain = not args.get("HAS_BIAS") and args.get("GELU", "none") == "none"
    waves = triton.cdiv(args["M"], 128) * triton.cdiv(args["N"], 256) / args["NUM_SMS"]
    kept = [c for c in configs if c.kwargs["BLOCK_M"] * c.kwargs["BLOCK_N"] >= 128 * 256]
    return kept if plain and waves >= 2 and kept else configs


_EVEN_K = {"EVEN_K": lambda args: args["K"] % args["BLOCK_K"] == 0}


# --- pieces shared by the three kernels ----------------------------------------------------------


@triton.jit
def _tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_M: tl.constexpr):
    # Grouped order: walk GROUP_M tile-rows column by column, so that consecutive tile ids (the
    # programs resident together) reuse GROUP_M A panels and a few B panels from L2.
    num_pid_in_group = GROUP_M * num_pid_n
    group_id = tile_id // num_pid_in_group
    first_pid_m = group_id * GROUP_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + (tile_id % group_size_m)
    pid_n = (tile_id % num_pid_in_group) // group_size_m
    return pid_m, pid_n


@triton.jit
def _mma(a, b, acc, UPCAST_DOT: tl.constexpr):
    # The interpreter multiplies bf16 bit patterns as integers (numpy has no bf16): upcast there only.
    if UPCAST_DOT:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc)
    return tl.dot(a, b, acc)


SQRT_2_OVER_PI = tl.constexpr(0.7978845608028654)
TANH_CUBIC = tl.constexpr(0.7978845608028654 * 0.044715)
SFU_ASM = tl.constexpr(not INTERPRET)
"""tanh, ex2 and rcp as single special-function-unit instructions (sm75+); the interpreter has no inline PTX."""


@triton.jit
def _tanh(u):
    if SFU_ASM:
        # One MUFU op, relative error under 2^-10.99 (PTX ISA): GELU off by at most |x| 2^-12, a thirtieth
        # of a bf16 ulp where GELU(x) ~ x.
        return tl.inline_asm_elementwise("tanh.approx.f32 $0, $1;", "=r,r", [u], dtype=tl.float32,
                                         is_pure=True, pack=1)
    return 2.0 / (1.0 + tl.exp(-2.0 * u)) - 1.0


@triton.jit
def _ex2(u):
    if SFU_ASM:  # one MUFU op, relative error 2^-22, without tl.exp2's range fix-ups
        return tl.inline_asm_elementwise("ex2.approx.ftz.f32 $0, $1;", "=r,r", [u], dtype=tl.float32,
                                         is_pure=True, pack=1)
    return tl.exp2(u)


@triton.jit
def _rcp(u):
    if SFU_ASM:  # one MUFU op, without a division's refinement
        return tl.inline_asm_elementwise("rcp.approx.ftz.f32 $0, $1;", "=r,r", [u], dtype=tl.float32,
                                         is_pure=True, pack=1)
    return 1.0 / u


# The exact GELU's erfc, fitted for few instructions (gelu_fit says why and folds the coefficients).
_E0, _E1, _E2, _E3, _E4 = (tl.constexpr(c) for c in gelu_fit.EXP2_FIT)
_F0, _F1, _F2, _F3 = (tl.constexpr(c) for c in gelu_fit.EXP2_FIT_BF16)
HALF_LOG2E = tl.constexpr(gelu_fit.HALF_LOG2E)
T_RSQRT2 = tl.constexpr(gelu_fit.T_RSQRT2)
T_RSQRT2_BF16 = tl.constexpr(gelu_fit.T_RSQRT2_BF16)


@triton.jit
def _gelu_erf(x, BF16: tl.constexpr):
    """x Phi(x) = max(x, 0) - |x| erfc(|x| / sqrt 2) / 2: GELU's exact form, straight-line (libdevice's
    erf branches per element, which cost the GEMM 24-55%), with no cancellation on either side: 11 FP32
    instructions per element with the bias add (10 when the output is bf16, BF16), and two MUFU ones."""
    a = tl.abs(x)
    if BF16:
        t = _rcp(1.0 + T_RSQRT2_BF16 * a)  # z = |x| / sqrt 2, t = 1 / (1 + T_SCALE_BF16 z)
        p = t * _F3 + _F2
        p = p * t + _F1
        p = p * t + _F0  # log2(e) P(t) - 1
    else:
        t = _rcp(1.0 + T_RSQRT2 * a)  # t = 1 / (1 + T_SCALE z)
        p = t * _E4 + _E3
        p = p * t + _E2
        p = p * t + _E1
        p = p * t + _E0
    return tl.maximum(x, 0.0) - (a * t) * _ex2(p - HALF_LOG2E * x * x)  # erfc(z) / 2t = exp(P(t) - z^2) / 2


@triton.jit
def _epilogue(acc, bias_ptr, offs_n, N, HAS_BIAS: tl.constexpr, GELU: tl.constexpr, OUT_BF16: tl.constexpr):
    # On the fp32 accumulator, in registers: no extra pass over C. GELU is "none", "erf" (the exact
    # form, torch's default: a fitted erfc, 10-11 FP32 instructions per element and two on the
    # special-function unit) or "tanh" (the tanh form, cuBLASLt's GELU epilogue: 6 FP32 instructions
    # and one tanh on the special-function unit).
    if HAS_BIAS:
        bias = tl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)
        acc = acc + bias[None, :]
    if GELU == "erf":
        acc = _gelu_erf(acc, OUT_BF16)
    elif GELU == "tanh":
        half = 0.5 * acc
        acc = half + half * _tanh(acc * (SQRT_2_OVER_PI + TANH_CUBIC * acc * acc))
    return acc


# --- schedule 1: one program per tile, grouped order ---------------------------------------------


@triton.autotune(configs=TILED_CONFIGS, key=KEY)
@triton.heuristics(_EVEN_K)
@triton.jit
def _tiled_kernel(a_ptr, b_ptr, c_ptr, bias_ptr, M, N, K,
                  stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                  HAS_BIAS: tl.constexpr, GELU: tl.constexpr, UPCAST_DOT: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                  GROUP_M: tl.constexpr, EVEN_K: tl.constexpr):
    pid_m, pid_n = _tile_coords(tl.program_id(0), tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N), GROUP_M)
    # Rows/columns past the edge are clamped to 0 instead of masked: loads stay unmasked along M and N
    # (the store is masked), and the hints keep them vectorised.
    offs_am = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_bn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_am = tl.max_contiguous(tl.multiple_of(tl.where(offs_am < M, offs_am, 0), BLOCK_M), BLOCK_M)
    offs_bn = tl.max_contiguous(tl.multiple_of(tl.where(offs_bn < N, offs_bn, 0), BLOCK_N), BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + offs_am[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_bn[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kt in range(0, tl.cdiv(K, BLOCK_K)):
        if EVEN_K:
            a = tl.load(a_ptrs)
            b = tl.load(b_ptrs)
        else:
            a = tl.load(a_ptrs, mask=offs_k[None, :] < K - kt * BLOCK_K, other=0.0)
            b = tl.load(b_ptrs, mask=offs_k[:, None] < K - kt * BLOCK_K, other=0.0)
        acc = _mma(a, b, acc, UPCAST_DOT)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    offs_cm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_cn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = _epilogue(acc, bias_ptr, offs_cn, N, HAS_BIAS, GELU, c_ptr.dtype.element_ty == tl.bfloat16)
    c_ptrs = c_ptr + offs_cm[:, None] * stride_cm + offs_cn[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=(offs_cm[:, None] < M) & (offs_cn[None, :] < N))


# --- schedule 2: one or two programs per SM, same grouped order -----------------------------------


@triton.autotune(configs=PERSISTENT_CONFIGS, key=KEY)
@triton.heuristics(_EVEN_K)
@triton.jit
def _persistent_kernel(a_ptr, b_ptr, c_ptr, bias_ptr, M, N, K,
                       stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                       HAS_BIAS: tl.constexpr, GELU: tl.constexpr, UPCAST_DOT: tl.constexpr,
                       NUM_SMS: tl.constexpr, PER_SM: tl.constexpr,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                       GROUP_M: tl.constexpr, EVEN_K: tl.constexpr):
    start = tl.program_id(0)
    NUM_PROGRAMS: tl.constexpr = NUM_SMS * PER_SM
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_tiles = num_pid_m * num_pid_n
    k_tiles = tl.cdiv(K, BLOCK_K)
    offs_k_base = tl.arange(0, BLOCK_K)
    # A second tile counter for the epilogue (as in tutorial 09): with flatten=True the compiler
    # pipelines across tiles, and keeping prologue and epilogue values apart keeps that legal.
    tile_id_c = start - NUM_PROGRAMS
    for tile_id in tl.range(start, num_tiles, NUM_PROGRAMS, flatten=True):
        pid_m, pid_n = _tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_M)
        offs_am = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_bn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_am = tl.max_contiguous(tl.multiple_of(tl.where(offs_am < M, offs_am, 0), BLOCK_M), BLOCK_M)
        offs_bn = tl.max_contiguous(tl.multiple_of(tl.where(offs_bn < N, offs_bn, 0), BLOCK_N), BLOCK_N)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for kt in range(k_tiles):
            offs_k = kt * BLOCK_K + offs_k_base
            a_ptrs = a_ptr + offs_am[:, None] * stride_am + offs_k[None, :] * stride_ak
            b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_bn[None, :] * stride_bn
            if EVEN_K:
                a = tl.load(a_ptrs)
                b = tl.load(b_ptrs)
            else:
                a = tl.load(a_ptrs, mask=offs_k_base[None, :] < K - kt * BLOCK_K, other=0.0)
                b = tl.load(b_ptrs, mask=offs_k_base[:, None] < K - kt * BLOCK_K, other=0.0)
            acc = _mma(a, b, acc, UPCAST_DOT)
        tile_id_c += NUM_PROGRAMS
        pid_m, pid_n = _tile_coords(tile_id_c, num_pid_m, num_pid_n, GROUP_M)
        offs_cm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_cn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        acc = _epilogue(acc, bias_ptr, offs_cn, N, HAS_BIAS, GELU, c_ptr.dtype.element_ty == tl.bfloat16)
        c_ptrs = c_ptr + offs_cm[:, None] * stride_cm + offs_cn[None, :] * stride_cn
        tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=(offs_cm[:, None] < M) & (offs_cn[None, :] < N))


# --- schedule 3: persistent, tiles moved by TMA --------------------------------------------------


@triton.autotune(configs=TMA_CONFIGS, key=KEY, prune_configs_by={"early_config_prune": _prune_tma})
@triton.jit
def _tma_persistent_kernel(a_desc, b_desc, c_desc, bias_ptr, M, N, K,
                           HAS_BIAS: tl.constexpr, GELU: tl.constexpr, UPCAST_DOT: tl.constexpr,
                           NUM_SMS: tl.constexpr, PER_SM: tl.constexpr,
                           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                           GROUP_M: tl.constexpr):
    # The descriptors carry shape and strides: TMA zero-fills reads past the edge and clips writes,
    # so the kernel has no masks at all (only the bias load). Storing C in two halves (tutorial 09's
    # epilogue subtiling, a fourth stage in the freed shared memory) was measured on an H200 and made
    # the tanh epilogue dearer: benchmarks/explore/epilogue_subtile.py.
    start = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_tiles = num_pid_m * num_pid_n
    k_tiles = tl.cdiv(K, BLOCK_K)
    NUM_PROGRAMS: tl.constexpr = NUM_SMS * PER_SM
    tile_id_c = start - NUM_PROGRAMS
    for tile_id in tl.range(start, num_tiles, NUM_PROGRAMS, flatten=True):
        pid_m, pid_n = _tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_M)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for kt in range(k_tiles):
            a = a_desc.load([pid_m * BLOCK_M, kt * BLOCK_K])
            b = b_desc.load([kt * BLOCK_K, pid_n * BLOCK_N])
            acc = _mma(a, b, acc, UPCAST_DOT)
        tile_id_c += NUM_PROGRAMS
        pid_m, pid_n = _tile_coords(tile_id_c, num_pid_m, num_pid_n, GROUP_M)
        offs_cn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        acc = _epilogue(acc, bias_ptr, offs_cn, N, HAS_BIAS, GELU, c_desc.dtype == tl.bfloat16)
        c_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N], acc.to(c_desc.dtype))


# --- launchers ------------------------------------------------------------------------------------


def reference_device() -> torch.device:
    """Where the float64 references compute: a GPU when there is one (a 7 TFLOP float64 GEMM takes
    ~0.2 s there and minutes on a CPU), else the CPU. The result goes back to the inputs' device."""
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def device_generator(generator: torch.Generator, device: str) -> torch.Generator:
    """A generator on `device` seeded from `generator`: large operands are drawn where they live
    (drawing a 70B layer's weights on the CPU and copying them takes seconds per check)."""
    seed = int(torch.randint(2**62, (1,), generator=generator))
    return torch.Generator(device=device).manual_seed(seed)


@functools.cache
def _device_properties(index: int):
    # torch looks the properties up on every call, four times per GEMM call here (on an H200, 1200
    # lookups took 15 ms under cProfile: notes/h200-2026-12-01c/host_overhead.txt, which inflates
    # small calls); they do not change while the process lives.
    return torch.cuda.get_device_properties(index)


def num_sms(t: torch.Tensor) -> int:
    """Programs of a persistent grid: the SM count on a GPU, a small odd number under the interpreter."""
    if t.is_cuda:
        return _device_properties(t.device.index).multi_processor_count
    return INTERPRETER_SMS


def _tma_alloc(size: int, alignment: int, stream):
    # Device-side descriptors (the grouped kernel's) need a little global scratch per launch.
    return torch.empty(size, device="cuda", dtype=torch.int8)


def tma_supported(*tensors: torch.Tensor) -> bool:
    """True where the TMA path is valid: Triton has host-side tensor descriptors; on a GPU, sm90+;
    every tensor unit-stride in its last dimension with 16-byte-aligned base and row strides."""
    if TensorDescriptor is None:
        return False
    for t in tensors:
        if t.is_cuda and _device_properties(t.device.index).major < 9:
            return False
        if t.stride(-1) != 1 or t.data_ptr() % 16:
            return False
        if any((s * t.element_size()) % 16 for s in t.stride()[:-1]):
            return False
    return True


def matmul(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None, gelu: str = "none",
           schedule: str = "tiled") -> torch.Tensor:
    """C = [gelu](A @ B [+ bias]) with A [M, K], B [K, N], bias [N]; C has A's dtype.

    gelu: "none", "erf" (exact) or "tanh" (the tanh form).
    schedule: "tiled", "persistent" or "tma_persistent" (which runs "persistent" where TMA is not valid).
    """
    if gelu not in ("none", "erf", "tanh"):
        raise ValueError(f"gelu must be 'none', 'erf' or 'tanh', got {gelu!r}")
    M, K = a.shape
    K_b, N = b.shape
    if K != K_b:
        raise ValueError(f"inner dimensions differ: a is {tuple(a.shape)}, b is {tuple(b.shape)}")
    if max(a.numel(), b.numel(), M * N) >= 2**31:
        raise ValueError("offsets are 32-bit: every operand must have fewer than 2**31 elements")
    c = torch.empty((M, N), device=a.device, dtype=a.dtype)
    has_bias = bias is not None
    bias_arg = bias if has_bias else c  # never read when HAS_BIAS is False
    flags = dict(HAS_BIAS=has_bias, GELU=gelu, UPCAST_DOT=a.dtype == torch.bfloat16 and not a.is_cuda)

    sms = num_sms(a)
    tiles = lambda meta: triton.cdiv(M, meta["BLOCK_M"]) * triton.cdiv(N, meta["BLOCK_N"])  # noqa: E731
    persistent_grid = lambda meta: (min(sms * meta["PER_SM"], tiles(meta)),)  # noqa: E731
    if schedule == "tma_persistent" and tma_supported(a, b, c):
        descs = [TensorDescriptor.from_tensor(t, [1, 1]) for t in (a, b, c)]  # blocks set per config
        _tma_persistent_kernel[persistent_grid](*descs, bias_arg, M, N, K, NUM_SMS=sms, **flags)
        return c
    args = (a, b, c, bias_arg, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1))
    if schedule == "tiled":
        _tiled_kernel[lambda meta: (tiles(meta),)](*args, **flags)
    elif schedule in ("persistent", "tma_persistent"):
        _persistent_kernel[persistent_grid](*args, NUM_SMS=sms, **flags)
    else:
        raise ValueError(f"unknown schedule {schedule!r}")
    return c
