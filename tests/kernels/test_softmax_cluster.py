"""softmax_cluster without a GPU: the split of a row over a cluster, the CUDA source compiled by NVRTC for
sm_90a (no GPU needed), and cluster_bulk's dispatch. The kernel itself runs in
tests/kernels/test_softmax_fusion_gpu.py."""

from __future__ import annotations

import math

import pytest
import torch

from casebook.kernels import softmax_cluster as sc


@pytest.mark.parametrize("rows", [1, 7, 64, 256, 4096])
@pytest.mark.parametrize("cols,element_size", [(16392, 2), (32000, 2), (65536, 2), (128256, 2), (151936, 2),
                                               (262144, 2), (262144, 4), (300000, 2), (40000, 4)])
def test_plan_covers_every_row_with_nonempty_chunks_that_fit(rows, cols, element_size):
    p = sc.plan(rows, cols, element_size, sms=132)
    assert p is not None
    assert p.row_vecs * 16 == cols * element_size
    assert p.cluster * p.chunk_vecs >= p.row_vecs > (p.cluster - 1) * p.chunk_vecs  # no CTA left empty
    assert p.shared_bytes <= sc.CHUNK_BYTES and 1 <= p.cluster <= sc.MAX_CLUSTER
    if p.cluster > sc.PORTABLE_CLUSTER:  # only size forces a non-portable cluster
        assert p.cluster == math.ceil(cols * element_size / sc.CHUNK_BYTES)


def test_plan_splits_further_when_rows_are_few():
    assert sc.plan(4096, 32768, 2, sms=132).cluster == 1  # 64 KB rows, plenty of them
    few = sc.plan(64, 32000, 2, sms=132)
    assert few.cluster == 4 and few.chunk_vecs * 16 >= sc.MIN_CHUNK_BYTES  # 256 CTAs of 16 KB


@pytest.mark.parametrize("cols,element_size", [(65537, 2), (3, 4), (262144 * 2, 4), (0, 2)])
def test_plan_refuses_rows_it_cannot_split(cols, element_size):
    assert sc.plan(8, cols, element_size, sms=132) is None  # not whole 16-byte vectors, or over 1 MB


def test_unsupported_names_the_reason_on_a_cpu_tensor():
    assert sc.unsupported(torch.zeros(4, 32768)) == "needs a CUDA device"
    with pytest.raises(ValueError, match="needs a CUDA device"):
        sc.softmax(torch.zeros(4, 32768))


def test_source_compiles_for_hopper_without_a_gpu():
    pytest.importorskip("cuda.core", reason="cuda-core (the test extra) compiles the CUDA source")
    code = sc.compile_source("sm_90a")
    assert code.code[:4] == b"\x7fELF"  # a cubin, with the three dtypes' kernels in it
    symbols = code.code
    for name in (b"softmax_rowsILi0EE", b"softmax_rowsILi1EE", b"softmax_rowsILi2EE"):
        assert name in symbols


def test_cluster_bulk_gives_short_rows_to_triton_online_and_fails_long_ones_off_hopper(monkeypatch):
    from casebook.kernels import softmax_fusion as sf

    calls = []
    monkeypatch.setattr(sf, "triton_online", lambda x: calls.append(x.shape) or torch.softmax(x, -1))
    x = torch.randn(3, 16384, dtype=torch.bfloat16)  # 32 KB rows: not over the bound
    torch.testing.assert_close(sf.cluster_bulk(x), torch.softmax(x, -1))
    sf.cluster_bulk(torch.randn(3, 65537, dtype=torch.bfloat16))  # long, but not whole 16-byte vectors
    assert calls == [(3, 16384), (3, 65537)]
    with pytest.raises(ValueError, match="needs a CUDA device"):  # long and splittable: the cluster kernel
        sf.cluster_bulk(torch.randn(3, 16392, dtype=torch.bfloat16))
