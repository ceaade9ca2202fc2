"""Device check: can a fresh GPU's ceilings be measured in seconds without reading lower?

Not a casebook run. On a fresh H200, `casebook hardware` took 41 s, nearly all of it 17 rests of 2 s before
the ceiling matmuls (4 shapes x bf16, fp16, tf32 and fp8, and fp32 once), each timed for up to 1 s. Where GPU
machines are rented by the job, every job pays it.

Prediction, written before running: the rest exists because a GPU at its power limit sets its clock by its
recent power draw (3 s of 8192^3 matmuls took an H200 from 1980 to 1470 MHz). A ceiling is the fastest
repetition of a few tens of milliseconds of matmuls; after 0.5 s idle the clock has not dropped, so the same
shapes read the same rates. fp16, tf32 and fp8 reach their best at the shapes bf16 does (the two largest),
so timing them at bf16's two fastest shapes loses nothing. Expected: every ceiling of the quick measurement
within 1% of the thorough one, in about a quarter of its time.

The script measures the quick way (the default), the thorough way (every shape for every dtype, 2 s rests,
1 s a ceiling), and the quick way again, and prints each ceiling's ratio to the thorough one.

Measured on an H200 (after a 3-minute softmax run on the same machine): quick 12.2 s (the first, CUDA's start
in it), thorough 36.0 s, quick again 7.2 s; inside a fresh `casebook run` the ceilings took 7.6-7.8 s. Against
the thorough measurement the two quick ones read: copy 1.002 / 1.000, bf16 0.997 / 0.995, fp16 1.009 / 1.008,
fp32 1.001 / 0.999, fp8 1.017 / 0.995, tf32 1.032 / 1.032 (the thorough one read 401 TFLOP/s where earlier
runs read 413-419: it was the low one). The prediction held for the rates. The launch ceiling did not: 10.5 and
9.2 us quick against 6.7 us thorough, the fastest of 200 back-to-back launches being a host's pace, which
scatters; the launch is timed for 1 s again (1.5 s more), not yet measured since.

    python3 benchmarks/explore/method/ceilings_rested.py          (GPU)
"""

import time

from casebook.run import hardware

RUNS = (("quick", {}), ("thorough", {"rest_s": 2.0, "best_shapes": None, "time_cap_s": 1.0}), ("quick again", {}))


def flat(measured: dict) -> dict:
    return {"copy GB/s": measured["copy_gbps"], **{f"{k} TFLOP/s": v for k, v in measured["matmul_tflops"].items()},
            "launch us": measured["launch_us"], "graph launch us": measured["graph_launch_us"]}


def main() -> None:
    seen = {}
    for label, kwargs in RUNS:
        t0 = time.perf_counter()
        seen[label] = flat(hardware.measure_gpu(**kwargs))
        print(f"{label}: {time.perf_counter() - t0:.1f} s", flush=True)
    print(f"{'ceiling':18s} " + " ".join(f"{label:>12s}" for label, _ in RUNS) + "   quick/thorough")
    for key in seen["thorough"]:
        values = [seen[label][key] for label, _ in RUNS]
        ratios = " ".join(f"{seen[q][key] / seen['thorough'][key]:.4f}" for q in ("quick", "quick again"))
        print(f"{key:18s} " + " ".join(f"{v:12.2f}" for v in values) + f"   {ratios}")


if __name__ == "__main__":
    main()
