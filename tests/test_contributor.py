"""A contributor's afternoon, end to end, in a copy of the repository: new, write a real kernel, validate,
run on the CPU, check, build the site; the new case shows up everywhere and nothing else changes.

The CLI runs as a subprocess in the copy, with the copy first on PYTHONPATH: kernel modules resolve in
the package `casebook.kernels`, so the copy's package must be the one imported (the test checks it).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO

pytestmark = pytest.mark.slow  # site builds and child-process runs

CASE = "contrib_rmsnorm"
"""The contributor's case: a fused RMSNorm, not a copy of any case in the book."""

KERNEL = '''\
"""RMSNorm: y = x / sqrt(mean(x^2) + EPS) * w, from several passes over memory to one read and one write.

What you will learn: RMSNorm does about 4 FLOPs per element against 4 bytes moved in bf16 (read x,
write y; the weight is one row, read once): about 1 FLOP/byte, far under any GPU's ridge point. It is
bandwidth-bound, so what matters is how many times each element crosses device memory.

The ladder:
  eager        square, mean, rsqrt and two multiplies as tensor ops: ~3 reads + 2 writes of x's size
  torch_fused  torch.nn.functional.rms_norm: the library's fused kernel
  triton_rows  one Triton program per block of rows, each row held on chip: 1 read + 1 write
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from casebook.traffic import Term, Traffic

EPS = 1e-6
"""Added to the mean square before the square root: a module constant, so every variant agrees."""

# --- reference, inputs, traffic ----------------------------------------------------------------


def reference(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """The exact answer, in float64."""
    return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + EPS) * w


def make_inputs(shape: dict, dtype: torch.dtype, device: str, generator: torch.Generator) -> dict:
    """Activations [rows, cols] and a gain [cols] near 1, as a trained norm's is."""
    x = torch.randn(shape["rows"], shape["cols"], generator=generator)
    w = 1.0 + 0.1 * torch.randn(shape["cols"], generator=generator)
    return {"x": x.to(device=device, dtype=dtype), "w": w.to(device=device, dtype=dtype)}


def traffic(shape: dict, dtype: torch.dtype) -> Traffic:
    """The floor: x read once, w read once, y written once."""
    rows, cols = shape["rows"], shape["cols"]
    n = rows * cols
    b = torch.empty((), dtype=dtype).element_size()
    return Traffic([
        Term("read x", bytes=n * b),
        Term("read w (one row, once)", bytes=cols * b),
        Term("write y", bytes=n * b),
        Term("square and sum (2 / element)", flops=2 * n),
        Term("rsqrt of the mean (1 / row)", flops=rows),
        Term("scale by rsqrt and w (2 / element)", flops=2 * n),
    ])


# --- variant 1: eager -----------------------------------------------------------------------------


def eager(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Separate tensor ops; intermediates of x's size make round trips through memory."""
    ms = x.float().pow(2).mean(dim=-1, keepdim=True)  # read x, write and read x^2
    return (x.float() * torch.rsqrt(ms + EPS)).to(x.dtype) * w  # read x, write t, read t, write y


# --- variant 2: the library's fused kernel --------------------------------------------------------


def torch_fused(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.rms_norm(x, (x.shape[-1],), weight=w, eps=EPS)


# --- variant 3: one Triton program per block of rows -----------------------------------------------


@triton.jit
def _rmsnorm_kernel(x_ptr, w_ptr, y_ptr, n_rows, n_cols, stride, eps, ROWS: tl.constexpr, BLOCK: tl.constexpr):
    # ROWS rows per program, each row whole in registers: x read once, y written once, math in fp32.
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)[:, None]
    cols = tl.arange(0, BLOCK)[None, :]
    mask = (rows < n_rows) & (cols < n_cols)
    offs = rows.to(tl.int64) * stride + cols
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(x * x, axis=1)[:, None] / n_cols + eps)
    tl.store(y_ptr + offs, (x * inv * w).to(y_ptr.dtype.element_ty), mask=mask)


INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


def triton_rows(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """One read of x, one write of y, for rows up to 16K columns."""
    n_rows, n_cols = x.shape
    if n_cols > 16384:
        raise NotImplementedError(f"triton_rows holds at most 16384 columns on chip; got {n_cols}")
    x = x.contiguous()
    y = torch.empty_like(x)
    block = triton.next_power_of_2(n_cols)
    # A few rows per program on a GPU; the interpreter runs programs one by one, so give it big ones.
    rows = max(1, 2**20 // block) if INTERPRETED else max(1, 4096 // block)
    _rmsnorm_kernel[(triton.cdiv(n_rows, rows),)](x, w, y, n_rows, n_cols, x.stride(0), EPS,
                                                  ROWS=rows, BLOCK=block, num_warps=8)
    return y


# --- level 3: the pre-norm of a transformer block ---------------------------------------------------


def make_block_inputs(shape: dict, dtype: torch.dtype, device: str, generator: torch.Generator) -> dict:
    """Activations [tokens, hidden], the norm's gain [hidden], the projection after it [hidden, hidden]."""
    t, h = shape["tokens"], shape["hidden"]
    x = torch.randn(t, h, generator=generator)
    gain = 1.0 + 0.1 * torch.randn(h, generator=generator)
    proj = torch.randn(h, h, generator=generator) * h**-0.5
    return {k: v.to(device=device, dtype=dtype) for k, v in (("x", x), ("gain", gain), ("proj", proj))}


def prenorm_linear(kernel, x: torch.Tensor, gain: torch.Tensor, proj: torch.Tensor) -> torch.Tensor:
    """rmsnorm(x) @ proj: the matmul is compute-bound; `kernel` does the norm, called once."""
    return torch.matmul(kernel(x, gain), proj)  # [tokens, hidden]
'''

CASE_YAML = '''\
# yaml-language-server: $schema=../docs/schema/case.schema.json
schema_version: 1
id: contrib_rmsnorm
title: "Fused RMSNorm: one read and one write per row"
operator: rmsnorm
summary: >-
  RMSNorm does about four FLOPs per element and moves four bytes (bf16), so it is bandwidth-bound:
  its speed is set by how many times each element crosses device memory. Holding each row on chip
  while its mean square is reduced and applied cuts eager's several passes to one read and one write.
tags: [normalization, llm]

bottleneck:
  kind: bandwidth
  arithmetic_intensity: 1.0
  reasoning: >-
    4 FLOPs per element over 4 bytes per element (bf16 read + write; the weight row is negligible) is
    1 FLOP/byte, two orders of magnitude under an H200's ridge point (~160 FLOP/byte in bf16):
    bandwidth-bound once the tensor is a few MB.

patterns: [fusion]

boundaries:
  - axis: shape
    holds: "Rows of 1K-16K columns (the hidden sizes of current LLMs), enough rows to fill the GPU."
    breaks: "Rows over 16K columns no longer fit in registers: tile the row and re-read it, as long softmax rows do."
  - axis: distribution
    holds: "Prefill and training: thousands of tokens per call."
    breaks: "Decode with a handful of tokens: a few KB per call, launch-bound; fuse into the neighbouring matmul."

transfers:
  - operator: softmax
    why: "The same one-row-on-chip structure, with max and sum in place of the mean square."
    case: softmax_fusion
  - operator: layernorm
    why: "Adds the mean: two reductions per row, still one read and one write."

kernel:
  module: contrib_rmsnorm
  reference: reference
  inputs: make_inputs
  traffic: traffic
  tensors:
    x: [rows, cols]
    w: [cols]
    y: [rows, cols]
  baseline: eager
  variants:
    - name: eager
      fn: eager
      note: "Square, mean, rsqrt and two multiplies as tensor ops: intermediates round-trip memory."
      backends: [cuda, cpu]
    - name: torch_fused
      fn: torch_fused
      note: "torch.nn.functional.rms_norm: the library's fused kernel."
      backends: [cuda, cpu]
    - name: triton_rows
      fn: triton_rows
      note: "One Triton program per block of rows, each row on chip: one read of x, one write of y."
      backends: [cuda, interpreter]

levels:
  kernel:
    cache: cold
    dtypes: [bf16, fp32]
    shapes:
      - {rows: 16384, cols: 4096}
      - {rows: 4096, cols: 8192}
    cpu_shapes:
      - {rows: 1024, cols: 2048}
  workload:
    description: "The pre-attention and pre-MLP norms of Llama-3-8B (hidden 4096) over prefill chunk sizes."
    dtype: bf16
    shapes:
      - {shape: {rows: 4096, cols: 4096}, weight: 0.6,
         source: "4K-token prefill chunks; share assumed, not from a trace"}
      - {shape: {rows: 16384, cols: 4096}, weight: 0.4, source: "16K-token training micro-batches; share assumed"}
    cpu_shapes:
      - {shape: {rows: 512, cols: 2048}, weight: 1.0, source: "scaled-down stand-in"}
  end_to_end:
    description: "The pre-norm of a transformer block and the projection after it: rmsnorm(x) @ W."
    scenario: prenorm_linear
    inputs: make_block_inputs
    shape: {tokens: 8192, hidden: 4096}
    cpu_shape: {tokens: 256, hidden: 512}
    dtype: bf16
    baseline: eager
    variant: triton_rows

claims:
  - kind: regime
    text: "The Triton kernel is bandwidth-bound at every level-1 shape."
    variant: triton_rows
    regime: bandwidth
    hardware: [nvidia-h200]

writeup:
  gap: >-
    The projection is compute-bound and untouched: the end-to-end gain is the norm's share of the block
    times its kernel speedup (Amdahl), a few percent at most.
  remaining_bottleneck: >-
    The matmul. Folding the norm into the matmul's prologue would remove the write and re-read of the
    normalised activations altogether.
  references:
    - title: "Zhang and Sennrich, Root Mean Square Layer Normalization (2019)"
      url: "https://arxiv.org/abs/1910.07467"
'''


def _git(copy: Path, *args: str) -> str:
    proc = subprocess.run(["git", "-c", "user.name=casebook test", "-c", "user.email=test@casebook.invalid",
                           "-c", "commit.gpgsign=false", *args], cwd=copy, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.fixture(scope="module")
def book(tmp_path_factory) -> Path:
    """The tracked files of this repository, copied into a fresh git repository with one commit."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    copy = tmp_path_factory.mktemp("book")
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    for name in filter(None, tracked.decode().split("\0")):
        src = REPO / name
        if src.is_file():  # a tracked file deleted in the working tree is skipped
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, copy / name)
    _git(copy, "init", "-q")
    _git(copy, "add", "-A")
    _git(copy, "commit", "-q", "-m", "the book as it was")
    return copy


def casebook(copy: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """`casebook ARGS` in the copy, on the CPU, importing the copy's package."""
    env = {**os.environ, "PYTHONPATH": str(copy), "CUDA_VISIBLE_DEVICES": "", "NO_COLOR": "1",
           "COLUMNS": "200", "CASEBOOK_CASES": "", "CASEBOOK_RESULTS": ""}
    return subprocess.run([sys.executable, "-m", "casebook.cli", *args], cwd=copy, env=env, capture_output=True,
                          text=True, timeout=timeout)


def test_a_contributor_adds_a_case(book: Path):
    steps: dict[str, float] = {}

    def step(name: str, *args: str, ok: tuple[int, ...] = (0,)) -> subprocess.CompletedProcess:
        start = time.perf_counter()
        proc = casebook(book, *args)
        steps[name] = time.perf_counter() - start
        assert proc.returncode in ok, \
            f"casebook {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
        return proc

    probe = subprocess.run([sys.executable, "-c", "import casebook.kernels as k; print(k.__file__)"], cwd=book,
                           env={**os.environ, "PYTHONPATH": str(book)}, capture_output=True, text=True, timeout=60)
    assert Path(probe.stdout.strip()).resolve().is_relative_to(book.resolve()), probe.stdout + probe.stderr

    case_file, kernel_file = book / "cases" / f"{CASE}.yaml", book / "casebook" / "kernels" / f"{CASE}.py"

    # 1. The scaffold: a case and a kernel module that validate as they stand, and the case's notebook.
    new = step("new", "new", CASE)
    notebook = book / "notes" / f"{CASE}.md"
    assert case_file.is_file() and kernel_file.is_file() and notebook.is_file(), new.stdout
    assert "validates" in new.stdout

    # 2. The contributor replaces both with a real kernel, and validates.
    kernel_file.write_text(KERNEL)
    case_file.write_text(CASE_YAML)
    assert "1 case file checked: all valid" in step("validate", "validate", f"cases/{CASE}.yaml").stdout

    # 3. Run on the CPU: torch variants timed, the Triton variant checked through the interpreter. On a loaded
    # machine the scenario's timings can come out disturbed, which the run reports as a failed scenario (exit 1,
    # "a loaded machine?"); nothing else may fail.
    run = step("run", "run", f"cases/{CASE}.yaml", "--save", ok=(0, 1))
    [stored] = (book / "results").glob(f"*/{CASE}.json")
    doc = json.loads(stored.read_text())
    loaded = doc["end_to_end"]["status"] == "failed" and "a loaded machine?" in (doc["end_to_end"].get("error") or "")
    assert run.returncode == 0 or loaded, f"{run.stdout}\n{run.stderr}"
    assert doc["hardware"]["kind"] == "cpu"
    status = {(p["variant"], p["dtype"]): p["status"] for p in doc["kernel_level"]}
    assert status == {("eager", "bf16"): "ok", ("eager", "fp32"): "ok", ("torch_fused", "bf16"): "ok",
                      ("torch_fused", "fp32"): "ok", ("triton_rows", "bf16"): "checked",
                      ("triton_rows", "fp32"): "checked"}, run.stdout
    assert all(p["correct"] for p in doc["kernel_level"] + doc["workload_level"]["points"])
    assert doc["end_to_end"]["status"] == "partial" or loaded  # the Triton variant is not timed on a CPU
    assert [c["held"] for c in doc["claims"]] == [None]  # scoped to nvidia-h200: not applicable here

    # 4. What a reviewer would reject: nothing (results present and current).
    # On a loaded machine the run's points can be marked unstable and its scenario disturbed, which check rightly
    # refuses; nothing else.
    check = step("check", "check", f"cases/{CASE}.yaml", ok=(0, 2))
    problems = [line for line in check.stdout.splitlines()
                if line.startswith(f"cases/{CASE}.yaml:") and ": warning: " not in line]
    assert "all valid" in check.stdout if check.returncode == 0 else (
        problems and all("unstable point(s)" in line or "a loaded machine?" in line for line in problems)), check.stdout

    # 5. The site: the case has a page and appears in every index it belongs to.
    step("build", "build", "--out", "site")
    site = book / "site"
    page = (site / "cases" / CASE / "index.html").read_text()
    assert "Fused RMSNorm" in page
    for index in ("browse/pattern", "browse/operator", "browse/bottleneck", "browse/transfers", "cases"):
        html = (site / index / "index.html").read_text()
        assert f"{CASE}/" in html, f"{index} does not link the new case"
    assert (site / "notebooks" / CASE / "index.html").is_file() and f"notebooks/{CASE}/" in page
    operator = (site / "browse" / "operator" / "index.html").read_text()
    assert "rmsnorm" in operator
    search = json.loads((site / "search" / "search_index.json").read_text())
    assert any(d["location"].startswith(f"cases/{CASE}/") for d in search["docs"])
    assert any("Fused RMSNorm" in d["title"] + d["text"] for d in search["docs"])

    # 6. The pull request touches the case, its kernel module, its notebook and its result, and nothing else.
    changed = [line[3:] for line in _git(book, "status", "--porcelain", "--untracked-files=all").splitlines()]
    assert sorted(changed) == sorted([f"cases/{CASE}.yaml", f"casebook/kernels/{CASE}.py", f"notes/{CASE}.md",
                                      stored.relative_to(book).as_posix()]), changed
    print("steps (s):", {k: round(v, 1) for k, v in steps.items()})
