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
import secrets
import signal
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

TENSOR_DTYPES = ("float64", "float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2", "int64", "int32",
                 "int16", "int8", "uint8", "bool")
"""The tensor element types a message may hold."""


# --- the message format ------------------------------------------------------------------------------


def encode(payload: Any) -> bytes:
    """`payload` (JSON data, with torch tensors anywhere in it) as one message: an 8-byte header length, the
    header (JSON, each tensor replaced by {"__tensor__": index, "dtype", "shape"}), then the tensors' bytes."""
    blobs: list[bytes] = []

    def walk(x):
        if type(x).__module__.startswith("torch") and type(x).__name__ == "Tensor":
            t = x.detach().cpu().contiguous()
            blobs.append(t.reshape(-1).view(__import__("torch").uint8).numpy().tobytes() if t.numel() else b"")
            return {"__tensor__": len(blobs) - 1, "dtype": str(t.dtype).removeprefix("torch."),
                    "shape": list(t.shape)}
        if isinstance(x, dict):
            return {str(k): walk(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [walk(v) for v in x]
        return x

    header = json.dumps({"body": walk(payload), "blobs": [len(b) for b in blobs]}).encode()
    return struct.pack("<Q", len(header)) + header + b"".join(blobs)


class BadMessage(ValueError):
    """A child's answer that is not in the format."""


def decode(data: bytes) -> Any:
    """A message back as data: tensors rebuilt from their bytes after their declared type and shape are
    checked against their length. Nothing in it is executed."""
    if len(data) < 8:
        raise BadMessage("message too short")
    (n,) = struct.unpack("<Q", data[:8])
    if n > len(data) - 8:
        raise BadMessage("header longer than the message")
    try:
        head = json.loads(data[8:8 + n])
        sizes = [int(s) for s in head["blobs"]]
    except (ValueError, KeyError, TypeError) as e:
        raise BadMessage(f"unreadable header: {e}") from None
    if sum(sizes) != len(data) - 8 - n or any(s < 0 for s in sizes):
        raise BadMessage("tensor bytes do not add up to the message")
    offsets, at = [], 8 + n
    for s in sizes:
        offsets.append(at)
        at += s
    torch = None

    def walk(x):
        nonlocal torch
        if isinstance(x, dict):
            if "__tensor__" in x:
                if torch is None:
                    import torch
                i, dtype, shape = x["__tensor__"], x.get("dtype"), x.get("shape")
                if (not isinstance(i, int) or not 0 <= i < len(sizes) or dtype not in TENSOR_DTYPES
                        or not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape)):
                    raise BadMessage("malformed tensor")
                dt = getattr(torch, dtype)
                numel = 1
                for d in shape:
                    numel *= d
                if numel * torch.empty((), dtype=dt).element_size() != sizes[i]:
                    raise BadMessage(f"tensor {i}: {sizes[i]} bytes for {dtype} {shape}")
                if numel == 0:
                    return torch.empty(shape, dtype=dt)
                raw = bytearray(data[offsets[i]:offsets[i] + sizes[i]])
                return torch.frombuffer(raw, dtype=torch.uint8).view(dt).reshape(shape)
            return {k: walk(v) for k, v in x.items()}
        if isinstance(x, list):
            return [walk(v) for v in x]
        return x

    return walk(head.get("body"))


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
    conn.send_bytes(encode({"ready": True}))
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
            message = encode({"done": payload})
        except Exception as e:
            message = encode({"done": {"status": "crashed", "error": f"unsendable answer: {type(e).__name__}: {e}"}})
        conn.send_bytes(message)


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
            ready = self.conn.poll(max(0.0, limit_s))
        except (OSError, EOFError):
            ready = True
        if not ready:
            return {"status": "timeout", "error": f"no answer within {limit_s:.0f} s: killed"}
        try:
            data = self.conn.recv_bytes(MAX_MESSAGE)
        except (EOFError, OSError):  # the child died: segfault, abort, out of memory, os._exit
            self.proc.join(5)
            return {"status": "crashed", "error": f"child process died (exit code {self.proc.exitcode})"}
        try:
            return decode(data)
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
