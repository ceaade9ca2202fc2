"""What the kernel tests share on a GPU, where the GPU-only tests run spread over several processes on one card
(`pytest -n 8 --dist loadgroup`): each test hands back the memory torch's allocator cached for it, and the tests
whose float64 reference needs gigabytes run one after another in one process (the `large_memory` group), so
that no two of them meet on the card. Eight processes at once ran 16 of them out of memory on an 80 GB H100.

A test module says which of its tests those are with a function `large_memory(**params) -> bool`, called
with each test's parameters."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def _release_cached_gpu_memory():
    yield
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def pytest_collection_modifyitems(config, items):
    if not config.pluginmanager.hasplugin("xdist"):
        return
    for item in items:
        large = getattr(item.module, "large_memory", None)
        if large is not None and hasattr(item, "callspec") and large(**item.callspec.params):
            item.add_marker(pytest.mark.xdist_group("large_memory"))
