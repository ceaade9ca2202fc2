"""casebook.run.transport: the crossing of a child's answer, host or device (memory the parent lends: `Arena`).

Most tests play both sides in one process over a shared-memory arena (`HostMemory`, a file in the test's own
folder): the child's side (`open_loan`, `split`) writes into a `multiprocessing.Pipe`, the parent's side
(`receive`) reads it back. Those marked slow run `casebook.run.isolate.Worker` children, whose functions, below, are
pickled by name. The GPU section runs only where torch sees a GPU (the same tests over CUDA IPC).
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import threading
import time

import pytest
import torch

from casebook.run import hardware, transport
from casebook.run.isolate import Worker
from casebook.run.transport import (
    ALIGN,
    DIGEST_BLOCK,
    Arena,
    BadMessage,
    CudaMemory,
    HostMemory,
    NeedRoom,
    Unsent,
    aligned,
    arena_for,
    digest,
    open_loan,
    receive,
    send_frames,
    split,
)

slow = pytest.mark.slow  # the tests that start child processes
gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU (CUDA IPC)")
MiB = 2**20


@pytest.fixture
def shm(tmp_path, monkeypatch):
    """The arena's files (and the children's spills) in the test's own folder; the child side's loan forgotten
    before the test and closed after it."""
    monkeypatch.setenv("CASEBOOK_SPILL_DIR", str(tmp_path))
    monkeypatch.delenv("CASEBOOK_TRANSPORT", raising=False)
    monkeypatch.setattr(transport, "_opened", {})
    yield tmp_path
    memory = transport._opened.get("memory")
    if memory is not None and memory.tensor is not None:
        memory.close()


@pytest.fixture
def arena(shm):
    a = Arena(HostMemory)
    yield a
    a.close()


_OPEN: list = []  # the sending ends, kept open while a test reads


def json_dumps(d) -> bytes:
    return json.dumps(d).encode()


def _frames(header: dict, *blobs: bytes):
    a, b = mp.Pipe()
    a.send_bytes(json_dumps(header))
    for blob in blobs:
        a.send_bytes(blob)
    _OPEN.append(a)
    return b


def _cross(arena: Arena, header: bytes, blobs: list):
    """The child's frames down a pipe, read back by the parent with `arena` lent."""
    a, b = mp.Pipe()
    send_frames(a, header, blobs)
    _OPEN.append(a)
    return receive(b, time.monotonic() + 5, arena=arena)


def _payload() -> dict:
    g = torch.Generator().manual_seed(7)
    return {
        "bf16": torch.randn(3, 5, generator=g).to(torch.bfloat16),
        "f32": torch.randn(7, generator=g),
        "i64": torch.arange(-5, 6, dtype=torch.int64),
        "empty": torch.empty(0, 4),
        "strided": torch.arange(24.0).reshape(4, 6).t(),  # not contiguous
        "offset": torch.arange(10, dtype=torch.int32)[3:],  # a view past its storage's start
        "nested": [torch.tensor([True, False, True]), 3, "s"],
        "n": 1.5,
    }


# --- one process, both sides: the round trip ----------------------------------------------------------------


def test_tensors_cross_through_the_lent_memory_and_the_file_goes_with_the_arena(arena, shm):
    """Every CPU tensor of an answer crosses in the lent memory, named by offset, and arrives equal."""
    payload = _payload()
    grant = arena.lend(64 * 1024)
    outbox = open_loan(grant)
    header, blobs = split(payload, None, outbox)
    head = json.loads(header)
    assert head["lent"]["arena"] == grant["id"] and blobs == []  # nothing down the pipe
    offsets = head["lent"]["offsets"]
    assert len(offsets) == 7 and all(isinstance(o, int) for o in offsets)
    assert all(o % ALIGN == 0 for o, size in zip(offsets, head["blobs"]) if size)
    back = _cross(arena, header, blobs)
    assert arena.taken == 7
    for key in ("bf16", "f32", "i64", "strided", "offset"):
        assert back[key].dtype == payload[key].dtype and torch.equal(back[key], payload[key]), key
    assert back["empty"].shape == (0, 4) and back["empty"].dtype == torch.float32
    assert torch.equal(back["nested"][0], payload["nested"][0]) and back["nested"][1:] == [3, "s"]
    assert back["n"] == 1.5
    arena.memory.zero()  # what the parent received is its own copy, not a view of the arena
    assert torch.equal(back["f32"], payload["f32"])
    assert [p.name for p in shm.iterdir()] == [grant["name"]]
    transport._opened["memory"].close()
    arena.close()
    assert list(shm.iterdir()) == []


def test_a_fresh_loan_of_the_same_memory_is_reused_by_the_child(arena):
    """open_loan maps the arena once: a later grant of the same memory reuses the mapping."""
    first = open_loan(arena.lend(4096))
    memory = transport._opened["memory"]
    second = open_loan(arena.lend(4096))
    assert second.memory is memory and first.id != second.id


# --- forged headers ------------------------------------------------------------------------------------------


def _lent_header(sizes: list, offsets: list, arena_id) -> dict:
    body = [{"__tensor__": i, "dtype": "uint8", "shape": [s]} for i, s in enumerate(sizes)]
    return {"body": body, "blobs": sizes, "lent": {"arena": arena_id, "offsets": offsets}}


def test_a_header_within_the_loan_is_read(arena):
    """The control for the forgeries below: two tensors inside the room, apart, are copied out."""
    grant = arena.lend(1024)
    arena.memory.tensor[512:528] = 9
    back = receive(_frames(_lent_header([16, 16], [0, 512], grant["id"])), time.monotonic() + 5, arena=arena)
    assert back[0].tolist() == [0] * 16 and back[1].tolist() == [9] * 16


@pytest.mark.parametrize("sizes, offsets, match", [
    ([16], [1024 - 8], "outside"),
    ([1], [1024], "outside"),
    ([16], [2**62], "outside"),
    ([2048], [0], "outside"),
    ([64, 64], [0, 32], "share bytes"),
    ([64, 64], [512, 512], "share bytes"),
    ([16, 16, 16], [512, 0, 8], "share bytes"),
    ([16], [-512], "not a byte offset"),
    ([16], [1.5], "not a byte offset"),
    ([16], [0.0], "not a byte offset"),
    ([16], ["0"], "not a byte offset"),
    ([16], [True], "not a byte offset"),
    ([16], [[0]], "not a byte offset"),
    ([16, 16], [0], "offsets do not match"),
    ([16], [0, 512], "offsets do not match"),
], ids=["tail-outside", "at-the-end", "far", "longer-than-room", "overlap", "same-offset", "overlap-unsorted",
        "negative", "float", "float-integral", "string", "bool", "list", "too-few", "too-many"])
def test_a_forged_offset_is_refused(arena, sizes, offsets, match):
    """receive refuses lent offsets outside the room, overlapping, not integers, or not one a tensor."""
    grant = arena.lend(1024)
    with pytest.raises(BadMessage, match=match):
        receive(_frames(_lent_header(sizes, offsets, grant["id"])), time.monotonic() + 5, arena=arena)


@pytest.mark.parametrize("lent", [[], 0, {"arena": "x"}, {"arena": "x", "offsets": {"0": 0}}], ids=str)
def test_a_malformed_lent_entry_is_refused(arena, lent):
    """A "lent" entry that is not {"arena", "offsets": [...]} is refused, never indexed."""
    arena.lend(1024)
    header = {"body": {"__tensor__": 0, "dtype": "uint8", "shape": [16]}, "blobs": [16], "lent": lent}
    with pytest.raises(BadMessage, match="offsets do not match"):
        receive(_frames(header), time.monotonic() + 5, arena=arena)


def test_an_arena_that_is_not_the_loan_is_refused(arena):
    """An arena id other than this request's loan is refused."""
    arena.lend(1024)
    with pytest.raises(BadMessage, match="not lent"):
        receive(_frames(_lent_header([16], [0], "0" * 16)), time.monotonic() + 5, arena=arena)


def test_a_stale_loan_is_refused(arena):
    """The id of an earlier loan is refused once a new one is lent (the same memory, another request)."""
    old = arena.lend(1024)
    new = arena.lend(1024)
    assert old["name"] == new["name"] and old["id"] != new["id"]
    with pytest.raises(BadMessage, match="not lent"):
        receive(_frames(_lent_header([16], [0], old["id"])), time.monotonic() + 5, arena=arena)


def test_nothing_lent_before_the_first_loan_nor_after_close(shm):
    """An arena that has lent nothing, or was closed, accepts no offsets."""
    a = Arena(HostMemory)
    with pytest.raises(BadMessage, match="not lent"):
        receive(_frames(_lent_header([16], [0], None)), time.monotonic() + 5, arena=a)
    grant = a.lend(1024)
    a.close()
    with pytest.raises(BadMessage, match="not lent"):
        receive(_frames(_lent_header([16], [0], grant["id"])), time.monotonic() + 5, arena=a)
    assert list(shm.iterdir()) == []


def test_lent_offsets_without_a_loan_are_refused():
    """A header naming lent memory where the parent lent none is refused."""
    with pytest.raises(BadMessage, match="none was lent"):
        receive(_frames(_lent_header([16], [0], "x")), time.monotonic() + 5)


# --- room ----------------------------------------------------------------------------------------------------


def _sized() -> dict:
    return {"small": torch.arange(64, dtype=torch.int32),  # 256 bytes
            "big": torch.arange(1024, dtype=torch.float32),  # 4096 bytes
            "after": torch.ones(16)}  # 64 bytes


def test_a_tensor_over_the_room_is_unsent_and_the_rest_arrive(arena):
    """A tensor that does not fit what is left of the room arrives as Unsent (why, in bytes); the others arrive."""
    payload = _sized()
    outbox = open_loan(arena.lend(1024))
    header, blobs = split(payload, None, outbox)
    back = _cross(arena, header, blobs)
    assert torch.equal(back["small"], payload["small"]) and torch.equal(back["after"], payload["after"])
    unsent = back["big"]
    assert isinstance(unsent, Unsent) and unsent.dtype == "float32" and unsent.shape == (1024,)
    assert "4096 bytes" in unsent.reason and "1024" in unsent.reason
    assert "was not sent" in str(unsent)


def test_a_growable_loan_too_small_asks_for_room_before_copying(arena):
    """With grow, split raises NeedRoom with the answer's aligned bytes, and copies nothing in first."""
    payload = _sized()
    outbox = open_loan(arena.lend(1024, grow=True))
    with pytest.raises(NeedRoom) as e:
        split(payload, None, outbox)
    assert e.value.bytes == aligned(256) + aligned(4096) + aligned(64) == 5120
    assert not outbox.spans and not arena.memory.tensor.any()
    grant = arena.lend(e.value.bytes, grow=True)
    assert grant["room"] >= 5120
    header, blobs = split(payload, None, open_loan(grant))
    back = _cross(arena, header, blobs)
    assert all(torch.equal(back[k], v) for k, v in payload.items())


def test_an_empty_tensor_always_fits(arena):
    """A 0-element tensor needs no room: it arrives even where the room (unaligned here) is full."""
    payload = [torch.ones(25), torch.empty(0)]  # 100 bytes, then none
    header, blobs = split(payload, None, open_loan(arena.lend(100)))
    back = _cross(arena, header, blobs)
    assert torch.equal(back[0], payload[0])
    assert not isinstance(back[1], Unsent), back[1]


# --- the arena between borrowers -----------------------------------------------------------------------------


def test_the_arena_is_cleared_for_another_borrower_only(arena):
    """A loan to the same borrower keeps the arena's bytes; a loan to another zeroes them first."""
    arena.lend(4096, borrower="a")
    arena.memory.tensor[:100] = 7
    arena.lend(4096, borrower="a")
    assert int(arena.memory.tensor[:100].sum()) == 700
    arena.lend(2048, borrower="b")
    assert not arena.memory.tensor.any()


def test_a_held_snapshot_is_sent_from_where_it_lies_and_arrives_equal(arena):
    """A snapshot taken into the loan (`hold`) is named by its own offset when sent, not copied a second time,
    and the parent reads the bytes it holds; a tensor not held is copied into a gap beside it."""
    outbox = open_loan(arena.lend(3 * ALIGN))
    x, y = torch.arange(40.0), torch.arange(7, dtype=torch.int32)
    kept = outbox.hold(x)
    assert torch.equal(kept, x) and kept.data_ptr() == transport._opened["memory"].tensor.data_ptr()
    header, blobs = split({"kept": kept, "other": y}, None, outbox)
    offsets = json.loads(header)["lent"]["offsets"]
    assert offsets == [0, ALIGN] and sorted(outbox.spans) == [0, ALIGN]
    back = _cross(arena, header, blobs)
    assert torch.equal(back["kept"], x) and torch.equal(back["other"], y)


def test_a_released_span_is_taken_again_and_no_loan_holds_past_its_room(arena):
    """The sample's dropped calls give their room back (`release`), so a loan of k calls' room holds every call
    offered to a sample of k; a snapshot that finds no gap, of another device, empty, or for a growable loan is
    not held (the child copies it as before) and takes no room."""
    outbox = open_loan(arena.lend(2 * ALIGN))
    a, b = outbox.hold(torch.ones(100)), outbox.hold(torch.full((100,), 2.0))
    assert outbox.hold(torch.zeros(10)) is None and len(outbox.spans) == 2
    outbox.release(a)
    c = outbox.hold(torch.full((50,), 3.0))
    assert c.data_ptr() == a.data_ptr() and torch.equal(b, torch.full((100,), 2.0))
    outbox.release(torch.ones(100))  # not one it holds: nothing freed
    assert len(outbox.spans) == 2
    assert outbox.hold(torch.empty(0)) is None
    grown = open_loan(arena.lend(ALIGN, grow=True))
    assert grown.hold(torch.ones(4)) is None and not grown.spans


def test_a_held_view_is_not_mistaken_for_the_span_it_starts(arena):
    """Only a tensor `hold` made is named where it lies: a view that starts a held span but covers less of it (a
    variant's output aliasing the loan) is copied into a gap of its own, which the parent's check accepts."""
    outbox = open_loan(arena.lend(2 * ALIGN))
    kept = outbox.hold(torch.arange(16.0))
    header, blobs = split({"part": kept[:8]}, None, outbox)
    assert json.loads(header)["lent"]["offsets"] == [ALIGN]
    assert torch.equal(_cross(arena, header, blobs)["part"], torch.arange(8.0))


def test_a_larger_loan_replaces_the_memory_and_retires_the_old_until_settled(arena, shm):
    """A loan larger than the arena gets new memory; the old file lives until settle (the child may map it)."""
    first = arena.lend(1024, borrower="a")
    second = arena.lend(8192, borrower="a")
    assert second["name"] != first["name"] and arena.memory.nbytes >= 8192
    assert sorted(p.name for p in shm.iterdir()) == sorted([first["name"], second["name"]])
    arena.settle()
    assert [p.name for p in shm.iterdir()] == [second["name"]]
    grown = arena.lend(16, grow=True, borrower="a")
    assert grown["room"] == arena.memory.nbytes  # a growable loan is of all the arena holds


def test_an_arena_over_its_keep_is_lent_once_and_freed_after_its_request(shm):
    """An arena larger than `keep` says so in its grant; `after` its request it is freed (file and all), and the next
    loan has fresh memory. One within `keep` stays for the next request."""
    a = Arena(HostMemory, keep=4096)
    small = a.lend(1024, borrower="a")
    assert not small["once"]
    a.after()
    assert a.memory is not None and [p.name for p in shm.iterdir()] == [small["name"]]
    big = a.lend(8192, borrower="a")
    assert big["once"] and big["name"] != small["name"]
    a.after()  # the small one retired by the big loan, the big one lent once: both gone
    assert a.memory is None and list(shm.iterdir()) == []
    again = a.lend(1024, borrower="a")
    assert not again["once"] and again["name"] not in (small["name"], big["name"])
    a.close()
    assert list(shm.iterdir()) == []
    assert not Arena(HostMemory).lend(2**20, borrower="a")["once"]  # no keep: every arena is kept
    assert transport.keep_bytes("cpu") == int(transport.KEEP_FRACTION * (hardware.memory_bytes() or 8 * 2**30))


def test_the_child_unmaps_a_loan_lent_once_and_keeps_any_other(arena, shm):
    once = Arena(HostMemory, keep=0)
    grant = once.lend(64, borrower="a")
    transport.open_loan(grant)
    assert transport._opened["memory"].tensor is not None
    transport.close_loan(grant)
    assert transport._opened == {}
    kept = arena.lend(64, borrower="a")
    transport.open_loan(kept)
    transport.close_loan(kept)
    transport.close_loan(None)
    assert transport._opened["memory"].tensor is not None  # reused by the next request
    once.close()


# --- through Worker children ---------------------------------------------------------------------------------


def _seeded(seed: int, n: int = 1000) -> torch.Tensor:
    return torch.randn(n, generator=torch.Generator().manual_seed(seed))


def child(task):
    """A child's answer of CPU tensors, by task."""
    kind = task[0]
    if kind == "tensors":
        return {"status": "ok", **_payload()}
    if kind == "sized":
        return {"status": "ok", **_sized()}
    if kind == "bytes":
        return {"status": "ok", "t": torch.arange(task[1] // 4, dtype=torch.float32)}
    if kind == "unmap":  # the variant unmaps the memory it was lent, before its answer is copied in
        transport._opened["memory"].close()
        return {"status": "ok", "t": torch.ones(4)}
    if kind == "scribbles":
        return _scribbles(task[1])
    raise ValueError(task)


def _scribbles(seed: int) -> dict:
    """Answers a tensor and its digest, then overwrites the memory it was lent once the harness has copied the
    answer in: with 0xFF before the header leaves (through its own `isolate.send_frames`, so that the write
    surely lands before the parent's copy, whatever the machine's speed), then with 0x3F from a thread that goes
    on for 30 s, as a kernel still running on memory it no longer owns would."""
    from casebook.run import isolate

    t = _seeded(seed)
    send = isolate.send_frames

    def scribble_then_send(conn, header, blobs):
        isolate.send_frames = send
        memory = transport._opened["memory"]
        memory.tensor.fill_(0xFF)

        def keep_on():
            end = time.monotonic() + 30
            while time.monotonic() < end:
                memory.tensor.fill_(0x3F)
                time.sleep(0.001)

        threading.Thread(target=keep_on, daemon=True).start()
        send(conn, header, blobs)

    isolate.send_frames = scribble_then_send
    return {"status": "ok", "t": t, "d": digest(t)}


@slow
def test_a_worker_answers_through_the_arena(shm):
    """A child's CPU tensors cross in the lent host memory and arrive equal; nothing is left after release."""
    with Worker(child, arena=Arena(HostMemory)) as worker:
        answer = worker.request(("tensors",), 60, room=64 * 1024)
        assert answer["status"] == "ok" and worker.arena.taken == 7
        expected = _payload()
        for key in ("bf16", "f32", "i64", "strided", "offset"):
            assert torch.equal(answer[key], expected[key]), key
        assert answer["empty"].shape == (0, 4) and torch.equal(answer["nested"][0], expected["nested"][0])
        again = worker.request(("tensors",), 60)  # no room: everything crosses the host
        assert torch.equal(again["bf16"], expected["bf16"]) and worker.arena.taken == 7
    assert list(shm.iterdir()) == []


class _Full(HostMemory):
    """Memory that cannot be had past 1 MiB, as a full device's."""

    def __init__(self, nbytes: int, *a, **k):
        if nbytes > 2**20:
            raise RuntimeError("out of memory")
        super().__init__(nbytes, *a, **k)


@slow
def test_memory_that_cannot_be_lent_fails_the_request_not_the_run(shm):
    """A loan the device has no memory for (the parent's allocation fails, as it did on a full H200 and ended
    the whole run): that request fails with why, and the same child answers the next request."""
    with Worker(child, arena=Arena(_Full)) as worker:
        failed = worker.request(("tensors",), 60, room=2**21)
        assert failed["status"] == "crashed" and "could not be had" in failed["error"], failed
        pid = worker.proc.pid
        answer = worker.request(("tensors",), 60, room=64 * 1024)
        assert answer["status"] == "ok" and worker.proc.pid == pid and worker.arena.taken == 7
        assert worker.request(("tensors",), 60, room=2**21)["status"] == "crashed", "no larger memory to be had"
        for taken in (14, 21):  # the memory it had is still lent, whole, and still there after the child moves on
            again = worker.request(("tensors",), 60, room=64 * 1024)
            assert again["status"] == "ok" and worker.arena.taken == taken, (again, worker.crossing_error)
    assert list(shm.iterdir()) == []


@slow
def test_a_worker_answer_over_its_room_arrives_unsent(shm):
    """Without grow, a tensor over the room lent comes back as Unsent; the ones that fit arrive."""
    with Worker(child, arena=Arena(HostMemory)) as worker:
        answer = worker.request(("sized",), 60, room=1024)
    assert isinstance(answer["big"], Unsent) and "4096 bytes" in answer["big"].reason
    assert torch.equal(answer["small"], _sized()["small"]) and torch.equal(answer["after"], _sized()["after"])
    assert list(shm.iterdir()) == []


@slow
def test_a_growable_loan_grows_to_the_answer(shm):
    """With grow, a child lent 1 byte asks for more room and its 4 MiB answer arrives through the arena."""
    arena = Arena(HostMemory)
    with Worker(child, arena=arena) as worker:
        answer = worker.request(("bytes", 4 * MiB), 60, room=1, grow=True)
        assert torch.equal(answer["t"], torch.arange(MiB, dtype=torch.float32))
        assert arena.memory.nbytes >= 4 * MiB and arena.taken == 1
        assert len(list(shm.iterdir())) == 1  # the first, smaller memory freed once the child moved on
    assert list(shm.iterdir()) == []


@slow
def test_an_answer_lent_once_arrives_and_its_memory_is_gone_after(shm):
    """Over the arena's keep: each request's memory is fresh, the answer arrives equal, and nothing of it is left
    once the request has ended, in the parent or the child (the child answers the next request all the same)."""
    arena = Arena(HostMemory, keep=1024)
    with Worker(child, arena=arena) as worker:
        for _ in range(2):
            answer = worker.request(("bytes", 64 * 1024), 60, room=64 * 1024)
            assert torch.equal(answer["t"], torch.arange(16 * 1024, dtype=torch.float32))
            assert arena.memory is None and list(shm.iterdir()) == []
        assert arena.taken == 2
        small = worker.request(("bytes", 512), 60, room=512)  # within the keep: kept for the next request
        assert torch.equal(small["t"], torch.arange(128, dtype=torch.float32)) and arena.memory is not None
    assert list(shm.iterdir()) == []


@slow
def test_bytes_written_after_the_copy_show_in_the_digest(shm):
    """A child that overwrites its lent memory after the harness copied its answer in: the digest it sent does not
    match what arrives, and the parent's copy is its own (later writes do not reach it)."""
    expected = _seeded(11)
    arena = Arena(HostMemory)
    with Worker(child, arena=arena) as worker:
        answer = worker.request(("scribbles", 11), 60, room=4096)
        assert answer["status"] == "ok" and answer["d"] == digest(expected)  # the child's digest: of the original
        got = answer["t"]
        assert not set(expected.view(torch.uint8).unique().tolist()) <= {0xFF, 0x3F}  # the test can tell them apart
        assert set(got.view(torch.uint8).unique().tolist()) <= {0xFF, 0x3F}  # not a byte of the original
        assert digest(got) != answer["d"] and not torch.equal(got.view(torch.uint8), expected.view(torch.uint8))
        kept = got.view(torch.uint8).clone()
        deadline = time.monotonic() + 20
        while not bool((arena.memory.tensor[:4000] == 0x3F).all()) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert bool((arena.memory.tensor[:4000] == 0x3F).all()), "the child's later writes never landed"
        assert torch.equal(got.view(torch.uint8), kept)
    assert list(shm.iterdir()) == []


@slow
def test_a_child_that_unmaps_its_loan_is_refused_not_raised(shm):
    """A child that unmapped its lent memory before its answer was copied in: a crashed answer, no exception."""
    with Worker(child, arena=Arena(HostMemory)) as worker:
        assert worker.request(("bytes", 64), 60, room=4096)["status"] == "ok"  # opens the loan
        refused = worker.request(("unmap",), 60, room=4096)
        assert refused["status"] == "crashed" and "unmapped" in refused["error"]
        assert "t" not in refused
    assert list(shm.iterdir()) == []


@slow
def test_a_request_after_an_unmapped_loan_is_answered(shm):
    """After a child's answer was refused for an unmapped loan, the next request on the same Worker is answered."""
    with Worker(child, arena=Arena(HostMemory)) as worker:
        worker.request(("bytes", 64), 60, room=4096)
        assert worker.request(("unmap",), 60, room=4096)["status"] == "crashed"
        after = worker.request(("bytes", 64), 60, room=4096)
        assert after.get("status") == "ok", after
        assert torch.equal(after["t"], torch.arange(16, dtype=torch.float32))


class _Unmappable(Arena):
    """An arena whose file is gone by the time the child opens it (the parent's own mapping stays)."""

    def lend(self, room, **kw):
        grant = super().lend(room, **kw)
        os.unlink(self.memory.path)
        self.memory.owner = False
        return grant


@slow
def test_a_child_that_cannot_map_its_loan_answers_through_the_host_and_says_why(shm):
    """A loan the child cannot open: its tensors cross the host, and the Worker keeps why."""
    with Worker(child, arena=_Unmappable(HostMemory)) as worker:
        answer = worker.request(("sized",), 60, room=8192)
        assert torch.equal(answer["big"], _sized()["big"]) and worker.arena.taken == 0
        assert "FileNotFoundError" in worker.crossing_error
    assert list(shm.iterdir()) == []


# --- digest --------------------------------------------------------------------------------------------------

N = 3 * DIGEST_BLOCK * 4 + 104  # three whole 16 KiB blocks and a tail


def _bytes(n: int = N, seed: int = 3) -> torch.Tensor:
    return torch.randint(0, 256, (n,), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))


def test_digest_is_of_the_bytes_whatever_their_type_and_shape():
    """The same bytes give the same digest in any dtype view or shape."""
    b = _bytes()
    d = digest(b)
    assert d[0] == N
    for view in (b.view(torch.int32), b.view(torch.float32).reshape(2, -1), b.view(torch.bfloat16).reshape(2, -1),
                 b.view(torch.int64)[None], b.reshape(8, -1)):
        assert digest(view) == d
    x = b.view(torch.float32).reshape(-1, 2)
    assert digest(x.t()) == digest(x.t().contiguous())


@pytest.mark.parametrize("at", [0, N // 2, 3 * DIGEST_BLOCK * 4 - 1, 3 * DIGEST_BLOCK * 4, N - 1],
                         ids=["first", "middle", "last-of-blocks", "first-of-tail", "last"])
def test_one_changed_byte_changes_the_digest(at):
    """A single byte changed anywhere, in a whole block or in the tail past them, changes the digest."""
    b = _bytes()
    for delta in (1, 128, 255):
        c = b.clone()
        c[at] = (int(c[at]) + delta) % 256
        assert digest(c) != digest(b), (at, delta)


def test_swapped_blocks_change_the_digest():
    """Blocks are weighted by position: two whole blocks swapped change the digest (their sum does not)."""
    b = _bytes()
    block = DIGEST_BLOCK * 4
    c = b.clone()
    c[:block], c[block:2 * block] = b[block:2 * block], b[:block]
    assert digest(c)[:2] == digest(b)[:2] and digest(c) != digest(b)


def test_digest_of_a_view_at_an_odd_offset_and_of_nothing():
    """A view whose storage offset is not a multiple of 4 bytes, and an empty tensor, have digests."""
    big = _bytes(N + 3)
    assert digest(big[1:N + 1]) == digest(big[1:N + 1].clone())
    h = torch.randn(1001, generator=torch.Generator().manual_seed(5)).half()
    assert digest(h[1:]) == digest(h[1:].clone())
    assert digest(torch.empty(0)) == digest(torch.empty(0, 3, dtype=torch.bfloat16)) == [0, 0, 0]


@gpu
def test_digest_is_the_same_on_the_gpu():
    """The same bytes give the same digest on a GPU as on the CPU."""
    for t in (_bytes(), _bytes(N + 3)[1:], torch.randn(5000, dtype=torch.float64)):
        assert digest(t.cuda()) == digest(t)


# --- which crossing ------------------------------------------------------------------------------------------


def test_arena_for_host_when_asked(monkeypatch):
    """CASEBOOK_TRANSPORT=host: no arena, on a CPU or a GPU."""
    monkeypatch.setenv("CASEBOOK_TRANSPORT", "host")
    for device in ("cpu", "cuda"):
        arena, why = arena_for(device)
        assert arena is None and why.startswith("host")


def test_arena_for_a_cpu(monkeypatch):
    """On a CPU: the host crossing by default; shared host memory with CASEBOOK_TRANSPORT=device."""
    monkeypatch.delenv("CASEBOOK_TRANSPORT", raising=False)
    arena, why = arena_for("cpu")
    assert arena is None and why.startswith("host: ")
    monkeypatch.setenv("CASEBOOK_TRANSPORT", "device")
    arena, why = arena_for("cpu")
    assert isinstance(arena, Arena) and arena.memory_type is HostMemory and arena.device == "cpu"
    assert "device" in why and arena.memory is None  # nothing allocated until it lends


# --- on a GPU: CUDA IPC --------------------------------------------------------------------------------------


def gpu_child(task):
    """A child's answer of CUDA tensors (and one CPU tensor, which crosses the host), by task."""
    kind = task[0]
    if kind == "tensors":
        g = torch.Generator().manual_seed(7)
        return {"status": "ok", "bf16": torch.randn(33, 17, generator=g).to(torch.bfloat16).cuda(),
                "i64": torch.arange(-5, 6).cuda(), "strided": torch.arange(24.0).cuda().reshape(4, 6).t(),
                "empty": torch.empty(0, 4, device="cuda"), "cpu": torch.arange(5)}
    if kind == "bytes":
        return {"status": "ok", "t": torch.arange(task[1] // 4, dtype=torch.float32, device="cuda")}
    if kind == "unmap":
        transport._opened["memory"].close()
        return {"status": "ok", "t": torch.ones(4, device="cuda")}
    raise ValueError(task)


@gpu
@slow
def test_a_worker_answers_through_device_memory(shm):
    """A child's CUDA tensors cross in the lent device memory and arrive on the GPU, equal; CPU ones, the host."""
    arena = Arena(CudaMemory)
    with Worker(gpu_child, arena=arena) as worker:
        answer = worker.request(("tensors",), 120, room=MiB)
        assert answer["status"] == "ok" and arena.taken == 4
    g = torch.Generator().manual_seed(7)
    assert answer["bf16"].is_cuda and torch.equal(answer["bf16"].cpu(), torch.randn(33, 17, generator=g).bfloat16())
    assert answer["i64"].is_cuda and answer["i64"].tolist() == list(range(-5, 6))
    assert torch.equal(answer["strided"].cpu(), torch.arange(24.0).reshape(4, 6).t())
    assert answer["empty"].is_cuda and answer["empty"].shape == (0, 4)
    assert not answer["cpu"].is_cuda and answer["cpu"].tolist() == list(range(5))


@gpu
@slow
def test_a_growable_device_loan_grows_to_the_answer(shm):
    """With grow, a child lent 1 byte of device memory gets room for its 4 MiB answer."""
    arena = Arena(CudaMemory)
    with Worker(gpu_child, arena=arena) as worker:
        answer = worker.request(("bytes", 4 * MiB), 120, room=1, grow=True)
        assert arena.memory.nbytes >= 4 * MiB and arena.taken == 1
    assert answer["t"].is_cuda and torch.equal(answer["t"].cpu(), torch.arange(MiB, dtype=torch.float32))


@gpu
@slow
def test_a_child_that_unmaps_its_device_loan_is_refused(shm):
    """A child that closed its IPC mapping before its answer was copied in: a crashed answer, no exception."""
    with Worker(gpu_child, arena=Arena(CudaMemory)) as worker:
        assert worker.request(("bytes", 64), 120, room=4096)["status"] == "ok"
        refused = worker.request(("unmap",), 120, room=4096)
        assert refused["status"] == "crashed" and "unmapped" in refused["error"]


@gpu
@slow
def test_a_request_after_an_unmapped_device_loan_is_answered(shm):
    """After a refused answer for an unmapped device loan, the next request on the same Worker is answered."""
    with Worker(gpu_child, arena=Arena(CudaMemory)) as worker:
        worker.request(("bytes", 64), 120, room=4096)
        worker.request(("unmap",), 120, room=4096)
        after = worker.request(("bytes", 64), 120, room=4096)
        assert after.get("status") == "ok", after


@gpu
def test_a_forged_offset_outside_a_device_loan_is_refused():
    """receive refuses an offset outside the room of a CUDA IPC loan, and reads one inside it."""
    arena = Arena(CudaMemory)
    try:
        grant = arena.lend(1024)
        with pytest.raises(BadMessage, match="outside"):
            receive(_frames(_lent_header([16], [1020], grant["id"])), time.monotonic() + 5, arena=arena)
        back = receive(_frames(_lent_header([16], [512], grant["id"])), time.monotonic() + 5, arena=arena)
        assert back[0].is_cuda and back[0].tolist() == [0] * 16
    finally:
        arena.close()


def test_a_message_s_tensors_are_freed_without_the_cycle_collector():
    """`split` and `_rebuild` walk a message with functions of the module, not closures that call themselves
    (each such closure a reference cycle, which held every tensor of a message, and its host copies, until the
    cycle collector ran)."""
    import gc
    import weakref

    from casebook.run import transport

    gc.collect()
    gc.disable()
    try:
        t = torch.arange(1000.0)
        gone = weakref.ref(t)
        header, frames = transport.split({"done": {"a": [t, (t[:10],)], "b": 1}})
        del t
        body, sizes, _, _ = transport._header(header)
        blob = torch.frombuffer(bytearray(frames[0]), dtype=torch.uint8)
        rebuilt = transport._rebuild(body, [blob, torch.frombuffer(bytearray(frames[1]), dtype=torch.uint8)])
        assert torch.equal(rebuilt["done"]["a"][0], torch.arange(1000.0))
        seen = weakref.ref(rebuilt["done"]["a"][0])
        del header, frames, body, blob, rebuilt
        assert gone() is None and seen() is None
    finally:
        gc.enable()


def test_device_memory_a_process_holds_for_good_is_collected_once_then_learned(monkeypatch):
    """A process that holds memory for good (a flush buffer) pays a full collection after its first task, not after
    every task; memory beyond that held after a task still sends the cycles to the collector."""
    import sys
    import types

    allocated = {"bytes": 3 * transport.GARBAGE_BYTES}
    cuda = types.SimpleNamespace(is_initialized=lambda: True, memory_allocated=lambda: allocated["bytes"],
                                 empty_cache=lambda: None)
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(cuda=cuda))
    monkeypatch.setattr(transport, "_standing", 0)
    collections = []
    monkeypatch.setattr(transport.gc, "collect", lambda: collections.append(allocated["bytes"]))
    transport.give_back_device_memory()
    transport.give_back_device_memory(keeping=0)
    assert len(collections) == 1  # the standing memory learned, not collected again
    allocated["bytes"] += 2 * transport.GARBAGE_BYTES  # a task's leftovers beyond it
    transport.give_back_device_memory()
    assert len(collections) == 2
