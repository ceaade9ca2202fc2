"""The CI workflows keep the book honest without handing a pull request anything to abuse.

Parsed from .github/workflows/*.yml: no `pull_request_target` anywhere; the pull-request workflow is
read-only and secret-free; the GPU run waits for a maintainer's label, runs on the self-hosted GPU
runner with a time limit per case and pushes nothing; publishing happens on main only. The helper
scripts the workflows call are tested on a scratch repository.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import REPO, SOFTMAX

WORKFLOWS = REPO / ".github" / "workflows"
SCRIPTS = REPO / ".github" / "scripts"
sys.path.insert(0, str(SCRIPTS))

import correctness  # noqa: E402


def load(name: str) -> dict:
    return yaml.safe_load((WORKFLOWS / name).read_text())


def triggers(doc: dict) -> dict:
    """The `on:` mapping (YAML 1.1 reads the bare key `on` as True)."""
    on = doc.get("on", doc.get(True))
    if isinstance(on, str):
        return {on: None}
    if isinstance(on, list):
        return {k: None for k in on}
    return on


def steps(doc: dict) -> list[dict]:
    return [s for job in doc["jobs"].values() for s in job.get("steps", [])]


def runs(doc: dict) -> str:
    return "\n".join(s.get("run", "") for s in steps(doc))


def code(path: Path) -> str:
    """The workflow's text without its comment lines (which may name what the workflow avoids)."""
    return "\n".join(line for line in path.read_text().splitlines() if not line.lstrip().startswith("#"))


SECRETS = re.compile(r"\bsecrets\s*[.\[]|secrets:\s*inherit")


ALL = sorted(WORKFLOWS.glob("*.y*ml"))


def test_the_three_workflows_exist():
    assert {p.name for p in ALL} >= {"pr.yml", "gpu.yml", "publish.yml"}


@pytest.mark.parametrize("path", ALL, ids=lambda p: p.name)
def test_no_pull_request_target_and_no_credentials_kept(path):
    doc = yaml.safe_load(path.read_text())
    assert "pull_request_target" not in triggers(doc)
    assert "pull_request_target" not in code(path)
    assert "workflow_run" not in triggers(doc)  # runs with secrets after an untrusted run: not here
    for step in steps(doc):
        if step.get("uses", "").startswith("actions/checkout"):
            assert step.get("with", {}).get("persist-credentials") is False, f"{path.name}: checkout keeps the token"


@pytest.mark.parametrize("path", ALL, ids=lambda p: p.name)
def test_actions_are_pinned_to_commits(path):
    for step in steps(yaml.safe_load(path.read_text())):
        if "uses" in step:
            assert re.fullmatch(r"[\w.-]+/[\w.-]+@[0-9a-f]{40}", step["uses"]), \
                f"{path.name}: {step['uses']} is not pinned"


@pytest.mark.parametrize("path", ALL, ids=lambda p: p.name)
def test_untrusted_event_text_never_reaches_a_shell(path):
    # Only SHAs and numbers may be expanded by ${{ }}; titles, bodies, branch names and labels may not.
    for step in steps(yaml.safe_load(path.read_text())):
        for expr in re.findall(r"\$\{\{(.*?)\}\}", step.get("run", "")):
            assert expr.strip() in (), f"{path.name}: `${{{{{expr}}}}}` expanded inside a run script"


def test_pr_workflow_is_read_only_and_secret_free():
    doc = load("pr.yml")
    assert set(triggers(doc)) == {"pull_request"}
    assert doc["permissions"] == {"contents": "read"}
    for job in doc["jobs"].values():
        assert job.get("permissions", {"contents": "read"}) == {"contents": "read"}
        assert "self-hosted" not in json.dumps(job.get("runs-on"))
    text = code(WORKFLOWS / "pr.yml")
    assert not SECRETS.search(text)
    assert "git push" not in text


def test_pr_workflow_does_the_whole_review_on_cpu():
    doc = load("pr.yml")
    script = runs(doc)
    assert "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu" in script
    assert re.search(r"^\s*casebook validate\b", script, re.M)
    assert "TRITON_INTERPRET=1 python -m pytest -q" in script
    assert "changed_cases.py" in script and 'casebook check "cases/$c.yaml"' in script
    assert re.search(r'timeout \d+ casebook run "cases/\$c\.yaml"', script)
    assert "correctness.py" in script
    assert "casebook build --strict" in script
    uploads = [s for s in steps(doc) if s.get("uses", "").startswith("actions/upload-artifact")]
    assert any(s["with"]["name"] == "site-preview" and s["with"]["path"] == "site" for s in uploads)


def test_gpu_workflow_waits_for_the_label_and_pushes_nothing():
    doc = load("gpu.yml")
    assert triggers(doc) == {"pull_request": {"types": ["labeled"]}}
    assert doc["permissions"] == {"contents": "read"}
    for job in doc["jobs"].values():
        assert re.fullmatch(r"\s*github\.event\.label\.name == 'run-gpu'\s*", job["if"])
        assert job["runs-on"] == ["self-hosted", "gpu"]
        assert job.get("permissions", {"contents": "read"}) == {"contents": "read"}
        checkout = next(s for s in job["steps"] if s.get("uses", "").startswith("actions/checkout"))
        assert checkout["with"]["ref"] == "${{ github.event.pull_request.head.sha }}"
    assert not SECRETS.search(code(WORKFLOWS / "gpu.yml"))
    script = runs(doc)
    assert not re.search(r"git\s+(push|commit)|\bgh\s", script)
    commands = re.findall(r"^\s*(?:timeout \d+ )?casebook run\b.*$", script, re.M)
    assert commands and all(re.match(r"\s*timeout \d+ casebook run ", line) for line in commands), commands
    assert any(s.get("uses", "").startswith("actions/upload-artifact") for s in steps(doc))


def test_publish_only_from_main_with_pages_rights_in_the_deploy_job_only():
    doc = load("publish.yml")
    assert triggers(doc) == {"push": {"branches": ["main"]}}
    assert doc["permissions"] == {"contents": "read"}
    jobs = doc["jobs"]
    deploy = [name for name, job in jobs.items()
              if any(s.get("uses", "").startswith("actions/deploy-pages") for s in job.get("steps", []))]
    assert deploy == ["deploy"]
    assert jobs["deploy"]["permissions"] == {"pages": "write", "id-token": "write"}
    assert all("permissions" not in job for name, job in jobs.items() if name != "deploy")
    assert "casebook build --strict" in runs(doc)


@pytest.mark.parametrize("path", ALL, ids=lambda p: p.name)
def test_only_other_workflows_can_write(path):
    text = code(path)
    writes = re.findall(r"^\s*([a-z-]+):\s*write\s*$", text, re.M)
    assert set(writes) <= ({"pages", "id-token"} if path.name == "publish.yml" else set()), writes


# --- the scripts ----------------------------------------------------------------------------------


def git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t.invalid", "-c", "commit.gpgsign=false",
                           *args], cwd=root, capture_output=True, text=True, check=True).stdout


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A scratch repository holding the softmax case and a gemm-like case that shares a helper module."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    (tmp_path / "cases").mkdir()
    kernels = tmp_path / "casebook" / "kernels"
    kernels.mkdir(parents=True)
    shutil.copytree(REPO / "casebook", tmp_path / "casebook", dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("__pycache__", "kernels"))
    softmax = SOFTMAX.read_text()
    (tmp_path / "cases" / "softmax_fusion.yaml").write_text(softmax)
    (tmp_path / "cases" / "shared_user.yaml").write_text(
        softmax.replace("\nid: softmax_fusion\n", "\nid: shared_user\n").replace("  module: softmax_fusion",
                                                                                 "  module: shared_user"))
    (kernels / "softmax_fusion.py").write_text("def reference(x):\n    return x\n")
    (kernels / "helper.py").write_text("SCALE = 1\n")
    (kernels / "shared_user.py").write_text("from casebook.kernels import helper\n")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "index.md").write_text("# book\n")
    git(tmp_path, "init", "-q")
    git(tmp_path, "add", "-A")
    git(tmp_path, "commit", "-q", "-m", "base")
    git(tmp_path, "checkout", "-q", "-b", "pr")
    return tmp_path


def touched(repo: Path, edits: dict[str, str | None]) -> list[str]:
    for name, text in edits.items():
        if text is None:
            git(repo, "rm", "-q", name)
        else:
            (repo / name).parent.mkdir(parents=True, exist_ok=True)
            (repo / name).write_text(text)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "--allow-empty", "-m", "change")
    base = git(repo, "rev-parse", "main" if "main" in git(repo, "branch") else "master").strip()
    out = subprocess.run([sys.executable, str(SCRIPTS / "changed_cases.py"), base, "--root", str(repo)], cwd=repo,
                         capture_output=True, text=True, check=True).stdout
    return out.split()


@pytest.mark.parametrize("edits, expected", [
    ({"docs/index.md": "# changed\n"}, []),
    ({"cases/softmax_fusion.yaml": None}, []),  # deleted: nothing left to run
    ({"casebook/kernels/softmax_fusion.py": "def reference(x):\n    return -x\n"}, ["softmax_fusion"]),
    ({"casebook/kernels/helper.py": "SCALE = 2\n"}, ["shared_user"]),  # a shared helper touches its users
    ({"casebook/bench.py": "# changed\n"}, ["shared_user", "softmax_fusion"]),  # the harness touches all
    ({"casebook/render/site.py": "# changed\n"}, []),
    ({"results/nvidia-h200/softmax_fusion.json": "{}\n"}, ["softmax_fusion"]),  # a result alone is checked too
])
def test_changed_cases(repo, edits, expected):
    assert touched(repo, edits) == expected


def test_changed_cases_with_a_new_case(repo):
    text = (repo / "cases" / "softmax_fusion.yaml").read_text().replace("\nid: softmax_fusion\n", "\nid: new_one\n")
    assert touched(repo, {"cases/new_one.yaml": text}) == ["new_one"]


def test_correctness_fails_on_wrong_answers_only(tmp_path, capsys):
    ok = {"variant": "v", "shape": {"n": 4}, "dtype": "fp32", "status": "ok", "correct": True}
    doc = {"kernel_level": [ok, {**ok, "status": "failed", "error": "faster than physics"}],
           "workload_level": {"points": [ok]}, "end_to_end": {"status": "partial"},
           "claims": [{"text": "fast", "held": False, "detail": "1.1x"}]}
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "a.json").write_text(json.dumps(doc))
    assert correctness.main([str(tmp_path), "a"]) == 0
    out = capsys.readouterr().out
    assert out.count("::warning file=cases/a.yaml::") == 2 and "::error" not in out
    doc["workload_level"]["points"].append({**ok, "status": "failed", "correct": False, "error": "rel err 0.3"})
    (tmp_path / "cpu" / "a.json").write_text(json.dumps(doc))
    assert correctness.main([str(tmp_path), "a"]) == 1
    assert "::error file=cases/a.yaml::a: v 4 fp32: failed: rel err 0.3" in capsys.readouterr().out
    assert correctness.main([str(tmp_path), "missing"]) == 1
