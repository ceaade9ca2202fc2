"""Run tasks in child processes the parent does not trust: a crash, a hang, an out-of-memory, a forged
message or a process left behind is contained.

A child (`Worker`) answers one request at a time. What it sends back is data, never code: a JSON header
and the raw bytes of the tensors it names (`encode`, `decode`), so a child that writes its own bytes into
the pipe can at worst send wrong numbers, which the parent judges; it cannot make the parent unpickle.
The child runs in its own process group and dies with its parent (PR_SET_PDEATHSIG); when it ends, or
is killed for overrunning its limit, its whole group is killed, and so is every process that still
carries its token in its environment (a grandchild that left the group), so nothing it started lives on
to rewrite files later. Its standard output goes to standard error: `casebook run --json` stays JSON.
"""

from __future__ import annotations

import ctypes
import json
import multiprocessing as mp
import os
import re
import secrets
import signal
import stat
import struct
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable

_ctx = mp.get_context("spawn")

TOKEN_ENV = "CASEBOOK_WORKER_TOKEN"
"""Set in every child's environment to a fresh random token: what its leftover descendants are found by."""

MAX_MESSAGE = 16 * 2**30
"""The largest answer the parent reads (outputs of a large GEMM in float64 fit); a longer one is a crash."""

SPILL_BYTES = 2**20
"""Tensors of this many bytes or more cross through a file in shared memory (`Spill`), smaller ones down the pipe."""

SPILL_ENV = "CASEBOOK_SPILL_DIR"
"""Overrides the spill directory (default /dev/shm); empty: everything down the pipe."""

MAX_HEADER = 64 * 2**20
"""The largest header frame the parent reads (the data of a message, its tensors apart)."""

TENSOR_DTYPES = ("float64", "float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2", "int64", "int32",
                 "int16", "int8", "uint8", "bool")
"""The tensor element types a message may hold."""


# --- the message format ------------------------------------------------------------------------------


def _split(payload: Any, spill: "Spill | None" = None) -> tuple[bytes, list]:
    """`payload` as its JSON header (each tensor replaced by {"__tensor__": index, "dtype", "shape"}, the
    byte length of each listed) and the tensors' bytes, as buffers over CPU copies (no further copy). With
    `spill`, a large tensor's bytes go to a file of its own instead (`Spill`), named in the header."""
    blobs: list = []
    files: list = []
    sizes: list[int] = []

    def walk(x):
        if type(x).__module__.startswith("torch") and type(x).__name__ == "Tensor":
            t = x.detach().cpu().contiguous()
            raw = t.reshape(-1).view(__import__("torch").uint8).numpy() if t.numel() else b""
            name = spill.write(raw) if spill is not None else None
            blobs.append(b"" if name else raw)
            files.append(name)
            sizes.append(len(raw))
            return {"__tensor__": len(blobs) - 1, "dtype": str(t.dtype).removeprefix("torch."),
                    "shape": list(t.shape)}
        if isinstance(x, dict):
            return {str(k): walk(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [walk(v) for v in x]
        return x

    head = {"body": walk(payload), "blobs": sizes}
    if any(files):
        head["files"] = files
    return json.dumps(head).encode(), [b for b, f in zip(blobs, files) if not f]


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


def encode(payload: Any) -> bytes:
    """`payload` (JSON data, with torch tensors anywhere in it) as one message: an 8-byte header length, the
    header, then the tensors' bytes (a rank's answer written to a file)."""
    header, blobs = _split(payload)
    return struct.pack("<Q", len(header)) + header + b"".join(bytes(b) for b in blobs)


class BadMessage(ValueError):
    """A child's answer that is not in the format."""


def _header(raw: bytes) -> tuple[Any, list[int], list]:
    try:
        head = json.loads(raw)
        sizes = [int(s) for s in head["blobs"]]
        files = head.get("files") or [None] * len(sizes)
    except (ValueError, KeyError, TypeError) as e:
        raise BadMessage(f"unreadable header: {e}") from None
    if any(s < 0 for s in sizes):
        raise BadMessage("a negative tensor length")
    if not isinstance(files, list) or len(files) != len(sizes):
        raise BadMessage("the spilled files do not match the tensors")
    return head.get("body"), sizes, files


def _rebuild(body: Any, blobs: list) -> Any:
    """The message's data with each tensor rebuilt from its bytes (a uint8 tensor of the length the header
    declared) after its declared type and shape are checked against that length. Nothing in it is
    executed."""
    torch = None

    def walk(x):
        nonlocal torch
        if isinstance(x, dict):
            if "__tensor__" in x:
                if torch is None:
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
                    return torch.empty(shape, dtype=dt)
                return blobs[i].view(dt).reshape(shape)
            return {k: walk(v) for k, v in x.items()}
        if isinstance(x, list):
            return [walk(v) for v in x]
        return x

    return walk(body)


def decode(data: bytes) -> Any:
    """A message of `encode` back as data."""
    if len(data) < 8:
        raise BadMessage("message too short")
    (n,) = struct.unpack("<Q", data[:8])
    if n > len(data) - 8:
        raise BadMessage("header longer than the message")
    body, sizes, files = _header(data[8:8 + n])
    if any(files):
        raise BadMessage("a message of a file names spilled tensors")
    if sum(sizes) != len(data) - 8 - n:
        raise BadMessage("tensor bytes do not add up to the message")
    import torch

    blobs, at = [], 8 + n
    for s in sizes:
        raw = bytearray(data[at:at + s])
        blobs.append(torch.frombuffer(raw, dtype=torch.uint8) if s else torch.empty(0, dtype=torch.uint8))
        at += s
    return _rebuild(body, blobs)


# --- the pipe: a header frame, then a frame per tensor -------------------------------------------------


def send(conn, payload: Any) -> None:
    """`payload` down `conn`: its header, then each tensor's bytes straight from its CPU copy (an output of
    a gigabyte crosses once, not copied into one message first)."""
    _send(conn, *_split(payload))


def _send(conn, header: bytes, blobs: list) -> None:
    """The header frame, then a frame for each tensor not spilled."""
    conn.send_bytes(header)
    for b in blobs:
        conn.send_bytes(b)


def receive(conn, deadline: float, limit: int = MAX_MESSAGE, token: str = "") -> Any:
    """A message of `send` from `conn`, every frame by `deadline` (`time.monotonic()`, else TimeoutError):
    each tensor read straight into memory of the length its header declared, all of them at most `limit`
    bytes; a spilled one from its file, which must be the child's (`token`) and of that length, deleted once
    read. BadMessage where the frames disagree with the header. EOFError / OSError where the child is gone."""

    def frame_ready():
        if not conn.poll(max(0.0, deadline - time.monotonic())):
            raise TimeoutError

    frame_ready()
    body, sizes, files = _header(conn.recv_bytes(MAX_HEADER))
    if sum(sizes) > limit:
        raise BadMessage(f"{sum(sizes)} bytes of tensors, over the limit of {limit}")
    blobs = []
    for s, name in zip(sizes, files):
        import torch

        buf = torch.empty(s, dtype=torch.uint8)  # not zeroed: the bytes are read straight into it
        if name is not None:
            _read_spilled(name, buf, token)
            blobs.append(buf)
            continue
        frame_ready()
        try:
            got = conn.recv_bytes_into(buf.numpy()) if s else len(conn.recv_bytes(1))
        except mp.BufferTooShort:
            raise BadMessage("a tensor frame longer than its header says") from None
        if got != s:
            raise BadMessage(f"a tensor frame of {got} bytes where its header says {s}")
        blobs.append(buf)
    return _rebuild(body, blobs)


def _read_spilled(name, buf, token: str) -> None:
    """A spilled tensor's bytes into `buf`: only a regular file of the child's own (by name, in the spill
    directory, no link followed) of exactly `buf`'s length; the file deleted."""
    d = spill_dir()
    if not (d and token and isinstance(name, str) and re.fullmatch(f"casebook-{token}-[0-9]+", name)):
        raise BadMessage(f"a spilled tensor names a file that is not this child's: {str(name)[:80]!r}")
    path = os.path.join(d, name)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as e:
        raise BadMessage(f"a spilled tensor's file cannot be read ({e.strerror})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size != buf.numel():
            raise BadMessage(f"a spilled tensor's file holds {st.st_size} bytes where its header says {buf.numel()}")
        with os.fdopen(fd, "rb", closefd=False) as f:
            if buf.numel() and f.readinto(buf.numpy()) != buf.numel():
                raise BadMessage("a spilled tensor's file ended early")
    finally:
        os.close(fd)
        os.unlink(path)


# --- the child ---------------------------------------------------------------------------------------

_conn = None


def _contain(token: str) -> None:
    """In the child: its own process group, death with its parent, stdout to stderr, the token set."""
    try:
        os.setpgid(0, 0)
    except OSError:
        pass
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG: killed when the parent dies
        except (OSError, AttributeError):
            pass
    os.dup2(2, 1)  # whatever the kernel prints lands in the log, never in `--json`'s output
    sys.stdout = sys.stderr
    os.environ[TOKEN_ENV] = token


def _serve(worker: Callable[[Any], dict], env: dict, conn, token: str, parent: int) -> None:
    global _conn
    _contain(token)
    if os.getppid() != parent:  # the parent died before the death signal was armed
        os._exit(1)
    os.environ.update(env)
    _conn = conn
    send(conn, {"ready": True})
    while True:
        try:
            task = conn.recv()  # from the parent, which the child trusts
        except (EOFError, OSError):
            return
        if task is None:
            return
        try:
            payload = worker(task)
        except Exception as e:  # a raising task is recorded, and the child goes on
            payload = {"status": "crashed", "error": f"{type(e).__name__}: {e}",
                       "traceback": traceback.format_exc(limit=8)}
        try:
            frames = _split({"done": payload}, Spill(token))
        except Exception as e:
            frames = _split({"done": {"status": "crashed", "error": f"unsendable answer: {type(e).__name__}: {e}"}})
        _send(conn, *frames)


# --- the parent's side ---------------------------------------------------------------------------------


class Worker:
    """One child process, started on the first request, answering requests in turn. A request it does not
    answer within its limit, or whose child dies, gets {"status": "timeout" | "crashed", "error": ...},
    and the next request starts a fresh child."""

    def __init__(self, worker: Callable[[Any], dict], env: dict | None = None, startup_s: float = 120.0):
        self.worker, self.env, self.startup_s = worker, dict(env or {}), startup_s
        self.proc = self.conn = None
        self.token = ""

    def _start(self) -> dict | None:
        self.token = secrets.token_hex(16)
        parent, child = _ctx.Pipe(duplex=True)
        self.proc = _ctx.Process(target=_serve, args=(self.worker, self.env, child, self.token, os.getpid()),
                                 daemon=True)
        try:
            self.proc.start()
        except BaseException:
            self.proc = None
            parent.close()
            raise
        finally:
            child.close()
        self.conn = parent
        answer = self._receive(self.startup_s)
        if answer is None or not (isinstance(answer, dict) and answer.get("ready")):
            failure = answer if isinstance(answer, dict) and "status" in answer else {
                "status": "crashed", "error": "child process sent no greeting"}
            self.close()
            return failure
        return None

    def _receive(self, limit_s: float) -> Any:
        """The next message, or a timeout / crash payload (a dict with "status")."""
        try:
            return receive(self.conn, time.monotonic() + limit_s, token=self.token)
        except TimeoutError:
            return {"status": "timeout", "error": f"no answer within {limit_s:.0f} s: killed"}
        except (EOFError, OSError):  # the child died: segfault, abort, out of memory, os._exit
            self.proc.join(5)
            return {"status": "crashed", "error": f"child process died (exit code {self.proc.exitcode})"}
        except BadMessage as e:
            return {"status": "crashed", "error": f"child process sent a malformed answer ({e})"}

    def request(self, task: Any, timeout_s: float) -> dict:
        """Run `worker(task)` in the child; its payload, or a timeout / crash record."""
        if self.proc is None:
            failure = self._start()
            if failure is not None:
                return failure
        try:
            self.conn.send(task)
        except (OSError, EOFError, BrokenPipeError):
            self.close()
            return {"status": "crashed", "error": "child process died before the task"}
        answer = self._receive(timeout_s)
        if isinstance(answer, dict) and isinstance(answer.get("done"), dict):
            return answer["done"]
        self.close()
        if isinstance(answer, dict) and answer.get("status") in ("timeout", "crashed"):
            return {"status": answer["status"], "error": answer["error"]}
        return {"status": "crashed", "error": "child process sent an answer out of turn"}

    def close(self) -> None:
        """End the child, its process group and every process that carries its token."""
        if self.proc is None:
            return
        if self.conn is not None:
            try:
                if self.proc.is_alive():
                    self.conn.send(None)
            except (OSError, EOFError, BrokenPipeError):
                pass
        self.proc.join(2)
        end_group(self.proc.pid)
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join(10)
        end_token(self.token)
        clear_spill(self.token)
        if self.conn is not None:
            self.conn.close()
        self.proc = self.conn = None

    def __enter__(self) -> "Worker":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def end_group(pgid: int) -> None:
    """SIGKILL to every process of the group the child led (it may be gone already)."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError, OSError):
        pass


def end_token(token: str) -> list[int]:
    """Kill every process whose environment carries `token` (a descendant that left the process group);
    the pids killed. Linux only (reads /proc); elsewhere the process group is the whole guard."""
    if not token:
        return []
    needle = f"{TOKEN_ENV}={token}".encode()
    killed = []
    for _ in range(3):  # a descendant may fork while it is being hunted
        found = []
        for entry in Path("/proc").glob("[0-9]*"):
            try:
                if needle in (entry / "environ").read_bytes().split(b"\0"):
                    found.append(int(entry.name))
            except (OSError, ValueError):
                continue
        found = [p for p in found if p != os.getpid()]
        if not found:
            break
        for pid in found:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.05)
    return killed


def run_isolated(worker: Callable[[Any], dict], tasks: list, *, timeout_s: float, env: dict | None = None,
                 on_done: Callable[[int, dict], None] | None = None, startup_s: float = 120.0) -> list[dict]:
    """Run `worker(task)` for each task in child processes; return one payload per task, in order.

    `worker` must be a module-level function (it is pickled by name). A task that hangs past
    `timeout_s`, or whose child dies, gets {"status": "timeout" | "crashed", "error": ...}; a fresh child
    takes the next one.
    """
    out = []
    with Worker(worker, env, startup_s) as w:
        for i, task in enumerate(tasks):
            payload = w.request(task, timeout_s)
            out.append(payload)
            if on_done is not None:
                on_done(i, payload)
    return out
