"""The registry of datasheet peaks (`casebook/data/hardware.yaml`), keyed by hardware slug: what a vendor
states, beside what `casebook hardware` measures."""

from __future__ import annotations

from functools import cache
from importlib import resources

import yaml


@cache
def datasheets() -> dict[str, dict]:
    """The registry of datasheet peaks, keyed by hardware slug."""
    text = resources.files("casebook").joinpath("data/hardware.yaml").read_text()
    return yaml.safe_load(text)
