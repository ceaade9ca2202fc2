"""Cross-entropy's loss and gradient over rows longer than an SM holds, each row split over a thread-block
cluster and landed in shared memory by bulk copies (Hopper; CUDA C++ compiled at run time by NVRTC).

Why: the Triton split kernel (`cross_entropy.triton_split`) moves the model's bytes, one read of the logits and
one write of the gradient, but at 2.0 TB/s on an H200: each program holds its chunk in registers, so it has
nothing in flight while it reduces, meets the row's other programs at a global barrier and stores. Softmax
met the same wall at 2.9-3.1 TB/s and `softmax_cluster` lifted it to 3.7-3.95 by landing chunks in shared
memory with bulk copies, which hold no registers while in flight. A cross-entropy row is a softmax row with
three differences, each small in that kernel, so this kernel is softmax_cluster's with them:

- **A third number in the reduction**: the row's sum of logits (label smoothing's `mean x`), carried in the
  cluster's offer beside (max, sum), in the word the softmax kernel leaves free.
- **The store writes the gradient**, `(p - eps / V) * scale`, with `(1 - eps) * scale` taken off at the
  target's column by the thread that holds it, and zeros for an ignored row, where softmax writes `p`;
  `scale` is `1 / n_valid`, read from the device (no host synchronisation).
- **The loss**: one thread of the cluster's first CTA writes the row's
  `(1 - eps)(lse - x_t) + eps (lse - mean x)`, with one load of `x_t` (an L2 hit: the row was just read).

Everything else is softmax_cluster's and comes from its `SOURCE`, unchanged: the plan of a row over CTAs
(`softmax_cluster.plan`), the bulk loads piece by piece, each piece's exponentials left in shared memory in
place of the elements (one ex2 an element in all), the persistent schedule with the next row's pieces loaded
while this row's drain, the row counter. One read of the logits, one write of the gradient.

Applies where softmax_cluster's kernel does (`softmax_cluster.unsupported`): Hopper or later, fp32 / bf16 /
fp16, contiguous rows of a multiple of 16 bytes and at most 1 MB.
"""

from __future__ import annotations

import functools

import numpy as np
import torch

from casebook.kernels import softmax_cluster as sc

KERNEL = r"""
// The row's (max, sum, sum of logits) over the cluster, as softmax_cluster's row_total does (max, sum): the
// warp, the CTA, then every CTA's offer read by warp 0 between two cluster barriers; `next` is the cluster's
// next row from the first CTA's offer. The caller's last act must be cluster_wait().
__device__ __forceinline__ float3 row_total3(float m, float s, float sx, int ticket, int& next) {
  __shared__ float3 red[THREADS / 32];
  __shared__ uint4 mine;  // (max, sum, ticket, sum of logits) of this CTA, read by the others
  __shared__ float3 total;
  __shared__ int next_row;
  warp_merge(m, s);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) sx += __shfl_xor_sync(0xffffffffu, sx, o);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) red[warp] = make_float3(m, s, sx);
  __syncthreads();
  if (warp == 0) {
    float3 p = lane < THREADS / 32 ? red[lane] : make_float3(-INFINITY, 0.f, 0.f);
    warp_merge(p.x, p.y);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) p.z += __shfl_xor_sync(0xffffffffu, p.z, o);
    if (lane == 0) mine = make_uint4(__float_as_uint(p.x), __float_as_uint(p.y), ticket, __float_as_uint(p.z));
  }
  cluster_arrive(true);
  cluster_wait();
  if (warp == 0) {
    uint4 o = make_uint4(__float_as_uint(-INFINITY), 0, 0, 0);
    if (lane < (int)cluster_size()) {
      unsigned remote;
      asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(smem(&mine)), "r"(lane));
      asm volatile("ld.shared::cluster.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(o.x), "=r"(o.y), "=r"(o.z), "=r"(o.w)
                   : "r"(remote) : "memory");
    }
    float2 p = make_float2(__uint_as_float(o.x), __uint_as_float(o.y));
    float z = __uint_as_float(o.w);
    warp_merge(p.x, p.y);
#pragma unroll
    for (int k = 16; k > 0; k >>= 1) z += __shfl_xor_sync(0xffffffffu, z, k);
    if (lane == 0) { total = make_float3(p.x, p.y, z); next_row = (int)o.z; }  // lane 0 read the first CTA's offer
  }
  __syncthreads();
  cluster_arrive(false);  // this CTA has read the others' offers
  next = next_row;
  return total;
}

// softmax_rows (softmax_cluster.SOURCE) with the gradient stored in place of the probabilities and the loss
// written by the cluster's dealer: see that kernel for the load, the schedule and the refill.
template <int DT>
__global__ void __launch_bounds__(THREADS, 3) ce_rows(const uint4* __restrict__ x, uint4* __restrict__ g,
                                                      const long long* __restrict__ target, float* __restrict__ loss,
                                                      const int* __restrict__ n_valid, int rows, int row_vecs,
                                                      int chunk_vecs, unsigned* tickets, int n_cols, float eps,
                                                      long long ignore_index) {
  constexpr int EPV = DT == 0 ? 4 : 8;
  extern __shared__ __align__(128) uint4 buf[];
  __shared__ __align__(8) unsigned long long bars[MAX_PIECES];
  const int first = cluster_rank() * chunk_vecs;
  const int len = max(0, min(chunk_vecs, row_vecs - first));
  const int pieces = (len + PIECE - 1) / PIECE;
  const int clusters = cluster_count();
  const bool dealer = threadIdx.x == 0 && cluster_rank() == 0;
  const float scale = 1.f / (float)n_valid[0];
  const float off = eps / (float)n_cols;
  int row = cluster_index();
  if (threadIdx.x == 0) {
    for (int k = 0; k < pieces; ++k) asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(smem(&bars[k])));
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    if (row < rows) load_pieces(buf, bars, x, (long long)row * row_vecs + first, len, 0, pieces);
  }
  __syncthreads();
  for (unsigned parity = 0; row < rows; parity ^= 1) {
    const long long base = (long long)row * row_vecs + first;
    const long long t = target[row];
    const bool counted = t != ignore_index;
    const int te = (int)(t % EPV);  // the target's element in its vector
    int ticket = 0;
    if (dealer) ticket = tickets ? clusters + (int)atomicAdd(&tickets[0], 1u) : row + clusters;
    float m = -INFINITY, s = 0.f, sx = 0.f;  // log2-scaled running max, sum of 2^(x log2 e - m), sum of x
    float mk[MAX_PIECES];
#pragma unroll
    for (int k = 0; k < MAX_PIECES; ++k) {
      mk[k] = -INFINITY;
      if (k >= pieces) continue;
      unsigned done;
      do {
        asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
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
        const float ref = m == -INFINITY ? 0.f : m;
#pragma unroll
        for (int e = 0; e < EPV; ++e) {
          sx += f[e];
          f[e] = ex2(fmaf(f[e], LOG2E, -ref));
          s += f[e];
        }
        buf[j] = pack<DT>(f);
        mk[k] = m;
      }
    }
    int next;
    const float3 tot = row_total3(m, s, sx, ticket, next);
    const float inv = 1.f / tot.y;
    if (dealer) {  // the row's loss: lse in natural units from the log2-scaled (max, sum)
      const float lse = (tot.x + __log2f(tot.y)) * 0.6931471805599453f;
      float xt = 0.f;
      if (counted) {
        float f[EPV];
        unpack<DT>(x[(long long)row * row_vecs + t / EPV], f);
#pragma unroll
        for (int e = 0; e < EPV; ++e) xt = e == te ? f[e] : xt;  // a select, not an index into local memory
      }
      loss[row] = counted ? (1.f - eps) * (lse - xt) + (eps > 0.f ? eps * (lse - tot.z / (float)n_cols) : 0.f) : 0.f;
    }
    const long long tv = counted ? t / EPV - first : -1;  // the target's vector in this CTA's chunk, if it is
    const auto store = [&](int k) {  // the gradient of vector k of the thread's pieces, written evict-first
      const int j = k * PIECE + threadIdx.x;
      if (j >= len) return;
      const float c = ex2(mk[k] - tot.x) * inv;
      float f[EPV];
      unpack<DT>(buf[j], f);
      const bool has_target = j == tv;
#pragma unroll
      for (int e = 0; e < EPV; ++e) {
        f[e] = counted ? (f[e] * c - off) * scale : 0.f;
        if (has_target && e == te) f[e] -= (1.f - eps) * scale;
      }
      const uint4 v = pack<DT>(f);
      asm volatile("st.global.cs.v4.u32 [%0], {%1, %2, %3, %4};" :: "l"(g + base + j), "r"(v.x), "r"(v.y), "r"(v.z),
                   "r"(v.w) : "memory");
    };
    if (next >= rows) {
#pragma unroll
      for (int k = 0; k < MAX_PIECES; ++k)
        if (k < pieces) store(k);
    } else {
      asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#pragma unroll
      for (int k = 0; k < MAX_PIECES; k += 2) {
        if (k >= pieces) break;
        store(k);
        if (k + 1 < pieces) store(k + 1);
        __syncthreads();
        if (threadIdx.x == 0) load_pieces(buf, bars, x, (long long)next * row_vecs + first, len, k, min(k + 2, pieces));
      }
    }
    cluster_wait();
    row = next;
  }
  if (dealer && tickets) {
    __threadfence();
    if (atomicAdd(&tickets[1], 1u) == (unsigned)clusters - 1) {
      atomicExch(&tickets[0], 0u);
      atomicExch(&tickets[1], 0u);
    }
  }
}
"""

SOURCE = sc.SOURCE + KERNEL
"""softmax_cluster's helpers (its uninstantiated softmax kernel with them), then this kernel."""


def compile_source(arch: str) -> object:
    """The three dtypes' kernels, compiled by NVRTC for `arch` (e.g. "sm_90a"); needs no GPU."""
    from cuda.core import Program, ProgramOptions

    options = ProgramOptions(arch=arch, use_fast_math=True, std="c++17")
    return Program(SOURCE, "c++", options).compile("cubin", name_expressions=tuple(_names()))


def _names() -> list[str]:
    return [f"ce_rows<{code}>" for code in sc.DTYPES.values()]


@functools.cache
def _kernels(device_index: int) -> dict:
    """Compiled once per device and process, each allowed softmax_cluster's 64 KB of dynamic shared memory and
    clusters past the portable size."""
    from cuda.bindings import driver
    from cuda.core import Device

    device = Device(device_index)
    device.set_current()
    major, minor = device.compute_capability
    code = compile_source(f"sm_{major}{minor}a")
    attrs = driver.CUfunction_attribute
    kernels = {}
    for dtype, name in zip(sc.DTYPES, _names()):
        kernel = code.get_kernel(name)
        for attr, value in ((attrs.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, sc.CHUNK_BYTES),
                            (attrs.CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1)):
            (err,) = driver.cuKernelSetAttribute(attr, value, kernel.handle, device_index)
            if err != driver.CUresult.CUDA_SUCCESS:
                raise RuntimeError(f"cuKernelSetAttribute({attr.name}) failed: {err.name}")
        kernels[dtype] = kernel
    return kernels


_resident: dict[tuple, int] = {}


def _resident_clusters(device: torch.device, dtype: torch.dtype, p: sc.Plan) -> int:
    """How many clusters of plan `p` the device runs at once (the occupancy calculator), per device, dtype, plan."""
    from cuda.core import LaunchConfig

    key = (device.index, dtype, p.cluster, p.shared_bytes)
    if key not in _resident:
        config = LaunchConfig(grid=1, cluster=p.cluster, block=sc.THREADS, shmem_size=p.shared_bytes)
        _resident[key] = max(1, _kernels(device.index)[dtype].occupancy.max_active_clusters(
            config, stream=sc._stream(device)))
    return _resident[key]


def loss_and_grad(logits: torch.Tensor, target: torch.Tensor, label_smoothing: float, n_valid: torch.Tensor,
                  ignore_index: int, persistent: bool | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(each row's loss, the gradient) of the mean cross-entropy over the `n_valid` counted rows (an int32 scalar
    on the device), for logits that `softmax_cluster.unsupported` accepts and int64 targets. Persistent as
    softmax_cluster's kernel is (from its PERSISTENT_FROM CTAs a cluster)."""
    from cuda.core import LaunchConfig, launch

    reason = sc.unsupported(logits)
    if reason is not None:
        raise (NotImplementedError if logits.is_cuda and logits.dtype in sc.DTYPES else ValueError)(
            f"cross_entropy_cluster: {reason}")
    rows, cols = logits.shape
    grad = torch.empty_like(logits)
    losses = torch.empty(rows, device=logits.device, dtype=torch.float32)
    if rows == 0:
        return losses, grad
    sms = torch.cuda.get_device_properties(logits.device).multi_processor_count
    p = sc.plan(rows, cols, logits.element_size(), sms)
    if persistent is None:
        persistent = p.cluster >= sc.PERSISTENT_FROM
    if persistent:
        grid = min(rows, _resident_clusters(logits.device, logits.dtype, p))
        tickets = sc._tickets(logits.device).data_ptr()
    else:
        grid, tickets = rows, 0
    target = target.to(torch.int64).contiguous()
    config = LaunchConfig(grid=grid, cluster=p.cluster, block=sc.THREADS, shmem_size=p.shared_bytes)
    launch(sc._stream(logits.device), config, _kernels(logits.device.index)[logits.dtype],
           np.uint64(logits.data_ptr()), np.uint64(grad.data_ptr()), np.uint64(target.data_ptr()),
           np.uint64(losses.data_ptr()), np.uint64(n_valid.data_ptr()), np.int32(rows), np.int32(p.row_vecs),
           np.int32(p.chunk_vecs), np.uint64(tickets), np.int32(cols), np.float32(label_smoothing),
           np.int64(ignore_index))
    return losses, grad
