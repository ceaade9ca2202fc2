"""The shared device helpers: seeded generators, the SM count off the GPU, the compile rung."""

import torch

from casebook.kernels import device


def test_on_device_is_seeded_by_the_parent_generator():
    a = device.on_device(torch.Generator().manual_seed(1), "cpu")
    b = device.on_device(torch.Generator().manual_seed(1), "cpu")
    c = device.on_device(torch.Generator().manual_seed(2), "cpu")
    assert torch.equal(torch.randn(4, generator=a), torch.randn(4, generator=b))
    assert not torch.equal(torch.randn(4, generator=device.on_device(torch.Generator().manual_seed(1), "cpu")),
                           torch.randn(4, generator=c))


def test_num_sms_off_the_gpu_is_the_interpreter_grid():
    assert device.num_sms(torch.empty(1)) == device.INTERPRETER_SMS


def test_compiled_keeps_the_function_and_builds_lazily():
    calls = []

    def double(x):
        calls.append(1)
        return x * 2

    f = device.compiled(double)
    assert f.__name__ == "double" and not calls  # nothing compiled at definition


def test_peer_says_why_it_cannot_run():
    import pytest

    with pytest.raises(NotImplementedError, match="no_such_peer is not installed"):
        device.peer("no_such_peer.ops", torch.empty(1), "a peer")
    with pytest.raises(NotImplementedError, match="a peer runs on a GPU only"):
        device.peer("torch.nn", torch.empty(1), "a peer")


def test_autotune_times_each_candidate_for_the_shorter_window(monkeypatch):
    import triton
    import triton.testing


    asked = []
    monkeypatch.setattr(triton.testing, "do_bench", lambda fn, **kw: asked.append(kw) or [1.0, 1.0, 1.0])

    @triton.jit
    def _noop(x_ptr, BLOCK: triton.language.constexpr):
        pass

    tuned = device.autotune([triton.Config({"BLOCK": 16}), triton.Config({"BLOCK": 32})], key=[])(_noop)
    assert tuned.do_bench(lambda: None, quantiles=(0.5, 0.2, 0.8)) == [1.0, 1.0, 1.0]
    assert asked == [{"warmup": device.TUNE_WARMUP_MS, "rep": device.TUNE_REP_MS, "quantiles": (0.5, 0.2, 0.8)}]
    assert device.TUNE_REP_MS < 100  # Triton's own default, which a fresh machine paid at every shape of a ladder
