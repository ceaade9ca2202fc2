"""softmax_fusion: every CPU-checkable variant against the float64 softmax at awkward shapes (Triton through
the interpreter), through casebook.run.inprocess as `casebook run` checks them; the two paths of triton_online and
its row barrier; the traffic model. The barrier's wait across programs needs programs that run at the same
time, which the interpreter's do not: `test_softmax_fusion_gpu.py` checks that on a GPU.

Shapes: rows 1, 37, 199 and columns 1, 760, 1128, 65537 (one element, under and over a power of two, a
vocabulary-sized row one past 64K), each row count and each column count in every dtype for every variant.
The interpreter runs one Python step per program and tile, so the Triton variants get a covering subset
rather than the whole grid (199 x 65537 alone takes ~15 s per dtype there).
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # before any kernel module is imported: @triton.jit reads it then

import zlib
from pathlib import Path

import pytest
import torch
import yaml

from casebook.kernels import softmax_fusion as mod
from casebook.run.check import TORCH_DTYPES
from casebook.run.inprocess import check
from casebook.tolerance import TOLERANCE

REPO = Path(__file__).resolve().parents[2]
CASE = yaml.safe_load((REPO / "cases" / "softmax_fusion.yaml").read_text())
ON_CPU = [v["fn"] for v in CASE["kernel"]["variants"] if {"cpu", "interpreter"} & set(v["backends"])]
DTYPES = ["fp32", "bf16", "fp16"]

# The interpreter computes -inf - -inf in masked lanes (the kernels mask the result): numpy warns.
pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered in subtract:RuntimeWarning")

CHUNK = 16384
"""Split rows' chunk here: the interpreter pays per program, and 65537 columns in chunks of 16K are still
five chunks, the last one column (the module's own interpreter chunk, 1K, makes 65 and takes minutes)."""


@pytest.fixture(autouse=True)
def _larger_interpreter_chunks(monkeypatch):
    monkeypatch.setattr(mod, "INTERPRETER_CHUNK", CHUNK)

ROWS, COLS = (1, 37, 199), (1, 760, 1128, 65537)
SHAPES = {
    "eager": [(r, c) for r in ROWS for c in COLS if (r, c) != (199, 65537)],
    "torch_softmax": [(r, c) for r in ROWS for c in COLS if (r, c) != (199, 65537)],
    "triton_onepass": [(1, 1), (37, 1128), (199, 760)],  # 65537: refused, below
    "triton_online": [(1, 1), (37, 760), (199, 1128),  # one pass
                      (1, 65537), (37, 65537)],  # rows split over 5 chunks (the last one column)
}
CASES = [(fn, r, c, d) for fn in SHAPES for (r, c) in SHAPES[fn] for d in DTYPES]


def seeds(*key) -> list[int]:
    """Two fresh seeds per test, different for every test."""
    s = zlib.crc32(repr(key).encode())
    return [s, s + 1]


def run_check(fn: str, rows: int, cols: int, dtype: str, seed_list: list[int] | None = None):
    return check(getattr(mod, fn), mod.reference, mod.make_inputs, {"rows": rows, "cols": cols}, dtype, "cpu",
                 seed_list or seeds(fn, rows, cols, dtype))


def test_every_cpu_variant_is_covered():
    assert sorted(ON_CPU) == sorted(SHAPES)
    for fn, shapes in SHAPES.items():
        refused = [c for c in COLS if c > mod.MAX_ONEPASS] if fn == "triton_onepass" else []
        assert {r for r, _ in shapes} == set(ROWS), fn
        assert {c for _, c in shapes} | set(refused) == set(COLS), fn


@pytest.mark.parametrize("fn, rows, cols, dtype",
                         [pytest.param(*c, marks=pytest.mark.slow) if c[1] * c[2] > 10**6 else c for c in CASES],
                         ids=[f"{f}-{r}x{c}-{d}" for f, r, c, d in CASES])
def test_variant_matches_reference(fn, rows, cols, dtype):
    c = run_check(fn, rows, cols, dtype)
    assert c.correct, c.error
    assert c.max_rel_err <= TOLERANCE[dtype]


@pytest.mark.parametrize("cols", [mod.MAX_ONEPASS + 1, 65537])
def test_onepass_refuses_rows_it_cannot_hold(cols):
    with pytest.raises(NotImplementedError, match=f"at most {mod.MAX_ONEPASS} columns on chip; got {cols}"):
        run_check("triton_onepass", 1, cols, "bf16")


def test_onepass_holds_the_longest_row():
    assert run_check("triton_onepass", 3, mod.MAX_ONEPASS, "fp16").correct


def test_one_column_is_all_ones():
    x = mod.make_inputs({"rows": 5, "cols": 1}, torch.bfloat16, "cpu", torch.Generator().manual_seed(0))["x"]
    for fn in ON_CPU:
        assert torch.equal(getattr(mod, fn)(x), torch.ones_like(x)), fn


# --- the two paths of triton_online, and its row barrier ---------------------------------------------


class Spy:
    """Stands in for a @triton.jit kernel: records `kernel[grid]` launches, then launches the real one."""

    def __init__(self, name: str, kernel, launches: list):
        self.name, self.kernel, self.launches = name, kernel, launches

    def __getitem__(self, grid):
        self.launches.append((self.name, grid))
        return self.kernel[grid]


@pytest.fixture
def launches(monkeypatch) -> list:
    seen: list = []
    for name in ("_onepass_kernel", "_streaming_rows_kernel", "_split_row_kernel"):
        monkeypatch.setattr(mod, name, Spy(name, getattr(mod, name), seen))
    return seen


LONG = mod.SPLIT_ABOVE + 1
CHUNKS = -(-LONG // CHUNK)


@pytest.mark.skipif(not mod.INTERPRETED, reason="the interpreter launches untuned kernels; compiled, the autotuners do")
@pytest.mark.parametrize("rows, cols, expected", [
    (37, mod.STREAM_ABOVE, [("_onepass_kernel", (19,))]),  # the row fits: one pass, 2 rows per program
    (3, mod.SPLIT_ABOVE, [("_streaming_rows_kernel", (3,))]),  # long but whole rows: streamed
    (3, LONG, [("_split_row_kernel", (3 * CHUNKS,))] * 2),  # split: statistics, then normalise
], ids=["one-pass", "streamed", "split"])
def test_online_path(launches, rows, cols, expected):
    c = run_check("triton_online", rows, cols, "bf16", seed_list=[rows])
    assert c.correct, c.error
    assert launches == expected


@pytest.mark.parametrize("rows, cols", [(1, 1), (5, 1000), (3, 1024)])
def test_row_barrier_in_one_launch(rows, cols):
    """PHASE 0, the GPU's path, with one program per row: the last (only) arriver zeroes the count and
    moves the generation, so that the next launch finds every barrier at rest."""
    x = mod.make_inputs({"rows": rows, "cols": cols}, torch.float32, "cpu", torch.Generator().manual_seed(rows))["x"]
    y = torch.full_like(x, float("nan"))
    m, s = torch.empty(rows), torch.empty(rows)
    barriers = torch.full((32 * rows,), 7 << 16, dtype=torch.int32)  # generation 7, nobody arrived
    for launch in (1, 2):
        mod._split_row_kernel[(rows,)](x, y, m, s, barriers, rows, cols, x.stride(0), CHUNK=1024, MAX_CHUNKS=1, PHASE=0)
        torch.testing.assert_close(y, torch.softmax(x, dim=-1))
        assert barriers[::32].tolist() == [(7 + launch) << 16] * rows  # one word per 128-byte line
        assert barriers.view(rows, 32)[:, 1:].eq(7 << 16).all()  # the rest of each line untouched


# --- the traffic model ------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_traffic_is_one_read_and_one_write(dtype):
    shape = {"rows": 37, "cols": 1128}
    n, b = 37 * 1128, torch.empty((), dtype=TORCH_DTYPES[dtype]).element_size()
    t = mod.traffic(shape, TORCH_DTYPES[dtype])
    moving = [(term.name, term.bytes) for term in t.terms if term.bytes]
    assert moving == [("read x", n * b), ("write y", n * b)]
    assert t.bytes == 2 * n * b
    assert t.flops == 5 * n  # max, subtract, exp, sum, scale: five per element


def test_traffic_matches_the_case_arithmetic_intensity():
    t = mod.traffic({"rows": 32768, "cols": 4096}, torch.bfloat16)
    assert t.flops / t.bytes == pytest.approx(CASE["bottleneck"]["arithmetic_intensity"])
