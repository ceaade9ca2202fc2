"""Device memory one process allocates and another maps: the CUDA driver's IPC, through ctypes.

The parent allocates a block of its own (`cuMemAlloc`, outside torch's caching allocator, so that the handle
it gives out opens that block and nothing beside it), exports its IPC handle (64 bytes, crossing as hex) and
lends it to a child (`casebook.run.transport.Arena`); the child opens the handle and writes into it. Both sides
see the block as a uint8 torch tensor (through `__cuda_array_interface__`, no copy). torch's own CUDA sharing
(`torch.multiprocessing`) keeps a block alive until every consumer has said it is done, so a child killed
while it holds one would pin it in the parent for the rest of the run; here the parent frees what it lent
when it chooses. Only libcuda is needed: it is where the GPU is.
"""

from __future__ import annotations

import ctypes
from functools import cache

CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS = 1


class _Handle(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_char * 64)]


class CudaError(RuntimeError):
    pass


def handle_to_hex(handle: _Handle) -> str:
    """All 64 bytes of a handle (its `reserved` field read as a value would stop at the first zero byte)."""
    return bytes(handle).hex()


def handle_from_hex(text: str) -> _Handle:
    raw = bytes.fromhex(text)
    if len(raw) != ctypes.sizeof(_Handle):
        raise CudaError(f"an IPC handle is {ctypes.sizeof(_Handle)} bytes, not {len(raw)}")
    return _Handle.from_buffer_copy(raw)


@cache
def _driver():
    lib = ctypes.CDLL("libcuda.so.1")
    u64, ptr = ctypes.c_uint64, ctypes.POINTER(ctypes.c_uint64)
    for name, args in (("cuInit", [ctypes.c_uint]), ("cuDeviceGet", [ctypes.POINTER(ctypes.c_int), ctypes.c_int]),
                       ("cuDevicePrimaryCtxRetain", [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int]),
                       ("cuCtxSetCurrent", [ctypes.c_void_p]), ("cuMemAlloc_v2", [ptr, ctypes.c_size_t]),
                       ("cuMemFree_v2", [u64]), ("cuIpcGetMemHandle", [ctypes.POINTER(_Handle), u64]),
                       ("cuIpcOpenMemHandle_v2", [ptr, _Handle, ctypes.c_uint]), ("cuIpcCloseMemHandle", [u64]),
                       ("cuGetErrorName", [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)])):
        getattr(lib, name).argtypes = args
        getattr(lib, name).restype = ctypes.c_int
    _check(lib, lib.cuInit(0), "cuInit")
    return lib


def _check(lib, rc: int, what: str) -> None:
    if rc != 0:
        name = ctypes.c_char_p()
        lib.cuGetErrorName(rc, ctypes.byref(name))
        raise CudaError(f"{what}: {(name.value or b'').decode() or rc}")


def _current_context(lib) -> None:
    """The device torch uses, its primary context current on this thread (the one torch's kernels run in)."""
    import torch

    torch.cuda.init()
    dev, ctx = ctypes.c_int(), ctypes.c_void_p()
    _check(lib, lib.cuDeviceGet(ctypes.byref(dev), torch.cuda.current_device()), "cuDeviceGet")
    _check(lib, lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev.value), "cuDevicePrimaryCtxRetain")
    _check(lib, lib.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")


class _Interface:
    """A device pointer as `__cuda_array_interface__`, for `torch.as_tensor` to view without a copy."""

    def __init__(self, ptr: int, nbytes: int):
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (ptr, False), "version": 2}


class Block:
    """A block of device memory: allocated here (`allocate`) or opened from another process's handle (`open`)."""

    def __init__(self, ptr: int, nbytes: int, owned: bool):
        import torch

        self.ptr, self.nbytes, self.owned = ptr, nbytes, owned
        self.tensor = torch.as_tensor(_Interface(ptr, nbytes), device="cuda") if nbytes else torch.empty(
            0, dtype=torch.uint8, device="cuda")

    @classmethod
    def allocate(cls, nbytes: int) -> "Block":
        lib = _driver()
        _current_context(lib)
        ptr = ctypes.c_uint64()
        _check(lib, lib.cuMemAlloc_v2(ctypes.byref(ptr), max(nbytes, 1)), "cuMemAlloc")
        return cls(ptr.value, nbytes, owned=True)

    @classmethod
    def open(cls, handle_hex: str, nbytes: int) -> "Block":
        lib = _driver()
        _current_context(lib)
        handle, ptr = handle_from_hex(handle_hex), ctypes.c_uint64()
        _check(lib, lib.cuIpcOpenMemHandle_v2(ctypes.byref(ptr), handle, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS),
               "cuIpcOpenMemHandle")
        return cls(ptr.value, nbytes, owned=False)

    def handle_hex(self) -> str:
        lib = _driver()
        handle = _Handle()
        _check(lib, lib.cuIpcGetMemHandle(ctypes.byref(handle), self.ptr), "cuIpcGetMemHandle")
        return handle_to_hex(handle)

    def close(self) -> None:
        """Free the block (its owner) or unmap it (a process that opened it); every view of it is void after."""
        if self.ptr is None:
            return
        import torch

        torch.cuda.synchronize()
        lib = _driver()
        if self.owned:
            _check(lib, lib.cuMemFree_v2(self.ptr), "cuMemFree")
        else:
            _check(lib, lib.cuIpcCloseMemHandle(self.ptr), "cuIpcCloseMemHandle")
        self.ptr, self.tensor = None, None


@cache
def unavailable() -> str | None:
    """Why device memory cannot be lent here (None: it can): no driver, or a block that exports no handle."""
    try:
        block = Block.allocate(2**20)
        try:
            block.handle_hex()
        finally:
            block.close()
    except (OSError, CudaError, RuntimeError, AttributeError) as e:
        return f"{type(e).__name__}: {e}"
    return None
