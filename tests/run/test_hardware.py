"""casebook.run.hardware: the registry, and the source hash that names the harness code that measured."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from casebook import paths, roofline
from casebook.result import Ceilings, Machine
from casebook.run import hardware

PACKAGE = Path(hardware.__file__).resolve().parents[1]


def test_source_hash_names_the_code_not_the_checkout(tmp_path):
    copy = tmp_path / "casebook"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    assert hardware.source_sha256(copy) == hardware.source_sha256()  # same bytes anywhere: same hash
    (copy / "roofline.py").write_text((copy / "roofline.py").read_text() + "\n# one more line\n")
    assert hardware.source_sha256(copy) != hardware.source_sha256()
    (copy / "roofline.py").rename(copy / "roofs.py")  # a rename is a change too
    assert hardware.source_sha256(copy) != hardware.source_sha256()


def test_the_registry_lists_the_h200_with_its_sources():
    entry = next(e for e in hardware.datasheets().values() if "H200" in e["name"])
    assert entry["bandwidth_gbps"] == 4800 and entry["source"].startswith("https://")


# --- hardware names ------------------------------------------------------------------------------------

GIB = 2**30


def test_a_cpu_name_has_model_cores_and_memory_class():
    assert hardware.cpu_slug("AMD EPYC 7B13", 2, int(23.5 * GIB)) == "cpu-amd-epyc-7b13-2c-24g"
    assert hardware.cpu_slug("Intel(R) Xeon(R) CPU @ 2.20GHz", 8, 31 * GIB) == "cpu-intel-xeon-8c-32g"
    assert hardware.cpu_slug("AMD EPYC 7B13 64-Core Processor", 64, 250 * GIB) == "cpu-amd-epyc-7b13-64c-256g"
    assert hardware.cpu_slug("", 2, None) == "cpu-unknown-2c"


def test_machines_the_model_alone_merged_are_told_apart():
    """One "AMD EPYC" name stood for a 46 GB/s and a 16-19 GB/s machine; their cores or memory differ."""
    names = {hardware.cpu_slug("AMD EPYC", cores, mem) for cores, mem in ((2, 24 * GIB), (4, 16 * GIB), (2, 8 * GIB))}
    assert len(names) == 3


def test_memory_class_is_stable_across_small_differences():
    assert {hardware.memory_class_gib(int(g * GIB)) for g in (22.9, 23.5, 24.0, 25.1)} == {24}
    assert hardware.memory_class_gib(int(15.6 * GIB)) == 16 and hardware.memory_class_gib(int(11 * GIB)) == 12


def test_identify_names_this_cpu_by_the_rule(monkeypatch):
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    ident = hardware.identify()
    assert ident.slug == hardware.cpu_slug(hardware.cpu_model(), ident.cores, hardware.memory_bytes())


def test_ceilings_apart_over_a_fifth():
    def measured(copy_gbps: float, fp32: float) -> Ceilings:
        return Ceilings(copy_gbps=copy_gbps, matmul_tflops={"fp32": fp32}, launch_us=5.0, graph_launch_us=5.0)

    a = measured(45.9, 0.2)
    assert roofline.ceilings_apart(a, measured(19.3, 0.21)) == ["copy 45.9 vs 19.3 GB/s"]
    assert roofline.ceilings_apart(a, measured(40.0, 0.23)) == []
    assert roofline.ceilings_apart(a, measured(45.0, 0.3)) == ["fp32 matmul 0.2 vs 0.3 TFLOP/s"]


def test_cached_ceilings_beyond_the_datasheet_are_measured_again():
    from casebook.run.hardware import ceilings_implausible

    sheet = Machine(slug="nvidia-h200", name="NVIDIA H200", kind="gpu", datasheet={
        "name": "NVIDIA H200", "match": ["H200"], "bandwidth_gbps": 4800, "peak_tflops": {"bf16": 989.4}})
    good = {"copy_gbps": 4200.0, "matmul_tflops": {"bf16": 700.0}, "launch_us": 4.0, "graph_launch_us": 0.8}
    assert ceilings_implausible(good, sheet) == []
    assert ceilings_implausible({**good, "copy_gbps": 48000.0}, sheet)  # a tenfold bandwidth: a tampered cache
    assert ceilings_implausible({**good, "read_gbps": 4600.0, "write_gbps": 4400.0}, sheet) == []
    assert ceilings_implausible({**good, "read_gbps": 46000.0}, sheet)
    assert ceilings_implausible({**good, "write_gbps": -1.0}, sheet)
    assert ceilings_implausible({**good, "matmul_tflops": {"bf16": -1.0}}, sheet)
    assert ceilings_implausible({**good, "launch_us": None}, sheet.model_copy(update={"datasheet": None})) == [
        "a ceiling is not a positive number"]


def fake_ceilings(copy_gbps: float) -> dict:
    return {"copy_gbps": copy_gbps, "matmul_tflops": {"fp32": 0.1}, "launch_us": 2.0, "graph_launch_us": 2.0}


def test_ceilings_measured_on_a_busy_machine_are_measured_again_and_never_cached(tmp_path, monkeypatch):
    monkeypatch.setattr(paths, "CACHE_DIR", tmp_path)
    monkeypatch.setattr(hardware, "identify", lambda: Machine(slug="cpu-toy", name="toy", kind="cpu"))
    attempts = iter([fake_ceilings(3.7), fake_ceilings(12.0), fake_ceilings(9.0)])
    monkeypatch.setattr(hardware, "measure_cpu", lambda: next(attempts))
    monkeypatch.setattr(hardware.stability, "reading_reasons", lambda reading: ["waited for a CPU 40% of the timing"])
    busy = hardware.ceilings()
    assert busy["copy_gbps"] == 12.0  # each ceiling at its best over the attempts
    assert busy["unstable"] == ["waited for a CPU 40% of the timing"]
    assert not list(tmp_path.glob("ceilings-*.json"))  # the next run measures again

    monkeypatch.setattr(hardware.stability, "reading_reasons", lambda reading: [])
    monkeypatch.setattr(hardware, "measure_cpu", lambda: fake_ceilings(13.0))
    quiet = hardware.ceilings()
    assert quiet["copy_gbps"] == 13.0 and not quiet["unstable"]
    assert json.loads((tmp_path / "ceilings-cpu-toy.json").read_text())["copy_gbps"] == 13.0
    monkeypatch.setattr(hardware, "measure_cpu", lambda: pytest.fail("a quiet measurement is cached"))
    assert hardware.ceilings()["copy_gbps"] == 13.0


def test_two_measurements_keep_each_stream_at_its_best_and_one_measured_once_as_it_was():
    a = {**fake_ceilings(10.0), "launch_us": 2.0, "read_gbps": 14.0, "write_gbps": 9.0}
    b = {**fake_ceilings(12.0), "launch_us": 3.0, "read_gbps": 13.0}
    merged = hardware.best_of(a, b)
    assert (merged["copy_gbps"], merged["read_gbps"], merged["write_gbps"], merged["launch_us"]) == (12.0, 14.0, 9.0,
                                                                                                    2.0)
    assert "read_gbps" not in hardware.best_of(fake_ceilings(1.0), fake_ceilings(2.0))


def test_each_gpu_of_a_host_has_its_own_ceilings_and_is_named_in_the_result(monkeypatch):
    """The ceilings are cached per GPU (its UUID), and the environment names the device that ran."""
    def smi(fields=()):
        return {"uuid": f"GPU-{os.environ['CUDA_VISIBLE_DEVICES']}aa", "pci_bus_id": "00000000:19:00.0"}

    monkeypatch.setattr(hardware, "_nvidia_smi", smi)
    gpu = Machine(kind="gpu", slug="nvidia-h200", name="NVIDIA H200")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    assert hardware.ceilings_key(gpu) == "nvidia-h200-gpu-3aa"
    assert hardware.device() == {"cuda_visible_devices": "3", "uuid": "GPU-3aa", "pci_bus_id": "00000000:19:00.0"}
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5,6")
    assert hardware.visible_device() == "5"  # nvidia-smi's -i names the first
    assert hardware.ceilings_key(Machine(kind="cpu", slug="cpu-x-2c-24g", name="x")) == "cpu-x-2c-24g"


@pytest.mark.slow
def test_a_cpus_matmul_ceilings_are_each_measured_in_their_own_dtype():
    """No rate copied from another: fp32, fp64, bf16 and fp16 each timed (one 2-core EPYC: 0.17, 0.08, 0.41 and
    0.001 TFLOP/s); a CPU has no tf32, so none is reported and its points fall under the fp32 roof."""
    from casebook.run.hardware import CPU_MATMULS, measure_cpu

    measured = measure_cpu()
    assert sorted(measured["matmul_tflops"]) == sorted(name for name, _, _ in CPU_MATMULS) == [
        "bf16", "fp16", "fp32", "fp64"]
    assert all(v > 0 for v in measured["matmul_tflops"].values())
    assert "tf32" not in measured["matmul_tflops"] and "no tf32" in measured["method"]["matmul"]
    assert measured["read_gbps"] > 0 and measured["write_gbps"] > 0 and "bytes read" in measured["method"]["read"]


def test_the_ceilings_say_whether_they_were_measured_now_or_read_from_the_cache(tmp_path, monkeypatch):
    import time

    from casebook.run import hardware

    monkeypatch.setattr(paths, "CACHE_DIR", tmp_path)
    monkeypatch.setattr(hardware, "identify", lambda devices=1: Machine(slug="cpu-x-2c-24g", name="x", kind="cpu"))
    now = time.time()
    stamp = hardware.datetime.datetime.now(hardware.datetime.timezone.utc).isoformat()
    fresh = {"measured_at": stamp, "measure_s": 4.5}
    assert hardware.provenance_of(fresh, now) == "measured now in 4.5 s"
    old = {"measured_at": "2026-12-01T00:00:00+00:00", "measure_s": 4.5}
    said = hardware.provenance_of(old, now)
    assert said.startswith(f"read from the cache {tmp_path / 'ceilings-cpu-x-2c-24g.json'}")
    assert "measured 2026-12-01T00:00:00+00:00 in 4.5 s" in said and "--remeasure" in said
    assert "at an unrecorded time" in hardware.provenance_of({}, now), "an older cache: it says it does not know"


@pytest.mark.parametrize("tamper", [{"by_the_variant": True}, {"copy_gbps": "fast"}, {"matmul_tflops": [1.0]}])
def test_a_cache_that_is_not_ceilings_is_measured_again_not_believed(tmp_path, monkeypatch, tamper):
    """The cache is a file any process of the user can write (a variant's child among them): one with a key of its
    own or a rate of the wrong type once ended every later run with a ValidationError; now it is measured again."""
    monkeypatch.setattr(paths, "CACHE_DIR", tmp_path)
    monkeypatch.setattr(hardware, "identify", lambda: Machine(slug="cpu-toy", name="toy", kind="cpu"))
    monkeypatch.setattr(hardware.stability, "reading_reasons", lambda reading: [])
    monkeypatch.setattr(hardware, "measure_cpu", lambda: fake_ceilings(13.0))
    hardware.ceilings()
    cache = tmp_path / "ceilings-cpu-toy.json"
    cache.write_text(json.dumps({**json.loads(cache.read_text()), **tamper}))
    monkeypatch.setattr(hardware, "measure_cpu", lambda: fake_ceilings(14.0))
    assert hardware.ceilings()["copy_gbps"] == 14.0


def test_a_checkout_is_dirty_by_its_code_and_cases_not_by_the_results_it_stores(tmp_path, monkeypatch):
    """`casebook_dirty`: an edit to the harness, a kernel or a case; not a result stored in results/ (in a batch,
    each `run --save` made every later run of it read dirty, and the stored H200 results all say so)."""
    import subprocess

    repo = tmp_path / "repo"
    for folder in ("casebook", "cases", "results"):
        (repo / folder).mkdir(parents=True)
        (repo / folder / "f.txt").write_text("one\n")
    git = lambda *a: subprocess.run(["git", *a], cwd=repo, check=True, capture_output=True)  # noqa: E731
    git("init", "-q")
    git("-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qam", "x", "--allow-empty")
    git("add", ".")
    git("-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "files")
    fake = repo / "casebook" / "run" / "hardware.py"
    monkeypatch.setattr(hardware, "__file__", str(fake))
    assert hardware._git()["casebook_dirty"] is False
    (repo / "results" / "f.txt").write_text("a result stored\n")
    assert hardware._git()["casebook_dirty"] is False
    (repo / "cases" / "f.txt").write_text("a case edited\n")
    assert hardware._git()["casebook_dirty"] is True


def test_the_device_memory_is_the_hosts_without_a_gpu_and_never_unknown(monkeypatch):
    assert hardware.device_memory_bytes("cpu") == (hardware.memory_bytes() or 8 * 2**30)
    monkeypatch.setattr(hardware, "memory_bytes", lambda: None)
    assert hardware.device_memory_bytes("cpu") == 8 * 2**30
    if not __import__("torch").cuda.is_available():  # asked for a GPU where there is none: the host's
        assert hardware.device_memory_bytes("cuda") == 8 * 2**30
