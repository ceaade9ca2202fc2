"""The Ray path: each case a Ray task asking for its GPUs (and its hardware's resource label), run against a
local Ray started here with CPUs only and GPUs and the label faked; the results come back to the caller,
which writes them. Skipped where ray (the `cluster` extra) is not installed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from casebook.run.cluster import hardware_resource, ship, task_options
from casebook.run.pool import Job


def test_a_case_asks_for_a_gpu_a_device_and_its_hardwares_label():
    assert task_options(Job(Path("a.yaml")), None) == {"num_gpus": 1, "max_retries": 1, "retry_exceptions": False}
    opts = task_options(Job(Path("allreduce.yaml"), devices=4), "nvidia-h200")
    assert opts["num_gpus"] == 4 and opts["resources"] == {"hardware:nvidia-h200": 4}
    assert hardware_resource("nvidia-b200") == "hardware:nvidia-b200"


def test_the_book_is_shipped_without_its_results(tmp_path):
    env = ship(tmp_path)
    assert env["working_dir"] == str(tmp_path) and "results" in env["excludes"] and ".git" in env["excludes"]
    assert env["env_vars"]["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"


@pytest.fixture
def local_ray(small_book, monkeypatch):
    ray = pytest.importorskip("ray")
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")  # a local test cluster: no token written to ~/.ray
    from casebook.run import hardware

    slug = hardware.identify().slug
    ray.init(num_cpus=2, num_gpus=2, resources={hardware_resource(slug): 2}, include_dashboard=False,
             log_to_driver=False)
    try:
        yield slug
    finally:
        ray.shutdown()


@pytest.mark.slow
def test_two_cpu_cases_run_as_ray_tasks_and_land_with_the_caller(local_ray, small_book, cli):
    out = small_book / "results"
    r = cli("run", "cases/scaled_add.yaml", "cases/scaled_add_b.yaml", "--ray", "auto", "--hardware", local_ray,
            "--quick", "--save", "--results", out, "--json")
    assert r.exit_code in (0, 1), r.output
    rows = json.loads(r.stdout[r.stdout.index("["):r.stdout.rindex("]") + 1])
    assert [row["status"] for row in rows] == ["ok", "ok"] and all(row["stored"] for row in rows), rows
    assert all(row["where"].split(" gpu ")[1] in ("0", "1") for row in rows), rows  # Ray's GPU, one each
    from casebook import results

    for name in ("scaled_add", "scaled_add_b"):
        stored = results.load(out / local_ray / f"{name}.json")
        assert stored.environment.device.cuda_visible_devices in ("0", "1")
        assert stored.argv[:3] == ["casebook", "run", f"cases/{name}.yaml"] and "--quick" in stored.argv
        assert not {"--ray", "--hardware", "--json", "cases/scaled_add_b.yaml"} & set(stored.argv[3:])


def test_what_the_cluster_does_not_offer_is_said_not_waited_for():
    from casebook.run.cluster import lacking

    opts = task_options(Job(Path("a.yaml"), devices=2), "nvidia-h200")
    assert lacking(opts, {"GPU": 8.0, "hardware:nvidia-h200": 8.0, "CPU": 64.0}) is None
    assert lacking(opts, {"GPU": 8.0, "CPU": 64.0}) == "needs 2 hardware:nvidia-h200 (the cluster offers 0)"
    assert lacking(task_options(Job(Path("a.yaml")), None), {"CPU": 2.0}) == "needs 1 GPU (the cluster offers 0)"
