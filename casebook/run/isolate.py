"""Run tasks in child processes the parent does not trust: a crash, a hang, an out-of-memory, a forged
message or a process left behind is contained.

A child (`Worker`) answers one request at a time. What it sends back is data, never code (`casebook.run.transport`:
a JSON header and the raw bytes of the tensors it names, through the host or through memory the parent lends
it for the request), so a child that writes its own bytes can at worst send wrong numbers, which the parent
judges; it cannot make the parent unpickle, nor name memory it was not lent.
The child runs in its own process group and dies with its parent (PR_SET_PDEATHSIG); when it ends, or
is killed for overrunning its limit, its whole group is killed, and so is every process that still
carries its token in its environment (a grandchild that left the group), so nothing it started lives on
to rewrite files later. Its standard output goes to standard error: `casebook run --json` stays JSON.
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing as mp
import os
import secrets
import signal
import sys
import threading
import time
import traceback
from multiprocessing import resource_tracker
from pathlib import Path
from typing import Any, Callable

from casebook.run.interference import count_as_own
from casebook.run.transport import (
    BadMessage,
    LoanLost,
    NeedRoom,
    Spill,
    clear_spill,
    close_loan,
    give_back_device_memory,
    open_loan,
    receive,
    send,
    send_frames,
    serving,
    split,
)

_ctx = mp.get_context("spawn")

MAX_ROOM = 64 * 2**30
"""The most device memory a growable loan (the reference's answers) is enlarged to."""


class CannotLend(RuntimeError):
    """The memory a request's answer needs cannot be lent (the device is full): that request fails, not the run."""


TOKEN_ENV = "CASEBOOK_WORKER_TOKEN"
"""Set in every child's environment to a fresh random token: what its leftover descendants are found by."""


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


WARM_NICE = 10
"""How far a child lowers its priority while it warms up (`_yielding`). A GPU run starts the next variant's child
while the variant before it is timed; on an H200 host of 16 CPUs a variant's second point waited for a CPU 21%
of its timing (`casebook.stability` judges over 5% unstable) while the next child was starting, and a point's
timing thread must not lose its CPU to the harness's own start-up."""


@contextlib.contextmanager
def _yielding():
    """This process's priority lowered by `WARM_NICE` inside, and put back after where the system lets it: an
    unprivileged process may not raise its priority again, and then times at the lower one (on a quiet machine the
    same; where it has to wait for a CPU, `casebook.stability` says so whatever the priority). The threads started
    inside (the driver's, OpenMP's) keep the lower priority."""
    before = os.getpriority(os.PRIO_PROCESS, 0)
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, 0, before + WARM_NICE)
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, 0, before)


def warm(module: str, device: str) -> None:
    """What a child does before it greets, where its parent names the case (`Worker`'s `warm`): the case's kernel
    module imported (Triton, the peers' libraries) and, on a GPU, the device's context made, NVML opened and the
    profiler that counts launches started once (its first start is a second of host work, later ones a tenth).
    Started early, a child pays these beside the parent's work; at its first request they were seconds of the first
    point's wall time (the reference's child's first answer took 6 s on an H200). Nothing here runs a kernel: the
    child may start while another variant is timed. A failure here is left for the first request to meet."""
    import importlib

    from casebook.kernels import __name__ as package

    try:
        importlib.import_module(f"{package}.{module}")
        if device == "cuda":
            import torch

            from casebook.run.bench import count_launches
            from casebook.run.interference import gpu_state

            torch.cuda.init()
            gpu_state()
            count_launches(lambda: None)
    except Exception:
        pass


def _serve(worker: Callable[[Any], dict], env: dict, conn, token: str, parent: int, spill: bool = True,
           warm_up: tuple[str, str] | None = None) -> None:
    global _conn
    _contain(token)
    if os.getppid() != parent:  # the parent died before the death signal was armed
        os._exit(1)
    os.environ.update(env)
    _conn = conn
    count_as_own([parent])  # the run's other processes (the parent, the reference's child, the next variant's)
    if warm_up is not None:
        with _yielding():
            warm(*warm_up)
    send(conn, {"ready": True})
    while True:
        try:
            request = conn.recv()  # from the parent, which the child trusts: (task, loan)
        except (EOFError, OSError):
            return
        if request is None:
            return
        task, loan = request
        try:  # the loan opened first, so the kept calls' outputs are snapshot into it (`transport.lent`)
            serving(open_loan(loan))
        except Exception:  # refused, or sent through the host, as the answer is sent below
            serving(None)
        try:
            payload = worker(task)
        except Exception as e:  # a raising task is recorded, and the child goes on
            payload = {"status": "crashed", "error": f"{type(e).__name__}: {e}",
                       "traceback": traceback.format_exc(limit=8)}
        while True:
            try:
                outbox = open_loan(loan)
            except LoanLost as e:  # the variant unmapped it: refused, not sent another way
                frames = split({"done": {"status": "crashed", "error": f"unsendable answer: {e}"}})
                break
            except Exception as e:  # the loan cannot be mapped here: the host crossing, and the parent told why
                outbox = None
                payload = {**payload, "crossing_error": f"{type(e).__name__}: {e}"[:300]}
            try:
                frames = split({"done": payload}, Spill(token) if spill else None, outbox)
            except NeedRoom as e:  # a growable loan too small: ask for more, keep the answer meanwhile
                send(conn, {"room": e.bytes})
                try:
                    request = conn.recv()
                except (EOFError, OSError):
                    return
                if request is None:
                    return
                loan = request[1]
                continue
            except Exception as e:
                frames = split({"done": {"status": "crashed", "error": f"unsendable answer: {type(e).__name__}: {e}"}})
            break
        # The task's own memory (its inputs, the tensors the answer was copied from) let go and handed back before
        # the answer goes: the parent copies the outputs out of the lent memory as soon as it has the answer, and
        # on an 80 GB H100 (cross_entropy, 4096 x 262144 fp32) it ran out while this child still held 30 GB of
        # the task it had answered. What the frames hold is on the host (a device's tensors are in the loan).
        del payload
        give_back_device_memory()
        send_frames(conn, *frames)
        serving(None)
        del frames
        close_loan(loan)


# --- the parent's side ---------------------------------------------------------------------------------

_STARTING = threading.Lock()
"""One child started at a time (the next variant's child may start in a thread): each with its own token."""


@contextlib.contextmanager
def started_with(env: dict[str, str]):
    """This process's environment holds `env` while a child is started, so the child's initial environment does:
    the block `/proc/<pid>/environ` shows, which a process forked from the child without exec keeps whatever it
    sets later (a token set in the child after its start was not there, and such a grandchild escaped the hunt),
    and what the C library and the dynamic loader read once, as the process starts (`GLIBC_TUNABLES`: set in the
    child after its start, it changed nothing)."""
    before = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class Worker:
    """One child process, started on the first request, answering requests in turn. A request it does not
    answer within its limit, or whose child dies, gets {"status": "timeout" | "crashed", "error": ...},
    and the next request starts a fresh child.

    `arena` (`casebook.run.transport.Arena`): memory lent to the child for each request that asks for room, so
    that its tensors on that device cross without leaving it; None: everything crosses the host."""

    def __init__(self, worker: Callable[[Any], dict], env: dict | None = None, startup_s: float = 120.0,
                 arena=None, spill: bool = True, warm: tuple[str, str] | None = None):
        self.worker, self.env, self.startup_s, self.arena = worker, dict(env or {}), startup_s, arena
        self.spill = spill
        """Whether the child may send large tensors through files of its own (`transport.Spill`). The reference's
        child may not: a file in shared memory is readable by every process of the user, a variant's among them,
        so its answers cross the host down the pipe alone (or, on a GPU, in device memory)."""
        self.warm = warm
        """(kernel module, device) the child imports and opens before it greets (`warm`); None: nothing."""
        self.proc = self.conn = None
        self.greeted = False
        self.token = ""
        self.receive_s = 0.0
        """Seconds the last request's answer took to read once it began to arrive (header, frames, files, copies
        out of the arena): what the crossing cost."""
        self.start_wait_s = 0.0
        """Seconds the last request waited for the child's greeting: its start, where a child started ahead
        (`start`) had not finished it, or was started by the request itself."""
        self.crossing_error: str | None = None
        """Why a child could not map what it was lent (its tensors then crossed the host), the first time."""

    @property
    def pid(self) -> int | None:
        """The child's process id while it lives; None before it starts or once it has ended."""
        return self.proc.pid if self.proc is not None else None

    def start(self) -> None:
        """Start the child now rather than at the first request, without waiting for it: its start (a new
        interpreter importing torch, Triton and casebook, seconds of host work) goes on in its own process while
        this one works, and its greeting is read at the first request. A GPU run starts the next variant's child
        this way while the variant before it is measured. From the thread that will make the requests: the child
        dies with the thread that started it (PR_SET_PDEATHSIG is the parent *thread*'s death; a child started
        from a helper thread was killed as that thread ended, seen on the H200 as each variant's first task
        crashing with "child process died before the task")."""
        if self.proc is None:
            self._launch()

    def _launch(self) -> None:
        self.token = secrets.token_hex(16)
        parent, child = _ctx.Pipe(duplex=True)
        self.proc = _ctx.Process(target=_serve, args=(self.worker, self.env, child, self.token, os.getpid(),
                                                      self.spill, self.warm), daemon=True)
        try:
            with _STARTING:  # the token and env in the environment the child starts with: see `started_with`
                resource_tracker.ensure_running()  # started before, never with a child's token: shared by all
                with started_with({**self.env, TOKEN_ENV: self.token}):
                    self.proc.start()
        except BaseException:
            self.proc = None
            parent.close()
            raise
        finally:
            child.close()
        self.conn, self.greeted = parent, False

    def greet(self) -> dict | None:
        """Wait now for the child's greeting (started here where it was not): its start, an interpreter importing
        torch, Triton and the case's kernel module and on a GPU making the device's context, paid before a request
        rather than inside the first one. None, or why it did not come (the child is ended; the next request starts
        another)."""
        if self.proc is None:
            self._launch()
        return None if self.greeted else self._greet()

    def _greet(self) -> dict | None:
        """Wait for the started child's greeting: None, or why it did not come (the child is ended)."""
        answer = self._receive(self.startup_s)
        if answer is None or not (isinstance(answer, dict) and answer.get("ready")):
            failure = answer if isinstance(answer, dict) and "status" in answer else {
                "status": "crashed", "error": "child process sent no greeting"}
            self.close()
            return failure
        self.greeted = True
        return None

    def _receive(self, limit_s: float, stated_s: float | None = None) -> Any:
        """The next message, or a timeout / crash payload (a dict with "status"); `stated_s`, the limit its
        error names (the request's, where this wait is what is left of it)."""
        deadline = time.monotonic() + limit_s
        try:
            if not self.conn.poll(limit_s):
                raise TimeoutError
            t0 = time.perf_counter()
            message = receive(self.conn, deadline, token=self.token if self.spill else "", arena=self.arena)
            self.receive_s = time.perf_counter() - t0
            return message
        except TimeoutError:
            return {"status": "timeout", "error": f"no answer within {stated_s or limit_s:.0f} s: killed"}
        except (EOFError, OSError):  # the child died: segfault, abort, out of memory, os._exit
            self.proc.join(5)
            return {"status": "crashed", "error": f"child process died (exit code {self.proc.exitcode})"}
        except BadMessage as e:
            return {"status": "crashed", "error": f"child process sent a malformed answer ({e})"}
        except Exception as e:  # the parent could not take the answer (out of device memory, say): that task's
            return {"status": "crashed", "error": f"the answer could not be received ({type(e).__name__}: "
                                                  f"{str(e)[:300]})"}  # failure; the child is replaced

    def _lend(self, room: int, grow: bool) -> dict | None:
        """The loan of `room` bytes for a request (None: no room, or no arena); `CannotLend` where the memory
        cannot be had (the device is full), once what this process caches has been given back and tried again."""
        if self.arena is None or room <= 0:
            return None
        for attempt in (1, 2):
            try:
                return self.arena.lend(room, grow=grow, borrower=self.token)
            except Exception as e:  # out of device memory, mostly
                if attempt == 2:
                    raise CannotLend(f"the {room} bytes of memory lent for its answer could not be had "
                                     f"({type(e).__name__}: {str(e)[:200]})") from None
                give_back_device_memory()

    def request(self, task: Any, timeout_s: float, room: int = 0, grow: bool = False) -> dict:
        """Run `worker(task)` in the child; its payload, or a timeout / crash record. `room`: bytes of the arena
        the child may fill with its answer's tensors on the arena's device (0: none, they cross the host);
        `grow`: the child may ask for more (up to `MAX_ROOM`) before it sends."""
        starting, t0 = self.proc is None or not self.greeted, time.perf_counter()
        failure = self.greet()
        self.start_wait_s = time.perf_counter() - t0 if starting else 0.0
        if failure is not None:
            return failure
        deadline = time.monotonic() + timeout_s
        try:
            message = (task, self._lend(room, grow))
        except CannotLend as e:  # this request fails; the child, which has not seen it, stays for the next
            return {"status": "crashed", "error": str(e)}
        while True:
            try:
                self.conn.send(message)
            except (OSError, EOFError, BrokenPipeError):
                self.close()
                return {"status": "crashed", "error": "child process died before the task"}
            answer = self._receive(max(0.0, deadline - time.monotonic()), timeout_s)
            wanted = answer.get("room") if isinstance(answer, dict) else None
            if not (grow and isinstance(wanted, int) and not isinstance(wanted, bool) and room < wanted <= MAX_ROOM):
                break
            try:
                room, message = wanted, (None, self._lend(wanted, grow))
            except CannotLend as e:  # the child waits for a loan that will not come: it ends with the request
                self.close()
                return {"status": "crashed", "error": str(e)}
        if isinstance(answer, dict) and isinstance(answer.get("done"), dict):
            done = answer["done"]
            if self.arena is not None:
                self.arena.after()  # the child holds the newest loan now: older memory can go, and one lent once
                if isinstance(done.get("crossing_error"), str) and self.crossing_error is None:
                    self.crossing_error = done["crossing_error"]
            return done
        self.close()
        if isinstance(answer, dict) and answer.get("status") in ("timeout", "crashed"):
            return {"status": answer["status"], "error": answer["error"]}
        if grow and isinstance(wanted, int):
            return {"status": "crashed", "error": f"its answer needs {wanted} bytes of lent memory, more than the "
                                                  f"{MAX_ROOM} a loan grows to"}
        return {"status": "crashed", "error": "child process sent an answer out of turn"}

    def close(self) -> None:
        """End the child, its process group and every process that carries its token. The hunt for its token comes
        first, while every descendant is still the child's: one whose parent has gone no longer shows its
        environment here (seen: ESRCH for a grandchild forked without exec, which lived on and wrote a file)."""
        if self.proc is None:
            return
        end_token(self.token, spare=self.proc.pid)
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
        if self.arena is not None:
            self.arena.settle()  # the child is gone: nothing it mapped is in use

    def release(self) -> None:
        """End the child and free the memory it was lent."""
        self.close()
        if self.arena is not None:
            self.arena.close()

    def __enter__(self) -> "Worker":
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def end_group(pgid: int) -> None:
    """SIGKILL to every process of the group the child led (it may be gone already)."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError, OSError):
        pass


def end_token(token: str, spare: int | None = None) -> list[int]:
    """Kill every process whose environment carries `token` (a descendant that left the process group), but
    `spare` (the child itself, let go first); the pids killed. Linux only (reads /proc); elsewhere the process
    group is the whole guard."""
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
        found = [p for p in found if p not in (os.getpid(), spare)]
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
