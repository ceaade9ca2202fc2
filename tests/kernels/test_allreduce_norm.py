"""allreduce_norm: every variant that runs on a CPU, on two gloo ranks, at awkward shapes, against the float64
reference; the symmetric-memory variants skip with the reason (CUDA-only)."""

from __future__ import annotations

import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from casebook.kernels import allreduce_norm as k
from casebook.tolerance import TOLERANCE

CPU_VARIANTS = ["allreduce_separate", "allreduce_fused", "twoshot", "twoshot_fused"]
SYMMETRIC_MEMORY = ["oneshot", "oneshot_fused"]
SHAPES = [{"tokens": 1, "hidden": 1024}, {"tokens": 3, "hidden": 1000}, {"tokens": 7, "hidden": 1031},
          {"tokens": 33, "hidden": 2049}]
"""One row (fewer rows than ranks: one rank's shard is padding), odd and prime sizes, sizes just past a
power of two (a masked tail)."""


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(rank: int, port: int, dtypes: list[str], errors) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    from casebook.run.check import TORCH_DTYPES, upcast

    for dtype in dtypes:
        for shape in SHAPES:
            inputs = k.make_inputs(shape, TORCH_DTYPES[dtype], "cpu", torch.Generator().manual_seed(5))
            s_ref, y_ref = k.reference(**upcast(inputs))
            for name in CPU_VARIANTS:
                s, y = getattr(k, name)(**inputs)
                for got, want in ((s, s_ref), (y, y_ref)):
                    err = ((got.double() - want).norm() / want.norm()).item()
                    if not err <= TOLERANCE[dtype]:
                        errors.put(f"rank {rank} {name} {shape} {dtype}: relative error {err:.3g}")
    dist.destroy_process_group()


@pytest.mark.slow
def test_every_cpu_variant_on_two_gloo_ranks(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # the ranks import Triton with it set
    ctx = mp.get_context("spawn")
    errors = ctx.SimpleQueue()
    mp.start_processes(_rank, args=(_port(), ["fp32", "bf16"], errors), nprocs=2, start_method="spawn")
    found = []
    while not errors.empty():
        found.append(errors.get())
    assert not found, found


@pytest.mark.parametrize("name", SYMMETRIC_MEMORY)
def test_symmetric_memory_variants_skip_on_cpu_with_the_reason(name):
    if torch.cuda.is_available():
        pytest.skip("on a GPU these run in tests/kernels/test_allreduce_norm_gpu.py's place: the case's run")
    inputs = k.make_inputs(SHAPES[0], torch.float32, "cpu", torch.Generator().manual_seed(1))
    with pytest.raises(NotImplementedError, match="symmetric memory, which is CUDA-only"):
        getattr(k, name)(**inputs)


def test_traffic_counts_bus_bytes_and_the_norms_passes():
    t = k.traffic({"tokens": 64, "hidden": 8192}, torch.bfloat16)
    message = 64 * 8192 * 2
    terms = {term.name.split(",")[0].split(" (")[0]: term.bytes for term in t.terms}
    assert terms["all-reduce bus bytes"] == 0  # one rank outside a process group: 2(n-1)/n = 0
    assert t.bytes == 6 * message + 8192 * 2


def test_the_mlp_scenario_calls_the_kernel_with_this_ranks_partial():
    shape = {"tokens": 4, "hidden": 64, "ffn": 128}
    inputs = k.make_mlp_inputs(shape, torch.float32, "cpu", torch.Generator().manual_seed(2))
    seen = []

    def kernel(partials, r, w):
        seen.append(partials.shape)
        return k.reference(partials.double(), r.double(), w.double())

    out = k.tp_mlp(kernel, **inputs)
    assert seen == [torch.Size([1, 4, 64])] and out.shape == (4, 64) and torch.isfinite(out).all()
