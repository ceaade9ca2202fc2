"""casebook.hardware: the registry, and the source hash that names the harness code that measured."""

from __future__ import annotations

import shutil
from pathlib import Path

from casebook import hardware

PACKAGE = Path(hardware.__file__).resolve().parent


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
