"""counters.read without a GPU: ncu's CSV summed per variant, gaps flagged, and a variant's own word that
it does not cover the counters' shape recorded as not applicable (not as an error tail)."""

from __future__ import annotations

import json
import subprocess

from casebook.load import load_case
from casebook.result import Result
from casebook.run import counters

from conftest import SOFTMAX as CASE
from conftest import empty_result


def _csv(read: float, write: float, kernels: int) -> str:
    lines = ['"ID","Kernel Name","Metric Name","Metric Unit","Metric Value"']
    for k in range(kernels):
        lines.append(f'"{k}","k{k}","dram__bytes_read.sum","Mbyte","{read / kernels / 1e6:,.3f}"')
        lines.append(f'"{k}","k{k}","dram__bytes_write.sum","byte","{write / kernels:.0f}"')
    return "\n".join(lines)


def test_counters_sum_kernels_flag_gaps_and_record_what_does_not_apply(monkeypatch):
    def fake_ncu(cmd, **kwargs):
        fn = json.loads(cmd[-1])["fn"]
        if fn == "triton_onepass":
            out = "CASEBOOK_NOT_APPLICABLE=triton_onepass holds at most 32768 columns on chip; got 65536\n"
        elif fn == "eager":
            out = _csv(3e9, 1.2e9, 5) + "\nCASEBOOK_MODELLED_BYTES=1073741824\n"
        elif fn == "torch_softmax":
            out = "ncu: ==ERROR== the application crashed\n"
        else:
            out = _csv(536e6, 512e6, 1) + "\nCASEBOOK_MODELLED_BYTES=1073741824\n"
        return subprocess.CompletedProcess(cmd, 0 if fn != "torch_softmax" else 1, out, "Traceback: boom")

    monkeypatch.setattr(counters.shutil, "which", lambda name: "/usr/bin/ncu")
    monkeypatch.setattr(counters.subprocess, "run", fake_ncu)
    ran = Result.model_validate(empty_result(variants=[
        {"name": n, "note": "-", "backends": ["cuda"], "device": "cuda", "mode": "timed"}
        for n in ("eager", "torch_softmax", "triton_onepass", "triton_online")]))
    rows = {r["variant"]: r for r in counters.read(load_case(CASE), ran, progress=lambda msg: None)}

    assert set(rows) == {"eager", "torch_softmax", "triton_onepass", "triton_online"}  # only what ran on the GPU
    assert rows["eager"]["kernels"] == 5 and rows["eager"]["measured_bytes"] == 4.2e9
    assert rows["eager"]["flagged"] and abs(rows["eager"]["gap"] - (4.2e9 / 2**30 - 1)) < 1e-9
    assert not rows["triton_online"]["flagged"]  # 1048 MB against 1074: -2.4%
    assert rows["triton_onepass"] == {"variant": "triton_onepass", "shape": rows["eager"]["shape"], "dtype": "bf16",
                                      "not_applicable": "triton_onepass holds at most 32768 columns on chip; got 65536"}
    assert rows["torch_softmax"]["error"].startswith("ncu gave no counters (exit 1)")
