"""Where cluster_bulk's gap to softmax's cluster kernel goes: the rung's wrapper, or what its kernel adds.

On the H200 the stored cross_entropy run puts cluster_bulk at 3476 / 3509 GB/s at 4096 x 128256 / 262144 bf16,
against softmax_cluster's 3.83 / 3.72 TB/s on the same bytes in softmax_fusion's stored run: 91-94%, where the
H100 measured 95-97%. The claim is 3.8 TB/s. The rung differs from softmax's in two places:

- **The wrapper**: `cross_entropy.cluster_loss` counts the rows that count (`(target != ignore).sum()`, then a
  cast: tiny kernels) and takes the mean loss (`losses.sum() / n_valid`) around the one launch; each small
  kernel costs a few microseconds of device time in a stream of dependent work.
- **The kernel** (`cross_entropy_cluster.KERNEL`), softmax's with three additions, each a lever here, applied
  alone and together by editing the committed source (each edit must find its text once, so the script fails
  loudly when the kernel changes under it):
  - `owner`: the dealer (thread 0 of the cluster's first CTA) loads `x_t` from global memory after the row's
    total and before its first refill barrier, so that CTA's next row is issued a dependent load's latency
    late. Here the thread that reads the target's vector from the landed piece keeps it in shared memory
    (one predicated store a vector; exact, before the exponentials overwrite it) and writes the loss itself;
    the dealer writes only an ignored row's zero. (Kept in registers instead, the element's selects were
    if-converted into every vector of the loop, 8 FSEL a vector, and fp32 spilled.)
  - `prefetch`: the other cure, the dealer's load issued as the row starts, in flight while the pieces land;
    but it needs the target, itself a load, so warp 0 waits for it before its first piece.
  - `fold`: the store computes `counted ? (p c - off) scale : 0` and a per-element target test; here the scale
    and the count fold into the piece's factor and the row's offset (one FFMA an element) and the target's
    correction sits behind one branch a vector.
  - `nosx`: the sum of logits (label smoothing's mean) is taken only when smoothing is on (a uniform branch);
    the claim shapes run without it.

Predicted (notes/cross_entropy.md, before the run), bf16:
- wrapper: 8-15 us a call (five small kernels), 2-3% at 4096 x 128256, 1-2% at 262144, ~4-5% at 8192 x 32000;
- the committed kernel alone within 3-6% of softmax_cluster at the same bytes;
- `owner` alone 1-3% faster than the committed kernel, `prefetch` less (its wait on the target moves to the
  row's start), `fold` and `nosx` 0-2% each, all (owner, fold, nosx) within 2% of softmax_cluster. A lever
  that slows the kernel, or moves nothing while the kernel is 5% behind softmax, sends the search to the
  counters (the store path, the barriers), not to more arithmetic.

Every lever's gradient and loss are checked against the committed kernel's (`owner` and `prefetch` must match it
bit for bit: the same arithmetic on the same values) and against float64 on the first rows.

    python3 benchmarks/explore/cross_entropy/cluster_lean.py          (GPU: correctness, then do_bench)
    python3 benchmarks/explore/cross_entropy/cluster_lean.py --sass   (no GPU: each lever compiled for sm_90a,
                                                                       registers, spills, SASS counts)
"""

from __future__ import annotations

import argparse
import collections
import io
import os
import re
import subprocess
import tempfile

from casebook.kernels import cross_entropy_cluster as cec
from casebook.kernels import softmax_cluster as sc

DEALER_LOAD = ("      float xt = 0.f;\n"
               "      if (counted) {\n"
               "        float f[EPV];\n"
               "        unpack<DT>(x[(long long)row * row_vecs + t / EPV], f);\n"
               "#pragma unroll\n"
               "        for (int e = 0; e < EPV; ++e) xt = e == te ? f[e] : xt;"
               "  // a select, not an index into local memory\n"
               "      }\n")

PREFETCH = [  # the dealer issues x_t's load as the row starts: in flight while the pieces land
    ("    const int te = (int)(t % EPV);  // the target's element in its vector\n",
     "    const int te = (int)(t % EPV);  // the target's element in its vector\n"
     "    float xt = 0.f;\n"
     "    if (dealer && counted) {  // the 4-byte word that holds x_t (an element is 16 / EPV bytes)\n"
     "      const unsigned w ="
     " reinterpret_cast<const unsigned*>(x)[((long long)row * row_vecs * EPV + t) * 4 / EPV];\n"
     "      float f[EPV];\n"
     "      unpack<DT>(make_uint4(w, 0u, 0u, 0u), f);  // the word's one (fp32) or two elements\n"
     "      xt = DT != 0 && t % 2 ? f[1] : f[0];\n"
     "    }\n"),
    (DEALER_LOAD, ""),
]

OWNER = [  # the target's owner keeps its raw vector in shared memory as it reads the piece, and writes the loss
    ("  __shared__ __align__(8) unsigned long long bars[MAX_PIECES];\n",
     "  __shared__ __align__(8) unsigned long long bars[MAX_PIECES];\n"
     "  __shared__ uint4 target_vec;  // the target's vector as it landed, kept by the thread that owns it\n"),
    ("    const int te = (int)(t % EPV);  // the target's element in its vector\n",
     "    const int te = (int)(t % EPV);  // the target's element in its vector\n"
     "    const long long tv = counted ? t / EPV - first : -1;"
     "  // the target's vector in this CTA's chunk, if it is\n"),
    ("        unpack<DT>(buf[j], f);\n        float mv = f[0];\n",
     "        if (j == tv) target_vec = buf[j];"
     "  // one predicated store a vector, before the exponentials overwrite it\n"
     "        unpack<DT>(buf[j], f);\n        float mv = f[0];\n"),
    ("    if (dealer) {  // the row's loss: lse in natural units from the log2-scaled (max, sum)\n"
     "      const float lse = (tot.x + __log2f(tot.y)) * 0.6931471805599453f;\n" + DEALER_LOAD,
     "    // the row's loss, by the thread that kept the target's vector (known from tv: no flag held through the\n"
     "    // loop), an ignored row's 0 by the dealer\n"
     "    if (counted ? tv >= 0 && tv < len && (int)(tv % PIECE) == (int)threadIdx.x : dealer) {\n"
     "      const float lse = (tot.x + __log2f(tot.y)) * 0.6931471805599453f;\n"
     "      float xt = 0.f;\n"
     "      if (counted) {\n"
     "        float f[EPV];\n"
     "        unpack<DT>(target_vec, f);\n"
     "#pragma unroll\n"
     "        for (int e = 0; e < EPV; ++e) xt = e == te ? f[e] : xt;\n"
     "      }\n"),
    ("    const long long tv = counted ? t / EPV - first : -1;  // the target's vector in this CTA's chunk, if it is\n"
     "    const auto store", "    const auto store"),
]

FOLD = [  # the scale and the count folded into the factor and the offset; the target's correction a branch
    ("      const float c = ex2(mk[k] - tot.x) * inv;\n",
     "      const float c = counted ? ex2(mk[k] - tot.x) * inv * scale : 0.f;\n"),
    ("      for (int e = 0; e < EPV; ++e) {\n"
     "        f[e] = counted ? (f[e] * c - off) * scale : 0.f;\n"
     "        if (has_target && e == te) f[e] -= (1.f - eps) * scale;\n"
     "      }\n",
     "      for (int e = 0; e < EPV; ++e) f[e] = fmaf(f[e], c, -off_row);\n"
     "      if (has_target) {\n#pragma unroll\n"
     "        for (int e = 0; e < EPV; ++e) f[e] = e == te ? f[e] - (1.f - eps) * scale : f[e];\n"
     "      }\n"),
    ("    const auto store = [&](int k) {",
     "    const float off_row = counted ? off * scale : 0.f;\n    const auto store = [&](int k) {"),
]

NOSX = [  # the sum of logits only under label smoothing (a uniform branch)
    ("#pragma unroll\n        for (int e = 0; e < EPV; ++e) {\n          sx += f[e];\n",
     "        if (eps > 0.f) {\n#pragma unroll\n          for (int e = 0; e < EPV; ++e) sx += f[e];\n        }\n"
     "#pragma unroll\n        for (int e = 0; e < EPV; ++e) {\n"),
]

LEVERS = {"owner": OWNER, "prefetch": PREFETCH, "fold": FOLD, "nosx": NOSX}
VARIANTS = {"committed": (), "owner": ("owner",), "prefetch": ("prefetch",), "fold": ("fold",), "nosx": ("nosx",),
            "all": ("owner", "fold", "nosx")}


def source(levers: tuple[str, ...]) -> str:
    """The committed kernel with the levers' edits, each found exactly once."""
    kernel = cec.KERNEL
    for lever in levers:
        for old, new in LEVERS[lever]:
            if kernel.count(old) != 1:
                raise SystemExit(f"{lever}: the committed kernel no longer has this text once:\n{old}")
            kernel = kernel.replace(old, new)
    return sc.SOURCE + kernel


def compile_variant(levers: tuple[str, ...], arch: str, log: io.StringIO | None = None):
    from cuda.core import Program, ProgramOptions

    options = ProgramOptions(arch=arch, use_fast_math=True, std="c++17", ptxas_options="-v" if log else None)
    return Program(source(levers), "c++", options).compile("cubin", name_expressions=tuple(cec._names()), logs=log)


def sass() -> None:
    """Each variant lowered for sm_90a: registers, stack and spills (ptxas), and the bf16 kernel's SASS opcodes."""
    import triton

    nvdisasm = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "nvdisasm")
    for name, levers in VARIANTS.items():
        log = io.StringIO()
        code = compile_variant(levers, "sm_90a", log)
        usage = re.findall(r"ce_rowsILi(\d)E.*?(\d+) bytes stack frame, (\d+) bytes spill stores.*?"
                           r"Used (\d+) registers", log.getvalue(), re.S)
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(code.code)
            f.flush()
            text = subprocess.run([nvdisasm, "-c", f.name], capture_output=True, text=True, check=True).stdout
        bf16 = re.split(r"^\.text\._Z7ce_rowsILi1E\S*:$", text, maxsplit=1, flags=re.M)[1].split(".section", 1)[0]
        opcodes = re.findall(r"/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", bf16)
        ops = collections.Counter(m.split(".")[0] for m in opcodes)
        regs = ", ".join(f"DT{dt}: {r} regs, stack {st}, spills {sp}" for dt, st, sp, r in usage)
        top = " ".join(f"{k} {ops[k]}" for k in ("FFMA", "FMUL", "FADD", "FMNMX", "MUFU", "FSEL", "ISETP", "F2FP",
                                                   "PRMT", "SHF", "LDG", "STG", "BAR", "SYNCS"))
        print(f"{name:9s} {regs}\n          bf16 SASS {sum(ops.values())} instructions: {top}", flush=True)


def gpu() -> None:
    import torch
    from cuda.bindings import driver
    from cuda.core import Device

    Device(torch.cuda.current_device()).set_current()  # the context get_kernel loads into (torch's primary one)
    major, minor = torch.cuda.get_device_capability()
    arch = f"sm_{major}{minor}a"

    attrs = driver.CUfunction_attribute
    built = {}
    for name, levers in VARIANTS.items():
        code = compile_variant(levers, arch)
        kernels = {}
        for dtype, kname in zip(sc.DTYPES, cec._names()):
            k = code.get_kernel(kname)
            for attr, value in ((attrs.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, sc.CHUNK_BYTES),
                                (attrs.CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1)):
                (err,) = driver.cuKernelSetAttribute(attr, value, k.handle, torch.cuda.current_device())
                assert err == driver.CUresult.CUDA_SUCCESS, err
            kernels[dtype] = k
        built[name] = kernels
    committed_kernels = cec._kernels

    def use(name):  # the launcher's kernels swapped for a variant's; occupancy asked again for it
        cec._kernels = (lambda _index, kernels=built[name]: kernels) if name != "committed" else committed_kernels
        cec._resident.clear()

    for (tokens, vocab), dtype in (((4096, 128256), torch.bfloat16), ((4096, 262144), torch.bfloat16),
                                   ((8192, 32000), torch.bfloat16), ((4096, 128256), torch.float32)):
        one_shape(tokens, vocab, dtype, use)
        torch.cuda.empty_cache()


def one_shape(tokens: int, vocab: int, dtype, use) -> None:
    """softmax_cluster and the rung, then each variant's kernel alone, checked and timed at one shape."""
    import torch
    import triton

    from casebook.kernels import cross_entropy as mod

    inputs = mod.make_inputs({"tokens": tokens, "vocab": vocab}, dtype, "cuda", torch.Generator().manual_seed(7))
    x, t = inputs["logits"], inputs["target"]
    n_valid = mod._n_valid(t)
    floor = 2 * x.numel() * x.element_size()
    tag = f"{tokens} x {vocab} {str(dtype).removeprefix('torch.')}"
    use("committed")
    loss0, grad0 = cec.loss_and_grad(x, t, 0.0, n_valid, mod.IGNORE_INDEX)
    ref = mod.reference(x[:256], t[:256], 0.0) * int((t[:256] != mod.IGNORE_INDEX).sum()) / int(n_valid)

    def rate(fn) -> str:
        us = triton.testing.do_bench(fn, warmup=25, rep=300, return_mode="median") * 1e3
        return f"{us:8.1f} us {floor / us / 1e6:5.2f} TB/s"

    def kernel() -> tuple:
        return cec.loss_and_grad(x, t, 0.0, n_valid, mod.IGNORE_INDEX)

    print(f"{tag}: softmax_cluster (same bytes) {rate(lambda: sc.softmax(x))}", flush=True)
    print(f"{tag}: cluster_bulk (the rung)      {rate(lambda: mod.cluster_bulk(x, t, 0.0))}", flush=True)
    for name in VARIANTS:
        use(name)
        loss, grad = kernel()
        same = bool(torch.equal(loss, loss0) and torch.equal(grad, grad0))
        err = float(torch.linalg.vector_norm(grad[:256].double() - ref) / torch.linalg.vector_norm(ref))
        dloss = float((loss.double() - loss0.double()).abs().max())
        verdict = "bit for bit" if same else f"max |loss diff| {dloss:.2e}"
        bad = err > 2e-2 or dloss > 1e-3 or (name in ("committed", "owner", "prefetch") and not same)
        print(f"{tag}: kernel {name:9s} {rate(kernel)}  vs float64 {err:.2e}, vs committed {verdict}"
              f"{'  WRONG' if bad else ''}", flush=True)
    use("committed")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--sass", action="store_true", help="no GPU: registers, spills and SASS counts for sm_90a")
    args = parser.parse_args()
    sass() if args.sass else gpu()


if __name__ == "__main__":
    main()
