"""Run tasks in a child process with a time limit: a crash, a hang or an out-of-memory is contained.

The child streams ("start", i) and ("done", i, payload) messages. When it dies or overruns a task's
limit, that task is recorded as crashed or timed out and a fresh child takes the remaining tasks.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time
import traceback
from typing import Any, Callable

_ctx = mp.get_context("spawn")


def _child(worker: Callable[[Any], dict], tasks: list, env: dict, conn) -> None:
    os.environ.update(env)
    for i, task in enumerate(tasks):
        conn.send(("start", i))
        try:
            payload = worker(task)
        except Exception as e:  # a raising task is recorded, and the child goes on
            payload = {"status": "crashed", "error": f"{type(e).__name__}: {e}",
                       "traceback": traceback.format_exc(limit=8)}
        conn.send(("done", i, payload))
    conn.send(("exit",))
    conn.close()


def run_isolated(worker: Callable[[Any], dict], tasks: list, *, timeout_s: float, env: dict | None = None,
                 on_done: Callable[[int, dict], None] | None = None, startup_s: float = 120.0) -> list[dict]:
    """Run `worker(task)` for each task in child processes; return one payload per task, in order.

    `worker` must be a module-level function (it is pickled by name). A task that hangs past
    `timeout_s`, or whose child dies, gets {"status": "timeout" | "crashed", "error": ...}.
    """
    results: list[dict | None] = [None] * len(tasks)
    first = 0
    while first < len(tasks):
        parent, child = _ctx.Pipe(duplex=False)
        proc = _ctx.Process(target=_child, args=(worker, tasks[first:], env or {}, child), daemon=True)
        proc.start()
        child.close()
        current, started, done = None, time.monotonic(), 0
        next_first = len(tasks)
        while True:
            limit = (timeout_s if current is not None else startup_s) - (time.monotonic() - started)
            if limit <= 0 or not parent.poll(limit):
                _kill(proc)
                j = first + (current if current is not None else done)
                results[j] = {"status": "timeout",
                              "error": f"no answer within {timeout_s if current is not None else startup_s:.0f} s: "
                                       "killed"}
                _emit(on_done, j, results[j])
                next_first = j + 1
                break
            try:
                msg = parent.recv()
            except EOFError:  # the child died: segfault, abort, out of memory, os._exit
                proc.join(5)
                j = first + (current if current is not None else done)  # between tasks: the next one
                results[j] = {"status": "crashed", "error": f"child process died (exit code {proc.exitcode})"}
                _emit(on_done, j, results[j])
                next_first = j + 1
                break
            if msg[0] == "start":
                current, started = msg[1], time.monotonic()
            elif msg[0] == "done":
                results[first + msg[1]] = msg[2]
                _emit(on_done, first + msg[1], msg[2])
                current, started, done = None, time.monotonic(), msg[1] + 1
            else:  # exit
                proc.join(30)
                break
        parent.close()
        if proc.is_alive():
            _kill(proc)
        first = next_first
    return [r if r is not None else {"status": "crashed", "error": "no result"} for r in results]


def _emit(cb, i, payload) -> None:
    if cb is not None:
        cb(i, payload)


def _kill(proc) -> None:
    proc.kill()
    proc.join(10)
