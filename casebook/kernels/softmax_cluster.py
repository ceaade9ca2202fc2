"""Softmax rows longer than 32 KB, split over a thread-block cluster, each chunk landed in shared memory
by bulk copies (Hopper; CUDA C++ compiled at run time by NVRTC, through cuda.core).

Why not Triton: the split-row Triton kernel (`softmax_fusion.triton_online`) holds each chunk in
registers, so a program keeps its loads in flight only until they land, then reduces, meets the other
chunks of its row at a barrier and stores, with nothing in flight. It stays at 2.9-3.1 TB/s from 64K
columns on, against a 4.15 TB/s copy. Two explorations found why (benchmarks/explore/cluster_softmax.py):
- The same register-held split with a hardware cluster barrier instead of the global one was no faster
  (64K: 2.97 TB/s): the barrier was not the limit.
- Landing each chunk in shared memory by bulk copies was (64K: 3.90 TB/s). A bulk copy holds no
  registers while in flight, so three 64 KB chunks per SM are in flight at once, ~192 KB.
Triton 3.6 exposes neither clusters for this (a `num_ctas=2` row reduction fails to compile) nor bulk
copies into shared memory for a row.

The kernel (`SOURCE`):
- **Plan** (`plan`). A row goes to a cluster of C CTAs, each a chunk of at most 64 KB, so three CTAs
  fit one SM's 227 KB of shared memory; C doubles while the rows are too few to give every SM two
  CTAs and the chunks stay 8 KB or more. At most 16 CTAs (past the portable 8: the kernel opts in).
- **Schedule** (`PERSISTENT_FROM`). Clusters of one or two CTAs run one row each, launched by the
  hardware into freed slots. Larger clusters run persistent: as many as the device holds at once (the
  occupancy calculator's count), each starting on its own row and taking the next from a counter.
  Rows dealt out in turn instead (c, c + clusters, ...) left the launch as long as its slowest cluster's
  rows (4096 x 32768: 3.58 TB/s, one row per cluster 3.72).
- **Load.** One thread issues the chunk's bulk copies (cp.async.bulk, the TMA's 1-D form) at once, in
  8 KB pieces, each signalling its own mbarrier, so the 512 threads reduce a piece (online max and sum
  of 2^(x log2 e - max)) as soon as it lands, each leaving its exponentials in shared memory in place of
  the elements, in their dtype, with the running max they were taken against (one register a piece).
- **Exchange.** Warp shuffles, then the CTA through shared memory, then the cluster: warp 0 reads every
  CTA's (max, sum) from its shared memory (mapa + ld.shared::cluster) between two cluster barriers.
- **Store.** Each thread scales its stored exponentials by one factor a piece (2^(max then - row max) /
  sum) and writes 16-byte vectors, evict-first: one ex2 an element in all, where normalising from the
  elements took a second (by count, two ex2 an element at MUFU's 16 a clock per SM are ~64 us of the
  ~140 at 4096 x 32768 bf16), for one more rounding to the dtype (bf16: worst element 7.7e-3 against
  3.9e-3 in a model of it on the CPU; normwise error unchanged). In a persistent cluster, pieces go two
  at a time, and as soon as every thread has read a pair its shared memory takes the same pieces of the
  cluster's next row, so the next row's loads are in flight while this row's stores drain. Each row ends
  in the second barrier's wait, so no CTA overwrites what it offered, or leaves, while another may
  still read it.
One read and one write of the tensor, like every fused variant.

Applies (`unsupported`): a CUDA device of compute capability 9.0 or higher (elsewhere `softmax` raises
NotImplementedError: the variant does not cover that machine), fp32 / bf16 / fp16, contiguous 2-D rows
of a multiple of 16 bytes and at most 1 MB (16 chunks of 64 KB).
"""

from __future__ import annotations

import functools
import math
import threading
from dataclasses import dataclass

import numpy as np
import torch

THREADS = 512
PIECE_VECS = THREADS  # 16-byte vectors per bulk copy (8 KB): one per thread
MAX_PIECES = 8
CHUNK_BYTES = PIECE_VECS * MAX_PIECES * 16  # 64 KB per CTA: three CTAs fit an SM's shared memory
MIN_CHUNK_BYTES = 8 * 1024
MAX_CLUSTER = 16
PORTABLE_CLUSTER = 8
DTYPES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}

SOURCE = r"""
#define LOG2E 1.4426950408889634f
#define INFINITY __int_as_float(0x7f800000)
#define THREADS %(threads)d
#define PIECE %(piece)d
#define MAX_PIECES %(max_pieces)d

__device__ __forceinline__ float ex2(float x) {
  float y; asm("ex2.approx.ftz.f32 %%0, %%1;" : "=f"(y) : "f"(x)); return y;
}
__device__ __forceinline__ unsigned smem(const void* p) {
  unsigned a; asm("{ .reg .u64 g; cvta.to.shared.u64 g, %%1; cvt.u32.u64 %%0, g; }" : "=r"(a) : "l"(p)); return a;
}
// This CTA's rank in its cluster, the cluster's size, its index in the grid, and the grid's clusters.
#define SPECIAL(name, reg) \
  __device__ __forceinline__ unsigned name() { unsigned r; asm volatile("mov.u32 %%0, %%%%" reg ";" : "=r"(r)); return r; }
SPECIAL(cluster_rank, "cluster_ctarank")
SPECIAL(cluster_size, "cluster_nctarank")
SPECIAL(cluster_index, "clusterid.x")
SPECIAL(cluster_count, "nclusterid.x")
__device__ __forceinline__ void cluster_arrive(bool release) {
  if (release) asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
  else asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
}
__device__ __forceinline__ void cluster_wait() { asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory"); }

// The elements of a 16-byte vector as floats. DT: 0 fp32, 1 bf16, 2 fp16.
template <int DT> __device__ __forceinline__ void unpack(uint4 r, float* f) {
  const unsigned w[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    if constexpr (DT == 0) {
      f[k] = __uint_as_float(w[k]);
    } else if constexpr (DT == 1) {
      f[2 * k] = __uint_as_float(w[k] << 16);
      f[2 * k + 1] = __uint_as_float(w[k] & 0xffff0000u);
    } else {
      float a, b;
      asm("{ .reg .b16 l, h; mov.b32 {l, h}, %%2; cvt.f32.f16 %%0, l; cvt.f32.f16 %%1, h; }" : "=f"(a), "=f"(b) : "r"(w[k]));
      f[2 * k] = a;
      f[2 * k + 1] = b;
    }
  }
}
template <int DT> __device__ __forceinline__ uint4 pack(const float* f) {
  unsigned w[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    if constexpr (DT == 0) w[k] = __float_as_uint(f[k]);
    else if constexpr (DT == 1) asm("cvt.rn.bf16x2.f32 %%0, %%1, %%2;" : "=r"(w[k]) : "f"(f[2 * k + 1]), "f"(f[2 * k]));
    else asm("cvt.rn.f16x2.f32 %%0, %%1, %%2;" : "=r"(w[k]) : "f"(f[2 * k + 1]), "f"(f[2 * k]));
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// (m, s) with s = sum of 2^(v - m); -inf means "nothing yet".
__device__ __forceinline__ void merge(float& m, float& s, float m2, float s2) {
  const float M = fmaxf(m, m2);
  s = M == -INFINITY ? 0.f : s * ex2(m - M) + s2 * ex2(m2 - M);
  m = M;
}
__device__ __forceinline__ void warp_merge(float& m, float& s) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) merge(m, s, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, s, o));
}

// The row's (max, sum): the warp, the CTA, then every CTA of the cluster between two barriers; and `next`,
// the cluster's next row, as thread 0 of the cluster's first CTA offers it in `ticket`. The caller's last
// act must be cluster_wait(): no CTA overwrites its offer, or leaves, while another may read it.
__device__ __forceinline__ float2 row_total(float m, float s, int ticket, int& next) {
  __shared__ float2 red[THREADS / 32];
  __shared__ uint4 mine;  // (max, sum, ticket) of this CTA, read by the others
  __shared__ float2 total;
  __shared__ int next_row;
  warp_merge(m, s);
  const int warp = threadIdx.x / 32, lane = threadIdx.x %% 32;
  if (lane == 0) red[warp] = make_float2(m, s);
  __syncthreads();
  if (warp == 0) {
    float2 p = lane < THREADS / 32 ? red[lane] : make_float2(-INFINITY, 0.f);
    warp_merge(p.x, p.y);
    if (lane == 0) mine = make_uint4(__float_as_uint(p.x), __float_as_uint(p.y), ticket, 0);
  }
  cluster_arrive(true);
  cluster_wait();
  if (warp == 0) {
    uint4 o = make_uint4(__float_as_uint(-INFINITY), 0, 0, 0);
    if (lane < (int)cluster_size()) {
      unsigned remote;
      asm volatile("mapa.shared::cluster.u32 %%0, %%1, %%2;" : "=r"(remote) : "r"(smem(&mine)), "r"(lane));
      asm volatile("ld.shared::cluster.v4.u32 {%%0, %%1, %%2, %%3}, [%%4];" : "=r"(o.x), "=r"(o.y), "=r"(o.z), "=r"(o.w)
                   : "r"(remote) : "memory");
    }
    float2 p = make_float2(__uint_as_float(o.x), __uint_as_float(o.y));
    warp_merge(p.x, p.y);
    if (lane == 0) { total = p; next_row = (int)o.z; }  // lane 0 read the first CTA's offer
  }
  __syncthreads();
  cluster_arrive(false);  // this CTA has read the others' offers
  next = next_row;
  return total;
}

// Bulk-copy this CTA's chunk of `row` (its vectors [first, first + len)) into shared memory, piece by piece,
// each piece from `from` on signalling its own mbarrier. One thread issues.
__device__ __forceinline__ void load_pieces(uint4* buf, unsigned long long* bars, const uint4* x, long long base,
                                            int len, int from, int to) {
  for (int k = from; k < to; ++k) {
    const unsigned bytes = min(PIECE, len - k * PIECE) * 16;
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%%0], %%1;" :: "r"(smem(&bars[k])), "r"(bytes) : "memory");
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%%0], [%%1], %%2, [%%3];"
                 :: "r"(smem(&buf[k * PIECE])), "l"(x + base + k * PIECE), "r"(bytes), "r"(smem(&bars[k])) : "memory");
  }
}

// Persistent: cluster c starts on row c, then takes the next row from a counter (`tickets[0]`, counting
// from the grid's clusters), so a cluster that finishes early takes more rows, as a grid of one row per
// cluster would be balanced by the hardware. `tickets[1]` counts the clusters done; the last one sets both
// back to 0, so the counter is at rest between launches. Without `tickets` (null), the rows are dealt out
// in turn: c, c + clusters, ... This CTA's chunk is vectors [rank * chunk_vecs, +chunk_vecs) of each row;
// thread t reduces and stores vector t of every piece.
// The reduction leaves each element's exponential in shared memory, in place of the element, scaled by
// the thread's running max when it was taken (`mk`, one per piece); the store pass then only multiplies
// by one factor a piece: one ex2 an element in all, not two (the two passes' MUFU work was half the
// kernel's time at 32K bf16 columns), for one more rounding to the input's dtype.
// While a row is stored, two pieces at a time, each pair's shared memory is refilled at once with the same
// pieces of the cluster's next row: the next row's loads are in flight while this row's stores drain.
template <int DT>
__global__ void __launch_bounds__(THREADS, 3) softmax_rows(const uint4* __restrict__ x, uint4* __restrict__ y,
                                                           int rows, int row_vecs, int chunk_vecs, unsigned* tickets) {
  constexpr int EPV = DT == 0 ? 4 : 8;
  extern __shared__ __align__(128) uint4 buf[];
  __shared__ __align__(8) unsigned long long bars[MAX_PIECES];
  const int first = cluster_rank() * chunk_vecs;
  const int len = max(0, min(chunk_vecs, row_vecs - first));
  const int pieces = (len + PIECE - 1) / PIECE;
  const int clusters = cluster_count();
  const bool dealer = threadIdx.x == 0 && cluster_rank() == 0;  // takes the cluster's tickets
  int row = cluster_index();
  if (threadIdx.x == 0) {
    for (int k = 0; k < pieces; ++k) asm volatile("mbarrier.init.shared::cta.b64 [%%0], 1;" :: "r"(smem(&bars[k])));
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    if (row < rows) load_pieces(buf, bars, x, (long long)row * row_vecs + first, len, 0, pieces);
  }
  __syncthreads();
  for (unsigned parity = 0; row < rows; parity ^= 1) {
    const long long base = (long long)row * row_vecs + first;
    int ticket = 0;
    if (dealer) ticket = tickets ? clusters + (int)atomicAdd(&tickets[0], 1u) : row + clusters;  // lands while the row does
    float m = -INFINITY, s = 0.f;  // log2-scaled running max, sum of 2^(x log2 e - m)
    float mk[MAX_PIECES];          // m when piece k's exponentials were taken
#pragma unroll
    for (int k = 0; k < MAX_PIECES; ++k) {
      mk[k] = -INFINITY;
      if (k >= pieces) continue;
      unsigned done;
      do {
        asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%%1], %%2; selp.u32 %%0, 1, 0, p; }"
                     : "=r"(done) : "r"(smem(&bars[k])), "r"(parity) : "memory");
      } while (!done);
      const int j = k * PIECE + threadIdx.x;
      if (j < len) {
        float f[EPV];
        unpack<DT>(buf[j], f);
        float mv = f[0];
#pragma unroll
        for (int e = 1; e < EPV; ++e) mv = fmaxf(mv, f[e]);
        mv *= LOG2E;
        if (mv > m) { s *= ex2(m - mv); m = mv; }
        const float ref = m == -INFINITY ? 0.f : m;  // a thread with only -inf so far: its exponentials are 0
#pragma unroll
        for (int e = 0; e < EPV; ++e) {
          f[e] = ex2(fmaf(f[e], LOG2E, -ref));
          s += f[e];
        }
        buf[j] = pack<DT>(f);
        mk[k] = m;
      }
    }
    int next;
    const float2 tot = row_total(m, s, ticket, next);
    const float inv = 1.f / tot.y;
    const auto store = [&](int k) {  // scale vector k of the thread's pieces and write it, evict-first
      const int j = k * PIECE + threadIdx.x;
      if (j >= len) return;
      const float c = ex2(mk[k] - tot.x) * inv;
      float f[EPV];
      unpack<DT>(buf[j], f);
#pragma unroll
      for (int e = 0; e < EPV; ++e) f[e] *= c;
      const uint4 v = pack<DT>(f);
      asm volatile("st.global.cs.v4.u32 [%%0], {%%1, %%2, %%3, %%4};" :: "l"(y + base + j), "r"(v.x), "r"(v.y), "r"(v.z),
                   "r"(v.w) : "memory");
    };
    if (next >= rows) {  // the cluster's last row: nothing to refill, no barrier between pieces
#pragma unroll
      for (int k = 0; k < MAX_PIECES; ++k)
        if (k < pieces) store(k);
    } else {
      // This thread's writes of the exponentials (generic proxy) before the bulk copies' (async proxy).
      asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#pragma unroll
      for (int k = 0; k < MAX_PIECES; k += 2) {
        if (k >= pieces) break;
        store(k);
        if (k + 1 < pieces) store(k + 1);
        __syncthreads();  // every thread has read pieces k, k + 1: they may take the next row's
        if (threadIdx.x == 0) load_pieces(buf, bars, x, (long long)next * row_vecs + first, len, k, min(k + 2, pieces));
      }
    }
    cluster_wait();  // the others have read this CTA's offer: the next row may overwrite it
    row = next;
  }
  if (dealer && tickets) {  // every ticket this cluster takes is taken: the last cluster done resets the counter
    __threadfence();
    if (atomicAdd(&tickets[1], 1u) == (unsigned)clusters - 1) {
      atomicExch(&tickets[0], 0u);
      atomicExch(&tickets[1], 0u);
    }
  }
}
""" % {"threads": THREADS, "piece": PIECE_VECS, "max_pieces": MAX_PIECES}


@dataclass(frozen=True)
class Plan:
    """How a row is split: `cluster` CTAs, each `chunk_vecs` 16-byte vectors of its `row_vecs`."""

    cluster: int
    chunk_vecs: int
    row_vecs: int

    @property
    def shared_bytes(self) -> int:
        return self.chunk_vecs * 16


def plan(rows: int, cols: int, element_size: int, sms: int) -> Plan | None:
    """The split for rows x cols, or None where the row is not a whole number of 16-byte vectors or
    needs more than MAX_CLUSTER chunks."""
    row_bytes = cols * element_size
    if row_bytes % 16 or row_bytes == 0:
        return None
    cluster = math.ceil(row_bytes / CHUNK_BYTES)
    if cluster > MAX_CLUSTER:
        return None
    while cluster * 2 <= PORTABLE_CLUSTER and rows * cluster < 2 * sms and row_bytes // (2 * cluster) >= MIN_CHUNK_BYTES:
        cluster *= 2  # too few rows to give every SM two CTAs: more, smaller chunks per row
    row_vecs = row_bytes // 16
    return Plan(cluster, math.ceil(row_vecs / cluster), row_vecs)


def unsupported(x: torch.Tensor) -> str | None:
    """Why the kernel cannot take `x`, or None."""
    if not x.is_cuda:
        return "needs a CUDA device"
    if torch.cuda.get_device_capability(x.device) < (9, 0):
        return "needs thread-block clusters and bulk copies: compute capability 9.0 (Hopper) or later"
    if x.dtype not in DTYPES:
        return f"takes fp32, bf16 or fp16, not {x.dtype}"
    if x.dim() != 2 or not x.is_contiguous() or x.data_ptr() % 16:
        return "takes contiguous 2-D rows starting on a 16-byte boundary"
    if plan(*x.shape, x.element_size(), 1) is None:
        return f"takes rows of a multiple of 16 bytes, at most {MAX_CLUSTER * CHUNK_BYTES // 1024} KB"
    return None


def compile_source(arch: str) -> object:
    """The three dtypes' kernels, compiled by NVRTC for `arch` (e.g. "sm_90a"): a cuda.core ObjectCode.
    Needs no GPU (tests compile it on CPU machines)."""
    from cuda.core import Program, ProgramOptions

    options = ProgramOptions(arch=arch, use_fast_math=True, std="c++17")
    return Program(SOURCE, "c++", options).compile("cubin", name_expressions=tuple(_names()))


def _names() -> list[str]:
    return [f"softmax_rows<{code}>" for code in DTYPES.values()]


@functools.cache
def _kernels(device_index: int) -> dict:
    """Compiled once per device and process (about a second), each kernel allowed 64 KB of dynamic
    shared memory and clusters past the portable size."""
    from cuda.bindings import driver
    from cuda.core import Device

    device = Device(device_index)
    device.set_current()
    major, minor = device.compute_capability
    code = compile_source(f"sm_{major}{minor}a")
    attrs = driver.CUfunction_attribute
    kernels = {}
    for dtype, name in zip(DTYPES, _names()):
        kernel = code.get_kernel(name)
        for attr, value in ((attrs.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, CHUNK_BYTES),
                            (attrs.CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1)):
            (err,) = driver.cuKernelSetAttribute(attr, value, kernel.handle, device_index)
            if err != driver.CUresult.CUDA_SUCCESS:
                raise RuntimeError(f"cuKernelSetAttribute({attr.name}) failed: {err.name}")
        kernels[dtype] = kernel
    return kernels


class _TorchStream:
    """torch's current stream, offered to cuda.core through the __cuda_stream__ protocol."""

    def __init__(self, handle: int):
        self.handle = handle

    def __cuda_stream__(self) -> tuple[int, int]:
        return (0, self.handle)


_streams = threading.local()


def _stream(device: torch.device) -> object:
    from cuda.core import Device

    handle = torch.cuda.current_stream(device).cuda_stream
    if not hasattr(_streams, "by_handle"):
        _streams.by_handle = {}
    cache = _streams.by_handle
    if handle not in cache:
        Device(device.index).set_current()  # this thread's current context: the primary one, as torch's
        cache[handle] = Device(device.index).create_stream(_TorchStream(handle))
    return cache[handle]


PERSISTENT_FROM = 4
"""Clusters of this many CTAs or more run persistent; smaller ones one row per cluster. Measured on an
H200 (notes/h200-2026-12-01h/call2-counter/, bf16, TB/s, one row per cluster against persistent with the
counter): 4096 x 32768 (1 CTA) 3.79 / 3.72, 4096 x 65536 (2) 3.91 / 3.84, 2048 x 131072 (4) 3.64 / 3.73,
1024 x 262144 (8) 3.50 / 3.65. The hardware launches small clusters into freed slots at no cost, and the
persistent loop's barrier between stored pieces costs ~2%; a cluster of 4 or 8 CTAs waits for as many
slots to free at once, and the persistent grid pays that once."""


def softmax(x: torch.Tensor, persistent: bool | None = None, clusters: int | None = None) -> torch.Tensor:
    """Softmax over the last dimension of a 2-D tensor that `unsupported` accepts. Persistent (the default
    from PERSISTENT_FROM CTAs a cluster): as many clusters as the device holds at once, each taking its
    next row from a counter; otherwise one row per cluster. `clusters` overrides the persistent grid
    (tests and explorations)."""
    from cuda.core import LaunchConfig, launch

    reason = unsupported(x)
    if reason is not None:
        raise (NotImplementedError if x.is_cuda and x.dtype in DTYPES else ValueError)(f"softmax_cluster: {reason}")
    rows, cols = x.shape
    p = plan(rows, cols, x.element_size(), torch.cuda.get_device_properties(x.device).multi_processor_count)
    y = torch.empty_like(x)
    if rows == 0:
        return y
    kernel = _kernels(x.device.index)[x.dtype]
    stream = _stream(x.device)
    if persistent is None:
        persistent = p.cluster >= PERSISTENT_FROM
    if persistent:  # the counter deals the rows
        grid, tickets = min(rows, clusters or resident_clusters(x.device, x.dtype, p)), _tickets(x.device).data_ptr()
    else:  # no counter: rows dealt out in turn over a grid of one cluster a row
        grid, tickets = rows, 0
    config = LaunchConfig(grid=grid, cluster=p.cluster, block=THREADS, shmem_size=p.shared_bytes)
    launch(stream, config, kernel, np.uint64(x.data_ptr()), np.uint64(y.data_ptr()), np.int32(rows),
           np.int32(p.row_vecs), np.int32(p.chunk_vecs), np.uint64(tickets))
    return y


_counters: dict[tuple, torch.Tensor] = {}


def _tickets(device: torch.device) -> torch.Tensor:
    """The row counter and the clusters-done count, zeroed once and left at zero by every launch; one pair
    per stream, so that launches on two streams never share one."""
    key = (device.index, torch.cuda.current_stream(device).cuda_stream)
    if key not in _counters:
        _counters[key] = torch.zeros(2, device=device, dtype=torch.int32)
    return _counters[key]


_resident: dict[tuple, int] = {}


def resident_clusters(device: torch.device, dtype: torch.dtype, p: Plan) -> int:
    """How many clusters of plan `p` the device runs at once (the occupancy calculator's answer, which
    knows the registers, shared memory and GPC limits), cached per device, dtype and plan."""
    from cuda.core import LaunchConfig

    key = (device.index, dtype, p.cluster, p.shared_bytes)
    if key not in _resident:
        config = LaunchConfig(grid=1, cluster=p.cluster, block=THREADS, shmem_size=p.shared_bytes)
        kernel = _kernels(device.index)[dtype]
        _resident[key] = max(1, kernel.occupancy.max_active_clusters(config, stream=_stream(device)))
    return _resident[key]
