"""Shared by the softmax row explorations (answers no question itself): their inputs and timing line.

Imported by the scripts beside it (run as `python3 benchmarks/explore/SCRIPT.py`, so this directory
is on the path); GPU only.
"""
import torch

from casebook.run.bench import Protocol, time_fn

PROTO = Protocol(time_cap_s=0.2, target_ci=0.02)


def logits(n_rows: int, n_cols: int, dtype: torch.dtype):
    """Logits with the case's spread (std 2) on the GPU, their fp32 softmax, the bytes of one read and
    one write, and a label: (x, ref, nbytes, key)."""
    x = torch.randn(n_rows, n_cols, device="cuda").mul_(2).to(dtype)
    return x, torch.softmax(x.float(), -1), 2 * x.numel() * x.element_size(), f"{n_rows}x{n_cols} {str(dtype)[6:]}"


def bench(label: str, f, ref: torch.Tensor, nbytes: int, width: int = 62) -> None:
    """Check f() against ref, time it with the casebook harness, print median, p10, p90, TB/s and the
    error; a failure is printed, not raised, so a sweep goes on."""
    try:
        y = f()
        err = ((y.float() - ref).norm() / ref.norm()).item()
        t = time_fn(f, "cuda", PROTO).summary
        print(f"{label:{width}s} {t.median_us:8.1f} us  p10 {t.p10_us:7.1f}  p90 {t.p90_us:7.1f}  "
              f"{nbytes / t.median_us / 1e6:6.3f} TB/s  err {err:.1e}", flush=True)
    except Exception as e:
        print(f"{label:{width}s} ERROR {repr(e)[:160]}", flush=True)
