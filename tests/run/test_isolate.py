"""casebook.run.isolate: a crash, a hang or an exception in one task is recorded, and the remaining tasks run.

The workers here import nothing heavy, so each child starts in a fraction of a second. (They are pickled
by name: the child imports this module, found through the sys.path the parent passes to spawned children.)
"""

from __future__ import annotations

import ctypes
import os
import time
from pathlib import Path

import pytest
from test_transport import _frames, json_dumps  # one pipe of framed messages for both files' tests

from casebook.run.isolate import Worker, run_isolated

pytestmark = pytest.mark.slow  # every test runs child processes


def worker(task: str) -> dict:
    """Do what the task says; answer with the child's pid so that tests can tell children apart."""
    if task == "abort":
        os.abort()
    elif task == "exit":
        os._exit(3)
    elif task == "segfault":
        ctypes.string_at(0)
    elif task == "hang":
        time.sleep(10**6)
    elif task == "raise":
        raise ValueError("bad shape")
    elif task == "loaded":  # which kernel modules the child had imported before its first task
        import sys

        return {"status": "ok", "loaded": sorted(m for m in sys.modules if m.startswith("casebook.kernels."))}
    elif task == "priority":  # the child's own, and the one threads it started while warming up keep
        return {"status": "ok", "priority": os.getpriority(os.PRIO_PROCESS, 0)}
    elif task == "env":
        return {"status": "ok", "pid": os.getpid(), "value": os.environ.get("CASEBOOK_TEST_ENV")}
    elif task == "initial env":  # the environment the process started with, as the C library read it
        with open(f"/proc/{os.getpid()}/environ", "rb") as f:
            return {"status": "ok", "initial": b"CASEBOOK_TEST_ENV=at start" in f.read().split(b"\0")}
    elif task in ("large", "spill then die"):
        import torch

        x = torch.arange(2**19, dtype=torch.float32)  # 2 MiB: over the spill size
        if task == "spill then die":
            from casebook.run.isolate import TOKEN_ENV
            from casebook.run.transport import Spill

            Spill(os.environ[TOKEN_ENV]).write(x.numpy())
            os._exit(5)
        return {"status": "ok", "pid": os.getpid(), "x": x}
    return {"status": "ok", "pid": os.getpid(), "task": task}


def test_tasks_run_in_order_in_one_child():
    out = run_isolated(worker, ["a", "b", "c"], timeout_s=30)
    assert [p["task"] for p in out] == ["a", "b", "c"]
    assert len({p["pid"] for p in out}) == 1 and out[0]["pid"] != os.getpid()


def test_no_tasks():
    assert run_isolated(worker, [], timeout_s=1) == []


def test_crash_mid_list_goes_on_with_the_next_task():
    tasks = ["a", "abort", "b", "exit", "c", "segfault", "d"]
    out = run_isolated(worker, tasks, timeout_s=30)
    assert [p["status"] for p in out] == ["ok", "crashed", "ok", "crashed", "ok", "crashed", "ok"]
    assert [out[i]["task"] for i in (0, 2, 4, 6)] == ["a", "b", "c", "d"]
    assert "child process died (exit code -6)" in out[1]["error"]  # SIGABRT
    assert "child process died (exit code 3)" in out[3]["error"]
    assert "child process died (exit code -11)" in out[5]["error"]  # SIGSEGV
    assert len({out[i]["pid"] for i in (0, 2, 4, 6)}) == 4, "a fresh child after each crash"


def test_hang_times_out_and_the_rest_goes_on():
    start = time.monotonic()
    out = run_isolated(worker, ["a", "hang", "b"], timeout_s=1.5)
    elapsed = time.monotonic() - start
    assert [p["status"] for p in out] == ["ok", "timeout", "ok"]
    assert out[1]["error"] == "no answer within 2 s: killed"
    assert out[2]["task"] == "b" and out[2]["pid"] != out[0]["pid"]
    assert elapsed < 15, f"the hang held the run for {elapsed:.1f} s"


def test_a_hang_as_the_last_task():
    out = run_isolated(worker, ["a", "hang"], timeout_s=1)
    assert [p["status"] for p in out] == ["ok", "timeout"]


def test_exception_is_recorded_and_the_same_child_goes_on():
    out = run_isolated(worker, ["raise", "a"], timeout_s=30)
    assert out[0]["status"] == "crashed"
    assert out[0]["error"] == "ValueError: bad shape"
    assert "Traceback" in out[0]["traceback"] and "bad shape" in out[0]["traceback"]
    assert out[1] == {"status": "ok", "pid": out[1]["pid"], "task": "a"}


def test_on_done_reports_every_task_once_in_order():
    seen = []
    run_isolated(worker, ["a", "exit", "hang", "b"], timeout_s=1, on_done=lambda i, p: seen.append((i, p["status"])))
    assert seen == [(0, "ok"), (1, "crashed"), (2, "timeout"), (3, "ok")]


def test_environment_reaches_the_child():
    [p] = run_isolated(worker, ["env"], timeout_s=30, env={"CASEBOOK_TEST_ENV": "set"})
    assert p["value"] == "set"
    assert "CASEBOOK_TEST_ENV" not in os.environ


def test_startup_limit():
    """A child that does not start its first task within `startup_s` is killed; the task is timed out."""
    [p] = run_isolated(worker, ["a"], timeout_s=30, startup_s=0.01)
    assert p["status"] == "timeout" and p["error"] == "no answer within 0 s: killed"


def test_every_task_crashing():
    out = run_isolated(worker, ["exit", "exit", "exit"], timeout_s=30)
    assert [p["status"] for p in out] == ["crashed"] * 3


# --- what crosses back is data ------------------------------------------------------------------------


def test_a_message_round_trips_tensors_as_data():
    import torch

    from casebook.run.transport import decode, encode

    x = torch.arange(6, dtype=torch.bfloat16).reshape(2, 3)
    back = decode(encode({"a": [x, 1.5, "s"], "empty": torch.empty(0, 4)}))
    assert torch.equal(back["a"][0], x) and back["a"][0].dtype == torch.bfloat16 and back["a"][1:] == [1.5, "s"]
    assert tuple(back["empty"].shape) == (0, 4)


def test_a_forged_message_is_refused_not_run():
    import pickle
    import struct

    from casebook.run.transport import BadMessage, decode, encode

    with pytest.raises(BadMessage):
        decode(pickle.dumps(os.system))  # a pickle is not a message: never unpickled
    good = encode({"t": __import__("torch").ones(4)})
    (n,) = struct.unpack("<Q", good[:8])
    header = json_loads(good[8:8 + n])
    header["body"]["t"]["shape"] = [1000]  # more elements than bytes
    forged = json_dumps(header)
    with pytest.raises(BadMessage):
        decode(struct.pack("<Q", len(forged)) + forged + good[8 + n:])


def test_a_message_crosses_the_pipe_a_frame_a_tensor():
    import multiprocessing as mp
    import time

    import torch

    from casebook.run.transport import receive, send

    a, b = mp.Pipe()
    x = torch.randn(3, 5).to(torch.bfloat16)
    send(a, {"outputs": [x, torch.empty(0)], "n": 2})
    back = receive(b, time.monotonic() + 5)
    assert torch.equal(back["outputs"][0], x) and back["outputs"][1].numel() == 0 and back["n"] == 2


@pytest.mark.parametrize("blob", [b"\0" * 8, b"\0" * 32], ids=["shorter", "longer"])
def test_a_tensor_frame_of_another_length_than_its_header_is_refused(blob):
    import time

    from casebook.run.transport import BadMessage, receive

    header = {"body": {"__tensor__": 0, "dtype": "float32", "shape": [4]}, "blobs": [16]}
    with pytest.raises(BadMessage):
        receive(_frames(header, blob), time.monotonic() + 5)


def test_a_header_over_the_limit_is_refused_before_any_tensor_is_read():
    import time

    from casebook.run.transport import BadMessage, receive

    header = {"body": {"__tensor__": 0, "dtype": "uint8", "shape": [2**40]}, "blobs": [2**40]}
    with pytest.raises(BadMessage, match="over the limit"):
        receive(_frames(header), time.monotonic() + 5)


def test_a_child_that_sends_its_header_then_stops_runs_out_of_time():
    import time

    from casebook.run.transport import receive

    header = {"body": {"__tensor__": 0, "dtype": "float32", "shape": [4]}, "blobs": [16]}
    t0 = time.monotonic()
    with pytest.raises(TimeoutError):
        receive(_frames(header), t0 + 0.5)
    assert time.monotonic() - t0 < 3


def test_a_large_tensor_crosses_through_shared_memory_and_leaves_nothing(tmp_path, monkeypatch):
    import torch

    monkeypatch.setenv("CASEBOOK_SPILL_DIR", str(tmp_path))
    big, died = run_isolated(worker, ["large", "spill then die"], timeout_s=30)
    assert torch.equal(big["x"], torch.arange(2**19, dtype=torch.float32))
    assert died["status"] == "crashed"
    assert list(tmp_path.iterdir()) == []  # read and deleted; the dead child's file cleared


@pytest.mark.parametrize("name", ["../../etc/passwd", "casebook-0000-1", "casebook-abc-1/../x"])
def test_a_spilled_tensor_must_be_a_file_of_the_childs_own(tmp_path, monkeypatch, name):
    import time

    from casebook.run.transport import BadMessage, receive

    monkeypatch.setenv("CASEBOOK_SPILL_DIR", str(tmp_path))
    (tmp_path / "casebook-0000-1").write_bytes(b"\0" * 16)
    header = {"body": {"__tensor__": 0, "dtype": "float32", "shape": [4]}, "blobs": [16], "files": [name]}
    with pytest.raises(BadMessage, match="not this child's"):
        receive(_frames(header), time.monotonic() + 5, token="abc")


def test_a_spilled_file_of_another_length_than_its_header_is_refused(tmp_path, monkeypatch):
    import time

    from casebook.run.transport import BadMessage, receive

    monkeypatch.setenv("CASEBOOK_SPILL_DIR", str(tmp_path))
    (tmp_path / "casebook-abc-1").write_bytes(b"\0" * 8)
    header = {"body": {"__tensor__": 0, "dtype": "float32", "shape": [4]}, "blobs": [16], "files": ["casebook-abc-1"]}
    with pytest.raises(BadMessage, match="holds 8 bytes"):
        receive(_frames(header), time.monotonic() + 5, token="abc")


def json_loads(b: bytes):
    import json

    return json.loads(b)


def spawn_late(path: str) -> dict:
    import subprocess
    import sys

    p = subprocess.Popen([sys.executable, "-c", f"import time; time.sleep(30); open({path!r}, 'w')"],
                         start_new_session=True)
    return {"status": "ok", "pid": p.pid}


def test_no_descendant_outlives_its_child(tmp_path):
    """A process the task starts in a session of its own is ended with the child (it carries its token)."""
    [p] = run_isolated(spawn_late, [str(tmp_path / "late")], timeout_s=30)
    time.sleep(0.5)
    status = f"/proc/{p['pid']}/status"
    assert not os.path.exists(status) or "zombie" in open(status).read()


def fork_late(path: str) -> dict:
    """A grandchild forked without exec, in a session of its own: it writes `path` two seconds later."""
    pid = os.fork()
    if pid == 0:
        os.setsid()
        time.sleep(2)
        open(path, "w").write("written late")
        os._exit(0)
    return {"status": "ok", "pid": pid}


def test_a_grandchild_forked_without_exec_does_not_outlive_its_child(tmp_path):
    """fork() + setsid() without exec: the grandchild leaves the process group and never execs, so only a token in
    the environment the child was started with (which a fork keeps) finds it; it is ended with the child."""
    [p] = run_isolated(fork_late, [str(tmp_path / "late")], timeout_s=30)
    time.sleep(3)
    status = f"/proc/{p['pid']}/status"
    assert not os.path.exists(status) or "zombie" in open(status).read()
    assert not (tmp_path / "late").exists(), "the grandchild lived on and wrote its file"


def test_the_childs_stdout_is_its_stderr(capfd):
    [p] = run_isolated(prints, ["x"], timeout_s=30)
    out, err = capfd.readouterr()
    assert p["status"] == "ok" and "from the child" not in out and "from the child" in err


def prints(task: str) -> dict:
    print("from the child", flush=True)
    return {"status": "ok"}


def test_a_child_started_ahead_answers_its_first_request():
    """`Worker.start`: the child is launched before the first request without waiting for it (a GPU run starts the
    next variant's this way, while the one before it is measured), and that request is answered by it."""
    from casebook.run.isolate import Worker

    with Worker(worker) as w:
        t0 = time.monotonic()
        w.start()
        assert time.monotonic() - t0 < w.startup_s and w.proc.is_alive() and not w.greeted
        pid = w.proc.pid
        assert w.request("a", timeout_s=30)["pid"] == pid
        w.start()
        assert w.proc.pid == pid, "started once"


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="reads /proc")
def test_the_child_starts_with_its_environment():
    """A child's environment is its own from its first instruction: what the C library and the loader read once,
    at the start (`GLIBC_TUNABLES`, for the warm allocator of a CPU timing), set after it changed nothing."""
    from casebook.run.isolate import Worker

    with Worker(worker, {"CASEBOOK_TEST_ENV": "at start"}) as w:
        assert w.request("initial env", timeout_s=30) == {"status": "ok", "initial": True}
    assert "CASEBOOK_TEST_ENV" not in os.environ, "the parent's own environment is as it was"


def test_a_fifo_in_place_of_a_spilled_file_is_refused_at_once(tmp_path, monkeypatch):
    """A child that names a FIFO as its output's file: the parent's open would wait for a writer with no deadline;
    it opens without waiting and refuses what is not a regular file."""
    import time

    from casebook.run.transport import BadMessage, receive

    monkeypatch.setenv("CASEBOOK_SPILL_DIR", str(tmp_path))
    os.mkfifo(tmp_path / "casebook-abc-1")
    header = {"body": {"__tensor__": 0, "dtype": "float32", "shape": [4]}, "blobs": [16], "files": ["casebook-abc-1"]}
    t0 = time.monotonic()
    with pytest.raises(BadMessage, match="not a regular file"):
        receive(_frames(header), time.monotonic() + 5, token="abc")
    assert time.monotonic() - t0 < 2


def test_a_spilled_file_with_another_name_too_is_refused(tmp_path, monkeypatch):
    """A hard link to another's file (the reference child's answers, had they been spilled) named as the child's
    own output: refused."""
    import time

    from casebook.run.transport import BadMessage, receive

    monkeypatch.setenv("CASEBOOK_SPILL_DIR", str(tmp_path))
    (tmp_path / "someone-elses").write_bytes(b"\0" * 16)
    os.link(tmp_path / "someone-elses", tmp_path / "casebook-abc-1")
    header = {"body": {"__tensor__": 0, "dtype": "float32", "shape": [4]}, "blobs": [16], "files": ["casebook-abc-1"]}
    with pytest.raises(BadMessage, match="another name"):
        receive(_frames(header), time.monotonic() + 5, token="abc")


def test_a_child_that_may_not_spill_sends_everything_down_the_pipe(tmp_path, monkeypatch):
    """`Worker(spill=False)` (the reference's child): a large answer crosses the pipe, never a file any process of
    the user could read or replace; a file the child writes itself is cleared when it ends."""
    import torch

    from casebook.run.isolate import Worker

    monkeypatch.setenv("CASEBOOK_SPILL_DIR", str(tmp_path))
    with Worker(worker, spill=False) as w:
        big = w.request("large", timeout_s=30)
        assert torch.equal(big["x"], torch.arange(2**19, dtype=torch.float32))
        assert w.request("spill then die", timeout_s=30)["status"] == "crashed"
    assert list(tmp_path.iterdir()) == []


def test_a_child_greeted_before_its_first_request_pays_its_start_there():
    """`Worker.greet`: the child's start is waited for at once (a run waits for the reference's child before its
    first point, so that the point's time is the point's), and the first request then waits for no start."""
    with Worker(worker, warm=("softmax_fusion", "cpu")) as w:
        assert not w.greeted and w.greet() is None and w.greeted
        assert "casebook.kernels.softmax_fusion" in w.request("loaded", 60)["loaded"]
        assert w.greet() is None, "greeted once"
    with Worker(worker, startup_s=0.001) as w:  # no greeting in time: why, and the child ended
        assert w.greet()["status"] in ("timeout", "crashed") and w.proc is None


def test_a_child_told_the_case_imports_its_kernel_module_before_it_greets():
    with Worker(worker, warm=("softmax_fusion", "cpu")) as w:
        assert "casebook.kernels.softmax_fusion" in w.request("loaded", 60)["loaded"]
    with Worker(worker) as w:  # not told: nothing imported until a task asks
        assert w.request("loaded", 60)["loaded"] == []


def test_a_child_warms_up_at_a_lower_priority_and_takes_its_own_back_where_it_may():
    """The next variant's child starts while a variant is timed: its warm-up must not take the timing's CPU. In a
    process of its own, so that a machine that does not let a process raise its priority again leaves this one be."""
    import subprocess
    import sys

    from casebook.run.isolate import WARM_NICE

    code = ("import os; from casebook.run import isolate; p = lambda: os.getpriority(os.PRIO_PROCESS, 0); b = p()\n"
            "with isolate._yielding(): i = p()\n"
            "print(b, i, p())")
    before, inside, after = map(int, subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                                    check=True).stdout.split())
    assert inside == min(before + WARM_NICE, 19)  # lowering one's own priority is always allowed (to 19)
    assert after in (before, inside)  # back, or kept low where the system does not let it rise
    with Worker(worker, warm=("softmax_fusion", "cpu")) as w:  # a real child: warmed low, then as far back
        assert w.request("priority", 60)["priority"] == after


def test_a_warm_up_that_fails_leaves_the_failure_to_the_first_task():
    with Worker(worker, warm=("no_such_case", "cpu")) as w:
        assert w.request("a", 60)["task"] == "a"


def test_a_child_hands_its_tasks_memory_back_before_it_answers(monkeypatch):
    """The parent copies the outputs out of the lent memory as soon as the answer comes: the child lets its task's
    memory go first (on an 80 GB H100 the parent ran out while the child still held 30 GB of an answered task)."""
    from casebook.run import isolate

    events = []

    class Conn:
        requests = [("t", None), None]

        def recv(self):
            return self.requests.pop(0)

    monkeypatch.setattr(isolate, "_contain", lambda token: None)
    monkeypatch.setattr(isolate, "send", lambda conn, payload: events.append("greeting"))
    monkeypatch.setattr(isolate, "give_back_device_memory", lambda *a, **k: events.append("give back"))
    monkeypatch.setattr(isolate, "send_frames", lambda conn, *frames: events.append("answer"))
    isolate._serve(lambda task: {"status": "ok"}, {}, Conn(), "0" * 32, os.getppid(), spill=False)
    assert events == ["greeting", "give back", "answer"], events
