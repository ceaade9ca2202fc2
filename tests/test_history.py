"""History over a throw-away git repository: a slower step is named with its commit, noise is not."""

import json
import subprocess

import pytest

from casebook import history
from casebook.commands import history as command
from tests.test_projection import result


def _point(variant, median_us, half_ci_us, shape=1):
    return {"variant": variant, "shape": {"n": shape}, "dtype": "bf16", "status": "ok", "median_us": median_us,
            "median_ci_us": [median_us - half_ci_us, median_us + half_ci_us], "flops": 1.0, "bytes": 8e6,
            "regime": "bandwidth", "roof_fraction": 10.0 / median_us}


def _commit(repo, message, kernel_source, points, kernel_sha):
    (repo / "casebook" / "kernels" / "toy.py").write_text(kernel_source)
    doc = result(points=points).model_dump()
    doc["kernel_sha256"] = kernel_sha
    (repo / "results" / "gpu-a" / "toy.json").write_text(json.dumps(doc))
    subprocess.run(["git", "add", "-A"], cwd=repo, check=True)
    subprocess.run(["git", "commit", "-qm", message], cwd=repo, check=True)
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def repo(tmp_path):
    (tmp_path / "casebook" / "kernels").mkdir(parents=True)
    (tmp_path / "results" / "gpu-a").mkdir(parents=True)
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    subprocess.run(["git", "config", "user.email", "t@example.com"], cwd=tmp_path, check=True)
    subprocess.run(["git", "config", "user.name", "t"], cwd=tmp_path, check=True)
    first = _commit(tmp_path, "first", "v1", [_point("fast", 100.0, 0.5), _point("base", 200.0, 1.0)], "k1")
    # A slower step: the kernel changed and its medians moved 10%, far outside both runs' intervals.
    slower = _commit(tmp_path, "slower kernel", "v2", [_point("fast", 110.0, 0.5), _point("base", 200.5, 1.0)], "k2")
    # Noise: the same kernel, a median 5% off but with an interval that covers it.
    noisy = _commit(tmp_path, "rerun", "v2", [_point("fast", 115.5, 8.0), _point("base", 199.0, 1.0)], "k2")
    return tmp_path, first, slower, noisy


def test_three_commits_judged(repo):
    path, first, slower, noisy = repo
    found = history.entries(path, "toy")
    assert [e.commit for e in found] == [first, slower, noisy]
    judged = {(v.variant, v.after.commit): v for v in history.verdicts(path, found)}
    step = judged[("fast", slower)]
    assert step.verdict == "slower" and step.kernel_commits == [slower]
    assert judged[("base", slower)].verdict == "same"
    rerun = judged[("fast", noisy)]
    assert rerun.verdict == "undecided" and rerun.kernel_commits == []  # noise is never called a regression
    assert found[0].headline["fast"] == pytest.approx(0.1)


def test_point_and_variant_words():
    a, b = result(points=[_point("v", 100, 1)]).kernel_level[0], result(points=[_point("v", 90, 1)]).kernel_level[0]
    assert history.point_verdict(a, b) == (pytest.approx(0.9), "faster")
    assert history.variant_verdict(["same", "slower", "undecided"]) == "slower"
    assert history.variant_verdict(["faster", "slower"]) == "undecided"
    assert history.variant_verdict(["same", "same"]) == "same"


def test_command(repo, capsys):
    path, *_ = repo
    assert command.main("toy", repo=path) == 0
    shown = capsys.readouterr().out
    assert "slower" in shown and "undecided" in shown
    assert command.main("nothing", repo=path) == 2
