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
        if "variants" in json.loads(cmd[-1]):  # the one process for all: broken here, so a process a variant
            return subprocess.CompletedProcess(cmd, 1, "ncu: ==ERROR== the application crashed\n", "")
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
    rows = {r.variant: r for r in counters.read(load_case(CASE), ran, progress=lambda msg: None)}

    assert set(rows) == {"eager", "torch_softmax", "triton_onepass", "triton_online"}  # only what ran on the GPU
    assert rows["eager"].kernels == 5 and rows["eager"].measured_bytes == 4.2e9
    assert rows["eager"].flagged and abs(rows["eager"].gap - (4.2e9 / 2**30 - 1)) < 1e-9
    assert not rows["triton_online"].flagged  # 1048 MB against 1074: -2.4%
    assert rows["triton_onepass"].model_dump(exclude_unset=True) == {
        "variant": "triton_onepass", "shape": rows["eager"].shape, "dtype": "bf16",
        "not_applicable": "triton_onepass holds at most 32768 columns on chip; got 65536"}
    assert rows["torch_softmax"].error.startswith("ncu gave no counters (exit 1)")


def _marked_csv(groups: list[list[tuple[float, float]]]) -> str:
    """ncu's CSV for a process whose variants' calls each follow a marker kernel: (read, write) bytes a kernel."""
    lines, k = ['"ID","Kernel Name","Metric Name","Metric Unit","Metric Value"'], 0
    for group in groups:
        for name, (read, write) in [("at::cuda::spin_kernel(long)", (0.0, 0.0))] + [(f"k{k}", rw) for rw in group]:
            lines.append(f'"{k}","{name}","dram__bytes_read.sum","byte","{read:.0f}"')
            lines.append(f'"{k}","{name}","dram__bytes_write.sum","byte","{write:.0f}"')
            k += 1
    return "\n".join(lines)


def _ran(*names):
    return Result.model_validate(empty_result(variants=[
        {"name": n, "note": "-", "backends": ["cuda"], "device": "cuda", "mode": "timed"} for n in names]))


def _said(name, **what):
    return "CASEBOOK_VARIANT=" + json.dumps({"name": name, **what})


def test_every_variant_in_one_profiled_process_split_at_the_markers(monkeypatch):
    calls = []

    def fake_ncu(cmd, **kwargs):
        calls.append(json.loads(cmd[-1]))
        out = "\n".join([_said("eager", profiled=True), _said("torch_softmax", profiled=True),
                         _said("triton_onepass", not_applicable="holds at most 32768 columns"),
                         _said("triton_online", profiled=True),
                         _marked_csv([[(1e9, 1e9), (1e9, 1.2e9)], [(536e6, 512e6)], [(530e6, 520e6)]]),
                         "CASEBOOK_MODELLED_BYTES=1073741824"])
        return subprocess.CompletedProcess(cmd, 0, out, "")

    monkeypatch.setattr(counters.shutil, "which", lambda name: "/usr/bin/ncu")
    monkeypatch.setattr(counters.subprocess, "run", fake_ncu)
    ran = _ran("eager", "torch_softmax", "triton_onepass", "triton_online")
    rows = {r.variant: r for r in counters.read(load_case(CASE), ran, progress=lambda msg: None)}
    assert len(calls) == 1 and [n for n, _ in calls[0]["variants"]] == list(rows)  # one process, the ladder's order
    assert rows["eager"].kernels == 2 and rows["eager"].measured_bytes == 4.2e9  # the markers not counted
    assert rows["torch_softmax"].measured_bytes == 1048e6 and not rows["torch_softmax"].flagged
    assert rows["triton_onepass"].not_applicable == "holds at most 32768 columns"
    assert rows["triton_online"].kernels == 1 and rows["triton_online"].read_bytes == 530e6


def test_the_profiled_process_uses_the_runs_compile_caches_and_autotuning_picks(monkeypatch):
    """Else it compiled every kernel and tuned every autotuner again, and may have profiled another pick."""
    envs = []

    def fake_ncu(cmd, **kwargs):
        envs.append(kwargs["env"])
        out = "\n".join([_said("eager", profiled=True), _marked_csv([[(1e9, 1e9)]]), "CASEBOOK_MODELLED_BYTES=1"])
        return subprocess.CompletedProcess(cmd, 0, out, "")

    for var in ("TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_AUTOTUNING"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("CASEBOOK_SOMETHING_OF_THE_CALLER", "kept")
    monkeypatch.setattr(counters.shutil, "which", lambda name: "/usr/bin/ncu")
    monkeypatch.setattr(counters.subprocess, "run", fake_ncu)
    counters.read(load_case(CASE), _ran("eager"), progress=lambda msg: None)
    from casebook import paths

    assert envs and envs[0]["TRITON_CACHE_DIR"] == str(paths.CACHE_DIR / "triton")
    assert envs[0]["TORCHINDUCTOR_CACHE_DIR"] == str(paths.CACHE_DIR / "inductor")
    assert envs[0]["TRITON_CACHE_AUTOTUNING"] == "1" and envs[0]["CASEBOOK_SOMETHING_OF_THE_CALLER"] == "kept"


def test_a_call_that_launched_no_kernel_has_no_counters_not_zero_bytes(monkeypatch):
    def fake_ncu(cmd, **kwargs):  # the copy's call: a copy-engine transfer between its marker and the next
        out = "\n".join([_said("eager", profiled=True), _said("torch_softmax", profiled=True),
                         _marked_csv([[(1e9, 1e9)], []]), "CASEBOOK_MODELLED_BYTES=1073741824"])
        return subprocess.CompletedProcess(cmd, 0, out, "")

    monkeypatch.setattr(counters.shutil, "which", lambda name: "/usr/bin/ncu")
    monkeypatch.setattr(counters.subprocess, "run", fake_ncu)
    rows = {r.variant: r for r in counters.read(load_case(CASE), _ran("eager", "torch_softmax"),
                                                  progress=lambda msg: None)}
    assert rows["eager"].measured_bytes == 2e9
    assert rows["torch_softmax"].measured_bytes is None and rows["torch_softmax"].gap is None
    assert rows["torch_softmax"].error == counters.NO_KERNEL and rows["torch_softmax"].modelled_bytes == 2**30


def test_kernels_that_do_not_split_one_a_variant_are_profiled_a_process_each(monkeypatch):
    alone = []

    def fake_ncu(cmd, **kwargs):
        spec = json.loads(cmd[-1])
        if "variants" in spec:  # two variants said profiled, one marker seen: the split would misplace kernels
            out = "\n".join([_said("eager", profiled=True), _said("triton_online", profiled=True),
                             _marked_csv([[(1e9, 1e9)]]), "CASEBOOK_MODELLED_BYTES=1073741824"])
            return subprocess.CompletedProcess(cmd, 0, out, "")
        alone.append(spec["fn"])
        return subprocess.CompletedProcess(cmd, 0, _csv(536e6, 512e6, 1) + "\nCASEBOOK_MODELLED_BYTES=1073741824\n", "")

    monkeypatch.setattr(counters.shutil, "which", lambda name: "/usr/bin/ncu")
    monkeypatch.setattr(counters.subprocess, "run", fake_ncu)
    rows = counters.read(load_case(CASE), _ran("eager", "triton_online"), progress=lambda msg: None)
    assert alone == ["eager", "triton_online"] and all(r.measured_bytes == 1048e6 for r in rows)
