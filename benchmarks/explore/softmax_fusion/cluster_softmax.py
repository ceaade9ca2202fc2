"""Device exploration: do 32K-256K softmax rows split over a thread-block cluster reach the copy rate?

Not a casebook run: the (max, sum) exchanged through distributed shared memory; issue 4's 64K and 256K
bars.

What the case found (cases/softmax_fusion.yaml): `triton_online` splits a long row over programs of 8K
columns that hold their chunk in registers and meet at a per-row barrier in global memory (an atomic
arrive, polling loads). One read and one write, yet 3.13 TB/s at 4096 x 65536 and 2.85 at 1024 x 262144
bf16, against a 4.15 TB/s copy. Triton 3.6 cannot launch clusters for this (a `num_ctas=2` row
reduction fails in make_ttgir) and Gluon has no cluster barrier, so this is CUDA C++, compiled at run
time by NVRTC through cuda.core (both on the H200 image).

The kernel: a cluster of C CTAs per row (C <= 8, the portable size, or 16 where the driver allows), each CTA T threads, each thread V
16-byte vectors of its CTA's chunk, loaded at once and held in registers as fp32. Each thread reduces its (max, sum of 2^(x log2 e -
max)), then the warp by shuffles, then the CTA through shared memory; warp 0 reads the C CTAs' pairs
from their shared memory (mapa + ld.shared::cluster) between two cluster barriers, and every thread
writes 2^(x log2 e - M) / S. The second barrier's wait sits at the very end, so no CTA leaves while
another may still read its pair.

What differs from triton_online: the barrier (hardware, one arrive and one wait, the CTAs of a cluster
co-scheduled by guarantee) instead of an atomic and polling through L2; and hand-placed loads.

Prediction, written before any run: at 4096 x 65536 bf16 the best configuration reaches 3.7 TB/s or
more (triton_online 3.13), at 1024 x 262144 3.5 or more (2.85), at 4096 x 32768 3.7 or more (3.47).
If it stays near triton_online's rates instead, the barrier was not what held the split kernel back, and
the load-free phases of each CTA's life (reductions, the exchange, the store's drain) are.

First H200 run: correct (fp32, bf16, fp16), and the
prediction failed. Best of 8-10 configurations, TB/s, triton_online in the same process in brackets:
32K 2.94 (3.45), 64K 2.97 (3.13), 128K 2.82 (3.00), 256K 2.76 (2.87); copy 4.15-4.20. Every shape's
best holds 4 vectors (64 B) per thread, in CTAs of 512-1024 threads; 8 vectors take 128 registers
and halve the rate, 1-2 vectors keep too few bytes in flight; the cluster size barely matters (64K:
C=2 2.97, C=4 2.87, C=8 2.82). So the barrier was not what held triton_online back: a CTA that loads
its chunk, then reduces, exchanges and stores keeps at most ~64 KB per SM in flight, and only while
it loads.

Second version, `softmax_bulk`: each CTA's chunk (32 or 64 KB) lands in shared memory by bulk copies
(cp.async.bulk, the TMA's 1-D form), issued at once by one thread in 8-16 KB pieces, each with its
mbarrier; the threads reduce each piece as it lands (online max and sum), exchange over the cluster
as before, and write from shared memory. No registers are held while the bytes are in flight, so
three 64 KB CTAs (or six 32 KB ones) per SM keep up to ~192 KB in flight.
Prediction, written before its run: 3.7 TB/s or more at 32K-256K bf16 for the best configuration.

The bulk kernel went into the case as `cluster_bulk` (casebook/kernels/softmax_cluster.py: 64 KB
chunks, 8 KB pieces, 512 threads). The case run read 3.78 TB/s
at 4096 x 32768 against 3.86 at 4096 x 65536. `--tail` asks whether that is the grid's last wave.
Prediction: at 3960 and 4356 rows (whole waves) 3.85 TB/s or more; at 4096 rows 3.78 again.

`--persist`: the tail's fit says a launch of the kernel costs ~7 us more than a copy's, the
fill and drain of the bytes in flight. The kernel became persistent: as many clusters as the device
holds at once, each refilling a piece's shared memory with the same piece of its next row as soon as the
piece is stored, so the next row's loads overlap this row's stores and the pipe empties once per launch,
not once per row. Timed beside the old schedule (one row per cluster: the same kernel on a grid of
`rows` clusters) at the tail's shapes and the case's 64K-256K.
Prediction, written before its run: persistent 4096 x 32768 bf16 at 3.85 TB/s or more (one row per
cluster 3.78-3.80); the fit over 4096 and 8192 rows gives a fixed cost under 6 us; 64K-256K at least as
fast as before (3.87 / 3.58 / 3.45 in the case run).

Run on the device from the repository root:  python3 benchmarks/explore/softmax_fusion/cluster_softmax.py --check
                                             python3 benchmarks/explore/softmax_fusion/cluster_softmax.py
"""

from __future__ import annotations

import itertools
import sys

import numpy as np

SRC = r"""
#define LOG2E 1.4426950408889634f
#define INFINITY __int_as_float(0x7f800000)

__device__ __forceinline__ float ex2(float x) {
  float y; asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x)); return y;
}
__device__ __forceinline__ unsigned cluster_rank() {
  unsigned r; asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r)); return r;
}
__device__ __forceinline__ unsigned cluster_id() {
  unsigned r; asm volatile("mov.u32 %0, %%clusterid.x;" : "=r"(r)); return r;
}
__device__ __forceinline__ void cluster_arrive_release() {
  asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
}
__device__ __forceinline__ void cluster_arrive_relaxed() {
  asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
}
__device__ __forceinline__ void cluster_wait() {
  asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
}
__device__ __forceinline__ float2 ld_remote(const float2* p, unsigned rank) {
  unsigned local, remote; float2 v;
  asm volatile("{ .reg .u64 g; cvta.to.shared.u64 g, %1; cvt.u32.u64 %0, g; }" : "=r"(local) : "l"(p));
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local), "r"(rank));
  asm volatile("ld.shared::cluster.v2.f32 {%0, %1}, [%2];" : "=f"(v.x), "=f"(v.y) : "r"(remote) : "memory");
  return v;
}
__device__ __forceinline__ uint4 ld_stream(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}
__device__ __forceinline__ void st_stream(uint4* p, uint4 v) {
  asm volatile("st.global.cs.v4.u32 [%0], {%1, %2, %3, %4};" :: "l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
               : "memory");
}

// DT: 0 fp32, 1 bf16, 2 fp16. Element k of a 16-byte vector, times log2(e).
template <int DT> __device__ __forceinline__ void unpack(uint4 r, float* f) {
  const unsigned w[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    if constexpr (DT == 0) {
      f[k] = __uint_as_float(w[k]) * LOG2E;
    } else if constexpr (DT == 1) {
      f[2 * k] = __uint_as_float(w[k] << 16) * LOG2E;
      f[2 * k + 1] = __uint_as_float(w[k] & 0xffff0000u) * LOG2E;
    } else {
      float a, b;
      asm("{ .reg .b16 l, h; mov.b32 {l, h}, %2; cvt.f32.f16 %0, l; cvt.f32.f16 %1, h; }"
          : "=f"(a), "=f"(b) : "r"(w[k]));
      f[2 * k] = a * LOG2E;
      f[2 * k + 1] = b * LOG2E;
    }
  }
}
template <int DT> __device__ __forceinline__ uint4 pack(const float* f) {
  unsigned w[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    if constexpr (DT == 0) {
      w[k] = __float_as_uint(f[k]);
    } else if constexpr (DT == 1) {
      asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(w[k]) : "f"(f[2 * k + 1]), "f"(f[2 * k]));
    } else {
      asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(w[k]) : "f"(f[2 * k + 1]), "f"(f[2 * k]));
    }
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// (m, s): s = sum of 2^(v - m). Merging two, with -inf for "nothing yet".
__device__ __forceinline__ void merge(float& m, float& s, float m2, float s2) {
  const float M = fmaxf(m, m2);
  s = M == -INFINITY ? 0.f : s * ex2(m - M) + s2 * ex2(m2 - M);
  m = M;
}
__device__ __forceinline__ void warp_merge(float& m, float& s) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) merge(m, s, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, s, o));
}


// The row's (max, sum) from each thread's: warp shuffles, the CTA through shared memory, then the
// cluster: warp 0 reads every CTA's pair from its shared memory between two cluster barriers. The
// caller's last act must be cluster_wait(), so that no CTA leaves while another may read its pair.
template <int C, int T> __device__ __forceinline__ float2 row_total(float m, float s) {
  __shared__ float2 red[T / 32];
  __shared__ float2 stat;
  __shared__ float2 total;
  warp_merge(m, s);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) red[warp] = make_float2(m, s);
  __syncthreads();
  if (warp == 0) {
    float2 p = lane < T / 32 ? red[lane] : make_float2(-INFINITY, 0.f);
    warp_merge(p.x, p.y);
    if (lane == 0) stat = p;
  }
  cluster_arrive_release();
  cluster_wait();
  if (warp == 0) {
    float2 p = lane < C ? ld_remote(&stat, lane) : make_float2(-INFINITY, 0.f);
    warp_merge(p.x, p.y);
    if (lane == 0) total = p;
  }
  __syncthreads();
  cluster_arrive_relaxed();  // this CTA has read the others' pairs
  return total;
}

// One row per cluster of C CTAs; row_vecs 16-byte vectors per row, chunk_vecs per CTA (<= T * V).
template <int DT, int C, int T, int V>
__global__ void __launch_bounds__(T) softmax_cluster(const uint4* __restrict__ x, uint4* __restrict__ y,
                                                     int row_vecs, int chunk_vecs) {
  constexpr int EPV = DT == 0 ? 4 : 8;
  const unsigned rank = cluster_rank();
  const long long base = (long long)cluster_id() * row_vecs;
  const int first = rank * chunk_vecs;
  const int stop = min(first + chunk_vecs, row_vecs);

  uint4 raw[V];
#pragma unroll
  for (int i = 0; i < V; ++i) {
    const int j = first + threadIdx.x + i * T;
    raw[i] = j < stop ? ld_stream(x + base + j) : make_uint4(0, 0, 0, 0);
  }
  float m = -INFINITY, s = 0.f;
  float v[V * EPV];
#pragma unroll
  for (int i = 0; i < V; ++i) {
    float f[EPV];
    unpack<DT>(raw[i], f);
    const bool ok = first + (int)threadIdx.x + i * T < stop;
#pragma unroll
    for (int k = 0; k < EPV; ++k) {
      if (!ok) f[k] = -INFINITY;
      v[i * EPV + k] = f[k];
      m = fmaxf(m, f[k]);
    }
  }
#pragma unroll
  for (int i = 0; i < V; ++i) {
    const bool ok = first + (int)threadIdx.x + i * T < stop;
#pragma unroll
    for (int k = 0; k < EPV; ++k) s += ok ? ex2(v[i * EPV + k] - m) : 0.f;
  }
  if (m == -INFINITY) s = 0.f;
  const float2 tot = row_total<C, T>(m, s);
  const float M = tot.x, inv = 1.f / tot.y;
#pragma unroll
  for (int i = 0; i < V; ++i) {
    const int j = first + threadIdx.x + i * T;
    if (j < stop) {
      float f[EPV];
#pragma unroll
      for (int k = 0; k < EPV; ++k) f[k] = ex2(v[i * EPV + k] - M) * inv;
      st_stream(y + base + j, pack<DT>(f));
    }
  }
  cluster_wait();  // no CTA leaves while another may still read its pair
}

__device__ __forceinline__ unsigned smem(const void* p) {
  unsigned a;
  asm("{ .reg .u64 g; cvta.to.shared.u64 g, %1; cvt.u32.u64 %0, g; }" : "=r"(a) : "l"(p));
  return a;
}

// The same row split, but each CTA's chunk is copied into shared memory by bulk copies (the TMA's
// 1-D form: one instruction per piece, no registers held while in flight), PIECES pieces of T * VP
// vectors, each with its mbarrier, so the reduction starts on the first piece while the rest land.
template <int DT, int C, int T, int VP, int PIECES>
__global__ void __launch_bounds__(T) softmax_bulk(const uint4* __restrict__ x, uint4* __restrict__ y, int row_vecs) {
  constexpr int EPV = DT == 0 ? 4 : 8;
  constexpr int PV = T * VP;  // vectors per piece
  extern __shared__ __align__(128) uint4 buf[];
  __shared__ __align__(8) unsigned long long bars[PIECES];
  const long long base = (long long)cluster_id() * row_vecs + (long long)cluster_rank() * PIECES * PV;
  if (threadIdx.x == 0) {
#pragma unroll
    for (int k = 0; k < PIECES; ++k) asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(smem(&bars[k])));
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#pragma unroll
    for (int k = 0; k < PIECES; ++k) {
      asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(smem(&bars[k])), "r"(PV * 16) : "memory");
      asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                   :: "r"(smem(&buf[k * PV])), "l"(x + base + k * PV), "r"(PV * 16), "r"(smem(&bars[k])) : "memory");
    }
  }
  __syncthreads();
  float m = -INFINITY, s = 0.f;
#pragma unroll 1
  for (int k = 0; k < PIECES; ++k) {
    unsigned done;
    do {
      asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], 0; selp.u32 %0, 1, 0, p; }"
                   : "=r"(done) : "r"(smem(&bars[k])) : "memory");
    } while (!done);
#pragma unroll
    for (int i = 0; i < VP; ++i) {
      float f[EPV];
      unpack<DT>(buf[k * PV + threadIdx.x + i * T], f);
      float mv = f[0];
#pragma unroll
      for (int e = 1; e < EPV; ++e) mv = fmaxf(mv, f[e]);
      if (mv > m) { s *= ex2(m - mv); m = mv; }
#pragma unroll
      for (int e = 0; e < EPV; ++e) s += ex2(f[e] - m);
    }
  }
  const float2 tot = row_total<C, T>(m, s);
  const float M = tot.x, inv = 1.f / tot.y;
#pragma unroll 2
  for (int j = threadIdx.x; j < PIECES * PV; j += T) {
    float f[EPV];
    unpack<DT>(buf[j], f);
#pragma unroll
    for (int e = 0; e < EPV; ++e) f[e] = ex2(f[e] - M) * inv;
    st_stream(y + base + j, pack<DT>(f));
  }
  cluster_wait();
}
"""

DTYPES = {"fp32": 0, "bf16": 1, "fp16": 2}


def configs(cols: int, dt: str):
    """Register kernels ("reg", C, T, V) that cover a row exactly: C * T * V vectors, at most 64 values
    per thread, and no spills (ptxas for sm_90a: 1024 threads of 8 vectors spill; 512 of 8 take 128
    registers). Bulk kernels ("bulk", C, T, VP, PIECES) with 32 or 64 KB of the row per CTA."""
    epv = 4 if dt == "fp32" else 8
    vecs = cols // epv
    for c, t, v in itertools.product((2, 4, 8, 16), (256, 512, 1024), (1, 2, 4, 8)):
        if c * t * v == vecs and v * epv <= 64 and t * v <= 4096:
            yield "reg", c, t, v
    for c, (t, vp) in itertools.product((1, 2, 4, 8, 16), ((256, 2), (512, 1), (512, 2))):
        if vecs // c in (2048, 4096) and vecs % c == 0:
            yield "bulk", c, t, vp, vecs // c // (t * vp)


def name(dt: str, cfg: tuple) -> str:
    kind, *params = cfg
    return f"softmax_{'cluster' if kind == 'reg' else 'bulk'}<{', '.join(map(str, [DTYPES[dt], *params]))}>"


def shmem(cfg: tuple) -> int:
    return cfg[2] * cfg[3] * cfg[4] * 16 if cfg[0] == "bulk" else 0


class _Kernels:
    """Every instantiation the run needs, compiled by NVRTC in one program."""

    def __init__(self, names: list[str]):
        from cuda.core import Device, Program, ProgramOptions

        self.device = Device()
        self.device.set_current()
        arch = "sm_" + "".join(str(i) for i in self.device.compute_capability) + "a"
        prog = Program(SRC, "c++", ProgramOptions(arch=arch, use_fast_math=True, std="c++17"))
        mod = prog.compile("cubin", name_expressions=tuple(names))
        self.kernels = {n: mod.get_kernel(n) for n in names}
        from cuda.bindings import driver

        attrs = driver.CUfunction_attribute
        for n, k in self.kernels.items():
            if ", 16, " in n:  # 16 CTAs is past the portable cluster size: the kernel must opt in
                print(n, "non-portable cluster size:", driver.cuKernelSetAttribute(
                    attrs.CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1, k.handle, self.device.device_id))
            if n.startswith("softmax_bulk"):  # 64 KB of dynamic shared memory is past the default 48
                print(n, "shared memory:", driver.cuKernelSetAttribute(
                    attrs.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, 128 * 1024, k.handle,
                    self.device.device_id))


class _TorchStream:
    def __cuda_stream__(self):
        import torch

        return (0, torch.cuda.current_stream().cuda_stream)


def softmax(ks: _Kernels, x, cfg, out):
    from cuda.core import LaunchConfig, launch

    dt = {"torch.float32": "fp32", "torch.bfloat16": "bf16", "torch.float16": "fp16"}[str(x.dtype)]
    rows, cols = x.shape
    row_vecs = cols // (16 // x.element_size())
    c, t = cfg[1], cfg[2]
    assert cols % (16 // x.element_size()) == 0 and x.is_contiguous()
    if cfg[0] == "reg":
        chunk = -(-row_vecs // c)
        assert chunk <= t * cfg[3]
        args = (np.int32(row_vecs), np.int32(chunk))
    else:
        assert row_vecs == c * t * cfg[3] * cfg[4]
        args = (np.int32(row_vecs),)
    launch(_TorchStream(), LaunchConfig(grid=rows, cluster=c, block=t, shmem_size=shmem(cfg)),
           ks.kernels[name(dt, cfg)], np.uint64(x.data_ptr()), np.uint64(out.data_ptr()), *args)
    return out


CHECKS = [(1, 32768, "bf16", ("reg", 2, 256, 8)), (37, 65536, "bf16", ("reg", 8, 256, 4)),
          (199, 32768, "fp16", ("reg", 4, 512, 2)), (3, 65536, "fp32", ("reg", 8, 512, 4)),
          (5, 32000, "bf16", ("reg", 4, 256, 4)), (64, 262144, "bf16", ("reg", 8, 1024, 4)),
          (1, 32768, "bf16", ("bulk", 1, 256, 2, 8)), (37, 65536, "bf16", ("bulk", 2, 512, 1, 8)),
          (199, 32768, "fp16", ("bulk", 2, 512, 2, 2)), (3, 65536, "fp32", ("bulk", 4, 256, 2, 8)),
          (64, 262144, "bf16", ("bulk", 16, 512, 2, 2))]


def check(ks: _Kernels) -> bool:
    import torch

    ok = True
    for rows, cols, dt, cfg in CHECKS:
        dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dt]
        x = (torch.randn(rows, cols, device="cuda") * 4).to(dtype)
        ref = torch.softmax(x.double(), -1)
        y = torch.full_like(x, float("nan"))
        softmax(ks, x, cfg, out=y)
        torch.cuda.synchronize()
        # relative to the value, or to the dtype's smallest normal where the answer underflows (fp16)
        err = ((y.double() - ref).abs() / ref.abs().clamp_min(torch.finfo(dtype).tiny)).max().item()
        tol = {"fp32": 1e-5, "bf16": 1e-2, "fp16": 2e-3}[dt]
        good = bool(torch.isfinite(y).all()) and err < tol
        ok &= good
        print(f"check {rows}x{cols} {dt} {cfg}: max rel err {err:.2e} {'ok' if good else 'WRONG'}", flush=True)
    return ok


SHAPES = [(4096, 32768), (4096, 65536), (2048, 131072), (1024, 262144)]


def main(check_only: bool) -> None:
    import torch

    torch.manual_seed(0)
    names = sorted({name(dt, cfg) for _, _, dt, cfg in CHECKS}
                   | {name("bf16", cfg) for _, cols in SHAPES for cfg in configs(cols, "bf16")})
    ks = _Kernels(names)
    for n, k in ks.kernels.items():
        a = k.attributes
        print(f"{n}: {a.num_regs} registers, {a.local_size_bytes} B local", flush=True)
    if not check(ks) or check_only:
        return
    from casebook.kernels import softmax_fusion as sf
    from casebook.run.bench import Protocol, time_fn

    for rows, cols in SHAPES:
        x = torch.randn(rows, cols, device="cuda").to(torch.bfloat16)
        y = torch.empty_like(x)
        nbytes = 2 * x.numel() * 2
        runs = {"copy": lambda: y.copy_(x), "triton_online": lambda: sf.triton_online(x)}
        for cfg in configs(cols, "bf16"):
            if cfg[0] == "bulk" or (cfg[3] == 4 and cfg[2] >= 512):  # the register kernel's best (call 2)
                runs[" ".join(map(str, cfg))] = lambda cfg=cfg: softmax(ks, x, cfg, out=y)
        for label, fn in runs.items():
            try:
                s = time_fn(fn, "cuda", Protocol()).summary
            except Exception as e:  # a configuration the driver refuses (cluster size) is reported, not fatal
                print(f"{rows}x{cols} {label:32s} failed: {type(e).__name__}: {e}", flush=True)
                continue
            print(f"{rows}x{cols} {label:32s} {s.median_us:8.1f} us  {nbytes / s.median_us / 1e6:5.2f} TB/s", flush=True)


def tail() -> None:
    """Is 4096 x 32768's 3.78 TB/s (against 3.86 at 64K) the grid's last wave? The case's kernel holds
    one 64 KB row per CTA there, three CTAs per SM: 396 at once, so 4096 rows are 10.34 waves, and the
    last 0.34 of a wave runs on a third of the slots. Timed beside 3960 and 4356 rows (10 and 11 whole
    waves), and the 64K-row counterpart, with a copy of each size."""
    import torch

    from casebook.kernels import softmax_cluster
    from casebook.run.bench import Protocol, time_fn

    for rows, cols in ((3960, 32768), (4096, 32768), (4356, 32768), (7920, 32768), (8192, 32768), (4096, 65536)):
        x = torch.randn(rows, cols, device="cuda").to(torch.bfloat16)
        y = torch.empty_like(x)
        nbytes = 2 * x.numel() * 2
        p = softmax_cluster.plan(rows, cols, 2, torch.cuda.get_device_properties(0).multi_processor_count)
        for label, fn in (("copy", lambda: y.copy_(x)), ("softmax_cluster", lambda: softmax_cluster.softmax(x))):
            s = time_fn(fn, "cuda", Protocol()).summary
            print(f"{rows}x{cols} ({rows * p.cluster / 396:.2f} waves) {label:16s} {s.median_us:8.1f} us  "
                  f"{nbytes / s.median_us / 1e6:5.2f} TB/s", flush=True)


def persist() -> None:
    """The persistent schedules against one row per cluster and the exploration's own bulk kernel (module
    docstring, `--persist`): correctness at shapes with more rows than resident clusters, then times."""
    import torch

    from casebook.kernels import softmax_cluster
    from casebook.run.bench import Protocol, time_fn

    torch.manual_seed(0)
    schedules = {"counter": {"persistent": True}, "counter, 7 clusters": {"persistent": True, "clusters": 7},
                 "row per cluster": {"persistent": False}}
    for rows, cols, dtype in ((1000, 32768, torch.bfloat16), (777, 65536 + 8, torch.bfloat16),
                              (2000, 16384 + 4, torch.float32), (300, 262144, torch.float16), (1, 32768, torch.bfloat16)):
        x = (torch.randn(rows, cols, device="cuda") * 4).to(dtype)
        ref = torch.softmax(x.double(), -1)
        for label, kw in schedules.items():
            for _ in range(3):  # the counter must be at rest after every launch
                y = softmax_cluster.softmax(x, **kw)
            err = ((y.double() - ref).abs() / ref.abs().clamp_min(torch.finfo(dtype).tiny)).max().item()
            good = bool(torch.isfinite(y).all()) and err < {torch.float32: 1e-5}.get(dtype, 1e-2)
            print(f"check {rows}x{cols} {dtype} {label}: max rel err {err:.2e} {'ok' if good else 'WRONG'}", flush=True)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    shapes = ((4096, 32768), (4096, 65536), (2048, 131072), (1024, 262144))
    bulk = {cols: ("bulk", max(1, cols // 32768), 512, 1, 8) for _, cols in shapes}
    ks = _Kernels(sorted({name("bf16", cfg) for cfg in bulk.values()}))
    for rows, cols in shapes:
        x = torch.randn(rows, cols, device="cuda").to(torch.bfloat16)
        y = torch.empty_like(x)
        nbytes = 2 * x.numel() * 2
        p = softmax_cluster.plan(rows, cols, 2, sms)
        resident = softmax_cluster.resident_clusters(x.device, x.dtype, p)
        runs = {"copy": lambda: y.copy_(x), "bulk (call 3)": lambda: softmax(ks, x, bulk[cols], out=y)}
        runs |= {label: lambda kw=kw: softmax_cluster.softmax(x, **kw) for label, kw in schedules.items()
                 if "7" not in label}
        for label, fn in runs.items():
            s = time_fn(fn, "cuda", Protocol()).summary
            print(f"{rows}x{cols} C={p.cluster} resident {resident:3d} {label:16s} {s.median_us:8.1f} us  "
                  f"{nbytes / s.median_us / 1e6:5.2f} TB/s", flush=True)


if __name__ == "__main__":
    if "--persist" in sys.argv:
        sys.exit(persist())
    if "--tail" in sys.argv:
        sys.exit(tail())
    sys.exit(main("--check" in sys.argv))
