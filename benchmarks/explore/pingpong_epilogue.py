"""Device exploration (not a casebook run): a ping-pong GEMM whose epilogue runs under the next tile's
main loop. Issue 5's gemm_epilogue bar.

What the case found (cases/gemm_epilogue.yaml): the Triton TMA GEMM pays its bias + GELU epilogue in
series after each tile's main loop, at 8192 x 8192 x 1024 bf16:
- the tanh form costs 3-14%;
- the erf form costs 24-55%.
The issue's bar is 5%. cuBLASLt's fused GELU_BIAS pays 7%. Triton's automatic warp specialisation
was slower. What closes the gap in CUTLASS is "ping-pong": two consumer warpgroups take this
program's tiles in turn, fed by one producer warp through a ring of shared-memory stages. Because the
ring is filled in tile order, one consumer's main loop starts only as the other's ends, and the
other's epilogue (bias, GELU, the store) runs while it computes.

This is that kernel in Gluon, Triton 3.6's explicit-layout dialect:
- a 1-warp producer: TMA loads of A and B into STAGES slots;
- two 4-warp consumers: wgmma on 128 x 128 tiles, then the epilogue and a TMA store, each from its
  own staging buffer;
- the tiles of a persistent grid in grouped order.

Written on a machine without a GPU. `--compile-only` compiles it for sm_90a with the installed Triton,
so it is known to lower; it has not been run. It was compiled with Triton 3.6.0, the device image's,
installed in a separate virtual environment from the registry's wheel. ptxas reports:
- 197 KB of shared memory;
- no spills for the plain and tanh forms;
- 440 B of spill stores for the erf form, with consumers at 232 registers (maxnreg 168).

The erf spills shrink to 308 B at maxnreg 176. If they cost time, split the epilogue into column
halves.

Prediction, written before any run: at 8192 x 8192 x 1024 bf16 the plain kernel is within 5% of the
Triton TMA GEMM (cuBLAS-class, ~205-220 us). Each epilogue then costs under 5% over the plain
ping-pong kernel:
- the tanh one, which costs ~5 us per tile against a ~13 us main loop;
- the erf one, which has ~20 FP32 instructions per element, still under the other consumer's main loop.
If so, fused erf reaches ~225 us: 1.3x over addmm + GELU (~300 us), the issue's target.

First H200 runs (notes/h200-2026-12-01e/pingpong*.txt):
- The first crashed (launch failure) at 2048 x 2048 x 1024, the first shape where both consumers had
  tiles: consumer 1's parity waits passed on consumer 0's loads. The fix is the `turn` barrier.
- Then at 8192 x 8192 x 1024: plain 205.7 us (Triton TMA 206.3, cuBLAS 198.2); tanh 217.1 (+5.5%,
  cuBLASLt GELU_BIAS 216.0); erf 458.6 (2.2x). At 4096^3: plain 205.7, 8% behind the Triton TMA GEMM
  (189.9); tanh +2.2%; erf +32%.
The erf miss is libdevice's erf: it branches per element (256 `__nv_erff.exit` blocks in the PTX), so
the epilogue cannot be scheduled as straight-line code, and at ~15 us a tile it no longer fits under the
other consumer's ~6 us main loop. The branch-free erfc (`_gelu_erf`, the same as gemm_common's now) has
~16 instructions per element, two on the special-function unit: ~1.3 us of issue per tile.
Prediction: ping-pong erfc within 3% of ping-pong tanh at 8192 x 8192 x 1024 (~220 us, ~1.28x over
addmm + GELU); the Triton TMA GEMM with the same erfc epilogue drops from ~297 to ~235 us, since its
epilogue stays serial after each tile.

    python3 benchmarks/explore/pingpong_epilogue.py --compile-only   (any machine with Triton 3.6)
    python3 benchmarks/explore/pingpong_epilogue.py --check          (H200: small and ragged shapes)
    python3 benchmarks/explore/pingpong_epilogue.py                  (H200: check, then time)
"""
import sys

import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

BLOCK_M, BLOCK_N, BLOCK_K, STAGES, GROUP_M = 128, 128, 64, 4, 8
NUM_WARPS, MAXNREG, CONSUMER_REGS, PRODUCER_REGS = 4, 168, 232, 40
GELU = {"none": 0, "tanh": 1, "erf": 2, "erf_libdevice": 3}


@gluon.jit
def _tile_offsets(tile, M, N, BM: gl.constexpr, BN: gl.constexpr, GROUP: gl.constexpr):
    """Grouped order: GROUP row-blocks sweep the columns together, so B's tiles are reused from L2."""
    num_m = gl.cdiv(M, BM)
    num_n = gl.cdiv(N, BN)
    in_group = GROUP * num_n
    first_m = (tile // in_group) * GROUP
    size_m = gl.minimum(num_m - first_m, GROUP)
    pid_m = first_m + (tile % in_group) % size_m
    pid_n = (tile % in_group) // size_m
    return pid_m * BM, pid_n * BN


@gluon.jit
def _tanh(x):
    return gl.inline_asm_elementwise("tanh.approx.f32 $0, $1;", "=r,r", [x], dtype=gl.float32, is_pure=True,
                                     pack=1)


@gluon.jit
def _gelu_erf(x):
    """x Phi(x) through a branch-free erfc: gemm_common._gelu_erf in Gluon."""
    z = gl.abs(x) * 0.7071067811865476
    t = 1.0 / (1.0 + 0.5 * z)
    p = t * 0.17087277 - 0.82215223
    p = p * t + 1.48851587
    p = p * t - 1.13520398
    p = p * t + 0.27886807
    p = p * t - 0.18628806
    p = p * t + 0.09678418
    p = p * t + 0.37409196
    p = p * t + 1.00002368
    p = p * t - 1.26551223
    half = 0.5 * x * t * gl.exp2((p - z * z) * 1.4426950408889634)
    return gl.where(x >= 0, x - half, half)


@gluon.jit
def _producer(descs, bufs, bars, turn, c_bufs, bias_ptr, M, N, K, WHICH: gl.constexpr, GELU_FORM: gl.constexpr,
              GROUP: gl.constexpr):
    a_desc, b_desc, c_desc = descs
    a_bufs, b_bufs = bufs
    ready, empty = bars
    BM: gl.constexpr = a_desc.block_type.shape[0]
    BK: gl.constexpr = a_desc.block_type.shape[1]
    BN: gl.constexpr = b_desc.block_type.shape[1]
    NS: gl.constexpr = a_bufs.type.shape[0]
    num_tiles = gl.cdiv(M, BM) * gl.cdiv(N, BN)
    k_tiles = gl.cdiv(K, BK)
    it = 0
    for tile in range(gl.program_id(0), num_tiles, gl.num_programs(0)):
        off_m, off_n = _tile_offsets(tile, M, N, BM, BN, GROUP)
        for kk in range(k_tiles):
            s = it % NS
            # A slot starts empty: the first pass waits on the phase before the first.
            mbarrier.wait(empty.index(s), ((it // NS) & 1) ^ 1)
            mbarrier.expect(ready.index(s), a_desc.block_type.nbytes + b_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(a_desc, [off_m, kk * BK], ready.index(s), a_bufs.index(s))
            tma.async_copy_global_to_shared(b_desc, [kk * BK, off_n], ready.index(s), b_bufs.index(s))
            it += 1


@gluon.jit
def _consumer(descs, bufs, bars, turn, c_bufs, bias_ptr, M, N, K, WHICH: gl.constexpr, GELU_FORM: gl.constexpr,
              GROUP: gl.constexpr):
    """This program's tiles number WHICH, WHICH + 2, ...: the main loop, then bias + GELU and the store.

    The two main loops take turns (`turn`, CUTLASS's order barrier). Without it, consumer 1 waits on its
    first slot while consumer 0's loads fill the ring: a parity wait cannot tell a slot's use 16 from its
    use 0, so it passed on the wrong data and handed slots back early (the first H200 run: a launch
    failure at 2048 x 2048 x 1024, the first shape where both consumers had tiles)."""
    a_desc, b_desc, c_desc = descs
    a_bufs, b_bufs = bufs
    ready, empty = bars
    c_smem = c_bufs.index(WHICH)
    BM: gl.constexpr = c_desc.block_type.shape[0]
    BN: gl.constexpr = c_desc.block_type.shape[1]
    BK: gl.constexpr = a_desc.block_type.shape[1]
    NS: gl.constexpr = a_bufs.type.shape[0]
    mma_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                         instr_shape=[16, BN, 16])
    num_tiles = gl.cdiv(M, BM) * gl.cdiv(N, BN)
    k_tiles = gl.cdiv(K, BK)
    pid = gl.program_id(0)
    step = gl.num_programs(0)
    j = 0
    for tile in range(pid + WHICH * step, num_tiles, 2 * step):
        off_m, off_n = _tile_offsets(tile, M, N, BM, BN, GROUP)
        base = (2 * j + WHICH) * k_tiles  # this tile's first slot use in the ring
        acc = gl.zeros((BM, BN), gl.float32, mma_layout)
        # Consumer 0's first turn is free (the phase before the first); after that each waits for the other.
        mbarrier.wait(turn.index(WHICH), (j & 1) ^ (1 - WHICH))
        for kk in range(k_tiles):
            it = base + kk
            s = it % NS
            mbarrier.wait(ready.index(s), (it // NS) & 1)
            acc = warpgroup_mma(a_bufs.index(s), b_bufs.index(s), acc, is_async=True)
            # One wgmma stays in flight; the one before it is done, so its slot goes back.
            acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc, ))
            mbarrier.arrive(empty.index((it + NS - 1) % NS), count=1, pred=kk > 0)
        mbarrier.arrive(turn.index(1 - WHICH), count=1)  # every load of this tile is consumed: the other's turn
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
        mbarrier.arrive(empty.index((base + k_tiles - 1) % NS), count=1)

        offs_n = off_n + gl.arange(0, BN, layout=gl.SliceLayout(0, mma_layout))
        bias = gl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0).to(gl.float32)
        x = acc + gl.expand_dims(bias, 0)
        if GELU_FORM == 1:
            x = 0.5 * x * (1.0 + _tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)))
        elif GELU_FORM == 2:
            x = _gelu_erf(x)
        elif GELU_FORM == 3:
            x = 0.5 * x * (1.0 + gl.erf(x * 0.7071067811865476))
        out = x.to(c_desc.dtype)
        tma.store_wait(pendings=0)  # this consumer's previous tile has left its staging buffer
        c_smem.store(out)
        fence_async_shared()
        tma.async_copy_shared_to_global(c_desc, [off_m, off_n], c_smem)
        j += 1
    tma.store_wait(pendings=0)


@gluon.jit
def pingpong_kernel(a_desc, b_desc, c_desc, bias_ptr, M, N, K, GELU_FORM: gl.constexpr, STAGES_: gl.constexpr,
                    GROUP: gl.constexpr, CONSUMER_REGS_: gl.constexpr, PRODUCER_REGS_: gl.constexpr):
    a_bufs = gl.allocate_shared_memory(a_desc.dtype, [STAGES_] + a_desc.block_type.shape, a_desc.layout)
    b_bufs = gl.allocate_shared_memory(b_desc.dtype, [STAGES_] + b_desc.block_type.shape, b_desc.layout)
    c_bufs = gl.allocate_shared_memory(c_desc.dtype, [2] + c_desc.block_type.shape, c_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES_, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES_, 1], mbarrier.MBarrierLayout())
    turn = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES_):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)
    for i in gl.static_range(2):
        mbarrier.init(turn.index(i), count=1)
    descs = (a_desc, b_desc, c_desc)
    bufs = (a_bufs, b_bufs)
    bars = (ready, empty)
    gl.warp_specialize([
        (_consumer, (descs, bufs, bars, turn, c_bufs, bias_ptr, M, N, K, 0, GELU_FORM, GROUP)),
        (_consumer, (descs, bufs, bars, turn, c_bufs, bias_ptr, M, N, K, 1, GELU_FORM, GROUP)),
        (_producer, (descs, bufs, bars, turn, c_bufs, bias_ptr, M, N, K, 1, GELU_FORM, GROUP)),
    ], [4, 1], [CONSUMER_REGS_, PRODUCER_REGS_])


def _layouts():
    return (gl.NVMMASharedLayout.get_default_for([BLOCK_M, BLOCK_K], gl.bfloat16),
            gl.NVMMASharedLayout.get_default_for([BLOCK_K, BLOCK_N], gl.bfloat16),
            gl.NVMMASharedLayout.get_default_for([BLOCK_M, BLOCK_N], gl.bfloat16))


def matmul(a, b, bias, gelu: str = "none"):
    """C = gelu(A @ B + bias), bf16, A [M, K] and B [K, N] row-major."""
    import torch
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    (m, k), n = a.shape, b.shape[1]
    c = torch.empty(m, n, device=a.device, dtype=a.dtype)
    la, lb, lc = _layouts()
    a_desc = TensorDescriptor.from_tensor(a, [BLOCK_M, BLOCK_K], la)
    b_desc = TensorDescriptor.from_tensor(b, [BLOCK_K, BLOCK_N], lb)
    c_desc = TensorDescriptor.from_tensor(c, [BLOCK_M, BLOCK_N], lc)
    tiles = triton.cdiv(m, BLOCK_M) * triton.cdiv(n, BLOCK_N)
    grid = (min(torch.cuda.get_device_properties(a.device).multi_processor_count, tiles), )
    pingpong_kernel[grid](a_desc, b_desc, c_desc, bias, m, n, k, GELU[gelu], STAGES, GROUP_M, CONSUMER_REGS,
                          PRODUCER_REGS, num_warps=NUM_WARPS, maxnreg=MAXNREG)
    return c


def compile_only() -> None:
    """Lower the kernel for sm_90a without a GPU, and report what ptxas says of registers and spills."""
    from aot import compile_report

    la, lb, lc = _layouts()
    for form, code in GELU.items():
        sig = {"a_desc": f"tensordesc<bf16[{BLOCK_M}, {BLOCK_K}],{la!r}>",
               "b_desc": f"tensordesc<bf16[{BLOCK_K}, {BLOCK_N}],{lb!r}>",
               "c_desc": f"tensordesc<bf16[{BLOCK_M}, {BLOCK_N}],{lc!r}>",
               "bias_ptr": "*bf16", "M": "i32", "N": "i32", "K": "i32", "GELU_FORM": "constexpr",
               "STAGES_": "constexpr", "GROUP": "constexpr", "CONSUMER_REGS_": "constexpr",
               "PRODUCER_REGS_": "constexpr"}
        consts = {"GELU_FORM": code, "STAGES_": STAGES, "GROUP": GROUP_M, "CONSUMER_REGS_": CONSUMER_REGS,
                  "PRODUCER_REGS_": PRODUCER_REGS}
        print(f"gelu={form:4s}", compile_report(pingpong_kernel, sig, consts, num_warps=NUM_WARPS, maxnreg=MAXNREG),
              flush=True)


def check(m: int, n: int, k: int) -> bool:
    """Every GELU form against a float64 reference on fresh inputs; True when all are within 2e-2."""
    import torch
    import torch.nn.functional as F

    a = torch.randn(m, k, device="cuda").to(torch.bfloat16)
    b = (torch.randn(k, n, device="cuda") * k**-0.5).to(torch.bfloat16)
    bias = torch.randn(n, device="cuda").to(torch.bfloat16)
    ref = a.double() @ b.double() + bias.double()
    ok = True
    for form in GELU:
        want = ref if form == "none" else F.gelu(ref, approximate="tanh" if form == "tanh" else "none")
        if form == "erf_libdevice" and m * n > 2**22:
            continue
        got = matmul(a, b, bias, form).double()
        torch.cuda.synchronize()
        err = ((got - want).norm() / want.norm()).item()
        ok &= err < 2e-2
        print(f"{m}x{n}x{k} {form:4s} normwise error {err:.2e} {'ok' if err < 2e-2 else 'WRONG'}", flush=True)
    return ok


def main() -> None:
    import torch
    import torch.nn.functional as F

    from casebook.bench import Protocol, time_fn
    from casebook.kernels import gemm_common

    torch.manual_seed(0)
    for m, n, k in ((8192, 8192, 1024), (4096, 4096, 4096)):
        if not check(m, n, k):
            continue
        a = torch.randn(m, k, device="cuda").to(torch.bfloat16)
        b = (torch.randn(k, n, device="cuda") * k**-0.5).to(torch.bfloat16)
        bias = torch.randn(n, device="cuda").to(torch.bfloat16)
        flops = 2 * m * n * k
        runs = {
            "cuBLAS matmul": lambda: a @ b,
            "addmm + GELU (erf)": lambda: F.gelu(torch.addmm(bias, a, b)),
            "cuBLASLt GELU_BIAS (tanh)": lambda: torch._addmm_activation(bias, a, b, use_gelu=True),
            "Triton TMA plain": lambda: gemm_common.matmul(a, b, schedule="tma_persistent"),
            "addmm + GELU (tanh)": lambda: F.gelu(torch.addmm(bias, a, b), approximate="tanh"),
            "Triton TMA + bias + erfc": lambda: gemm_common.matmul(a, b, bias, "erf", schedule="tma_persistent"),
            "Triton TMA + bias + tanh": lambda: gemm_common.matmul(a, b, bias, "tanh", schedule="tma_persistent"),
            "ping-pong + bias, no GELU": lambda: matmul(a, b, bias, "none"),
            "ping-pong + bias + tanh": lambda: matmul(a, b, bias, "tanh"),
            "ping-pong + bias + erfc": lambda: matmul(a, b, bias, "erf"),
        }
        for label, fn in runs.items():
            s = time_fn(fn, "cuda", Protocol()).summary
            print(f"{m}x{n}x{k} {label:28s} {s.median_us:8.1f} us  ({flops / s.median_us / 1e6:5.0f} TFLOP/s)",
                  flush=True)


if __name__ == "__main__":
    if "--compile-only" in sys.argv:
        compile_only()
    elif "--check" in sys.argv:  # small and ragged shapes first: a hang or a wrong answer shows in seconds
        import torch

        torch.manual_seed(0)
        sys.exit(0 if all([check(256, 256, 128), check(1000, 1160, 328), check(2048, 2048, 1024)]) else 1)
    else:
        main()
