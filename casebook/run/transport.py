"""The crossing: how the tensors a child computed reach the parent that judges them, as data.

A child's answer is a JSON header and the raw bytes of the tensors it names (`split`, `receive`; `encode` and
`decode` for an answer written to a file), their types and shapes checked against their lengths: a child that
writes its own bytes can send wrong numbers, which the parent judges, never code. Nothing it sends is
unpickled. A tensor's bytes take one of two crossings, which the run's code does not tell apart:

- **host**: down the pipe, a frame a tensor, or at a megabyte or more through a file of the child's own in
  shared memory (`Spill`), which the parent reads once and deletes. A GPU's tensor is copied to the host first.
- **device**: through memory the parent owns and lends the child for one request (`Arena`): on a GPU, device
  memory shared by CUDA IPC (`casebook.run.cuda_ipc`), so a GPU's outputs and the reference's answers never leave
  the device. The child copies its tensors in and names each by its offset; the parent checks every offset
  against the room it lent and copies the bytes into memory of its own. The child never receives a handle it
  could read anything else through: the arena is an allocation of its own, cleared before it is lent to
  another child, and it never holds an answer. On a CPU the arena is a file in shared memory (`HostMemory`):
  the same protocol, which the tests exercise without a GPU.

The room a request may fill is the parent's to set (`Arena.lend`): a variant's child gets what its kept calls'
outputs need at the reference's shapes and dtype; a tensor that does not fit is not sent (`Unsent`, with why),
and its check fails. A growable loan (the reference's child, whose answers' size only it knows) may ask for
more room first (`NeedRoom`). Which crossing a run used, and why, is part of its result.
"""

from __future__ import annotations

import gc
import json
import mmap
import os
import re
import secrets
import stat
import struct
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from casebook.run import cuda_ipc
from casebook.run.hardware import device_memory_bytes

MAX_MESSAGE = 16 * 2**30
"""The most bytes of tensors the parent reads through the host (outputs of a large GEMM in float64 fit)."""

MAX_HEADER = 64 * 2**20
"""The largest header frame the parent reads (the data of a message, its tensors apart)."""

SPILL_BYTES = 2**20
"""Tensors of this many bytes or more cross the host through a file in shared memory (`Spill`), smaller ones
down the pipe."""

SPILL_ENV = "CASEBOOK_SPILL_DIR"
"""Overrides the spill directory (default /dev/shm); empty: everything down the pipe."""

TRANSPORT_ENV = "CASEBOOK_TRANSPORT"
"""`host` keeps every tensor on the host crossing (a GPU run too); `device` lends an arena on a CPU as well
(shared host memory: the device crossing's protocol, without a GPU). Unset: the device crossing on a GPU."""

ALIGN = 512
"""Each tensor in an arena starts at a multiple of this many bytes (any dtype's view of it is aligned)."""

TENSOR_DTYPES = ("float64", "float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2", "int64", "int32",
                 "int16", "int8", "uint8", "bool")
"""The tensor element types a message may hold."""


class BadMessage(ValueError):
    """A child's answer that is not in the format, or names bytes it was not lent."""


class NeedRoom(Exception):
    """In the child: a growable loan is too small for the answer's tensors; `bytes` is the room they need."""

    def __init__(self, needed: int):
        super().__init__(f"{needed} bytes needed")
        self.bytes = needed


@dataclass(frozen=True)
class Unsent:
    """In the parent: a tensor the child did not send (no room for it in what it was lent), and why."""

    reason: str
    dtype: str
    shape: tuple

    def __str__(self) -> str:
        return f"a {self.dtype} tensor of shape {list(self.shape)} was not sent: {self.reason}"


def aligned(n: int) -> int:
    """`n` bytes rounded up to a whole `ALIGN`."""
    return -(-n // ALIGN) * ALIGN


def _is_tensor(x) -> bool:
    return type(x).__module__.startswith("torch") and type(x).__name__ == "Tensor"


def _dtype_name(t) -> str:
    return str(t.dtype).removeprefix("torch.")


# --- the child's side ------------------------------------------------------------------------------------


def _tensors(x):
    """Every tensor in a message's data (dicts, lists and tuples), in order."""
    if _is_tensor(x):
        yield x
    elif isinstance(x, dict):
        for v in x.values():
            yield from _tensors(v)
    elif isinstance(x, (list, tuple)):
        for v in x:
            yield from _tensors(v)


def _pack(x, leaf):
    """A message's data with each tensor replaced by `leaf(tensor)`: dicts' keys as strings, tuples as lists.
    (The walkers are functions of the module, not closures that call themselves: such a closure is a reference
    cycle, and it held every tensor of a message, its host copies too, until the cycle collector ran.)"""
    if _is_tensor(x):
        return leaf(x)
    if isinstance(x, dict):
        return {str(k): _pack(v, leaf) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_pack(v, leaf) for v in x]
    return x


def _unpack(x, leaf):
    """A header's data with each dict that `leaf` makes something of (a tensor's marker) replaced by that."""
    if isinstance(x, dict):
        made = leaf(x)
        return made if made is not None else {k: _unpack(v, leaf) for k, v in x.items()}
    if isinstance(x, list):
        return [_unpack(v, leaf) for v in x]
    return x


def split(payload: Any, spill: "Spill | None" = None, outbox: "Outbox | None" = None) -> tuple[bytes, list]:
    """`payload` as its JSON header and the bytes to send down the pipe after it. Each tensor is replaced in the
    header by {"__tensor__": index, "dtype", "shape"}, and its bytes go into `outbox` (the arena lent for this
    request, where the tensor is on the arena's device), else into a file of `spill`'s (large ones), else down
    the pipe as buffers over a CPU copy. A tensor for the arena that does not fit is replaced by
    {"__unsent__": why, "dtype", "shape"}; with a growable loan, NeedRoom is raised first, before any is copied."""
    found = list(_tensors(payload))
    lent = outbox is not None and any(outbox.takes(t) for t in found)
    if lent and outbox.grow:
        needed = sum(aligned(t.numel() * t.element_size()) for t in found if outbox.takes(t))
        if needed > outbox.room:
            raise NeedRoom(needed)
    blobs: list = []
    files: list = []
    offsets: list = []
    sizes: list[int] = []

    def leaf(t):
        t = t.detach()
        if lent and outbox.takes(t):
            try:
                offset = outbox.put(t)
            except NoRoom as e:
                return {"__unsent__": str(e), "dtype": _dtype_name(t), "shape": list(t.shape)}
            blobs.append(b"")
            files.append(None)
            offsets.append(offset)
            sizes.append(t.numel() * t.element_size())
        else:
            t = t.cpu().contiguous()
            raw = t.reshape(-1).view(__import__("torch").uint8).numpy() if t.numel() else b""
            name = spill.write(raw) if spill is not None else None
            blobs.append(b"" if name else raw)
            files.append(name)
            offsets.append(None)
            sizes.append(len(raw))
        return {"__tensor__": len(blobs) - 1, "dtype": _dtype_name(t), "shape": list(t.shape)}

    head = {"body": _pack(payload, leaf), "blobs": sizes}
    if any(files):
        head["files"] = files
    if any(o is not None for o in offsets):
        outbox.settle()  # every copy into the arena done before the header that names it leaves
        head["lent"] = {"arena": outbox.id, "offsets": offsets}
    pipe = [b for b, f, o in zip(blobs, files, offsets) if f is None and o is None]
    return json.dumps(head).encode(), pipe


def send(conn, payload: Any) -> None:
    """`payload` down `conn`: its header, then each tensor's bytes straight from its CPU copy (an output of
    a gigabyte crosses once, not copied into one message first)."""
    send_frames(conn, *split(payload))


def send_frames(conn, header: bytes, blobs: list) -> None:
    """The header frame, then a frame for each tensor that crosses down the pipe."""
    conn.send_bytes(header)
    for b in blobs:
        conn.send_bytes(b)


class LoanLost(Exception):
    """In the child: the loan it holds was closed there (by the variant: the harness never closes a loan in use)."""


class NoRoom(Exception):
    """In the child: a tensor does not fit in what is left of the loan (the message says how much)."""


class Outbox:
    """In the child: the arena lent for one request. Each tensor takes an `ALIGN`ed span of it, the first gap
    that holds it: copied in when the answer is sent (`put`), or earlier, when a kept call's output is snapshot
    (`hold`), so that the snapshot is the copy the parent reads and is not copied again (the child held each
    kept output twice, as a snapshot and in the arena: 26 GB at the cross-entropy case's largest point)."""

    def __init__(self, memory, grant: dict):
        self.memory, self.id = memory, grant["id"]
        self.room, self.grow = int(grant["room"]), bool(grant.get("grow"))
        self.device = memory.device
        self.spans: dict[int, int] = {}
        """The spans taken now, offset: bytes."""

    def takes(self, t) -> bool:
        return t.device.type == self.device

    def _place(self, n: int) -> int:
        at = 0
        for offset in sorted(self.spans):
            if aligned(at) + n <= offset:
                break
            at = max(at, offset + self.spans[offset])
        at = aligned(at)
        if at + n > self.room:
            raise NoRoom(f"{n} bytes, more than the {max(0, self.room - sum(self.spans.values()))} left of the "
                         f"{self.room} the task allows for its outputs")
        self.spans[at] = n
        return at

    def _view(self, at: int, t):
        return self.memory.tensor[at:at + t.numel() * t.element_size()].view(t.dtype).view(t.shape)

    def held(self, t) -> int | None:
        """The offset of `t` where it is a tensor `hold` made and has not released; else None."""
        tensor = getattr(self.memory, "tensor", None)
        if tensor is None or not self.takes(t):
            return None
        at = t.data_ptr() - tensor.data_ptr()
        return at if self.spans.get(at) == t.numel() * t.element_size() and t.is_contiguous() else None

    def put(self, t) -> int:
        """Copy `t` in (a tensor `hold` made is there already); its offset. NoRoom where no gap left in the loan
        holds it."""
        at = self.held(t)
        if at is not None:
            return at
        n = t.numel() * t.element_size()
        if not n:  # nothing to copy: it needs no room
            return 0
        at = self._place(n)
        self._view(at, t).copy_(t)
        return at

    def hold(self, t):
        """A copy of `t` in the loan, its span kept until `release`: None where it cannot be (not on the loan's
        device, empty, a growable loan, no gap left that holds it, the memory unmapped)."""
        n = t.numel() * t.element_size()
        if self.grow or not n or not self.takes(t) or getattr(self.memory, "tensor", None) is None:
            return None
        try:
            at = self._place(n)
        except NoRoom:
            return None
        view = self._view(at, t)
        view.copy_(t)
        return view

    def release(self, t) -> None:
        """The span of a tensor `hold` made, free again (the call it kept was dropped from the sample)."""
        at = self.held(t)
        if at is not None:
            del self.spans[at]

    def settle(self) -> None:
        self.memory.settle()


_opened: dict = {}
"""In the child: the memory of the loan it holds now ({"key": ..., "memory": ...}), kept across requests."""


def open_loan(grant: dict | None) -> Outbox | None:
    """In the child: the outbox for a request's loan (the same memory as the last request's when it is the same
    loan; the old one closed when it is not). None without a loan. The parent is trusted: its grant is not
    checked here."""
    if not grant:
        return None
    key = (grant["kind"], grant["name"], grant["bytes"])
    if _opened.get("key") == key and getattr(_opened.get("memory"), "tensor", None) is None:
        _opened.clear()  # this answer is refused; the next request maps its loan afresh
        raise LoanLost("the memory lent for its answers was unmapped in the child before they were copied in")
    if _opened.get("key") != key:
        _unmap()
        _opened.update(key=key, memory=MEMORY[grant["kind"]].open(grant))
    outbox = _opened.get("outbox")
    if outbox is None or outbox.id != grant["id"] or outbox.memory is not _opened["memory"]:
        outbox = _opened["outbox"] = Outbox(_opened["memory"], grant)
    return outbox


def close_loan(grant: dict | None) -> None:
    """In the child, once it has answered: the memory of a loan lent once (`Arena.lend`) unmapped, so that the
    parent's freeing it gives it back to the device."""
    if grant and grant.get("once") and _opened.get("key") == (grant["kind"], grant["name"], grant["bytes"]):
        _unmap()


def _unmap() -> None:
    """In the child: the loan it holds mapped, closed and forgotten."""
    memory = _opened.pop("memory", None)
    _opened.clear()
    if memory is not None:
        memory.close()


_serving: list = [None]


def serving(outbox: "Outbox | None") -> None:
    """In the child: the loan of the request it serves now (None between requests, or without one), where a
    kept call's outputs are snapshot (`lent`)."""
    _serving[0] = outbox


def lent() -> "Outbox | None":
    """In the child: the loan of the request being served, or None."""
    return _serving[0]


# --- the parent's side -----------------------------------------------------------------------------------


def _header(raw: bytes) -> tuple[Any, list[int], list, dict | None]:
    try:
        head = json.loads(raw)
        sizes = [int(s) for s in head["blobs"]]
        files = head.get("files") or [None] * len(sizes)
        lent = head.get("lent")
    except (ValueError, KeyError, TypeError) as e:
        raise BadMessage(f"unreadable header: {e}") from None
    if any(s < 0 for s in sizes):
        raise BadMessage("a negative tensor length")
    if not isinstance(files, list) or len(files) != len(sizes):
        raise BadMessage("the spilled files do not match the tensors")
    if lent is not None and not (isinstance(lent, dict) and isinstance(lent.get("offsets"), list)
                                 and len(lent["offsets"]) == len(sizes)):
        raise BadMessage("the lent memory's offsets do not match the tensors")
    return head.get("body"), sizes, files, lent


def _rebuild(body: Any, blobs: list) -> Any:
    """The message's data with each tensor rebuilt from its bytes (a uint8 tensor of the length the header
    declared) after its declared type and shape are checked against that length; a tensor not sent as an
    `Unsent`. Nothing in it is executed."""
    def leaf(x: dict):
        if "__unsent__" in x:
            reason, dtype, shape = x["__unsent__"], x.get("dtype"), x.get("shape")
            if (not isinstance(reason, str) or dtype not in TENSOR_DTYPES or not isinstance(shape, list)
                    or not all(isinstance(d, int) and d >= 0 for d in shape)):
                raise BadMessage("malformed unsent tensor")
            return Unsent(reason[:300], dtype, tuple(shape))
        if "__tensor__" not in x:
            return None
        import torch

        i, dtype, shape = x["__tensor__"], x.get("dtype"), x.get("shape")
        if (not isinstance(i, int) or not 0 <= i < len(blobs) or dtype not in TENSOR_DTYPES
                or not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape)):
            raise BadMessage("malformed tensor")
        dt = getattr(torch, dtype)
        numel = 1
        for d in shape:
            numel *= d
        if numel * torch.empty((), dtype=dt).element_size() != blobs[i].numel():
            raise BadMessage(f"tensor {i}: {blobs[i].numel()} bytes for {dtype} {shape}")
        if numel == 0:
            return torch.empty(shape, dtype=dt, device=blobs[i].device)
        return blobs[i].view(dt).reshape(shape)

    return _unpack(body, leaf)


def receive(conn, deadline: float, limit: int = MAX_MESSAGE, token: str = "", arena: "Arena | None" = None) -> Any:
    """A message of `split` from `conn`, every frame by `deadline` (`time.monotonic()`, else TimeoutError).

    Each tensor down the pipe is read straight into memory of the length its header declared, all of them at
    most `limit` bytes; a spilled one from its file, which must be the child's (`token`) and of that length,
    deleted once read; one in the arena must lie in the room `arena` lent for this request, apart from every
    other, and is copied into memory of the parent's own. BadMessage where the frames disagree with the header
    or name bytes that were not lent. EOFError / OSError where the child is gone."""

    def frame_ready():
        if not conn.poll(max(0.0, deadline - time.monotonic())):
            raise TimeoutError

    frame_ready()
    body, sizes, files, lent = _header(conn.recv_bytes(MAX_HEADER))
    offsets = lent["offsets"] if lent else [None] * len(sizes)
    if lent:
        if arena is None:
            raise BadMessage("names lent memory, but none was lent")
        arena.check(lent.get("arena"), [(o, s) for o, s in zip(offsets, sizes) if o is not None])
    if sum(s for s, o in zip(sizes, offsets) if o is None) > limit:
        raise BadMessage(f"{sum(sizes)} bytes of tensors, over the limit of {limit}")
    blobs = []
    for s, name, offset in zip(sizes, files, offsets):
        import torch

        if offset is not None:
            blobs.append(arena.take(offset, s))
            continue
        buf = torch.empty(s, dtype=torch.uint8)  # not zeroed: the bytes are read straight into it
        if name is not None:
            _read_spilled(name, buf, token)
            blobs.append(buf)
            continue
        frame_ready()
        try:
            got = conn.recv_bytes_into(buf.numpy()) if s else len(conn.recv_bytes(1))
        except __import__("multiprocessing").BufferTooShort:
            raise BadMessage("a tensor frame longer than its header says") from None
        if got != s:
            raise BadMessage(f"a tensor frame of {got} bytes where its header says {s}")
        blobs.append(buf)
    return _rebuild(body, blobs)


# --- an answer written to a file (a rank's) --------------------------------------------------------------


def encode(payload: Any) -> bytes:
    """`payload` (JSON data, with torch tensors anywhere in it) as one message: an 8-byte header length, the
    header, then the tensors' bytes."""
    header, blobs = split(payload)
    return struct.pack("<Q", len(header)) + header + b"".join(bytes(b) for b in blobs)


def decode(data: bytes) -> Any:
    """A message of `encode` back as data."""
    if len(data) < 8:
        raise BadMessage("message too short")
    (n,) = struct.unpack("<Q", data[:8])
    if n > len(data) - 8:
        raise BadMessage("header longer than the message")
    body, sizes, files, lent = _header(data[8:8 + n])
    if any(files) or lent:
        raise BadMessage("a message of a file names spilled or lent tensors")
    if sum(sizes) != len(data) - 8 - n:
        raise BadMessage("tensor bytes do not add up to the message")
    import torch

    blobs, at = [], 8 + n
    for s in sizes:
        raw = bytearray(data[at:at + s])
        blobs.append(torch.frombuffer(raw, dtype=torch.uint8) if s else torch.empty(0, dtype=torch.uint8))
        at += s
    return _rebuild(body, blobs)


# --- the host crossing: files in shared memory -----------------------------------------------------------


class Spill:
    """Where a child puts the bytes of a large tensor: a file of its own in shared memory (`spill_dir`),
    named after the child's token, which the parent reads in one call and deletes. A gigabyte output
    crosses at memory speed, where a pipe read in Python's chunks takes seconds. Without room there, the
    tensor goes down the pipe."""

    def __init__(self, token: str, directory: str | None = None):
        self.token, self.dir = token, directory if directory is not None else spill_dir()
        self.n = 0

    def write(self, raw) -> str | None:
        size = len(raw)
        if not self.dir or size < SPILL_BYTES:
            return None
        try:
            st = os.statvfs(self.dir)
            if st.f_bavail * st.f_frsize < 2 * size:  # a full tmpfs kills the writer (SIGBUS): keep room
                return None
            self.n += 1
            name = f"casebook-{self.token}-{self.n}"
            fd = os.open(os.path.join(self.dir, name), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except OSError:
            return None
        with os.fdopen(fd, "wb") as f:
            f.write(memoryview(raw))
        return name


def spill_dir() -> str | None:
    """The shared-memory directory large tensors cross through, where this machine has one."""
    d = os.environ.get(SPILL_ENV, "/dev/shm")
    return d if d and os.path.isdir(d) and os.access(d, os.W_OK) else None


def clear_spill(token: str, directory: str | None = None) -> None:
    """Delete what a child (by its token) left in the spill directory: it died between writing and sending."""
    d = directory if directory is not None else spill_dir()
    if d and token:
        for path in Path(d).glob(f"casebook-{token}-*"):
            path.unlink(missing_ok=True)


def _read_spilled(name, buf, token: str) -> None:
    """A spilled tensor's bytes into `buf`: only a regular file of the child's own (by name, in the spill
    directory, no link followed) of exactly `buf`'s length; the file deleted."""
    d = spill_dir()
    if not (d and token and isinstance(name, str) and re.fullmatch(f"casebook-{token}-[0-9]+", name)):
        raise BadMessage(f"a spilled tensor names a file that is not this child's: {str(name)[:80]!r}")
    path = os.path.join(d, name)
    try:  # never blocks: a FIFO in the file's place opens at once, and is refused below
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as e:
        raise BadMessage(f"a spilled tensor's file cannot be read ({e.strerror})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise BadMessage("a spilled tensor's file is not a regular file")
        if st.st_nlink != 1:  # a hard link to a file of another's (another child's answers, say)
            raise BadMessage("a spilled tensor's file has another name too")
        if st.st_size != buf.numel():
            raise BadMessage(f"a spilled tensor's file holds {st.st_size} bytes where its header says {buf.numel()}")
        with os.fdopen(fd, "rb", closefd=False) as f:
            if buf.numel() and f.readinto(buf.numpy()) != buf.numel():
                raise BadMessage("a spilled tensor's file ended early")
    finally:
        os.close(fd)
        os.unlink(path)


# --- device memory between tasks ------------------------------------------------------------------------

GARBAGE_BYTES = 2**28
"""Device memory still allocated after a task, beyond what the process means to keep and what it holds for good,
above which the cycle collector runs before the cache is emptied."""

_standing = 0
"""Device memory this process held after its last full collection beyond what it meant to keep: its own for good
(the L2 flush buffer, the ceilings' buffers), which no collection frees, so no longer a reason for one."""


def give_back_device_memory(keeping: int = 0, collect: bool = True) -> None:
    """What this process's caching allocator keeps of the device memory its last task used, back to the device:
    the variant's child, the reference's child and the parent share one GPU and take turns on it. Tensors caught
    in a reference cycle live until the cycle collector runs, which a process that allocates little host memory
    seldom does: on the H200 the reference's child still held the answers of earlier tasks, a variant's child its
    inputs and outputs (34 GB at the softmax case's largest points), and the next process to allocate ran out of
    memory. Where more is still allocated than the `keeping` bytes the process means to hold (the parent's kept
    answers) and what it held after its last collection, the cycles go first (a full collection: 0.1 s, which the
    parent paid at every point while its standing memory was counted as garbage). Never imports torch: a process
    that has not used a GPU has nothing to give back. `collect=False`: the cache alone, mid-task, where what was let
    go died with its last reference and what is still allocated is the task's own, not a standing hold."""
    global _standing
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return
    if collect and torch.cuda.memory_allocated() > keeping + _standing + GARBAGE_BYTES:
        gc.collect()
        _standing = max(0, torch.cuda.memory_allocated() - keeping)
    torch.cuda.empty_cache()


# --- the device crossing: memory the parent lends ----------------------------------------------------------


class HostMemory:
    """Shared host memory: a file in the spill directory, mapped by the parent and by the child it is lent
    to. The device crossing's protocol on a machine without a GPU (`CASEBOOK_TRANSPORT=device`)."""

    kind, device = "host", "cpu"

    def __init__(self, nbytes: int, name: str | None = None, create: bool = True):
        import torch

        d = spill_dir() or "/tmp"
        self.name, self.nbytes = name or f"casebook-arena-{secrets.token_hex(8)}", nbytes
        self.path = os.path.join(d, self.name)
        fd = os.open(self.path, (os.O_RDWR | os.O_CREAT | os.O_EXCL) if create else (os.O_RDWR | os.O_NOFOLLOW),
                     0o600)
        try:
            if create:
                os.ftruncate(fd, max(nbytes, 1))
            self.map = mmap.mmap(fd, max(nbytes, 1))
        finally:
            os.close(fd)
        self.tensor = torch.frombuffer(self.map, dtype=torch.uint8)[:nbytes]
        self.owner = create

    def grant(self) -> dict:
        return {"kind": self.kind, "name": self.name, "bytes": self.nbytes}

    @classmethod
    def open(cls, grant: dict) -> "HostMemory":
        if not re.fullmatch(r"casebook-arena-[0-9a-f]+", str(grant["name"])):
            raise ValueError("not an arena's name")
        return cls(int(grant["bytes"]), grant["name"], create=False)

    def zero(self) -> None:
        self.tensor.zero_()

    def settle(self) -> None:
        pass

    def close(self) -> None:
        self.tensor = None
        try:
            self.map.close()
        except BufferError:  # a view of it still alive somewhere: the mapping goes with the process
            pass
        if self.owner:
            Path(self.path).unlink(missing_ok=True)


class CudaMemory:
    """Device memory of an allocation of its own (`cuda_ipc`), lent through a CUDA IPC handle."""

    kind, device = "cuda", "cuda"

    def __init__(self, nbytes: int, opened=None):
        self.nbytes = nbytes
        self.block = opened or cuda_ipc.Block.allocate(nbytes)
        self.tensor = self.block.tensor
        self.name = self.block.handle_hex() if opened is None else None

    def grant(self) -> dict:
        return {"kind": self.kind, "name": self.name, "bytes": self.nbytes}

    @classmethod
    def open(cls, grant: dict) -> "CudaMemory":
        return cls(int(grant["bytes"]), opened=cuda_ipc.Block.open(grant["name"], int(grant["bytes"])))

    def zero(self) -> None:
        self.tensor.zero_()
        self.settle()

    def settle(self) -> None:
        import torch

        torch.cuda.synchronize()

    def close(self) -> None:
        self.tensor = None
        self.block.close()


MEMORY = {"host": HostMemory, "cuda": CudaMemory}


KEEP_FRACTION = 0.05
"""Of the device's memory, how large an arena may be and still be kept from one request to the next. A larger one
is lent once (`Arena.lend`'s grant says so), the child unmaps it once it has answered, and the parent frees it once
it has taken what it judges (`Arena.after`): a run's largest points no longer leave their arenas standing. On an
H100 (80 GB) the softmax case's fresh run lost its six 131072 x 8192 points: the reference's child could not have
the 8 GB its float64 answer needed while the parent held 59 GB. With large arenas lent once the parent peaked at
44 GB (63 before, nvidia-smi every 0.5 s) and every point ran."""


class Arena:
    """Memory the parent owns and lends a child for one request at a time (`lend`), reused while it is large
    enough and replaced by a larger one when it is not; cleared before it is lent to another child. What the
    child names in it is checked against the loan (`check`) and copied out (`take`). One larger than `keep` bytes
    is lent for its request alone."""

    def __init__(self, memory: type, keep: int | None = None):
        self.memory_type, self.memory, self.retired = memory, None, []
        self.keep = keep
        self.loan: tuple[str, int] | None = None
        self.borrower = None
        self.taken = 0
        """Tensors copied out of the arena so far (a request whose tensors all crossed the host adds none)."""

    @property
    def device(self) -> str:
        return self.memory_type.device

    def lend(self, room: int, *, grow: bool = False, borrower: Any = None) -> dict:
        """A loan of `room` bytes to `borrower`: the grant the child opens. A growable loan (`grow`) is of all the
        arena holds, and the child may ask for more."""
        if self.memory is None or self.memory.nbytes < room:
            fresh = self.memory_type(max(aligned(room), ALIGN))  # where it cannot be had, the arena is as it was
            if self.memory is not None:
                self.retired.append(self.memory)  # the child may still map it: freed once it has moved on
            self.memory = fresh
            self.memory.zero()  # fresh memory holds whatever its last owner left
            self.borrower = borrower
        elif borrower != self.borrower:
            self.memory.zero()  # nothing an earlier borrower left is readable by this one
            self.borrower = borrower
        if grow:
            room = self.memory.nbytes
        self.loan = (secrets.token_hex(8), room)
        return {"id": self.loan[0], **self.memory.grant(), "room": room, "grow": grow, "once": self._once()}

    def _once(self) -> bool:
        return self.keep is not None and self.memory is not None and self.memory.nbytes > self.keep

    def after(self) -> None:
        """A request ended (its tensors taken): memory the child has moved on from freed (`settle`), and an arena
        lent once freed with it."""
        if self._once():
            self.retired.append(self.memory)
            self.memory, self.loan, self.borrower = None, None, None
        self.settle()

    def check(self, arena_id, spans: list[tuple]) -> None:
        """The (offset, length) spans a message names in the loan: each inside its room, none overlapping."""
        if self.loan is None or arena_id != self.loan[0]:
            raise BadMessage("names memory that was not lent to it for this request")
        room, end = self.loan[1], 0
        for offset, size in sorted(spans, key=lambda s: (s[0], s[1]) if isinstance(s[0], int) else (-1, 0)):
            if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
                raise BadMessage(f"a lent tensor's offset is not a byte offset: {str(offset)[:40]}")
            if offset + size > room:
                raise BadMessage(f"a lent tensor of {size} bytes at {offset} lies outside the {room} bytes lent")
            if offset < end:
                raise BadMessage("two lent tensors share bytes")
            end = offset + size

    def take(self, offset: int, size: int):
        """A copy, in the parent's own memory on the arena's device, of `size` bytes at `offset`."""
        self.taken += 1
        return self.memory.tensor[offset:offset + size].clone()

    def settle(self) -> None:
        """Free the memory a child has moved on from (it answered a request with a newer loan, or it ended)."""
        for memory in self.retired:
            memory.close()
        self.retired = []

    def close(self) -> None:
        self.settle()
        if self.memory is not None:
            self.memory.close()
        self.memory, self.loan, self.borrower = None, None, None


def keep_bytes(device: str) -> int:
    """`KEEP_FRACTION` of `device`'s memory (`hardware.device_memory_bytes`)."""
    return int(KEEP_FRACTION * device_memory_bytes(device))


def arena_for(device: str) -> tuple["Arena | None", str]:
    """The arena a child on `device` is lent, and the crossing in words: the device's own memory on a GPU
    (CUDA IPC), none (the host crossing) on a CPU or where `CASEBOOK_TRANSPORT=host`, shared host memory where
    `CASEBOOK_TRANSPORT=device` on a CPU. Where a GPU's memory cannot be shared, the host crossing, and why."""
    choice = os.environ.get(TRANSPORT_ENV, "")
    if choice == "host":
        return None, f"host ({TRANSPORT_ENV}=host)"
    if device == "cuda":
        if why := cuda_ipc.unavailable():
            return None, f"host: device memory cannot be shared here ({why})"
        return Arena(CudaMemory, keep_bytes(device)), "device: CUDA IPC, outputs and answers never leave the GPU"
    if choice == "device":
        return (Arena(HostMemory, keep_bytes(device)),
                f"device protocol over shared host memory ({TRANSPORT_ENV}=device)")
    return None, "host: pipe, and shared-memory files for large tensors"


# --- a checksum for bytes that must not change ------------------------------------------------------------

DIGEST_BLOCK = 4096
"""32-bit words a block of the checksum (16 KiB): the blocks' sums are weighted by their position."""

_DIGEST_MOD = 2**27 - 39
"""Block sums are reduced modulo this before they are weighted: every product and sum stays exact in int64."""


def digest(t) -> list[int]:
    """A checksum of a tensor's bytes, on its own device in one pass: the sum of its 32-bit words, and the sum
    of each 16 KiB block's sum weighted by the block's position (exact integer arithmetic: the same bytes give
    the same two numbers on any device). A kept output's is taken when it is copied, and again where it is
    judged: bytes written after the copy, before the judge's own copy, show (`judge`)."""
    import torch

    b = torch.Tensor.contiguous(torch.Tensor.detach(t)).reshape(-1).view(torch.uint8)
    if b.storage_offset() % 4:
        b = torch.Tensor.clone(b)
    n = b.numel()
    whole = n // 4 // DIGEST_BLOCK * DIGEST_BLOCK
    words = b[:whole * 4].view(torch.int32).view(-1, DIGEST_BLOCK) if whole else b[:0].view(torch.int32).view(0, 1)
    blocks = words.sum(dim=1, dtype=torch.int64)
    tail = b[whole * 4:].to(torch.int64)
    weights = torch.arange(1, blocks.numel() + 1, device=b.device, dtype=torch.int64) % 65521 + 1
    total = blocks.sum() + tail.sum()
    weighted = ((blocks % _DIGEST_MOD) * weights).sum() + (tail * 7).sum()
    return [n, *torch.stack([total, weighted]).tolist()]  # one wait for the device, not four
