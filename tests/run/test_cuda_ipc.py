"""casebook.run.cuda_ipc without a GPU: a handle's 64 bytes cross as hex whole, zero bytes included."""

from __future__ import annotations

import pytest

from casebook.run.cuda_ipc import CudaError, _Handle, handle_from_hex, handle_to_hex


def test_a_handle_crosses_whole_with_zero_bytes_inside():
    """The first H200 run lost every handle at its first zero byte (its field read as a value): the loans
    fell back to the host crossing."""
    raw = bytes([0, 1, 0, 2] * 16)
    handle = _Handle.from_buffer_copy(raw)
    assert handle_to_hex(handle) == raw.hex()
    assert bytes(handle_from_hex(raw.hex())) == raw


@pytest.mark.parametrize("text", ["00" * 63, "00" * 65, ""])
def test_a_handle_of_another_length_is_refused(text):
    with pytest.raises(CudaError, match="64 bytes"):
        handle_from_hex(text)
