"""Device check: does the device crossing work on this machine, and how fast is it?

Not a casebook run. The first H200 run of the device crossing (`casebook.run.transport`, CUDA IPC through
`casebook.run.cuda_ipc`) took host-crossing times (a 268 MB output in about 0.2 s, answers in seconds): the child
had fallen back to the host, and the run did not say why. This probe says, step by step: the parent allocates
a block and exports its handle; a spawned child opens it through the driver (ctypes), writes a pattern and
says what failed if anything; the parent reads the pattern back. Then a `Worker` round trip of a 1 GiB bf16
output through an `Arena`, timed, and the crossing the child reports.

Measured on an H200: the handle crossed as `bytes(handle.reserved)`, which stops at the first zero byte, so
every child refused it ("an IPC handle is 64 bytes") and the run fell back to the host, as designed but silently;
points now say which crossing their outputs took. With the handle's 64 bytes whole: the child opened the block
and wrote, the parent read the pattern back; the 1 GiB round trip took 4.0 s the first time (the child's start),
then 2 ms, 0.5-0.6 ms of it the parent's copy.

    python3 benchmarks/explore/method/crossing_probe.py          (GPU)
"""

import multiprocessing as mp
import time
import traceback


def child(handle_hex: str, nbytes: int, q) -> None:
    try:
        import torch

        torch.zeros(1, device="cuda")
        from casebook.run import cuda_ipc

        block = cuda_ipc.Block.open(handle_hex, nbytes)
        block.tensor.fill_(7)
        torch.cuda.synchronize()
        block.close()
        q.put("child: opened, wrote 7s, closed")
    except Exception:
        q.put("child failed:\n" + traceback.format_exc())


def big(task):
    import torch

    return {"t": torch.ones(2**29, dtype=torch.bfloat16, device="cuda")}


def main() -> None:
    import torch

    from casebook.run import cuda_ipc
    from casebook.run.isolate import Worker
    from casebook.run.transport import Arena, CudaMemory

    torch.zeros(1, device="cuda")
    print("unavailable():", cuda_ipc.unavailable(), flush=True)
    block = cuda_ipc.Block.allocate(2**20)
    block.tensor.zero_()
    handle = block.handle_hex()
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=child, args=(handle, 2**20, q))
    p.start()
    print(q.get(timeout=120), flush=True)
    p.join(30)
    print("parent reads:", int(block.tensor.sum()), "(7 x 2**20 =", 7 * 2**20, ")", flush=True)
    block.close()
    with Worker(big, arena=Arena(CudaMemory)) as w:
        for i in range(3):
            t0 = time.perf_counter()
            out = w.request(None, 120, room=2**30)
            took = time.perf_counter() - t0
            t = out.get("t")
            print(f"round trip {i}: {took:.3f} s, read {w.receive_s:.4f} s, on {getattr(t, 'device', None)}, "
                  f"crossing error {w.crossing_error!r}, status {out.get('status')} {out.get('error', '')}",
                  flush=True)


if __name__ == "__main__":
    main()
