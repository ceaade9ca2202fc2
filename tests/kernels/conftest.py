"""What every kernel test shares: on a GPU, each test hands back the memory torch's allocator cached for it, so
that the GPU-only tests spread over several processes on one card (`pytest -n`) do not each hold the largest
test's blocks for the rest of the session."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def _release_cached_gpu_memory():
    yield
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
